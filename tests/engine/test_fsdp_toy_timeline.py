"""Whole FSDP step of the tiny 2-block model on the toy cluster (2 GPUs on one node,
100 GB/s NVLink, no latency, 1e12 FLOP/s at efficiency 1, 1 TB/s HBM), with prefetch
disabled so nothing overlaps: every op's start and end worked out by hand below."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from toy_cluster import make_toy_hw

from zsim.simulate import simulate
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

US = 1e-6


@dataclass(frozen=True)
class Durations:
    """Times of the tiny model's ops on the toy cluster, seconds, worked out by hand."""

    fwd: float
    bwd: float
    head: float
    """Output projection + loss forward."""
    loss: float
    """The loss's share of head (its backward runs apart, before the output projection's)."""
    ag_block: float
    ag_root: float
    opt: float
    copy_block: float
    copy_root: float
    copy_in_block: float
    copy_in_root: float
    rs_copy_in_block: float
    rs_copy_in_root: float
    cast_block: float
    cast_root: float


def hand_durations() -> Durations:
    # tiny: d=256, 4 heads (kv=256), SwiGLU 512, vocab 1000; micro-batch 1 x 256 tokens.
    tokens = 256
    matmul_params = 4 * 256 * 256 + 3 * 256 * 512          # wq wk wv wo, w1 w3 w2
    attention = 2 * 1 * 256 * 256 * 256                    # QK^T + AV, half masked
    # Memory-bound kernels of a block at 1 TB/s (bf16, per token, elements read+written):
    # 2 norms 2d each, RoPE of q and k 10d each, attention-output copy 2d, 2 residual
    # adds 3d each, SiLU 2f, gate product 3f = 32d + 5f (kv = d here).
    block_bytes = tokens * (32 * 256 + 5 * 512) * 2
    fwd = (2 * tokens * matmul_params + attention) / 1e12 + block_bytes / 1e12
    bwd = 2 * fwd                                          # backward = 2 x forward
    # Root: embedding gather and final norm (2d bf16 each), logits.float() (2 + 4 B per
    # logit), fp32 log_softmax (4 + 4), nll_loss (4 B per token read, 4 B written).
    loss_bytes = tokens * 1000 * (6 + 8) + tokens * 4 + 4
    root_bytes = tokens * 256 * 2 * 2 * 2 + loss_bytes
    head = 2 * tokens * 256 * 1000 / 1e12 + root_bytes / 1e12  # output projection + loss
    block_params = matmul_params + 2 * 256                 # + 2 RMSNorm weights
    root_params = 2 * 1000 * 256 + 256                     # embedding, output, final norm
    # Ring over 2 ranks: each moves half the bf16 tensor at 100 GB/s.
    ag_block = block_params * 2 / 2 / 100e9
    ag_root = root_params * 2 / 2 / 100e9
    # Foreach AdamW on the local half (torch.optim.adam._multi_tensor_adam): fp32 master
    # read+written by weight decay and addcdiv (16), fp32 m, v and denom accessed 14 times
    # (56), the sharded grad read by lerp and addcmul (fp32: foreach_reduce casts the
    # reduced gradient to the sharded parameter's dtype, 8), then the bf16 param copy
    # written from the master (4 + 2) = 86 B/param at 1 TB/s.
    opt = (2 * block_params + root_params) / 2 * 86 / 1e12
    # Copy-out: split_with_sizes_copy reads the flat bf16 buffer and writes the unsharded
    # parameters, 2 x 2 B per parameter at 1 TB/s (the toy has no kernel overhead).
    copy_block = block_params * 2 * 2 / 1e12
    copy_root = root_params * 2 * 2 / 1e12

    # FSDP2's copies around its collectives, per parameter: the all-gather copy-in casts
    # the fp32 half-shard to bf16 (4 + 2 B) and copies it into the flat buffer (2 + 2),
    # 5 B per parameter of the unit; the reduce-scatter copy-in reads the bf16 gradient
    # and writes the bf16 flat input (4 B); the bf16 output half is cast to the fp32
    # gradient shard (2 + 4 per shard element, 3 B per parameter).
    return Durations(fwd=fwd, bwd=bwd, head=head, loss=loss_bytes / 1e12, ag_block=ag_block,
                     ag_root=ag_root, opt=opt, copy_block=copy_block, copy_root=copy_root,
                     copy_in_block=block_params * 5 / 1e12, copy_in_root=root_params * 5 / 1e12,
                     rs_copy_in_block=block_params * 4 / 1e12,
                     rs_copy_in_root=root_params * 4 / 1e12,
                     cast_block=block_params * 3 / 1e12, cast_root=root_params * 3 / 1e12)


