"""Tensor parallelism on the toy cluster, worked out by hand: the tiny 2-block
model at tp=2 on one 2-GPU node (100 GB/s NVLink, no latency, 1e12 FLOP/s, 1 TB/s HBM),
FSDP2 over a data-parallel size of 1, so only TP communicates."""

from __future__ import annotations

import pytest
from test_fsdp_toy_timeline import hand_durations
from toy_cluster import make_toy_hw

from zsim.schedule.build import activation_sizes
from zsim.schedule.lower import state_at_rest_bytes
from zsim.simulate import simulate
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

TOKENS, D, F, V, T = 256, 256, 512, 1000, 2
S = TOKENS * D * 2                     # one micro-batch's bf16 activations (b x s x d)


def _plan(**knobs: object) -> Plan:
    return Plan.for_strategy("fsdp", gpus=2, tp=T, seq_len=TOKENS, prefetch=0, **knobs)


def hand_block_forward_s() -> float:
    """One block's forward on one TP rank: half the heads (q, k, v, o widths 128) and half
    the MLP (256 of 512); norms and residual adds on the whole d."""
    q = kv = D // T
    f = F // T
    matmul_params = D * q + D * kv + D * kv + q * D + 3 * D * f
    attention = 2 * 1 * TOKENS * TOKENS * q           # QK^T + AV, half masked
    # Per token, elements read + written: 2 norms 2d, RoPE of q and k 10 x width each,
    # the attention-output copy 2q, 2 residual adds 3d, SiLU 2f, gate product 3f.
    elems = 2 * 2 * D + 10 * q + 10 * kv + 2 * q + 2 * 3 * D + 2 * f + 3 * f
    return (2 * TOKENS * matmul_params + attention) / 1e12 + TOKENS * elems * 2 / 1e12


