"""Micro-benchmarks run on every rank at once: collectives over a range of sizes, point-to-
point bandwidth, matmul and attention throughput, memory copy and elementwise-kernel rates,
the fixed cost per kernel, the AdamW step, how much a collective in flight slows a
matmul, what a collective costs right after a compute segment (hand-off and rank skew),
and FSDP2's host time per unit.

Owns what is timed and how (medians of timed calls after warm-ups, a barrier before each
collective so ranks start together); zsim.calibrate.profile turns the figures into a
hardware profile. The collective sizes follow nccl-tests (-b 4K -e 256M -f 4). Imports
torch.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from zsim.calibrate.fit import CollectiveSample
from zsim.calibrate.model import Transformer
from zsim.calibrate.runner import RankContext
from zsim.spec.model import ModelSpec
from zsim.units import MiB

SIZES_BYTES: tuple[int, ...] = tuple(4096 * 4**i for i in range(9))
"""4 KiB to 256 MiB, x4 steps."""

OPS: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce")


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """What to run; the defaults take a minute or two on 2 CPU ranks."""

    sizes_bytes: tuple[int, ...] = SIZES_BYTES
    iters_small: int = 10
    """Timed calls for sizes up to 1 MiB."""
    iters_large: int = 3
    """Timed calls for larger sizes."""
    matmul_shapes: tuple[tuple[int, int, int], ...] = (
        (1024, 1024, 1024), (2048, 512, 512), (2048, 512, 1376), (2048, 1376, 512),
        (2048, 1024, 1024), (2048, 1024, 2752), (512, 256, 256), (512, 256, 688),
        (512, 688, 256))
    """(m, k, n) of the timed matmuls: a square GEMM and block shapes (tokens x width),
    including those of the validation grid (512 tokens, d_model 256, ffn 688)."""
    attention_shape: tuple[int, int, int, int] = (2, 4, 256, 64)
    """(batch, heads, seq, head_dim) of the timed attention: the validation grid's
    (zsim.calibrate.validate.grid_plans: micro-batch 2, seq 256, head_dim 64). On CPU the
    rate grows with seq (about 28 GFLOP/s at 256 to 66 at 2048 on one Zen 4 thread)."""
    elementwise_numels: tuple[int, ...] = (2**17, 2**19)
    """Elements per tensor of the timed memory-bound kernels: a (512, 256) activation and
    a (512, 1024)-sized one, the validation grid's sizes."""
    tiny_ops: int = 200
    """Length of the chain of 64-element multiplies timed for the per-kernel cost."""
    copy_bytes: int = 128 * MiB
    adam_params: int = 4 * 2**20
    sync_segments: tuple[int, ...] = (2, 8, 24, 48)
    """Lengths, in 256^3 matmuls, of the compute segments each followed by a tiny
    all-gather (collective_overhead_s and rank_skew: the line fitted through them)."""
    fsdp_layers: tuple[int, int] = (2, 10)
    """Block counts of the two nano models whose FSDP2 and plain steps are timed."""


@dataclass(slots=True)
class RankBench:
    """One rank's figures."""

    collectives: list[CollectiveSample] = field(default_factory=list)
    p2p_bytes_per_s: float = 0.0
    """Point-to-point send/recv bandwidth of a 64 MiB message (rank 0 -> 1)."""
    matmul_flop_per_s: dict[str, list[float]] = field(default_factory=dict)
    """Per dtype ("fp32", "bf16"), one rate per matmul shape, FLOP/s."""
    attention_flop_per_s: float = 0.0
    """Causal SDPA forward + backward in bf16, FLOP/s counted as zsim.analytic.compute
    counts them (3 x the forward's 4·b·h·s²·d/2), so the efficiency absorbs flash
    attention's recomputation in backward."""
    copy_bytes_per_s: float = 0.0
    """copy_ bytes read + written per second."""
    elementwise_bytes_per_s: float = 0.0
    """Bytes read + written per second by a mix of the block's memory-bound kernels in
    bf16 (the plans' compute dtype), total bytes over total time."""
    kernel_overhead_s: float = 0.0
    """Fixed cost per kernel, counted as zsim.analytic.compute counts kernels, seconds."""
    adam_params_per_s: float = 0.0
    comm_compute_slowdown: float = 0.0
    """Fraction of its rate a matmul loses while an all-reduce is in flight."""
    compute_comm_slowdown: float = 0.0
    """Fraction of its rate an all-reduce loses while matmuls run on every rank."""
    collective_overhead_s: float = 0.0
    """Extra time of a tiny all-gather issued right after compute, beyond the same
    all-gather back to back, with no compute before it (intercept of the line)."""
    rank_skew: float = 0.0
    """Extra time of that all-gather per second of compute before it (slope)."""
    fsdp_unit_overhead_s: float = 0.0
    """FSDP2's extra host time per unit per step on a 1-rank mesh, seconds."""