def test_fsdp_step_without_prefetch_by_hand(tiny_model: ModelSpec) -> None:
    d = hand_durations()
    fwd, bwd, head, opt = d.fwd, d.bwd, d.head, d.opt
    ag_block, ag_root, copy_block, copy_root = d.ag_block, d.ag_root, d.copy_block, d.copy_root
    t = [0.0]

    def after(d: float) -> float:
        t[0] += d
        return t[0]

    expected = [
        # Each unit's copy-in and all-gather run on the all-gather stream; its copy-out
        # right before the unit runs, once the all-gather has ended.
        (0.0, after(d.copy_in_root), "all_gather", "root copy-in forward (mb 0)"),
        (t[0], after(ag_root), "all_gather", "root all-gather forward (mb 0)"),
        (t[0], after(copy_root), "compute", "root copy-out forward (mb 0)"),
        (t[0], t[0], "compute", "embedding forward (mb 0)"),
        (t[0], after(d.copy_in_block), "all_gather", "unit 0 copy-in forward (mb 0)"),
        (t[0], after(ag_block), "all_gather", "unit 0 all-gather forward (mb 0)"),
        (t[0], after(copy_block), "compute", "unit 0 copy-out forward (mb 0)"),
        (t[0], after(fwd), "compute", "unit 0 forward (mb 0)"),
        (t[0], after(d.copy_in_block), "all_gather", "unit 1 copy-in forward (mb 0)"),
        (t[0], after(ag_block), "all_gather", "unit 1 all-gather forward (mb 0)"),
        (t[0], after(copy_block), "compute", "unit 1 copy-out forward (mb 0)"),
        (t[0], after(fwd), "compute", "unit 1 forward (mb 0)"),
        (t[0], after(head), "compute", "output+loss forward (mb 0)"),
        (t[0], after(2 * d.loss), "compute", "loss backward (mb 0)"),
        (t[0], after(2 * (head - d.loss)), "compute", "output backward (mb 0)"),
        (t[0], after(d.copy_in_block), "all_gather", "unit 1 copy-in backward (mb 0)"),
        (t[0], after(ag_block), "all_gather", "unit 1 all-gather backward (mb 0)"),
        (t[0], after(copy_block), "compute", "unit 1 copy-out backward (mb 0)"),
        (t[0], after(bwd), "compute", "unit 1 backward (mb 0)"),
    ]
    # After unit 1's backward, its reduce-scatter copy-in (compute stream) and unit 0's
    # all-gather copy-in (all-gather stream) start together; the reduce-scatter starts
    # first and runs alone until the all-gather joins it on NVLink, then each gets half.
    t1 = t[0]
    rs_start, ag_start = t1 + d.rs_copy_in_block, t1 + d.copy_in_block
    head_start = ag_start - rs_start                 # the reduce-scatter's time alone
    rs_end = ag_start + 2 * (ag_block - head_start)  # the rest at half rate
    ag_end = rs_end + head_start                     # the all-gather's rest, alone
    expected += [
        (t1, rs_start, "compute", "unit 1 reduce-scatter copy-in"),
        (t1, ag_start, "all_gather", "unit 0 copy-in backward (mb 0)"),
        (rs_start, rs_end, "reduce_scatter", "unit 1 reduce-scatter"),
        (rs_end, rs_end + d.cast_block, "reduce_scatter", "unit 1 grad cast"),
        (ag_start, ag_end, "all_gather", "unit 0 all-gather backward (mb 0)"),
    ]
    t[0] = ag_end
    expected += [
        (t[0], after(copy_block), "compute", "unit 0 copy-out backward (mb 0)"),
        (t[0], after(bwd), "compute", "unit 0 backward (mb 0)"),
        (t[0], after(d.rs_copy_in_block), "compute", "unit 0 reduce-scatter copy-in"),
        (t[0], t[0], "compute", "embedding backward (mb 0)"),
    ]
    # The root's copy-in runs beside unit 0's reduce-scatter and cast; the root's
    # reduce-scatter queues behind them on its stream.
    expected.append((t[0], t[0] + d.rs_copy_in_root, "compute", "root reduce-scatter copy-in"))
    expected += [
        (t[0], after(ag_block), "reduce_scatter", "unit 0 reduce-scatter"),
        (t[0], after(d.cast_block), "reduce_scatter", "unit 0 grad cast"),
        (t[0], after(ag_root), "reduce_scatter", "root reduce-scatter"),
        (t[0], after(d.cast_root), "reduce_scatter", "root grad cast"),
        (t[0], after(opt), "compute", "optimizer step"),
        (t[0], t[0], "compute", "end of step"),
    ]
    assert d.rs_copy_in_root < ag_block + d.cast_block  # the queueing above
    plan = Plan.for_strategy("fsdp", gpus=2, seq_len=256, prefetch=0)
    r = simulate(tiny_model, make_toy_hw(), plan, trace=True)
    got = sorted((sp.start_s, sp.end_s, sp.stream, sp.name) for sp in r.spans)
    want = sorted(expected)
    assert [(round(a / US, 6), round(b / US, 6), s, n) for a, b, s, n in got] == [
        (round(a / US, 6), round(b / US, 6), s, n) for a, b, s, n in want]
    assert r.step_time_s == pytest.approx(t[0], rel=1e-12)


