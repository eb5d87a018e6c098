"""DeepSpeed ZeRO-1/2/3 (impl "deepspeed") lowered, against hand-worked figures for the
tiny model and against DeepSpeed's own memory estimators where their assumptions hold.

The tiny model (conftest): 2 blocks, d 256, SwiGLU 512, vocab 1000, untied. On 8 ranks
with ZeRO-3's default persistence threshold (1e5 elements): the norms (256) and the
attention projections (256 x 256 = 65,536) stay whole; w1, w3, w2 (131,072) and the
embedding and output (256,000) are partitioned.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from zsim.analytic.compute import Flops, compute_time_s
from zsim.schedule.lower import fixed_bytes, lower
from zsim.schedule.ops import Op
from zsim.simulate import simulate
from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

N = 8


def _plan(strategy: str, **kw: object) -> Plan:
    return Plan.for_strategy(strategy, gpus=N, seq_len=128, **kw)  # type: ignore[arg-type]


def _baseline(model: ModelSpec, hw: HardwareProfile, plan: Plan) -> dict[str, int]:
    return {b.name: b.bytes for b in lower(model, hw, plan).baseline}


def test_zero3_state_at_rest_by_hand(tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    d, f, v = 256, 512, 1000
    whole = 2 * (2 * d + 4 * d * d)          # per block: 2 norms, 4 attention projections
    partitioned = 2 * v * d // N + 2 * 3 * d * f // N + d   # embedding + output, w1..w3, norm
    bf16 = 2 * (whole + partitioned)
    part = 2 * (v * d // N) + math.ceil(d / N) + 2 * (2 * d // N + 4 * d * d // N
                                                       + 3 * d * f // N)
    got = _baseline(tiny_model, h100, _plan("zero3"))
    buffers = 2 * tiny_model.max_seq_len * tiny_model.head_dim * 4
    assert got == {"state/params": bf16, "state/master_params": 4 * part,
                   "state/optimizer_states": 8 * part, "state/grads": 2 * part,
                   "state/comm_buffers": 2 * 500_000_000, "state/buffers": buffers,
                   "state/blas_workspaces": 2 * 32 * 2**20}


def _bus(ops: list, kind: str) -> float:
    return sum(op.bus_bytes for op in ops if op.kind == kind)


@pytest.mark.parametrize("grad_accum", [1, 3])
def test_zero12_reduce_by_all_reduce_and_gather_once(tiny_model: ModelSpec,
                                                     h100: HardwareProfile,
                                                     grad_accum: int) -> None:
    psi = tiny_model.num_params
    assert psi % (2 * N) == 0  # the flat buffer needs no padding
    for strategy, reductions in (("zero1", 1), ("zero2", grad_accum)):
        ops = lower(tiny_model, h100, _plan(strategy, grad_accum=grad_accum)).ops
        # DeepSpeed 0.19 all-reduces each bucket (use_multi_rank_bucket_allreduce): stage 1
        # once per step, stage 2 on every micro-batch; then the updated bf16 parameters are
        # all-gathered once. Bus bytes per rank: 2 (N-1)/N and (N-1)/N of 2-byte elements,
        # and the step's two scalars (the 1-byte overflow flag, the fp32 norm) all-reduced.
        assert _bus(ops, "all_reduce") == pytest.approx(
            reductions * 2 * (N - 1) / N * psi * 2 + 2 * (N - 1) / N * (1 + 4))
        assert _bus(ops, "all_gather") == pytest.approx((N - 1) / N * psi * 2)
        assert _bus(ops, "reduce_scatter") == 0


@pytest.mark.parametrize("allgather_bucket_size", [1, 500_000_000])
def test_zero12_gather_the_flat_buffer_in_one_call(tiny_model: ModelSpec,
                                                   h100: HardwareProfile,
                                                   allgather_bucket_size: int) -> None:
    # all_gather_dp_groups (deepspeed/runtime/utils.py, 0.19) makes one
    # all_gather_into_tensor per parameter group wherever torch has it; the bucket size
    # only matters on torch without it. A bucket of one element is still one call.
    plan = _plan("zero2").with_(options=DeepSpeedZero(allgather_bucket_size=allgather_bucket_size))
    gathers = [op for op in lower(tiny_model, h100, plan).ops if op.kind == "all_gather"]
    assert len(gathers) == 1
    assert gathers[0].bus_bytes == pytest.approx((N - 1) / N * tiny_model.num_params * 2)


def test_zero12_without_overlap_the_backward_waits_for_each_bucket(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    # Buckets of 300,000 elements: the tiny model's 1.07M gradients make several, each
    # all-reduced on the compute stream's critical path (overlap_comm is off by default).
    plan = _plan("zero2", options=DeepSpeedZero(reduce_bucket_size=300_000))
    ops = lower(tiny_model, h100, plan).ops
    reduces = [op for op in ops if op.kind == "all_reduce"]
    assert len(reduces) >= 3 and not any(op.async_op for op in reduces)
    waiting = [op for op in ops if op.kind == "backward" and op.stream == "compute"
               and any(ops[d].name.endswith("copy to partition") for d in op.after)]
    assert waiting, "a backward kernel waits for a bucket's reduction"


@pytest.mark.parametrize(("max_reuse", "gathers_per_use"), [(0, 2), (10**9, 1)])
def test_zero3_gathers_each_partitioned_parameter_per_use(
        tiny_model: ModelSpec, h100: HardwareProfile, max_reuse: int,
        gathers_per_use: int) -> None:
    # Partitioned elements, each padded to a multiple of N: embedding, output, 2 x (w1, w3,
    # w2). Without reuse each is gathered in forward and again in backward; with the
    # default distance (1e9 elements, far more than this model) nothing is released
    # between them. Gradients of every parameter are reduce-scattered once. After the
    # step the persistent ones (2 norms and 4 attention projections a block, the final
    # norm) are gathered once each.
    partitioned = 2 * 1000 * 256 + 2 * 3 * 256 * 512
    persistent = 2 * (2 * 256 + 4 * 256 * 256) + 256
    ops = lower(tiny_model, h100, _plan(
        "zero3", options=DeepSpeedZero(prefetch_bucket_size=0, max_reuse_distance=max_reuse))).ops
    assert _bus(ops, "all_gather") == pytest.approx(
        (gathers_per_use * partitioned + persistent) * (N - 1) / N * 2)
    assert _bus(ops, "reduce_scatter") == pytest.approx(
        (N - 1) / N * tiny_model.num_params * 2)


def test_zero3_fetches_qwen2_style_qkv_biases(tiny_model: ModelSpec,
                                              h100: HardwareProfile) -> None:
    # ModelSpec.qkv_bias (Qwen2): wq, wk, wv each hold a 256-element bias, persistent
    # (under the 1e5 threshold) like the norms: gathered once after the step with them,
    # and every parameter's gradient reduce-scattered once, the biases' too.
    model = replace(tiny_model, qkv_bias=True)
    partitioned = 2 * 1000 * 256 + 2 * 3 * 256 * 512
    persistent = 2 * (2 * 256 + 4 * 256 * 256 + 3 * 256) + 256
    ops = lower(model, h100, _plan(
        "zero3", options=DeepSpeedZero(prefetch_bucket_size=0, max_reuse_distance=10**9))).ops
    assert model.num_params == tiny_model.num_params + 2 * 3 * 256
    assert _bus(ops, "all_gather") == pytest.approx((partitioned + persistent) * (N - 1) / N * 2)
    assert _bus(ops, "reduce_scatter") == pytest.approx((N - 1) / N * model.num_params * 2)


def test_zero3_prefetch_runs_ahead_and_changes_no_volume(tiny_model: ModelSpec,
                                                         h100: HardwareProfile) -> None:
    base = lower(tiny_model, h100, _plan("zero3", options=DeepSpeedZero(prefetch_bucket_size=0)))
    ahead = lower(tiny_model, h100, _plan("zero3"))
    assert _bus(ahead.ops, "all_gather") == _bus(base.ops, "all_gather")
    assert any(op.name.startswith("prefetch") for op in ahead.ops)
    assert not any(op.name.startswith("prefetch") for op in base.ops)


def test_zero3_prefetch_hides_gathers_in_the_simulation(h100: HardwareProfile) -> None:
    # A 13B model on 128 GPUs: with the default prefetch the gathers overlap the matmuls;
    # without it every submodule waits for its own all-gather.
    from zsim.spec.registry import resolve_model

    model = resolve_model("13b")
    plan = Plan.for_strategy("zero3", gpus=128, seq_len=4096, recompute="selective")
    eager = simulate(model, h100, plan)
    lazy = simulate(model, h100, plan.with_(options=DeepSpeedZero(prefetch_bucket_size=0)))
    assert eager.exposed_comm_s < 0.5 * lazy.exposed_comm_s
    assert eager.step_time_s < lazy.step_time_s


def test_zero2_step_matches_deepspeeds_estimator(tiny_model: ModelSpec,
                                                 h100: HardwareProfile) -> None:
    """estimate_zero2_model_states_mem_needs (no offload): 2 Psi + 18 Psi / N, "2 =
    params_16bit, 18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit +
    8_optimizer_states_32bit" — what the ledger holds when the step's fp32 gradients are
    cast (the estimator leaves out module buffers), besides the flat 16-bit copy of the
    partition's gradients that step() casts from (2 Psi / N: flatten is a torch.cat, live
    until the cast ends)."""
    stage_1_and_2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    psi = tiny_model.num_params
    _, estimate = stage_1_and_2.estimate_zero2_model_states_mem_needs(
        psi, num_gpus_per_node=N, cpu_offload=False)
    r = simulate(tiny_model, h100, _plan("zero2"), trace=True)
    (cast,) = [sp for sp in r.spans if sp.name == "fp32 gradients"]
    # The last change at that instant: the fp32 gradients' allocation (the backward's
    # epilogue released the bucket buffer just before).
    level = [b for t, b in r.memory_curve if t == cast.start_s][-1]
    # What every rank holds besides: module buffers and cuBLAS workspaces.
    assert level - sum(fixed_bytes(tiny_model, h100).values()) == estimate + 2 * psi // N


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_zero_steps_fused_adam_in_one_pass(tiny_model: ModelSpec, h100: HardwareProfile,
                                           strategy: str) -> None:
    """A DeepSpeed config's AdamW runs as FusedAdam (engine.py _configure_basic_optimizer):
    one pass over the flat fp32 partition reading the gradient, the master weight and both
    moments and writing the three back (28 B a parameter), then the cast to the bf16
    partition (4 + 2 B), with no working memory; torch's foreach AdamW (FSDP2's) keeps
    sqrt(v) as a new list and moves 80 B. The tiny model on 8 ranks: one sub-group under
    ZeRO-3 (sub_group_size 1e9); every tensor splits evenly (no padding)."""
    ops = lower(tiny_model, h100, _plan(strategy)).ops
    (step,) = [op for op in ops if op.name == "optimizer step"]
    assert step.allocs == ()
    part = tiny_model.num_params / N
    moved = part * (28 + 6)
    device = compute_time_s(Flops(matmul=0.0, attention=0.0, memory_bytes=moved, kernels=2.0,
                                  traffic=(("optimizer", "forward", moved),)), h100, "bf16")
    # dgx-h100's async host issues the one op while nothing else is queued.
    assert h100.launch == "async" and h100.rank_skew == 0
    assert step.compute_s == pytest.approx(device + h100.optimizer_tensor_s["plain"])
    (fsdp_step,) = [op for op in lower(tiny_model, h100, _plan("fsdp")).ops
                    if op.name == "optimizer step"]
    assert [b.name for b in fsdp_step.allocs] == ["optimizer/exp_avg_sq_sqrt"]


def test_zero3_state_is_deepspeeds_estimate_plus_the_16_bit_partitions(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """estimate_zero3_model_states_mem_needs (no offload): 4 x the largest layer + 18 Psi / N.
    Stage 3 also keeps the 16-bit partition of every parameter (2 Psi / N,
    fp16_partitioned_groups_flat) and the ipg bucket buffer, which the estimator leaves
    out; persistent parameters stay whole."""
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    psi = tiny_model.num_params
    largest = 1000 * 256
    _, estimate, largest_mem = stage3.estimate_zero3_model_states_mem_needs(
        psi, largest, num_gpus_per_node=N, cpu_offload=False)
    state = _baseline(tiny_model, h100, _plan("zero3"))
    grads_master_moments = sum(state[f"state/{c}"] for c in
                               ("grads", "master_params", "optimizer_states"))
    # 2 (16-bit grads) + 4 (fp32 params) + 8 (moments) of the estimator's 18, per rank;
    # its other 4 are the fp32 gradients, cast at the step.
    partition = grads_master_moments / 14
    assert estimate - largest_mem == pytest.approx(18 * psi / N, rel=1e-6)
    assert partition == pytest.approx(psi / N, rel=0.02)  # padding and whole norms


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_zero12_offload_still_gathers_the_updated_parameters(tiny_model: ModelSpec,
                                                              h100: HardwareProfile,
                                                              strategy: str) -> None:
    """stage_1_and_2.step() with cpu_offload: DeepSpeedCPUAdam on the host, the updated
    16-bit partition copied back, then all_gather_dp_groups as without offload; the host
    step runs at DeepSpeedCPUAdam's rate where the profile measured it, the node's rate
    shared by its GPUs (a profile without its host's cores): psi / N parameters at 8e9 / 8
    a second."""
    coreless = replace(h100, cpu_cores=0)
    hw = replace(coreless, deepspeed_adam_params_per_s=8e9)
    ops = lower(tiny_model, hw, _plan(strategy, offload="optimizer")).ops
    by_name = {op.name: op for op in ops}
    step, copy = by_name["optimizer step (host)"], by_name["params to GPU"]
    (gather,) = [op for op in ops if op.kind == "all_gather"]
    assert step.index in copy.after and copy.index in gather.after
    assert gather.bus_bytes == pytest.approx((N - 1) / N * tiny_model.num_params * 2)
    torch_ops = lower(tiny_model, coreless, _plan(strategy, offload="optimizer")).ops
    (torch_step,) = [op for op in torch_ops if op.name == "optimizer step (host)"]
    # Without cores each of the node's 8 GPUs gets 1/8 of the rate. The same step at
    # torch's AdamW rate (dgx-h100's: 765,677,963 a node, measured on the DGX H200's host)
    # differs in the rate term only.
    assert h100.gpus_per_node == 8
    psi = tiny_model.num_params
    assert torch_step.compute_s - step.compute_s == pytest.approx(
        psi / N * (8 / 765_677_963 - 8 / 8e9), rel=1e-9)


def test_zero3_step_all_reduces_its_norm_and_regathers_each_persistent_parameter(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """stage3.py step(): the gradient norm (a float64 scalar; fp16 adds the 1-byte
    overflow flag first) all-reduced before the optimizer; _post_step: one all-gather per
    persistent parameter after it. The tiny model under the default threshold (1e5
    elements) keeps 2 norms and 4 attention projections per block and the final norm
    whole: 2 x 6 + 1 = 13 calls, 13 x 2 bytes x (the norms' 256 or the projections'
    65,536 elements) gathered."""
    d = 256
    for dtype, scalars in (("bf16", [8]), ("fp16", [1, 8])):
        plan = _plan("zero3").with_(param_dtype=dtype, grad_dtype=dtype, reduce_dtype=dtype)
        ops = lower(tiny_model, h100, plan).ops
        norms = [op for op in ops if op.name in ("overflow check all-reduce",
                                                 "gradient norm all-reduce")]
        assert [op.size_bytes for op in norms] == scalars
        step = next(op for op in ops if op.name == "optimizer step")
        assert norms[-1].index in next(op for op in ops if op.name == "fp32 gradients").after
        persistent = [op for op in ops if op.name.startswith("persistent ")]
        assert len(persistent) == 2 * 6 + 1
        assert sum(op.size_bytes for op in persistent) == 2 * (5 * d + 8 * d * d)
        assert all(op.kind == "all_gather" and op.async_op for op in persistent)
        assert all(op.index > step.index for op in persistent)


def test_a_synchronous_host_blocks_in_the_reductions_not_in_the_prefetches(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """DeepSpeed issues its gradient reductions without async_op (overlap_comm overlaps
    them through a CUDA stream) and its parameter fetches with it (the coordinator waits
    on the handle at use). On a synchronous host (gloo ranks) the next op the host issues
    after a reduction waits for it; after a prefetch, it does not."""
    sync = replace(h100, launch="synchronous")
    for strategy, reduction in (("zero2", "all-reduce"), ("zero3", "reduce-scatter")):
        ops = lower(tiny_model, sync, _plan(strategy)).ops
        reductions = [op for op in ops if op.name.startswith("bucket ")
                      and reduction in op.name]
        assert reductions and not any(op.async_op for op in reductions)
        for op in reductions:
            assert ops[op.index + 1].issue_after == (op.index,), op.name
    ops = lower(tiny_model, sync, _plan("zero3")).ops
    prefetches = [op for op in ops if op.name.startswith("prefetch ")]
    assert prefetches and all(op.async_op for op in prefetches)
    for op in prefetches:
        assert ops[op.index + 1].issue_after != (op.index,), op.name


def test_every_call_on_a_synchronous_host_takes_the_cost_of_a_call(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """gloo hands each call to its worker thread and back, waited for at once or not: on a
    synchronous host a ZeRO-3 prefetch and a persistent parameter's re-gather (async_op)
    take the profile's cost of a call (collective_overhead_s) in their latency, as a
    bucket's reduce-scatter (blocking) does; an async host's calls take none. The
    latency is the algorithm's plus exactly that cost."""
    from zsim.analytic.collectives import choose
    from zsim.schedule.build import shard_group

    call_s = 1.25e-3
    sync = replace(h100, launch="synchronous", collective_overhead_s=call_s)
    plan = _plan("zero3")
    group = shard_group(plan, sync)
    for hw, extra in ((sync, call_s), (h100, 0.0)):
        ops = lower(tiny_model, hw, plan).ops
        picked = {op.name.split()[0]: op for op in ops if op.is_collective
                  and op.name.startswith(("prefetch ", "persistent ", "bucket "))}
        assert set(picked) == {"prefetch", "persistent", "bucket"}
        assert picked["prefetch"].async_op and picked["persistent"].async_op
        assert not picked["bucket"].async_op
        for op in picked.values():
            algo = choose(op.kind, op.size_bytes, group, hw)
            assert op.latency_s == pytest.approx(algo.latency_s + extra, rel=1e-12), op.name


@pytest.mark.parametrize(("strategy", "synchronising"), [("zero1", 1), ("zero2", 15)])
def test_a_reduction_after_model_compute_pays_the_synchronisation(
        tiny_model: ModelSpec, h100: HardwareProfile, strategy: str,
        synchronising: int) -> None:
    """On a synchronous host a blocking call the ranks reach from model compute takes the
    profile's sync_overhead_s; one straight after another call does not. With one-element
    buckets every gradient tensor is a bucket of its own, reduced in the hook of the
    gradient after it. ZeRO-2 reduces from the hooks, as the backward produces the
    gradients: the hook after the output projection's backward pays, and in each of the
    2 blocks the hooks of its 7 weight matrices (wo, wq, wk, wv, w1, w3, w2), each right
    after its matmul's backward; the norms' hooks come straight after the previous
    hook's call, as does the embedding's (a gather, no FLOPs, after the last block's
    attention norm): 1 + 2 x 7 = 15. ZeRO-1 reduces everything at the end of the
    backward, and only its first bucket pays. The scalar all-reduces and the parameter
    all-gather after the step come after calls and copies. Everything on a synchronous
    host runs in turn: the step grows by exactly that many times the cost."""
    sync_s = 7e-4
    plan = _plan(strategy, options=DeepSpeedZero(reduce_bucket_size=1))
    base = replace(h100, launch="synchronous")
    step_s = {s: simulate(tiny_model, replace(base, sync_overhead_s=s), plan).step_time_s
              for s in (0.0, sync_s)}
    assert step_s[sync_s] - step_s[0.0] == pytest.approx(synchronising * sync_s, rel=1e-6)
    # An async host has no thread to wake: nothing changes.
    assert (simulate(tiny_model, replace(h100, sync_overhead_s=sync_s), plan).step_time_s
            == simulate(tiny_model, h100, plan).step_time_s)


def test_zero2_cuts_a_block_backward_without_changing_its_work(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """The pieces ZeRO-2 cuts a block's backward into at its mid-block buckets add up to
    the whole op ZeRO-1 issues (FLOPs and kernel time); the first piece allocates what
    the op allocates, the last frees the block's saved tensors and working set."""
    ds = DeepSpeedZero(reduce_bucket_size=100_000)  # w1, w3, w2 (131,072) each overflow
    whole = {op.name: op for op in lower(tiny_model, h100, _plan("zero1", options=ds)).ops
             if op.kind == "backward" and op.name.startswith("unit ")}
    ops = lower(tiny_model, h100, _plan("zero2", options=ds)).ops
    for name, op in whole.items():
        pieces = [o for o in ops if o.name == name or o.name.startswith(f"{name} after bucket")]
        assert len(pieces) > 1, name
        assert sum(p.flops for p in pieces) == pytest.approx(op.flops, rel=1e-12)
        assert sum(p.compute_s for p in pieces) == pytest.approx(op.compute_s, rel=1e-12)
        assert {b.name for b in pieces[0].allocs} >= {b.name for b in op.allocs
                                                      if b.category == "activations"}
        assert all(not p.allocs for p in pieces[1:])
        assert {f for f in op.frees if "/saved" in f or "working" in f} <= set(pieces[-1].frees)


def _step_op(ops: list[Op], name: str) -> Op:
    (op,) = [op for op in ops if op.name == name]
    return op


def _pass_s(hw: HardwareProfile, nbytes: float, kernels: float) -> float:
    return compute_time_s(Flops(matmul=0.0, attention=0.0, memory_bytes=nbytes,
                                kernels=kernels), hw, "bf16")


def test_zero12_step_checks_flattens_casts_and_clips_by_hand(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """stage_1_and_2.py step() under bf16 with DeepSpeed's defaults, on the tiny model's
    partition (Psi / 8 elements in ceil((21 tensors + 7 boundaries) / 8) = 4 tensors):
    has_inf_or_nan's amax and amin of each 16-bit gradient (2 x 2 B, 7 kernels a tensor),
    get_grad_norm_direct's fp32 cast and norm (2 + 4 + 4 B, 2 kernels a tensor and 3 to
    combine), the flatten (a cat: 2 + 2 B, its copy live until the cast has run), the
    fp32 cast (2 + 4 B), and gradient_clipping 1.0's scaling (4 + 4 B in place, 5
    kernels); in that order, each scan before its all-reduce."""
    part = tiny_model.num_params / N
    ops = lower(tiny_model, h100, _plan("zero1")).ops
    want = {"overflow check": (4 * part, 7 * 4), "gradient norm": (10 * part, 2 * 4 + 3),
            "flatten gradients": (4 * part, 1), "fp32 gradients": (6 * part, 1),
            "clip gradients": (8 * part, 5)}
    for name, (nbytes, kernels) in want.items():
        assert _step_op(ops, name).compute_s == pytest.approx(_pass_s(h100, nbytes, kernels))
    order = ["overflow check", "overflow check all-reduce", "gradient norm",
             "gradient norm all-reduce", "flatten gradients", "fp32 gradients",
             "clip gradients", "optimizer step"]
    index = [_step_op(ops, name).index for name in order]
    assert index == sorted(index)
    assert all(index[i] in ops[index[i + 1]].after for i in range(len(order) - 1))
    flatten, cast = _step_op(ops, "flatten gradients"), _step_op(ops, "fp32 gradients")
    assert [b.bytes for b in flatten.allocs] == [2 * part]
    assert flatten.allocs[0].name in cast.frees


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_bucket_reductions_divide_by_the_world_before_reducing_by_hand(
        tiny_model: ModelSpec, h100: HardwareProfile, strategy: str) -> None:
    """Each reduced bucket is copied (the gradients read in 2 B, written in the reduce
    dtype's 2 B) and divided by the world size in place (read and write 2 B, one more
    kernel) before its collective: stages 1/2's average_tensor divides the ipg bucket,
    stage 3's reduce_scatter_coalesced the flat buffer it cat'ed. With 100,000-element
    buckets the tiny model's 1,824,000 parameters go through 17 of them (a tensor larger
    than a bucket, the embedding and the output, 256,000 elements each, fills its own)."""
    plan = _plan(strategy, options=DeepSpeedZero(reduce_bucket_size=100_000))
    ops = lower(tiny_model, h100, plan).ops
    copies = [op for op in ops if op.name.startswith("bucket ")
              and (op.name.endswith(" flatten") or " copy-in " in op.name)]
    assert len(copies) == 17
    reduced = 0.0
    for op in copies:
        (coll,) = [o for o in ops if op.index in o.after and o.kind != "compute"]
        elements = coll.size_bytes / 2
        assert op.compute_s == pytest.approx(_pass_s(h100, elements * (2 + 2 + 2 * 2), 2))
        reduced += elements
    assert reduced == tiny_model.num_params


def test_zero12_step_follows_clipping_and_the_overflow_switch(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """No clipping skips the scaling unless fp16's loss scale needs it; bf16 without
    check_grad_overflow, and fp32, neither scan nor all-reduce the flag; optimizer offload
    keeps the all-reduces but scans nothing on the device (its norms were taken on the
    way to the host)."""
    def names(**kw: object) -> set[str]:
        return {op.name for op in lower(tiny_model, h100, _plan("zero2", **kw)).ops}

    def fp(dtype: str) -> dict[str, object]:
        return {"param_dtype": dtype, "grad_dtype": dtype, "reduce_dtype": dtype}

    assert "clip gradients" in names()
    assert "clip gradients" not in names(options=DeepSpeedZero(gradient_clipping=0.0))
    assert "clip gradients" in names(options=DeepSpeedZero(gradient_clipping=0.0), **fp("fp16"))
    flag = {"overflow check", "overflow check all-reduce"}
    assert flag <= names() and flag <= names(**fp("fp16"))
    assert not flag & names(options=DeepSpeedZero(check_grad_overflow=False))
    assert not flag & names(**fp("fp32"))
    offloaded = names(offload="optimizer")
    assert {"overflow check all-reduce", "gradient norm all-reduce"} <= offloaded
    assert not {"overflow check", "gradient norm", "flatten gradients"} & offloaded


def test_zero3_step_scales_every_sub_group_and_scans_only_under_fp16(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """stage3.py: unscale_and_clip_grads multiplies each sub-group's fp32 gradients
    whatever the clipping (4 + 4 B); the norm runs over every parameter's partition (21
    tensors); the overflow scan (isinf and isnan of the flat partition, each reading it
    and writing and reading a byte mask, 8 kernels) only under fp16."""
    ds = DeepSpeedZero(gradient_clipping=0.0, sub_group_size=1)
    ops = lower(tiny_model, h100, _plan("zero3", options=ds)).ops
    groups = [op for op in ops if op.name.startswith("clip gradients")]
    assert len(groups) == len(tiny_model.parameter_tensors())
    part = sum(-(-math.prod(s) // N) for _, s in tiny_model.parameter_tensors())
    assert sum(op.compute_s for op in groups) == pytest.approx(
        _pass_s(h100, 8 * part, 5 * len(groups)))
    assert _step_op(ops, "gradient norm").compute_s == pytest.approx(
        _pass_s(h100, 10 * part, 2 * 21 + 3))
    assert not [op for op in ops if op.name.startswith("overflow")]
    fp16 = _plan("zero3").with_(param_dtype="fp16", grad_dtype="fp16", reduce_dtype="fp16")
    scan = _step_op(lower(tiny_model, h100, fp16).ops, "overflow check")
    assert scan.compute_s == pytest.approx(_pass_s(h100, 2 * (2 + 2) * part, 8))


def test_zero2_offload_checks_each_slice_on_its_way_to_the_host(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    """With the optimizer on the CPU, copy_grads_in_partition does at the accumulation
    boundary what step() does on the device otherwise: each gradient of the rank's slice
    gets its fp32 norm (2 + 4 + 4 B) and its inf/NaN check (2 x 2 B), and is cast to fp32
    (2 + 4 B) and copied to the host in fp32; 10 kernels a tensor (the partition's 4).
    The tiny model fits one bucket; the micro-batch before the boundary sends its 16-bit
    slice to be accumulated on the host."""
    part = tiny_model.num_params / N
    ops = lower(tiny_model, h100, _plan("zero2", offload="optimizer", grad_accum=2)).ops
    (prep,) = [op for op in ops if op.name.endswith("norms and fp32 cast")]
    assert prep.compute_s == pytest.approx(_pass_s(h100, part * (10 + 4 + 6), 4 * 10))
    copies = [op for op in ops if op.name.endswith("partition to host")]
    assert [op.size_bytes for op in copies] == [2 * part, 4 * part]
    assert prep.index in copies[1].after
