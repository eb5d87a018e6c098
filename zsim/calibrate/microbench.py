"""Micro-benchmarks run on every rank at once: collectives over a range of sizes, point-to-
point bandwidth, matmul and attention throughput, memory copy rates, the AdamW step, and
how much a collective in flight slows a matmul.

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
from zsim.calibrate.runner import RankContext
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
        (2048, 1024, 1024), (2048, 1024, 2752))
    """(m, k, n) of the timed matmuls: a square GEMM and block shapes (tokens x width)."""
    copy_bytes: int = 128 * MiB
    adam_params: int = 4 * 2**20


@dataclass(slots=True)
class RankBench:
    """One rank's figures."""

    collectives: list[CollectiveSample] = field(default_factory=list)
    p2p_bytes_per_s: float = 0.0
    """Point-to-point send/recv bandwidth of a 64 MiB message (rank 0 -> 1)."""
    matmul_flop_per_s: dict[str, list[float]] = field(default_factory=dict)
    """Per dtype ("fp32", "bf16"), one rate per matmul shape, FLOP/s."""
    attention_flop_per_s: float = 0.0
    """Causal SDPA forward + backward in bf16, FLOP/s (4·b·h·s²·d·3.5/2 per call)."""
    copy_bytes_per_s: float = 0.0
    """copy_ bytes read + written per second."""
    add_bytes_per_s: float = 0.0
    """torch.add(x, y, out=z) bytes read + written per second."""
    adam_params_per_s: float = 0.0
    comm_compute_slowdown: float = 0.0
    """Fractional matmul slow-down while an all-reduce is in flight."""


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
    out.attention_flop_per_s = _attention(ctx)
    out.copy_bytes_per_s, out.add_bytes_per_s = _memory_rates(ctx, cfg.copy_bytes)
    out.adam_params_per_s = _adam(ctx, cfg.adam_params)
    out.comm_compute_slowdown = _slowdown(ctx)
    return out


def _memory_rates(ctx: RankContext, nbytes: int) -> tuple[float, float]:
    """(copy_, add) bytes read + written per second on `nbytes` fp32 tensors."""
    x = torch.randn(nbytes // 4, device=ctx.device)
    y, z = torch.empty_like(x), torch.empty_like(x)
    copy_s = _median_s(lambda: y.copy_(x), 3)
    add_s = _median_s(lambda: torch.add(x, y, out=z), 3)
    return 2 * nbytes / copy_s, 3 * nbytes / add_s


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


def _attention(ctx: RankContext) -> float:
    b, h, s, d = 1, 8, 1024, 64
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.bfloat16, device=ctx.device,
                           requires_grad=True) for _ in range(3))

    def call() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    # Forward 2 matmuls of 2bhs²d, backward 5 (with recomputed scores): 3.5x forward;
    # causal halves it (the same counting as the h200 microbench case).
    flops = 3.5 * 4 * b * h * s * s * d / 2
    return flops / _median_s(call, 3)


def _adam(ctx: RankContext, numel: int) -> float:
    p = torch.nn.Parameter(torch.randn(numel, device=ctx.device))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-4, foreach=True)
    return numel / _median_s(opt.step, 3)


def _slowdown(ctx: RankContext) -> float:
    a = torch.randn(1024, 1024, device=ctx.device)

    def matmuls() -> None:
        for _ in range(10):
            a @ a

    alone = _median_s(matmuls, 3)
    buf = torch.ones(16 * MiB, device=ctx.device)
    dist.barrier()
    work = dist.all_reduce(buf, async_op=True)
    start = time.perf_counter()
    matmuls()
    with_comm = time.perf_counter() - start
    assert work is not None
    work.wait()
    return max(with_comm / alone - 1.0, 0.0)