def test_fsdp_step_on_a_synchronous_host_runs_every_op_alone_in_host_order(
        tiny_model: ModelSpec) -> None:
    # A CPU rank runs its kernels on the calling thread and FSDP2 issues its collectives
    # without async_op, so the step is FSDP2's host program in order, one op at a time:
    # the implicit forward prefetch (host run-ahead) is gone, and the backward prefetch
    # issued from each pre-backward hook runs before that unit's backward. Host costs:
    # every kernel stretched by the rank skew (x1.5), 20 us of FSDP2 hook time on each
    # unit's forward copy-out, and each collective call 1 us more.
    d = hand_durations()
    skew, hooks, call = 1.5, 20 * US, 1 * US
    fwd, bwd, head, opt = skew * d.fwd, skew * d.bwd, skew * d.head, skew * d.opt
    loss = skew * d.loss
    copy_block, copy_root = skew * d.copy_block, skew * d.copy_root
    ag_block, ag_root = d.ag_block + call, d.ag_root + call
    rs_block, rs_root = ag_block, ag_root  # reduced in bf16: the same bytes
    cin_block, cin_root = skew * d.copy_in_block, skew * d.copy_in_root
    rcin_block, rcin_root = skew * d.rs_copy_in_block, skew * d.rs_copy_in_root
    cast_block, cast_root = skew * d.cast_block, skew * d.cast_root
    order = [
        ("all_gather", "root copy-in forward (mb 0)", cin_root),
        ("all_gather", "root all-gather forward (mb 0)", ag_root),
        ("compute", "root copy-out forward (mb 0)", copy_root + hooks),
        ("compute", "embedding forward (mb 0)", 0.0),
        ("all_gather", "unit 0 copy-in forward (mb 0)", cin_block),
        ("all_gather", "unit 0 all-gather forward (mb 0)", ag_block),
        ("compute", "unit 0 copy-out forward (mb 0)", copy_block + hooks),
        ("compute", "unit 0 forward (mb 0)", fwd),
        ("all_gather", "unit 1 copy-in forward (mb 0)", cin_block),
        ("all_gather", "unit 1 all-gather forward (mb 0)", ag_block),
        ("compute", "unit 1 copy-out forward (mb 0)", copy_block + hooks),
        ("compute", "unit 1 forward (mb 0)", fwd),
        ("compute", "output+loss forward (mb 0)", head),
        # the root's pre-backward, on the loss's gradient as the backward starts,
        # prefetches unit 1
        ("all_gather", "unit 1 copy-in backward (mb 0)", cin_block),
        ("all_gather", "unit 1 all-gather backward (mb 0)", ag_block),
        ("compute", "loss backward (mb 0)", 2 * loss),
        ("compute", "output backward (mb 0)", 2 * (head - loss)),
        ("compute", "unit 1 copy-out backward (mb 0)", copy_block),
        # unit 1's pre-backward prefetches unit 0
        ("all_gather", "unit 0 copy-in backward (mb 0)", cin_block),
        ("all_gather", "unit 0 all-gather backward (mb 0)", ag_block),
        ("compute", "unit 1 backward (mb 0)", bwd),
        ("compute", "unit 1 reduce-scatter copy-in", rcin_block),
        ("reduce_scatter", "unit 1 reduce-scatter", rs_block),
        ("reduce_scatter", "unit 1 grad cast", cast_block),
        ("compute", "unit 0 copy-out backward (mb 0)", copy_block),
        ("compute", "unit 0 backward (mb 0)", bwd),
        ("compute", "unit 0 reduce-scatter copy-in", rcin_block),
        ("reduce_scatter", "unit 0 reduce-scatter", rs_block),
        ("reduce_scatter", "unit 0 grad cast", cast_block),
        ("compute", "embedding backward (mb 0)", 0.0),
        ("compute", "root reduce-scatter copy-in", rcin_root),
        ("reduce_scatter", "root reduce-scatter", rs_root),
        ("reduce_scatter", "root grad cast", cast_root),
        ("compute", "optimizer step", opt),
        ("compute", "end of step", 0.0),
    ]
    expected, t = [], 0.0
    for stream, name, seconds in order:
        expected.append((t, t + seconds, stream, name))
        t += seconds
    hw = replace(make_toy_hw(), launch="synchronous", rank_skew=skew - 1,
                 fsdp_unit_overhead_s=hooks, collective_overhead_s=call)
    plan = Plan.for_strategy("fsdp", gpus=2, seq_len=256)
    r = simulate(tiny_model, hw, plan, trace=True)
    got = sorted((sp.start_s, sp.end_s, sp.stream, sp.name) for sp in r.spans)
    assert [(round(a / US, 6), round(b / US, 6), s, n) for a, b, s, n in got] == [
        (round(a / US, 6), round(b / US, 6), s, n) for a, b, s, n in sorted(expected)]
    assert r.step_time_s == pytest.approx(t, rel=1e-12)
    # Every wait of the compute stream is a blocking call.
    assert set(r.exposed_by_reason_s) == {"blocking_call"}
    # The same plan on an async host overlaps the backward all-gathers: faster.
    async_r = simulate(tiny_model, replace(hw, launch="async"), plan)
    assert async_r.step_time_s < r.step_time_s


def test_ddp_buckets_overlap_backward_even_on_a_synchronous_host(
        tiny_model: ModelSpec) -> None:
    # DDP's reducer issues its bucket all-reduces with async_op=True: the host thread gets
    # a Work and runs the next backward while gloo's threads reduce the bucket; only the
    # compute ops (and FSDP2-style blocking calls, none here) form the host's chain.
    hw = replace(make_toy_hw(intra_gb_per_s=1.0), launch="synchronous")
    plan = Plan.for_strategy("ddp", gpus=2, seq_len=256, bucket_bytes=1 << 20)
    r = simulate(tiny_model, hw, plan, trace=True)
    compute = [sp for sp in r.spans if sp.stream == "compute" and sp.end_s > sp.start_s]
    buckets = [sp for sp in r.spans if sp.kind == "all_reduce"]
    assert len(buckets) > 1
    assert any(b.start_s < c.end_s and c.start_s < b.end_s for b in buckets for c in compute
               if c.kind == "backward")
    # ... so the step is shorter than running everything one after another.
    assert r.step_time_s < r.compute_time_s + sum(b.end_s - b.start_s for b in buckets)