def _median_s(fn: Callable[[], Any], iters: int, warmup: int = 1,
              before: Callable[[], None] | None = None) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_rank(ctx: RankContext, cfg: BenchConfig) -> RankBench:
    """Run every benchmark on this rank (all ranks run it at once)."""
    # torch 2.13 deprecates the *_tensor spellings that FSDP2 itself still calls.
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    out = RankBench()
    n = ctx.world_size
    for op in OPS:
        for size in cfg.sizes_bytes:
            numel = size // 4
            iters = cfg.iters_small if size <= MiB else cfg.iters_large
            full = torch.ones(numel, device=ctx.device)
            shard = torch.ones(numel // n, device=ctx.device)
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
            t = _median_s(call, iters, before=dist.barrier)
            out.collectives.append(CollectiveSample(op=op, size_bytes=numel * 4, world_size=n,
                                                    time_s=t))
            del full, shard
    out.p2p_bytes_per_s = _p2p(ctx)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rates = []
        for m, k, nn in cfg.matmul_shapes:
            a = torch.randn(m, k, dtype=dtype, device=ctx.device)
            b = torch.randn(k, nn, dtype=dtype, device=ctx.device)
            rates.append(2 * m * k * nn / _median_s(lambda a=a, b=b: a @ b, 3))
        out.matmul_flop_per_s[name] = rates
    out.attention_flop_per_s = _attention(ctx, cfg.attention_shape)
    out.copy_bytes_per_s = _copy_rate(ctx, cfg.copy_bytes)
    out.elementwise_bytes_per_s = _elementwise(ctx, cfg.elementwise_numels)
    out.kernel_overhead_s = _kernel_overhead(ctx, cfg.tiny_ops)
    out.adam_params_per_s = _adam(ctx, cfg.adam_params)
    out.comm_compute_slowdown = _slowdown(ctx)
    out.compute_comm_slowdown = _comm_slowdown(ctx)
    # The shared host is noisy: the median of three fits.
    fits = sorted((_sync_cost(ctx, cfg.sync_segments) for _ in range(3)), key=lambda f: f[1])
    out.collective_overhead_s, out.rank_skew = fits[1]
    out.fsdp_unit_overhead_s = _fsdp_unit_overhead(ctx, cfg.fsdp_layers)
    return out


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


def _kernel_overhead(ctx: RankContext, ops: int) -> float:
    """Per-kernel cost: forward + backward of a chain of `ops` multiplies on a 64-element
    tensor that requires grad (dispatch, autograd recording and the backward engine),
    divided by 3 x ops kernels, as zsim.analytic.compute counts them (backward = 2 x
    forward)."""
    x = torch.randn(64, device=ctx.device, requires_grad=True)

    def chain() -> None:
        y = x
        for _ in range(ops):
            y = y * 1.0001
        y.sum().backward()

    return _median_s(chain, 10, warmup=2) / (3 * ops)


def _attention(ctx: RankContext, shape: tuple[int, int, int, int]) -> float:
    b, h, s, d = shape
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.bfloat16, device=ctx.device,
                           requires_grad=True) for _ in range(3))

    def call() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    # Forward 2 matmuls of 2bhs²d, halved by the causal mask; backward counted as twice
    # forward (zsim.analytic.compute's convention; the kernel really runs 2.5x).
    flops = 3 * 4 * b * h * s * s * d / 2
    return flops / _median_s(call, 3)


def _adam(ctx: RankContext, numel: int) -> float:
    p = torch.nn.Parameter(torch.randn(numel, device=ctx.device))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-4, foreach=True)
    return numel / _median_s(opt.step, 3)


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


def _sync_cost(ctx: RankContext, segments: tuple[int, ...]) -> tuple[float, float]:
    """(collective_overhead_s, rank_skew) of the engine: every rank repeats [a compute
    segment; a tiny blocking all-gather], as FSDP on a synchronous host does. The
    all-gather costs more there than back to back: its threads must wake up, and it waits
    for the slowest rank, which falls further behind the longer the segment. The extra
    time per segment (median of rounds that alternate with and without the all-gather)
    is fitted by least squares to a line in the segment's compute time: rank_skew is the
    slope, collective_overhead the intercept less the back-to-back all-gather."""
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
        _sync_device(ctx.device)
        return (time.perf_counter() - start) / iters

    tight = _median_s(gather, 20, warmup=3, before=dist.barrier)
    xs, ys = [], []
    for matmuls in segments:
        rounds = [(loop(matmuls, False), loop(matmuls, True)) for _ in range(5)]
        xs.append(statistics.median(alone for alone, _ in rounds))
        ys.append(statistics.median(with_ - alone for alone, with_ in rounds))
    slope, intercept = statistics.linear_regression(xs, ys)
    return max(intercept - tight, 0.0), max(slope, 0.0)


def _fsdp_unit_overhead(ctx: RankContext, layers: tuple[int, int]) -> float:
    """FSDP2's host time per unit per step: the step time of a nano Llama (width 16,
    8 tokens: kernels cost almost nothing) under fully_shard per block on a 1-rank mesh
    (no collectives; every hook, copy and DTensor optimizer call still runs), less the
    same model unsharded in bf16, per extra block between the two depths. Every rank
    runs it at once, so the ranks share the cores as in a real job."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    group, _ = dist.new_subgroups(group_size=1)
    mesh = DeviceMesh.from_group(group, ctx.device.split(":")[0],
                                 mesh_dim_names=("dp_shard",))
    tokens = torch.randint(0, 64, (1, 8), device=ctx.device)
    labels = torch.randint(0, 64, (1, 8), device=ctx.device)

    def step_s(num_layers: int, shard: bool) -> float:
        spec = ModelSpec(name="nano", num_layers=num_layers, d_model=16, num_heads=2,
                         num_kv_heads=2, ffn_hidden=32, vocab_size=64, max_seq_len=8)
        torch.manual_seed(0)
        with torch.device(ctx.device):
            model = Transformer(spec)
        model.init_weights()
        if shard:
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for block in model.layers:
                fully_shard(block, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
        else:
            model = model.to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step() -> None:
            model(tokens, labels).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync_device(ctx.device)

        return _median_s(step, 25, warmup=5)

    lo, hi = layers
    fsdp = step_s(hi, True) - step_s(lo, True)
    plain = step_s(hi, False) - step_s(lo, False)
    return max((fsdp - plain) / (hi - lo), 0.0)


def _sync_device(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
