"""Micro-benchmarks run on every rank at once: collectives over a range of sizes, point-to-
point bandwidth, matmul (alone, as linear layers forward + backward, and the validation
grid's GEMMs from a cold cache) and attention throughput, memory copy and
elementwise-kernel rates, the AdamW step, how much a collective in flight slows a matmul,
how far ranks drift apart between collectives, and the host time of the reference model's
blocks unsharded, under FSDP2 alone and with its collectives (the fixed cost per kernel is
derived from the first), and on a CPU host under DeepSpeed's ZeRO stages, FSDP1 and
DTensor TP (zsim.calibration.program_overhead).

Owns what is timed and how (medians of timed calls after warm-ups, a barrier before each
collective so ranks start together, and every figure the median over rounds of the whole
set, spread over the run); zsim.calibration.profile_writer turns the figures into a hardware
profile. The collective sizes follow nccl-tests (-b 4K -e 256M -f 4). Imports
torch.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F

from zsim.backend.reference_model import GELU_APPROXIMATE, Transformer
from zsim.backend.runner import RankContext, sync_device
from zsim.calibration.collective_fit import CollectiveSample
from zsim.cores import usable_cores
from zsim.spec.hardware import COLLECTIVES, REDUCING_COLLECTIVES
from zsim.spec.model import ModelSpec
from zsim.units import MiB, dtype_bytes

SIZES_BYTES: tuple[int, ...] = tuple(4096 * 4**i for i in range(9))
"""4 KiB to 256 MiB, x4 steps."""

BLOCK_STEPS: tuple[str, ...] = ("plain", "plain_forward", "full", "full_forward",
                                "selective", "selective_forward", "fsdp_local", "fsdp",
                                "fsdp_no_reshard")
"""What RankBench.block_step_s times per block of the nano model (nano_model: its kernels
cost almost nothing, so this is host time): "plain", a training step of the unsharded
bf16 model (forward, backward, AdamW); "full" and "selective", the same with each block
checkpointed (torch.utils.checkpoint, op-level SAC); "<x>_forward", the forward alone;
"fsdp_local", fully_shard per block on a 1-rank mesh (hooks, copies, DTensor optimizer, no
collectives); "fsdp", on all ranks (the same plus 2 all-gathers and a reduce-scatter per
block); "fsdp_no_reshard", on all ranks with reshard_after_forward=False (1 + 1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """What to run; the defaults took about three minutes on 2 CPU ranks (2 min 44 s to
    2 min 50 s on a 2-core AMD EPYC with the programs, `zsim calibrate --nproc 2`) before
    the bf16 reductions and 60 calls a small size were added. In the validation batches of
    2026-12-02 one round at 2 and one at 4 ranks together took about 5 minutes with the
    bf16 reductions and about 9 with the 60 calls too (on a spell when the host also ran
    the steps 20% slower)."""

    sizes_bytes: tuple[int, ...] = SIZES_BYTES
    iters_small: int = 60
    """Timed calls for sizes up to 1 MiB. On the 2-core VM a third to a half of gloo's
    calls up to 1 MiB stall for 2-4 ms, so a call's time is bimodal: its median jumps
    between the two modes from one calibration to the next (a 1 MiB all-reduce read
    1,119 us in one and 4,058 in the next, 2026-12-02), while a step, which pays every
    call, sees their mean. The figure is the mean of the calls less the slowest tenth
    (trimmed_mean), over enough calls to hold still."""
    iters_large: int = 7
    """Timed calls for larger sizes."""
    reduction_dtypes: tuple[str, ...] = ("bf16",)
    """Besides fp32, the element types the reducing collectives (reduce-scatter,
    all-reduce) are timed in, at the sizes up to reduction_dtype_max_bytes: the plans
    reduce their gradients in bf16, which gloo adds element by element through fp32 (on
    the 2-core EPYC a 4 MiB all-reduce took 3.6-3.9 ms in fp32 and 4.9-5.9 in bf16,
    interleaved call by call; an all-gather's time does not depend on it)."""
    reduction_dtype_max_bytes: int = 64 * MiB
    matmul_shapes: tuple[tuple[int, int, int], ...] = (
        (1024, 1024, 1024), (2048, 512, 512), (2048, 512, 1376), (2048, 1376, 512),
        (2048, 1024, 1024), (2048, 1024, 2752), (512, 256, 256), (512, 256, 688),
        (512, 688, 256))
    """(m, k, n) of the timed matmuls: a square GEMM and block shapes (tokens x width),
    including those of the validation grid (512 tokens, d_model 256, ffn 688)."""
    gemm_linears: tuple[tuple[int, int, int], ...] = tuple(
        (512, *io) for w in (64, 128, 256, 344, 688, 896, 1024, 2048)
        for io in {(256, w), (w, 256)})
    """(tokens, in, out) of the linear layers whose three GEMMs (gemm_shapes) are timed
    from a cold cache for the profile's kernels.matmul_tflops: the validation grid's
    (zsim.validation.report: 512 tokens, width 256; its attention, GQA and MLP
    projections, their halves under TP, the 2,048-word output layer)."""
    cache_flush_bytes: int = 64 * MiB
    """Written before each cold GEMM and each host optimizer step (_step_rate) so that
    they read their operands from memory, as in a training step, where a layer's weights
    and activations were last touched a block or more before: more than this host's L3
    (32 MiB) and a Hopper GPU's L2 (50 MiB). On the 2-core EPYC the grid's GEMMs ran
    1.05-1.5x faster hot (repeated on the same operands) than cold, and the unsharded grid
    model's GEMMs ran inside its steps at about the cold rate."""
    attention_shape: tuple[int, int, int, int] = (2, 4, 256, 64)
    """(batch, heads, seq, head_dim) of the timed attention: the validation grid's
    (zsim.validation.report.grid_plans: micro-batch 2, seq 256, head_dim 64). On CPU the
    rate grows with seq (about 28 GFLOP/s at 256 to 66 at 2048 on one Zen 4 thread)."""
    elementwise_numels: tuple[int, ...] = (2**17, 2**19)
    """Elements per tensor of the timed memory-bound kernels: a (512, 256) activation and
    a (512, 1024)-sized one, the validation grid's sizes."""
    copy_bytes: int = 128 * MiB
    adam_params: int = 4 * 2**20
    sync_segments: tuple[int, ...] = (2, 8, 24, 48)
    """Lengths, in 256^3 matmuls, of the compute segments each followed by a tiny
    all-gather (rank_skew: the slope of the line fitted through them; sync_overhead_s:
    its intercept less the all-gather back to back)."""
    host_layers: tuple[int, int] = (2, 10)
    """Block counts of the two nano models whose plain and FSDP2 steps are timed."""
    programs: bool = True
    """Time the library programs on the nano model on a CPU host
    (zsim.calibration.program_overhead: DeepSpeed's ZeRO stages, FSDP1, DTensor TP), for the
    profile's host.program_overhead_us; off, or on CUDA (whose host runs ahead), the
    profile has none."""
    cores: int | None = None
    """CPU cores the ranks of a CPU host share (None: the cores this process may run on);
    with more ranks than cores the kernels are timed alone and shared (core_share)."""
    rounds: int = 3
    """Times the whole set runs; each figure is its median over the rounds. A shared host
    has slow spells of seconds to minutes (here a compute-only loop varied by +-8% from
    one second to the next, and one calibration in five came out 15% slow), so a figure
    timed within one spell can be off; rounds are about 45 s apart at 2 ranks here."""


@dataclass(slots=True)
class RankBench:
    """One rank's figures."""

    collectives: list[CollectiveSample] = field(default_factory=list)
    p2p_bytes_per_s: float = 0.0
    """Point-to-point send/recv bandwidth of a 64 MiB message (rank 0 -> 1)."""
    matmul_flop_per_s: dict[str, list[float]] = field(default_factory=dict)
    """Per dtype ("fp32", "bf16"), one rate per matmul shape, FLOP/s."""
    gemm_flop_per_s: dict[str, list[float]] = field(default_factory=dict)
    """Per dtype, one rate per shape of gemm_shapes(config), each GEMM timed from a cold
    cache (BenchConfig.cache_flush_bytes), FLOP/s."""
    linear_flop_per_s: dict[str, list[float]] = field(default_factory=dict)
    """The same shapes as a linear layer's forward and backward (its three GEMMs: the
    output, the input gradient, the weight gradient, 6mkn FLOPs), as a block's matmuls
    run in a training step, FLOP/s."""
    attention_flop_per_s: float = 0.0
    """Causal SDPA forward + backward in bf16 from a cold cache, FLOP/s counted as
    zsim.analytic.compute counts them (3 x the forward's 4·b·h·s²·d/2), so the efficiency
    absorbs flash attention's recomputation in backward."""
    attention_pass_flop_per_s: dict[str, float] = field(default_factory=dict)
    """The same call's forward and backward apart ("forward", "backward"), each the
    forward's FLOPs (4·b·h·s²·d/2) per second of that pass, as the profile's
    kernels.attention rows hold them (see _attention)."""
    copy_bytes_per_s: float = 0.0
    """copy_ bytes read + written per second."""
    elementwise_bytes_per_s: float = 0.0
    """Bytes read + written per second by a mix of the block's memory-bound kernels in
    bf16 (the plans' compute dtype), total bytes over total time."""
    gelu_bytes_per_s: dict[str, float] = field(default_factory=dict)
    """GELU's rate by pass ("forward", "backward"), bytes per second as
    zsim.analytic.compute counts its traffic (see _gelu)."""
    adam_params_per_s: float = 0.0
    deepspeed_adam_params_per_s: float = 0.0
    """DeepSpeedCPUAdam's step on the same parameters (0: not timed; see
    _deepspeed_adam)."""
    comm_compute_slowdown: float = 0.0
    """Fraction of its rate a matmul loses while an all-reduce is in flight."""
    compute_comm_slowdown: float = 0.0
    """Fraction of its rate an all-reduce loses while matmuls run on every rank."""
    core_share: float = 1.0
    """The kernel rates above are a rank's alone divided by this (core_share): the ranks
    that share each of a CPU host's cores."""
    rank_skew: float = 0.0
    """Extra time of a tiny all-gather per second of compute before it (see
    _synchronisation)."""
    sync_overhead_s: float = 0.0
    """What a tiny all-gather after compute takes beyond the same call back to back, less
    the rank_skew share (see _synchronisation), seconds."""
    block_step_s: dict[str, float] = field(default_factory=dict)
    """Time per extra block of the nano model, by BLOCK_STEPS entry, seconds."""
    program_step_s: dict[str, dict[str, float]] = field(default_factory=dict)
    """The nano model's step and forward times under each library program, by program
    (zsim.calibration.program_overhead.program_steps_s), seconds."""


def _times_s(fn: Callable[[], Any], iters: int, warmup: int = 1,
             before: Callable[[], None] | None = None) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _median_s(fn: Callable[[], Any], iters: int, warmup: int = 1,
              before: Callable[[], None] | None = None) -> float:
    return statistics.median(_times_s(fn, iters, warmup, before))


def trimmed_mean(times: list[float], trim: float = 0.1) -> float:
    """The mean of `times` without its slowest `trim` fraction (rounded down)."""
    kept = sorted(times)[:len(times) - int(len(times) * trim)]
    return statistics.fmean(kept)


def bench_rank(ctx: RankContext, cfg: BenchConfig) -> RankBench:
    """Run every benchmark `cfg.rounds` times on this rank (all ranks run them at once);
    each figure is the median over the rounds."""
    return median_of_rounds([_bench_round(ctx, cfg) for _ in range(cfg.rounds)])


def median_of_rounds(rounds: list[RankBench]) -> RankBench:
    """A RankBench whose every figure is the median of that figure over `rounds` (rates
    per shape, collective times per size, block step times per kind)."""
    return RankBench(**{f.name: _median_of([getattr(r, f.name) for r in rounds])
                        for f in fields(RankBench)})


def _median_of(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, CollectiveSample):
        return replace(first, time_s=statistics.median(v.time_s for v in values))
    if isinstance(first, dict):
        return {k: _median_of([v[k] for v in values]) for k in first}
    if isinstance(first, list):
        return [_median_of([v[i] for v in values]) for i in range(len(first))]
    return statistics.median(values)


def _collective_cases(cfg: BenchConfig) -> list[tuple[str, str, int]]:
    """(kind, dtype, size_bytes) of every timed collective, in the order timed: each kind
    in fp32 at every size, the reducing kinds also in cfg.reduction_dtypes (right after
    fp32 at the same size, so the two see the same host) up to its largest size."""
    return [(op, dtype, size) for op in COLLECTIVES for size in cfg.sizes_bytes
            for dtype in ("fp32", *(cfg.reduction_dtypes if op in REDUCING_COLLECTIVES else ()))
            if dtype == "fp32" or size <= cfg.reduction_dtype_max_bytes]


def _bench_round(ctx: RankContext, cfg: BenchConfig) -> RankBench:
    from zsim.backend.fsdp2 import TORCH_DTYPES

    # torch 2.13 deprecates the *_tensor spellings that FSDP2 itself still calls.
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    out = RankBench()
    n = ctx.world_size
    for op, dtype, size in _collective_cases(cfg):
        numel = size // dtype_bytes(dtype)
        iters = cfg.iters_small if size <= MiB else cfg.iters_large
        full = torch.ones(numel, device=ctx.device, dtype=TORCH_DTYPES[dtype])
        shard = torch.ones(numel // n, device=ctx.device, dtype=TORCH_DTYPES[dtype])
        call: Callable[[], Any]
        if op == "all_gather":
            def call(full: torch.Tensor = full, shard: torch.Tensor = shard) -> None:
                dist.all_gather_into_tensor(full, shard)
        elif op == "reduce_scatter":
            def call(full: torch.Tensor = full, shard: torch.Tensor = shard) -> None:
                dist.reduce_scatter_tensor(shard, full)
        else:
            def call(full: torch.Tensor = full) -> None:
                dist.all_reduce(full)
        # A step pays every call's time, stalls included: the mean, not the median.
        t = trimmed_mean(_times_s(call, iters, before=dist.barrier))
        out.collectives.append(CollectiveSample(op=op, size_bytes=size, world_size=n,
                                                time_s=t, dtype=dtype))
        del full, shard
    out.p2p_bytes_per_s = _p2p(ctx)
    kernel_rates(ctx, cfg, out)
    out.adam_params_per_s = _adam(cfg.adam_params, cfg.cache_flush_bytes)
    out.comm_compute_slowdown = _slowdown(ctx)
    out.compute_comm_slowdown = _comm_slowdown(ctx)
    # The shared host is noisy: each the median of five fits.
    fits = [_synchronisation(ctx, cfg.sync_segments) for _ in range(5)]
    out.rank_skew = statistics.median(slope for slope, _ in fits)
    out.sync_overhead_s = statistics.median(sync for _, sync in fits)
    out.block_step_s = _block_step_s(ctx, cfg.host_layers)
    if cfg.programs and ctx.device == "cpu":
        # Imported here: program_overhead builds on this module's nano model.
        from zsim.calibration.program_overhead import program_steps_s

        out.program_step_s = program_steps_s(ctx, cfg.host_layers)
        out.deepspeed_adam_params_per_s = _deepspeed_adam(cfg.adam_params,
                                                          cfg.cache_flush_bytes)
    return out


KERNEL_RATES = ("matmul_flop_per_s", "linear_flop_per_s", "gemm_flop_per_s",
                "attention_flop_per_s", "attention_pass_flop_per_s", "copy_bytes_per_s",
                "elementwise_bytes_per_s", "gelu_bytes_per_s")
"""The RankBench figures that kernel_rates fills: rates of compute kernels, which a rank
runs on a core of its own or on a share of one."""


def core_share(world_size: int, cores: int) -> float:
    """The ranks that share each core when `world_size` CPU ranks, one thread each, run at
    once on `cores` cores (at least 1): a rank's kernels take this many times their time
    alone. On the 2-core EPYC (2026-12-03) the grid's llama-tiny forward and backward with
    no collectives took 2.2-2.3x its time alone with 4 ranks stepping together, 1.02x
    with 2."""
    return max(1.0, world_size / cores)


def host_core_share(world_size: int, cfg: BenchConfig) -> float:
    """core_share of `world_size` CPU ranks on cfg.cores (None: the CPUs this process may
    run on)."""
    return core_share(world_size, cfg.cores or usable_cores())


def kernel_rates(ctx: RankContext, cfg: BenchConfig, out: RankBench) -> None:
    """Time the compute kernels into `out` (KERNEL_RATES) as the ranks run them in a step.
    With no more ranks than cores (or on CUDA) every rank times its own at once. With more
    (core_share > 1), a call shorter than the scheduler's slice mostly runs on a core it
    holds, so the median of calls on every rank at once leaves out the time a rank waits
    for a core, which a step pays (on the 2-core EPYC at 4 ranks the grid's GEMMs under
    1 ms timed 0.97-1.24x their time at 2 ranks, those of 2 ms or more 2.1-2.5x, and the
    forward of a step took 2.5x its time alone). Then rank 0 times them alone, the others
    waiting off the cores, and every rank takes its rates divided by the share."""
    share = host_core_share(ctx.world_size, cfg) if ctx.device == "cpu" else 1.0
    if share == 1.0:
        _time_kernels(ctx, cfg, out)
        return
    alone = [RankBench()]
    if ctx.rank == 0:
        _time_kernels(ctx, cfg, alone[0])
    dist.broadcast_object_list(alone, src=0)
    for name in KERNEL_RATES:
        setattr(out, name, _divided(getattr(alone[0], name), share))
    out.core_share = share


def _divided(value: Any, by: float) -> Any:
    """`value` (a rate, or a list or dict of them) divided by `by`."""
    if isinstance(value, dict):
        return {k: _divided(v, by) for k, v in value.items()}
    if isinstance(value, list):
        return [_divided(v, by) for v in value]
    return value / by


def _time_kernels(ctx: RankContext, cfg: BenchConfig, out: RankBench) -> None:
    """Time every compute kernel of KERNEL_RATES on this rank into `out`."""
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rates, linear = [], []
        for m, k, nn in cfg.matmul_shapes:
            a = torch.randn(m, k, dtype=dtype, device=ctx.device)
            b = torch.randn(k, nn, dtype=dtype, device=ctx.device)
            rates.append(2 * m * k * nn / _median_s(lambda a=a, b=b: a @ b, 7))
            linear.append(6 * m * k * nn / _linear_s(a, b.t().contiguous()))
        out.matmul_flop_per_s[name] = rates
        out.linear_flop_per_s[name] = linear
        out.gemm_flop_per_s[name] = _cold_gemms(ctx, gemm_shapes(cfg), dtype,
                                                cfg.cache_flush_bytes)
    out.attention_flop_per_s, out.attention_pass_flop_per_s = _attention(
        ctx, cfg.attention_shape, cfg.cache_flush_bytes)
    out.copy_bytes_per_s = _copy_rate(ctx, cfg.copy_bytes)
    out.elementwise_bytes_per_s = _elementwise(ctx, cfg.elementwise_numels)
    out.gelu_bytes_per_s = _gelu(ctx, max(cfg.elementwise_numels))


def gemm_shapes(cfg: BenchConfig) -> tuple[tuple[int, int, int], ...]:
    """(m, k, n) of the three GEMMs of each of cfg.gemm_linears, as
    zsim.analytic.compute counts a linear layer's: the output (t, in, out), the input
    gradient (t, out, in) and the weight gradient (in, t, out); each shape once, sorted."""
    return tuple(sorted({g for t, i, o in cfg.gemm_linears
                         for g in ((t, i, o), (t, o, i), (i, t, o))}))


def _cold_gemms(ctx: RankContext, shapes: tuple[tuple[int, int, int], ...],
                dtype: torch.dtype, flush_bytes: int) -> list[float]:
    """FLOP/s of (m x k) @ (k x n) in `dtype` for each shape, the median of 9 calls, each
    after writing `flush_bytes` so that it reads its operands from memory."""
    flush = _cache_flush(ctx.device, flush_bytes)
    rates = []
    for m, k, n in shapes:
        a = torch.randn(m, k, dtype=dtype, device=ctx.device)
        b = torch.randn(k, n, dtype=dtype, device=ctx.device)

        def call(a: torch.Tensor = a, b: torch.Tensor = b) -> None:
            a @ b
            sync_device(ctx.device)

        rates.append(2 * m * k * n / _median_s(call, 9, before=flush))
    return rates


def _cache_flush(device: str, nbytes: int) -> Callable[[], None]:
    """What to run before a timed call so that it reads its operands from memory: write
    `nbytes` on `device` (BenchConfig.cache_flush_bytes) and wait for it."""
    buffer = torch.empty(nbytes // 4, device=device)

    def flush() -> None:
        buffer.zero_()
        sync_device(device)

    return flush


def _linear_s(x: torch.Tensor, weight: torch.Tensor) -> float:
    """Seconds of F.linear(x, weight) forward and backward (gradients of both)."""
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()

    def step() -> None:
        y = F.linear(x, weight)
        y.backward(torch.ones_like(y))
        x.grad = weight.grad = None

    return _median_s(step, 7)


def _copy_rate(ctx: RankContext, nbytes: int) -> float:
    """copy_ bytes read + written per second on `nbytes` fp32 tensors."""
    x = torch.randn(nbytes // 4, device=ctx.device)
    y = torch.empty_like(x)
    return 2 * nbytes / _median_s(lambda: y.copy_(x), 3)


def _p2p(ctx: RankContext) -> float:
    """Send/recv of 64 MiB between ranks 0 and 1 (other ranks idle), bytes/s."""
    buf = torch.ones(16 * MiB, device=ctx.device)

    def call() -> None:
        if ctx.rank == 0:
            dist.send(buf, 1)
        elif ctx.rank == 1:
            dist.recv(buf, 0)

    t = _median_s(call, 3, before=dist.barrier)
    rate = torch.tensor([64 * MiB / t if ctx.rank == 1 else 0.0])
    dist.all_reduce(rate, op=dist.ReduceOp.MAX)
    return float(rate.item())


def _elementwise(ctx: RankContext, numels: tuple[int, ...]) -> float:
    """Bytes per second of the block's memory-bound kernels in bf16 at each size: residual
    add (reads 2, writes 1), SwiGLU product (2, 1), SiLU (1, 1), RoPE's cat (1, 1), an
    upcast to fp32 and the fp32 log-softmax of the loss; total bytes over total time, so
    each kernel weighs by its time as in a real step."""
    total_bytes, total_s = 0.0, 0.0
    for n in numels:
        x, y = (torch.randn(n, dtype=torch.bfloat16, device=ctx.device) for _ in range(2))
        xf = x.float().view(-1, 256)
        calls: list[tuple[Callable[[], Any], int]] = [
            (lambda x=x, y=y: x + y, 3 * 2 * n),
            (lambda x=x, y=y: x * y, 3 * 2 * n),
            (lambda x=x: F.silu(x), 2 * 2 * n),
            (lambda x=x, h=n // 2: torch.cat((x[h:], x[:h])), 2 * 2 * n),
            (lambda x=x: x.float(), (2 + 4) * n),
            (lambda xf=xf: torch.log_softmax(xf, dim=-1), 2 * 4 * n),
        ]
        for fn, nbytes in calls:
            total_s += _median_s(fn, 5)
            total_bytes += nbytes
    return total_bytes / total_s


def _gelu(ctx: RankContext, numel: int) -> dict[str, float]:
    """GELU as the reference model's GELU MLP calls it (GELU_APPROXIMATE) on `numel` bf16
    elements, by pass: the forward reads and writes each element once; its backward
    (aten gelu_backward: reads the gradient and the input, writes the input's gradient)
    is counted as zsim.analytic.compute counts backward traffic, twice the forward's.
    Bytes so counted per second (medians of 7 calls). On a CPU GELU is not bound by
    memory: here it ran at a third of SiLU's rate per byte (2026-12-02, Xeon with AMX)."""
    x = torch.randn(numel, dtype=torch.bfloat16, device=ctx.device)
    grad = torch.randn_like(x)
    forward_bytes = 2 * 2 * numel
    return {"forward": forward_bytes / _median_s(
                lambda: F.gelu(x, approximate=GELU_APPROXIMATE), 7),
            "backward": 2 * forward_bytes / _median_s(
                lambda: torch.ops.aten.gelu_backward(grad, x, approximate=GELU_APPROXIMATE),
                7)}


def _attention(ctx: RankContext, shape: tuple[int, int, int, int],
               flush_bytes: int) -> tuple[float, dict[str, float]]:
    """Causal SDPA in bf16 at `shape` (b, h, s, d): (forward + backward FLOP/s as
    RankBench.attention_flop_per_s counts them, {pass: the forward's FLOPs per second of
    that pass}). The forward alone (building the graph, as in training) and forward +
    backward are each the median of 7 calls, each after writing `flush_bytes`: in a step
    attention reads q, k, v (and in backward the saved output) from memory, not from the
    cache a loop of calls leaves warm (on the 2-core Xeon, 2026-12-02: 0.75 ms forward,
    5.9 forward + backward cold, 0.54 and 5.4 warm, both ranks at once; inside a
    gpt-tiny step at the same shape the profiler read 0.72 and 5.0 a layer). The
    backward is the difference, at least the forward's time (it does twice the
    forward's FLOPs, flash attention's backward more: 2.5x on a GPU, about 7x here)."""
    b, h, s, d = shape
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.bfloat16, device=ctx.device,
                           requires_grad=True) for _ in range(3))
    flush = _cache_flush(ctx.device, flush_bytes)

    def forward() -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        sync_device(ctx.device)
        return out

    def forward_backward() -> None:
        torch.autograd.grad(forward().sum(), (q, k, v))
        sync_device(ctx.device)

    forward_s = _median_s(forward, 7, before=flush)
    both_s = _median_s(forward_backward, 7, before=flush)
    # Forward 2 matmuls of 2bhs²d, halved by the causal mask; the fwd+bwd rate counts
    # the backward as twice the forward (zsim.analytic.compute's convention), the pass
    # rates the forward's FLOPs per second of each pass (the kernels.attention schema).
    flops = 4 * b * h * s * s * d / 2
    return 3 * flops / both_s, {"forward": flops / forward_s,
                                "backward": flops / max(both_s - forward_s, forward_s)}


def _step_rate(numel: int, optimizer: Callable[[list[torch.nn.Parameter]], Any],
               flush_bytes: int) -> float:
    """Parameters per second of `optimizer`'s step on `numel` fp32 parameters in host
    memory (where an offloaded step runs), the median of 5 steps, each after writing
    `flush_bytes` so that it reads the parameters, gradients and moments from memory, as
    in a training step, where the forward and backward streamed through the caches since
    the last step (on this 2-core host DeepSpeedCPUAdam's in-step rate was 1.1 G params/s
    a rank, against 1.2 cold and 2.3 hot at 4 Mi parameters, both ranks at once)."""
    p = torch.nn.Parameter(torch.randn(numel))
    p.grad = torch.randn_like(p)
    return numel / _median_s(optimizer([p]).step, 5, before=_cache_flush("cpu", flush_bytes))


def _adam(numel: int, flush_bytes: int) -> float:
    return _step_rate(numel, lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True),
                      flush_bytes)


def _deepspeed_adam(numel: int, flush_bytes: int) -> float:
    """DeepSpeedCPUAdam's step (AdamW mode: what ZeRO's offload_optimizer runs on the host,
    its own vectorised kernel) on `numel` fp32 parameters, parameters per second; 0 where
    DeepSpeed does not import. Its op is built the first time (DeepSpeed's JIT)."""
    if importlib.util.find_spec("deepspeed") is None:
        return 0.0
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return _step_rate(numel, lambda ps: DeepSpeedCPUAdam(ps, lr=1e-4, adamw_mode=True),
                      flush_bytes)


def _slowdown(ctx: RankContext) -> float:
    """Fraction of its rate a matmul loses while a collective is in flight, the engine's
    comm_compute_slowdown: 1 - t_alone / t_with. Each timed matmul runs entirely inside a
    64 MiB all_reduce (several times longer here), issued by every rank in the same
    order; on CPU the collective's threads compete with compute for the cores."""
    a = torch.randn(1024, 1024, device=ctx.device)
    alone = _median_s(lambda: a @ a, 5)
    buf = torch.ones(16 * MiB, device=ctx.device)
    with_comm = []
    for _ in range(5):
        dist.barrier()
        work = dist.all_reduce(buf, async_op=True)
        assert work is not None
        start = time.perf_counter()
        a @ a
        with_comm.append(time.perf_counter() - start)
        work.wait()
    return max(1.0 - alone / statistics.median(with_comm), 0.0)


def _comm_slowdown(ctx: RankContext) -> float:
    """Fraction of its rate a collective loses while compute runs on its ranks, the
    engine's compute_comm_slowdown: 1 - t_alone / t_with for a 64 MiB all_reduce, alone
    and with every rank running small matmuls until it completes (each rank issues the
    same collectives in the same order; only the local polling differs)."""
    a = torch.randn(256, 256, device=ctx.device)
    buf = torch.ones(16 * MiB, device=ctx.device)
    alone, with_compute = [], []
    for _ in range(5):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buf)
        alone.append(time.perf_counter() - start)
    for _ in range(5):
        dist.barrier()
        start = time.perf_counter()
        work = dist.all_reduce(buf, async_op=True)
        assert work is not None
        while not work.is_completed():
            a @ a
        with_compute.append(time.perf_counter() - start)
        work.wait()
    return max(1.0 - statistics.median(alone) / statistics.median(with_compute), 0.0)


def _synchronisation(ctx: RankContext, segments: tuple[int, ...]) -> tuple[float, float]:
    """The engine's rank_skew and sync_overhead_s: every rank repeats [a compute segment;
    a tiny blocking all-gather], as FSDP on a synchronous host does. The all-gather waits
    for the slowest rank, which falls further behind the longer the segment: its extra
    time over the compute alone (median of rounds that alternate with and without it)
    grows with the segment's compute time; rank_skew is the least-squares slope of that
    line. Its intercept, the call after no compute at all, stands above the same call
    made back to back (segment 0): ranks that arrive apart pay a fixed cost beyond the
    wait (presumably the waiting rank's thread sleeping and being woken);
    sync_overhead_s is the difference (>= 0). On the 2-core AMD EPYC host 0.3-1.2 ms at 2
    ranks and 1.2-2.3 ms at 4 (by hand, 2026-12-02 07:3x UTC); on the Intel Xeon that
    replaced it 0.60-0.66 ms and 0.49-0.84 ms (two calibrations, 11:01 and 11:52)."""
    a = torch.randn(256, 256, device=ctx.device)
    shard = torch.zeros(512, device=ctx.device)
    full = torch.zeros(512 * ctx.world_size, device=ctx.device)

    def gather() -> None:
        dist.all_gather_into_tensor(full, shard)

    def loop(matmuls: int, collective: bool, iters: int = 8) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            for _ in range(matmuls):
                a @ a
            if collective:
                gather()
        sync_device(ctx.device)
        return (time.perf_counter() - start) / iters

    def extra_s(matmuls: int) -> tuple[float, float]:
        """(compute alone, the call's extra time), medians of 5 rounds."""
        rounds = [(loop(matmuls, False), loop(matmuls, True)) for _ in range(5)]
        return (statistics.median(alone for alone, _ in rounds),
                statistics.median(with_ - alone for alone, with_ in rounds))

    _, back_to_back = extra_s(0)
    xs, ys = zip(*(extra_s(m) for m in segments), strict=True)
    slope, intercept = statistics.linear_regression(xs, ys)
    return max(slope, 0.0), max(intercept - back_to_back, 0.0)


NANO_TOKENS: tuple[int, int] = (1, 8)
"""(micro-batch, sequence) of the nano model's steps."""


NanoBlock = Literal["llama", "gpt"]


def nano_model(num_layers: int, *, block: NanoBlock = "llama") -> ModelSpec:
    """The reference Llama at width 16 (8 tokens): its kernels cost almost nothing, so
    its step time is the host's (dispatch, autograd, hooks, collective calls). With
    block="gpt", GPT's block at the same width (LayerNorm and linears with biases, GELU
    MLP, learned positions, tied embeddings): 16 parameter tensors a block to Llama's 9."""
    llama = ModelSpec(name="nano", num_layers=num_layers, d_model=16, num_heads=2,
                      num_kv_heads=2, ffn_hidden=32, vocab_size=64, max_seq_len=NANO_TOKENS[1])
    if block == "gpt":
        return replace(llama, name="nano-gpt", ffn_hidden=64, mlp="gelu", norm="layernorm",
                       bias=True, learned_pos_emb=True, tied_embeddings=True)
    return llama


def _block_step_s(ctx: RankContext, layers: tuple[int, int]) -> dict[str, float]:
    """Time per extra block of the nano model (median of 25 steps at each of two depths;
    see RankBench.block_step_s), every rank at once so they share the cores as in a real
    job. The FSDP2 runs apply fsdp and fsdp-no-reshard plans (their default mixed
    precision) with the backend's own mapping, zsim.backend.fsdp2.shard; the
    checkpointed runs wrap each block as the backend does
    (zsim.backend.fsdp2.apply_recompute)."""
    from torch.distributed.device_mesh import DeviceMesh

    from zsim.backend.fsdp2 import TORCH_DTYPES, apply_recompute, shard
    from zsim.spec.plan import Plan

    device_type = ctx.device.split(":")[0]
    local, _ = dist.new_subgroups(group_size=1)
    meshes = {"fsdp_local": DeviceMesh.from_group(local, device_type),
              "fsdp": DeviceMesh.from_group(dist.group.WORLD, device_type)}
    plans = {s: Plan.for_strategy(s, gpus=ctx.world_size, seq_len=NANO_TOKENS[1])
             for s in ("fsdp", "fsdp-no-reshard")}
    g = torch.Generator().manual_seed(ctx.rank)
    tokens, labels = (torch.randint(0, 64, NANO_TOKENS, generator=g).to(ctx.device)
                      for _ in range(2))

    def step_s(num_layers: int, how: str) -> float:
        torch.manual_seed(0)
        with torch.device(ctx.device):
            model = Transformer(nano_model(num_layers))
        model.init_weights()
        kind = how.removesuffix("_forward")
        if kind in ("plain", "full", "selective"):
            model = model.to(TORCH_DTYPES[plans["fsdp"].param_dtype])
            if kind != "plain":
                apply_recompute(model, replace(plans["fsdp"], recompute=kind))
        else:
            shard(model, plans["fsdp-no-reshard" if kind == "fsdp_no_reshard" else "fsdp"],
                  meshes["fsdp_local" if kind == "fsdp_local" else "fsdp"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step() -> None:
            loss = model(tokens, labels)
            if how.endswith("_forward"):
                return
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync_device(ctx.device)

        dist.barrier()
        return _median_s(step, 25, warmup=5)

    lo, hi = layers
    return {how: (step_s(hi, how) - step_s(lo, how)) / (hi - lo) for how in BLOCK_STEPS}