def test_blocking_tp_all_reduces_by_hand(tiny_model: ModelSpec) -> None:
    r = simulate(tiny_model, make_toy_hw(), _plan(), trace=True)
    spans = sorted(r.spans, key=lambda sp: (sp.start_s, sp.index))
    fwd = next(sp for sp in spans if sp.name == "unit 0 forward (mb 0)")
    assert fwd.end_s - fwd.start_s == pytest.approx(hand_block_forward_s(), rel=1e-12)
    assert fwd.end_s - fwd.start_s == pytest.approx(hand_durations().fwd / 2, rel=0.15)
    tp = [sp for sp in spans if sp.stream == "tp"]
    # Megatron's f and g: 2 all-reduces per block forward and 2 backward, the embedding's
    # output forward and the output projection's input gradient: 2 x 2 x 2 + 2 = 10; and
    # between the passes the logits all-gathered for the loss (the output projection's
    # replicated output, no loss parallelism).
    assert [sp.kind for sp in tp] == ["all_reduce"] * 5 + ["all_gather"] + ["all_reduce"] * 5
    # A ring all-reduce over 2 ranks moves 2 x (1/2) x S per rank at 100 GB/s; the
    # all-gather (1/2) of the bf16 logits over the whole vocabulary.
    for sp in tp:
        moved = S if sp.kind == "all_reduce" else TOKENS * V * 2 / 2
        assert sp.end_s - sp.start_s == pytest.approx(moved / 100e9, rel=1e-12)
    compute = [sp for sp in spans if sp.stream == "compute"]
    for sp in tp:
        # Issued when the kernels before it end (the second of a pair queues behind the
        # first on the TP stream), and blocking the next kernel.
        assert any(c.end_s == pytest.approx(sp.start_s, abs=1e-15) for c in compute + tp)
        after = [c for c in compute if c.start_s >= sp.start_s and c.index > sp.index]
        assert after and after[0].start_s >= sp.end_s - 1e-15
    # Exposed: all but the 4 that run beside a longer FSDP2 all-gather copy-in (prefetch
    # 0 issues it when the kernels before end): the embedding's and unit 0's forward
    # pair beside unit 0's and unit 1's copy-in, and the output's beside unit 1's.
    # The copy-in casts the whole local fp32 block (one data-parallel rank) to bf16 and
    # copies it into the flat buffer: (4 + 2) + (2 + 2) B per parameter at 1 TB/s.
    local_block = 2 * D * (D // T) * 2 + 3 * D * (F // T) + 2 * D
    copy_in = local_block * 10 / 1e12
    assert copy_in > 2 * S / 100e9
    assert r.exposed_by_kind_s["all_reduce"] == pytest.approx(6 * S / 100e9, rel=1e-9)
    assert r.collective_calls == {"all_reduce": 10, "all_gather": 1}


def test_sequence_parallel_and_async_tp(tiny_model: ModelSpec) -> None:
    blocking = simulate(tiny_model, make_toy_hw(), _plan(sp=True), trace=True)
    tp = [sp for sp in blocking.spans if sp.stream == "tp"]
    # Per block, forward: all-gather before and reduce-scatter after attention and MLP;
    # backward the reverse; the embedding's reduce-scatter forward and all-gather
    # backward; the output projection's all-gather forward and reduce-scatter backward;
    # and the logits all-gathered.
    logits = [sp for sp in tp if "logits" in sp.name]
    assert [sp.kind for sp in logits] == ["all_gather"]
    tp = [sp for sp in tp if sp not in logits]
    kinds = sorted(sp.kind for sp in tp)
    assert kinds == ["all_gather"] * 10 + ["reduce_scatter"] * 10
    for sp in tp:  # (1/2) x S per rank each
        assert sp.end_s - sp.start_s == pytest.approx(S / 2 / 100e9, rel=1e-12)
    overlapped = simulate(tiny_model, make_toy_hw(), _plan(sp=True, async_tp=True), trace=True)
    fwd = next(sp for sp in overlapped.spans if sp.name == "unit 0 forward (mb 0)")
    mine = [sp for sp in overlapped.spans if sp.stream == "tp" and "unit 0 TP" in sp.name
            and "forward" in sp.name]
    assert len(mine) == 4 and min(sp.start_s for sp in mine) == fwd.start_s
    # Each block's 4 collectives (2 S / 100 GB/s in all) fit inside its forward, so
    # none of them is exposed there.
    assert fwd.end_s - fwd.start_s > 4 * S / 2 / 100e9
    assert overlapped.step_time_s < blocking.step_time_s
    assert overlapped.exposed_comm_s < blocking.exposed_comm_s


def test_tp_divides_the_state_and_activations_by_hand(tiny_model: ModelSpec) -> None:
    q = kv = D // T
    f = F // T
    block = 2 * D * q + 2 * D * kv + 3 * D * f + 2 * D     # norms whole
    root = 2 * (V // T) * D + D                             # vocab-sharded tables, norm
    state = state_at_rest_bytes(tiny_model, _plan())
    assert state == {"master_params": 4.0 * (2 * block + root),
                     "optimizer_states": 8.0 * (2 * block + root)}
    # One block's saved tensors (flash, bf16): whole norm inputs (2 x 2d B + 2 x 4 B rstd
    # per token), the shared q/k/v input (2d), q, k, v, out (2 x 128 each), the
    # log-sum-exp (2 heads x 4 B), the w1/w3 input (2d), w1, SiLU, w3 outputs and the w2
    # input (2 x 256 each); with SP the norms' tensors are halved.
    per_token = 2 * (2 * D + 4) + 2 * D + 2 * 4 * q + 2 * 4 + 2 * D + 4 * 2 * f
    acts = activation_sizes(tiny_model.tp_shard(T), _plan(), autocast=False)
    assert acts.saved_per_block == TOKENS * per_token
    sp = activation_sizes(tiny_model.tp_shard(T, sequence_parallel=True), _plan(sp=True),
                          autocast=False)
    assert sp.saved_per_block == TOKENS * per_token - TOKENS * (2 * D + 4)
