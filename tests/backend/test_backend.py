"""Real 2-process gloo runs of the reference step: state memory against closed forms of
ModelSpec, and saved activations against the CPU program derived op by op."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from _runs import RealRuns

from zsim.backend.measured_step import measure_plan
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

pytestmark = pytest.mark.slow

TINY = ModelSpec(name="tiny", num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                 ffn_hidden=344, vocab_size=500, max_seq_len=64, norm_kernel="composite")
"""The kernel knob as validate_plan() sets it on CPU (the real run does not read it), so the
FSDP2 run is test_validate's too."""
B, S = 2, 48
ROPE_BYTES = 2 * TINY.max_seq_len * TINY.head_dim * 4
"""The fp32 cos and sin tables, buffers of the root."""


def _cpu_block_saved_bytes(spec: ModelSpec, b: int, s: int) -> int:
    """What autograd keeps per block on CPU with bf16 compute, op by op: each composite
    RMSNorm keeps its fp32 input copy, the fp32 rstd (one per token), the fp32 normalised
    input and its bf16 output (the projections' input); attention keeps q and k after
    RoPE (RoPE itself keeps only the shared cos/sin), v, the output (whose transpose the
    o projection reuses) and the fp32 log-sum-exp per head and token; SwiGLU keeps w1 x,
    w3 x, silu(w1 x) and their product."""
    d, kv, f, h = spec.d_model, spec.kv_dim, spec.ffn_hidden, spec.num_heads
    norm = 4 * b * s * d + 4 * b * s + 4 * b * s * d + 2 * b * s * d
    attention = 2 * b * s * d + 2 * 2 * b * s * kv + 2 * b * s * d + 4 * b * h * s
    mlp = 4 * 2 * b * s * f
    return 2 * norm + attention + mlp


def test_fsdp_two_ranks_memory_and_saved_activations(real_runs: RealRuns) -> None:
    plan = Plan.for_strategy("fsdp", gpus=2, seq_len=S, micro_batch=B)
    m = real_runs.measure(TINY, plan, nproc=2, steps=2)
    assert all(math.isfinite(r.loss) for r in m.ranks)
    assert m.step_time_s > 0
    shard_bytes = TINY.num_params * 4 // 2  # fp32 parameters, half on each rank
    n_tensors = len(TINY.parameter_tensors())
    for r in m.ranks:
        # Beyond the shards and buffers, only bookkeeping scalars (DTensor's RNG state).
        assert 0 <= r.memory.after_init_bytes - (shard_bytes + ROPE_BYTES) <= 64
        # AdamW: exp_avg and exp_avg_sq per shard, plus one fp32 step counter per tensor.
        assert r.memory.after_first_step_bytes - r.memory.after_init_bytes == \
            2 * shard_bytes + 4 * n_tensors
        assert r.memory.peak_bytes >= r.memory.after_forward_bytes > \
            r.memory.after_first_step_bytes
    # FSDP2 all-gathers parameters; gloo runs reduce_scatter_tensor as an all-reduce.
    assert set(m.ranks[0].collective_busy_s) == {"all_gather", "all_reduce"}
    assert set(m.ranks[0].forward_s) == {"layers.0", "layers.1", "root"}
    assert set(m.ranks[0].backward_s) == {"layers.0", "layers.1"}
    # layers.1 owns no shared tensor (layers.0 is charged the bf16 cos/sin tables).
    assert m.saved_block_bytes("layers.1") == _cpu_block_saved_bytes(TINY, B, S)
    assert m.saved_block_bytes("layers.0") - m.saved_block_bytes("layers.1") == \
        2 * S * TINY.head_dim * 2


def test_ddp_keeps_full_parameters_gradient_buckets_and_adam_state() -> None:
    plan = Plan.for_strategy("ddp", gpus=2, seq_len=S, micro_batch=B, recompute="full")
    m = measure_plan(TINY, plan, nproc=2, steps=1, min_timed_s=0.5)
    # More steps than asked, to fill half a second at the warm-up's pace (all ranks
    # time the same count).
    assert len({len(r.step_times_s) for r in m.ranks}) == 1
    assert len(m.ranks[0].step_times_s) > 1
    assert sum(max(r.step_times_s[i] for r in m.ranks)
               for i in range(len(m.ranks[0].step_times_s))) > 0.25
    full_bytes = TINY.num_params * 4
    assert set(m.ranks[0].collective_busy_s) == {"all_reduce"}
    n_tensors = len(TINY.parameter_tensors())
    for r in m.ranks:
        # At rest: fp32 parameters, DDP's fp32 gradient buckets (the gradients are views
        # into them), AdamW's two moments and a 4-byte step per tensor. (Right after
        # construction the initial broadcast's flat buffer may still be alive.)
        assert r.memory.after_first_step_bytes == \
            4 * full_bytes + ROPE_BYTES + 4 * n_tensors
    # Full recomputation keeps only each block's bf16 input (the autocast residual
    # stream is fp32 here: DDP runs fp32 parameters under autocast).
    assert m.saved_block_bytes("layers.1") == B * S * TINY.d_model * 4
