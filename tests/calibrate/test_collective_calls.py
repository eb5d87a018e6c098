"""The collective calls each program issues in a step, counted in a real run on 2 gloo
ranks (the torch profiler's gloo spans, RankMeasurement.collective_calls), are the calls
the simulator lowers for the same plan, kind by kind: DDP's buckets, FSDP2's and FSDP1's
per-unit all-gathers and reduce-scatters, DeepSpeed ZeRO-1/2's bucket all-reduces, their
step's scalar all-reduces and parameter all-gather, ZeRO-3's per-submodule fetches and
persistent re-gathers (issue 10: the number of calls each program issues). gloo runs a
reduce-scatter as an all-reduce of the full buffer, so the simulator's reduce-scatters
are counted as all-reduces. TP's calls: test_tensor_parallel_backend.py."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from _library import TINY, ZERO3
from _runs import RealRuns

from zsim.simulate import simulate
from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware

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
    ("zero1", {"ds": DeepSpeedZero()}),
    ("zero2", {"ds": DeepSpeedZero(reduce_bucket_size=20_000)}),
    ("zero2", {"ds": DeepSpeedZero(reduce_bucket_size=20_000), "offload": "optimizer"}),
    ("zero3", {"ds": ZERO3}),
], ids=["ddp", "fsdp2", "fsdp1", "fsdp1-no-reshard", "zero1", "zero2", "zero2-offload",
        "zero3"])
def test_a_real_step_issues_the_simulated_calls(real_runs: RealRuns, strategy: str,
                                                knobs: dict) -> None:
    if "ds" in knobs:
        pytest.importorskip("deepspeed")
    plan = Plan.for_strategy(strategy, gpus=2, seq_len=64, micro_batch=2, **knobs)
    # ZeRO-3's run is test_deepspeed_backend's timed one (the same arguments).
    measured = real_runs.measure(TINY, plan, nproc=2, steps=1, warmup_steps=1)
    simulated = _gloo_kinds(simulate(TINY, resolve_hardware("local-cpu"),
                                     plan).collective_calls)
    assert sum(simulated.values()) > 0
    assert all(r.collective_calls == simulated for r in measured.ranks), (
        [r.collective_calls for r in measured.ranks], simulated)
