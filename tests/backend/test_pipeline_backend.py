"""Real gloo runs of pipeline parallelism (zsim.backend.pipelining): pp=2 under Schedule1F1B
and ScheduleGPipe. Each stage's model state, optimizer state and saved activations
against closed forms worked out here from the model's shapes and the cut."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from zsim.backend.measured_step import PlanMeasurement, measure_plan
from zsim.backend.pipelining import check_plan
from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

TINY = ModelSpec(name="tiny", num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                 ffn_hidden=344, vocab_size=500, max_seq_len=64)
B, S, M = 2, 48, 4
"""Sequences per micro-batch, tokens per sequence, micro-batches per step."""
ROPE_BYTES = 2 * TINY.max_seq_len * TINY.head_dim * 4
"""The fp32 cos and sin tables, buffers every stage keeps."""


def _stage_params(spec: ModelSpec, stage: int) -> tuple[int, int]:
    """(elements, tensors) of one stage of a 2-stage cut: one block each, the embedding
    on stage 0, the final norm and the output on stage 1."""
    d, kv, f, v = spec.d_model, spec.kv_dim, spec.ffn_hidden, spec.vocab_size
    block = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
    if stage == 0:
        return block + v * d, 9 + 1
    return block + d + v * d, 9 + 2


def _block_saved_autocast(spec: ModelSpec, b: int, s: int) -> int:
    """What one block saves per micro-batch with fp32 parameters under bf16 autocast on
    CPU, op by op: bf16 copies of its seven weights (autocast's cache lives for one
    stage forward, so each micro-batch casts anew) and of each linear's input (wq, wk, wv,
    w1, w3 each cast the fp32 norm output); per composite RMSNorm the fp32 residual
    stream, rstd and normalised input; attention's q, k, v, output (bf16) and fp32
    log-sum-exp; SwiGLU's w1 x, w3 x, silu(w1 x) and their product (bf16)."""
    d, kv, f, h = spec.d_model, spec.kv_dim, spec.ffn_hidden, spec.num_heads
    weights = 2 * (2 * d * d + 2 * d * kv + 3 * d * f)
    norm = 4 * b * s * d + 4 * b * s + 4 * b * s * d
    casts = 5 * 2 * b * s * d
    attention = 2 * b * s * d + 2 * 2 * b * s * kv + 2 * b * s * d + 4 * b * h * s
    mlp = 4 * 2 * b * s * f
    return weights + 2 * norm + casts + attention + mlp


def _check_stages(m: PlanMeasurement) -> None:
    first, last = m.ranks
    assert math.isnan(first.loss) and math.isfinite(last.loss)  # the loss is the last's
    # PipelineStage keeps one receive buffer per micro-batch across steps: the fp32
    # activation (b, s, d) from the stage before, or its gradient from the stage after.
    recv_bytes = M * B * S * TINY.d_model * 4
    for stage, r in enumerate(m.ranks):
        numel, tensors = _stage_params(TINY, stage)
        assert 0 <= r.memory.after_init_bytes - (4 * numel + ROPE_BYTES) <= 8
        # At rest: + AdamW's two fp32 moments and a step per tensor + receive buffers.
        assert r.memory.after_first_step_bytes - r.memory.after_init_bytes == \
            2 * 4 * numel + 4 * tensors + recv_bytes
        # Every micro-batch's block tensors, plus the fp32 RoPE tables (saved once, in
        # the stage's first block: under autocast the residual stream is fp32).
        assert sum(t.bytes for t in r.saved if t.scope == f"layers.{stage}") == \
            M * _block_saved_autocast(TINY, B, S) + ROPE_BYTES
    # The embedding saves its int64 token ids per micro-batch.
    assert sum(t.bytes for t in first.saved if t.scope == "root") == M * B * S * 8
    assert not first.collective_busy_s and not last.collective_busy_s  # p2p only


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pp2_stage_state_activations_and_micro_batches_in_flight(schedule: str) -> None:
    plan = Plan(strategy="ddp", dp_shard=1, pp=2, pp_schedule=schedule, seq_len=S,
                micro_batch=B, grad_accum=M)
    m = measure_plan(TINY, plan, nproc=2, steps=1)
    _check_stages(m)
    assert m.step_time_s > 0
    for r in m.ranks:
        # Every micro-batch's saved tensors (checked above) are alive at once under
        # GPipe, after the last forward; 1F1B holds at most pp - stage of the 4.
        activations = sum(t.bytes for t in r.saved)
        above_state = r.memory.peak_bytes - r.memory.after_first_step_bytes
        if schedule == "gpipe":
            assert above_state >= activations
        else:
            assert above_state < activations


@pytest.mark.parametrize(("plan", "field"), [
    (Plan(strategy="ddp", dp_shard=1, pp=2, tp=2, seq_len=S), "plan.tp"),
    (Plan(strategy="fsdp", dp_shard=2, pp=2, seq_len=S), "plan.strategy"),
    (Plan(strategy="ddp", dp_shard=1, pp=2, pp_schedule="interleaved", virtual_stages=2, seq_len=S,
          grad_accum=2), "plan.pp_schedule"),
    (Plan(strategy="ddp", dp_shard=1, pp=2, seq_len=S, grad_accum=1), "plan.grad_accum"),
    (Plan(strategy="ddp", dp_shard=1, pp=4, seq_len=S, grad_accum=4), "plan.pp"),
])
def test_check_plan_names_the_field(plan: Plan, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_plan(plan, plan.world_size, TINY)
    assert err.value.field == field
