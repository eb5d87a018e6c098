"""The two ModelSpec knobs of the training program that move FSDP's schedule: where the
loss is computed (loss_in_forward: when FSDP's root pre-backward runs) and the dtype
RoPE's tables reach the blocks in (rope_table_dtype: FSDP2's per-block cast), read from
torch/distributed/fsdp/_fully_shard/_fsdp_state.py (_register_pre_backward_hook on the
root's forward output; _cast_forward_inputs in every _pre_forward)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zsim.schedule.lower import lower
from zsim.schedule.ops import Op
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


def _op(ops: tuple[Op, ...], name: str) -> Op:
    return next(op for op in ops if op.name == name)


@pytest.mark.parametrize("impl", ["fsdp2", "fsdp1"])
def test_root_pre_backward_runs_on_its_outputs_gradient(
        tiny_model: ModelSpec, h100: HardwareProfile, impl: str) -> None:
    """The last unit's backward all-gather, which the root's pre-backward prefetches:
    issued after the head's forward when the model outputs its loss (the hook is on the
    loss, whose gradient exists first), after the loss's backward when it outputs its
    logits (their gradient is what the loss's backward makes)."""
    plan = Plan.for_strategy("fsdp", gpus=8, seq_len=128, impl=impl)
    forward, loss = "output+loss forward (mb 0)", "loss backward (mb 0)"
    for inside, after, not_after in ((True, forward, loss), (False, loss, forward)):
        ops = lower(replace(tiny_model, loss_in_forward=inside), h100, plan).ops
        first = next(op for op in ops if op.unit == 1 and op.kind == "backward"
                     and op.stream == "all_gather")
        # FSDP1 also waits for its rate limiter (the forward's all-gathers in flight).
        issue = [ops[i].name for i in first.issue_after + first.after]
        assert after in issue and not_after not in issue, (impl, inside, issue)


def test_loss_outside_frees_the_last_all_gather_before_the_loss(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """FSDP2's root post-forward frees the last unit's held all-gather output
    (AllGatherState): after the loss when the root's forward computes it, before it
    when the root's forward ends with the logits."""
    plan = Plan.for_strategy("fsdp", gpus=8, seq_len=128)
    held = "mb0/unit 1/gathered/forward/flat"
    for inside, at_start in ((True, ()), (False, (held,))):
        head = _op(lower(replace(tiny_model, loss_in_forward=inside), h100, plan).ops,
                   "output+loss forward (mb 0)")
        assert head.frees_at_start == at_start
        assert (held in head.frees) == inside


def test_fp32_rope_tables_cost_fsdp2_a_bf16_copy_per_block(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """Each block's saved buffer holds its cast cos and sin (s x head_dim, bf16) beside
    its saved tensors; fp32 compute casts nothing."""
    s, head_dim = 128, tiny_model.head_dim
    for plan, copies in ((Plan.for_strategy("fsdp", gpus=8, seq_len=s, unit_size=2), 2),
                         (Plan.for_strategy("fsdp", gpus=8, seq_len=s, param_dtype="fp32",
                                            grad_dtype="fp32"), 0)):
        def saved(model: ModelSpec, plan: Plan = plan) -> int:
            ops = lower(model, h100, plan).ops
            return sum(b.bytes for op in ops for b in op.allocs if b.name.endswith("/saved")
                       and op.unit is not None)

        extra = saved(replace(tiny_model, rope_table_dtype="fp32")) - saved(tiny_model)
        assert extra == copies * 2 * s * head_dim * 2
