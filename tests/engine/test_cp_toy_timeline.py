"""Context parallelism on the toy cluster, worked out by hand: the tiny 2-block
model at cp=2 on one 2-GPU node (100 GB/s NVLink, no latency, 1e12 FLOP/s, 1 TB/s HBM),
FSDP2 with a data-parallel size of 1: the two CP ranks shard the state between them
(torchtitan's dp_shard_cp), so FSDP's all-gathers share the link with ring attention's."""

from __future__ import annotations

import pytest
from test_fsdp_toy_timeline import hand_durations
from toy_cluster import make_toy_hw

from zsim.schedule.build import activation_sizes
from zsim.schedule.lower import lower, rank_model, rank_plan
from zsim.simulate import simulate
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

TOKENS, D = 256, 256
KV = TOKENS * 2 * D * 2            # the whole sequence's K and V, bf16 (kv = d here)


def _plan(cp: int) -> Plan:
    return Plan.for_strategy("fsdp", gpus=cp, cp=cp, seq_len=TOKENS, prefetch=0)


def test_ring_attention_by_hand(tiny_model: ModelSpec) -> None:
    r = simulate(tiny_model, make_toy_hw(), _plan(2), trace=True)
    spans = sorted(r.spans, key=lambda sp: (sp.start_s, sp.index))
    fwd = next(sp for sp in spans if sp.name == "unit 0 forward (mb 0)")
    # Half the tokens, each query attending to the whole sequence: half the matmuls, half
    # the causal attention (128 queries x 256 keys, load-balanced), half the traffic.
    assert fwd.end_s - fwd.start_s == pytest.approx(hand_durations().fwd / 2, rel=1e-12)
    cp = [sp for sp in spans if sp.stream == "cp"]
    # Per block: K/V all-gathered forward; gathered again and their gradients
    # reduce-scattered backward.
    assert sorted(sp.kind for sp in cp) == ["all_gather"] * 4 + ["reduce_scatter"] * 2
    compute_starts = {sp.start_s for sp in spans if sp.kind in ("forward", "backward")
                      and sp.stream == "compute"}
    for sp in cp:
        # Over 2 ranks each moves half the K/V at 100 GB/s ...
        assert sp.end_s - sp.start_s == pytest.approx(KV / 2 / 100e9, rel=1e-12)
    # ... issued with the block's kernels (the two backward ones queue on the stream),
    # which last far longer: ring attention's exchange is hidden.
    assert sum(sp.start_s in compute_starts for sp in cp) == 4
    assert r.waits and not [w for w in r.waits if " CP " in w.blocking]
    # They shard the state too: each block unit is all-gathered over both twice (fsdp
    # reshards after forward), the root once, and every unit's gradients are
    # reduce-scattered over both.
    fsdp = [op for op in lower(tiny_model, make_toy_hw(), _plan(2)).ops if op.group == "shard"]
    assert sorted(op.kind for op in fsdp) == ["all_gather"] * 5 + ["reduce_scatter"] * 3
    assert {op.group_ranks for op in fsdp} == {2}
    # The two CP ranks share one sequence: 128 tokens per GPU per step.
    assert r.tokens_per_s_per_gpu == pytest.approx(TOKENS / 2 / r.step_time_s)


def test_activations_divide_by_cp(tiny_model: ModelSpec) -> None:
    one = activation_sizes(tiny_model, _plan(1), autocast=False)
    plan = _plan(2)
    two = activation_sizes(rank_model(tiny_model, plan), rank_plan(plan), autocast=False)
    # Every tensor a flash-attention block saves is per token of the rank's share.
    assert two.saved_per_block * 2 == one.saved_per_block


def test_a_slow_link_exposes_the_exchange(tiny_model: ModelSpec) -> None:
    # At 0.01 GB/s the forward K/V all-gather (KV / 2 bytes per rank) outlasts the block.
    # The last unit's: unit 0's shares the link with unit 1's FSDP all-gather, issued
    # when unit 0's kernels end (prefetch 0) over the same two ranks.
    slow = make_toy_hw(intra_gb_per_s=0.01)
    r = simulate(tiny_model, slow, _plan(2), trace=True)
    fwd = next(sp for sp in r.spans if sp.name == "unit 1 forward (mb 0)")
    ag = next(sp for sp in r.spans if sp.name == "unit 1 CP K/V all_gather forward (mb 0)")
    assert ag.start_s == fwd.start_s
    assert ag.end_s - ag.start_s == pytest.approx(KV / 2 / 0.01e9, rel=1e-12)
    wait = next(w for w in r.waits if w.blocking == ag.name)
    assert wait.wait_s == pytest.approx((ag.end_s - ag.start_s) - (fwd.end_s - fwd.start_s),
                                        rel=1e-9)
