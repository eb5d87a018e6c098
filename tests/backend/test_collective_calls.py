"""The collective calls each program issues in a step, counted in a real run on 2 gloo
ranks (the torch profiler's gloo spans, RankMeasurement.collective_calls), are the calls
the simulator lowers for the same plan, kind by kind: DDP's buckets, FSDP2's and FSDP1's
per-unit all-gathers and reduce-scatters, DeepSpeed ZeRO-1/2's bucket all-reduces, their
step's scalar all-reduces and parameter all-gather, ZeRO-3's per-submodule fetches and
persistent re-gathers (the number of calls each program issues). gloo runs a
reduce-scatter as an all-reduce of the full buffer, so the simulator's reduce-scatters
are counted as all-reduces. DDP's buckets are also compared call by call, in dtype and
bytes (the profiler's record_shapes on gloo's spans: fp32 buckets under
autocast). TP's calls: test_tensor_parallel_backend.py."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from _library import TINY, ZERO3
from _runs import RealRuns

from zsim.backend.runner import RankContext, run_ranks
from zsim.schedule.lower import lower
from zsim.simulate import simulate
from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware
from zsim.units import MiB

pytestmark = pytest.mark.slow


def _gloo_kinds(calls: dict[str, int]) -> dict[str, int]:
    out = dict(calls)
    if "reduce_scatter" in out:
        out["all_reduce"] = out.get("all_reduce", 0) + out.pop("reduce_scatter")
    return out


@pytest.mark.parametrize(("strategy", "knobs"), [
    ("ddp", {}),
    ("fsdp", {}),
    ("fsdp", {"impl": "fsdp1"}),
    ("fsdp-no-reshard", {"impl": "fsdp1"}),
    ("zero1", {"options": DeepSpeedZero()}),
    ("zero2", {"options": DeepSpeedZero(reduce_bucket_size=20_000)}),
    ("zero2", {"options": DeepSpeedZero(reduce_bucket_size=20_000), "offload": "optimizer"}),
    ("zero3", {"options": ZERO3}),
], ids=["ddp", "fsdp2", "fsdp1", "fsdp1-no-reshard", "zero1", "zero2", "zero2-offload",
        "zero3"])
def test_a_real_step_issues_the_simulated_calls(real_runs: RealRuns, strategy: str,
                                                knobs: dict) -> None:
    if "options" in knobs:
        pytest.importorskip("deepspeed")
    plan = Plan.for_strategy(strategy, gpus=2, seq_len=64, micro_batch=2, **knobs)
    # ZeRO-3's run is test_deepspeed_backend's timed one (the same arguments).
    measured = real_runs.measure(TINY, plan, nproc=2, steps=1, warmup_steps=1)
    simulated = _gloo_kinds(simulate(TINY, resolve_hardware("local-cpu"),
                                     plan).collective_calls)
    assert sum(simulated.values()) > 0
    assert all(r.collective_calls == simulated for r in measured.ranks), (
        [r.collective_calls for r in measured.ranks], simulated)


GLOO_DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2}
"""The profiler's names for a span's tensor dtype -> bytes per element."""


def _gloo_calls(ctx: RankContext, job: tuple[ModelSpec, Plan]) -> list[tuple[str, str, int]]:
    """(kind, dtype, elements) of every gloo collective span of one step, in issue order:
    the third, after the step that rebuilt DDP's buckets in gradient order."""
    from torch.profiler import ProfilerActivity, profile

    from zsim.backend import programs, training

    spec, plan = job
    prep = programs.prepare(spec, plan, device=ctx.device, world_size=ctx.world_size)
    rank = training.data_rank(plan, ctx.rank)
    for step in range(2):
        training.train_step(prep, training.batches(spec, plan, device=ctx.device, rank=rank,
                                                   step=step))
    training.barrier()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        training.train_step(prep, training.batches(spec, plan, device=ctx.device, rank=rank,
                                                   step=2))
    return [(e.name.removeprefix("gloo:"), e.input_dtypes[0], math.prod(e.input_shapes[0]))
            for e in prof.events() if e.name.startswith("gloo:")]


@pytest.mark.parametrize(("strategy", "bucket_bytes"), [
    ("ddp", 25 * MiB), ("ddp", 262_144), ("zero1", 262_144)])
def test_ddp_buckets_are_the_simulated_ones_byte_for_byte(strategy: str,
                                                          bucket_bytes: int) -> None:
    """DDP's all-reduces in a real 2-rank gloo step, under torch.autocast to bf16 (the
    backend's mixed precision): each bucket fp32, the parameters' dtype, and the buckets
    the simulator lowers, in order and size: one of TINY's 494,208 elements within 25
    MiB; six within 256 KiB, the first the output projection alone. zero1 (DDP +
    ZeroRedundancyOptimizer) all-reduces the same buckets, then broadcasts every fp32
    parameter from its owner: as many bytes as the all-gathers the simulator stands them
    for."""
    plan = Plan.for_strategy(strategy, gpus=2, seq_len=64, micro_batch=2,
                             bucket_bytes=bucket_bytes, impl="torch")
    calls = run_ranks(_gloo_calls, (TINY, plan), nproc=2)
    ops = lower(TINY, resolve_hardware("local-cpu"), plan).ops
    for rank_calls in calls:
        reduced = [(dtype, GLOO_DTYPE_BYTES[dtype] * n)
                   for kind, dtype, n in rank_calls if kind == "all_reduce"]
        assert reduced == [("float", op.size_bytes) for op in ops if op.kind == "all_reduce"]
        sent = [(dtype, GLOO_DTYPE_BYTES[dtype] * n)
                for kind, dtype, n in rank_calls if kind == "broadcast"]
        if strategy == "zero1":
            assert {dtype for dtype, _ in sent} == {"float"}
            # The broadcasts of the parameters, less DDP's of its module buffers.
            params = sum(b for _, b in sent) - TINY.buffer_bytes
            assert params == sum(op.size_bytes for op in ops if op.kind == "all_gather")
    assert len([op for op in ops if op.kind == "all_reduce"]) == (
        1 if bucket_bytes == 25 * MiB else 6)
