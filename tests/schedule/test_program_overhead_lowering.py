"""A program's host overhead (HardwareProfile.program_overhead_s) on the step's timeline:
per block per micro-batch in forward, again in a recomputed forward, and in backward;
once per step; only for the plan's own programs; nothing on an async host. The expected
seconds are counted by hand from the figures below."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zsim.schedule.lower import lower
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

OVERHEAD = {
    program: {"forward_block": f * 1e-6, "backward_block": 2 * f * 1e-6,
              "forward_tensor": 0.1 * f * 1e-6, "backward_tensor": 0.2 * f * 1e-6,
              "step": 3 * f * 1e-3}
    for program, f in (("deepspeed-zero1", 1.0), ("deepspeed-zero2", 10.0),
                       ("deepspeed-zero3", 100.0), ("deepspeed-zero2-offload", 1e4),
                       ("fsdp1", 1e5), ("fsdp1-no-reshard", 1e6), ("tp", 1e3))}
"""Each program's figures a power of ten apart, so a figure charged to the wrong plan
shows."""


def _per_block(model: ModelSpec, program: str, phase: str) -> float:
    """A program's seconds per block in a phase: its block figure and its tensor figure
    times the block's parameter tensors."""
    figures = OVERHEAD[program]
    return (figures[f"{phase}_block"]
            + len(model.block_tensors()) * figures[f"{phase}_tensor"])


def _compute_s(model: ModelSpec, hw: HardwareProfile, plan: Plan) -> float:
    """Seconds of every op on the compute stream of the lowered step."""
    return sum(op.compute_s for op in lower(model, hw, plan).ops if op.stream == "compute")


@pytest.mark.parametrize(("plan", "programs"), [
    (Plan.for_strategy("zero1", gpus=8, seq_len=128, grad_accum=2), ("deepspeed-zero1",)),
    (Plan.for_strategy("zero2", gpus=8, seq_len=128, grad_accum=2), ("deepspeed-zero2",)),
    (Plan.for_strategy("zero3", gpus=8, seq_len=128, grad_accum=2), ("deepspeed-zero3",)),
    (Plan.for_strategy("zero3", gpus=8, seq_len=128, recompute="full"), ("deepspeed-zero3",)),
    (Plan.for_strategy("zero2", gpus=8, seq_len=128, recompute="selective"),
     ("deepspeed-zero2",)),
    # ZeRO-2 offloading its optimizer runs its own figures; ZeRO-1 offloading, its stage's.
    (Plan.for_strategy("zero2", gpus=8, seq_len=128, offload="optimizer"),
     ("deepspeed-zero2-offload",)),
    (Plan.for_strategy("zero1", gpus=8, seq_len=128, offload="optimizer"),
     ("deepspeed-zero1",)),
    (Plan(strategy="ddp", dp_shard=1, dp_replicate=4, tp=2, seq_len=128, grad_accum=2), ("tp",)),
    (Plan(strategy="fsdp", dp_shard=4, tp=2, seq_len=128, recompute="full"), ("tp",)),
    # FSDP1 by sharding strategy; HYBRID_SHARD runs FULL_SHARD's.
    (Plan.for_strategy("fsdp", gpus=8, seq_len=128, impl="fsdp1"), ("fsdp1",)),
    (Plan.for_strategy("fsdp-no-reshard", gpus=8, seq_len=128, impl="fsdp1",
                       recompute="full"), ("fsdp1-no-reshard",)),
    (Plan.for_strategy("hsdp", gpus=8, shard_group=4, seq_len=128, impl="fsdp1"), ("fsdp1",)),
    # Programs whose host costs the profile models otherwise: nothing added.
    (Plan.for_strategy("fsdp", gpus=8, seq_len=128), ()),
    (Plan.for_strategy("zero1", gpus=8, seq_len=128, impl="torch"), ()),
    (Plan.for_strategy("ddp", gpus=8, seq_len=128), ()),
])
def test_each_block_and_the_step_pay_their_programs_figures(
        tiny_model: ModelSpec, h100: HardwareProfile, plan: Plan,
        programs: tuple[str, ...]) -> None:
    sync = replace(h100, launch="synchronous")
    added = (_compute_s(tiny_model, replace(sync, program_overhead_s=OVERHEAD), plan)
             - _compute_s(tiny_model, sync, plan))
    # Per block and micro-batch: the forward figures (per block, and per tensor times
    # the block's tensors), again when the forward is re-run, and the backward figures;
    # once per step, the step figure.
    forwards = 2 if plan.recompute != "none" else 1
    expected = sum(
        tiny_model.num_layers * plan.grad_accum
        * (forwards * _per_block(tiny_model, p, "forward") + _per_block(tiny_model, p, "backward"))
        + OVERHEAD[p]["step"] for p in programs)
    assert added == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_an_async_host_runs_the_programs_overhead_ahead_of_the_device(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    for plan in (Plan.for_strategy("zero3", gpus=8, seq_len=128),
                 Plan(strategy="ddp", dp_shard=1, dp_replicate=4, tp=2, seq_len=128)):
        assert h100.launch == "async"
        assert lower(tiny_model, replace(h100, program_overhead_s=OVERHEAD), plan).ops == \
            lower(tiny_model, h100, plan).ops


def test_shard_grad_op_takes_full_shards_figures_where_it_has_none(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    sync = replace(h100, launch="synchronous")
    plan = Plan.for_strategy("fsdp-no-reshard", gpus=8, seq_len=128, impl="fsdp1")
    only_full = replace(sync, program_overhead_s={"fsdp1": OVERHEAD["fsdp1"]})
    added = _compute_s(tiny_model, only_full, plan) - _compute_s(tiny_model, sync, plan)
    per_block = _per_block(tiny_model, "fsdp1", "forward") + _per_block(tiny_model, "fsdp1",
                                                                        "backward")
    assert added == pytest.approx(tiny_model.num_layers * per_block + OVERHEAD["fsdp1"]["step"])
