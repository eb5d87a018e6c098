"""The communication micro-benchmarks every rank runs at once: collectives over a range of
sizes, point-to-point bandwidth, how much a collective in flight slows a matmul and
compute slows a collective, and how far ranks drift apart between collectives.

Owns how each is timed: a barrier before each collective so that ranks start together,
each call timed on its own (zsim.calibration.timing), a collective's figure the mean of
its calls less the slowest tenth (a step pays every call's time, stalls included). The
collective sizes follow nccl-tests (-b 4K -e 256M -f 4; BenchConfig.sizes_bytes).
Imports torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from zsim.backend.fsdp2 import TORCH_DTYPES
from zsim.backend.runner import RankContext, sync_device
from zsim.calibration.bench_figures import BenchConfig
from zsim.calibration.collective_fit import CollectiveSample
from zsim.calibration.timing import call_times_s, median_call_s, trimmed_mean
from zsim.spec.hardware import COLLECTIVES, OPTIONAL_COLLECTIVES, REDUCING_COLLECTIVES
from zsim.units import MiB, dtype_bytes


def collective_cases(cfg: BenchConfig) -> list[tuple[str, str, int]]:
    """(kind, dtype, size_bytes) of every timed collective, in the order timed: each kind
    (broadcast too) in fp32 at every size, the reducing kinds also in
    cfg.reduction_dtypes (right after fp32 at the same size, so the two see the same host)
    up to its largest size."""
    return [(op, dtype, size) for op in COLLECTIVES + OPTIONAL_COLLECTIVES
            for size in cfg.sizes_bytes
            for dtype in ("fp32", *(cfg.reduction_dtypes if op in REDUCING_COLLECTIVES else ()))
            if dtype == "fp32" or size <= cfg.reduction_dtype_max_bytes]




def collective_samples(ctx: RankContext, cfg: BenchConfig) -> list[CollectiveSample]:
    """Every collective_cases call timed on this rank (all ranks at once)."""
    out = []
    n = ctx.world_size
    for op, dtype, size in collective_cases(cfg):
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
        elif op == "broadcast":
            def call(full: torch.Tensor = full) -> None:
                dist.broadcast(full, 0)
        else:
            def call(full: torch.Tensor = full) -> None:
                dist.all_reduce(full)
        # A step pays every call's time, stalls included: the mean, not the median.
        t = trimmed_mean(call_times_s(call, iters, before=dist.barrier))
        out.append(CollectiveSample(op=op, size_bytes=size, world_size=n,
                                                time_s=t, dtype=dtype))
        del full, shard
    return out


def p2p_bytes_per_s(ctx: RankContext) -> float:
    """Send/recv of 64 MiB between ranks 0 and 1 (other ranks idle), bytes/s."""
    buf = torch.ones(16 * MiB, device=ctx.device)

    def call() -> None:
        if ctx.rank == 0:
            dist.send(buf, 1)
        elif ctx.rank == 1:
            dist.recv(buf, 0)

    t = median_call_s(call, 3, before=dist.barrier)
    rate = torch.tensor([64 * MiB / t if ctx.rank == 1 else 0.0])
    dist.all_reduce(rate, op=dist.ReduceOp.MAX)
    return float(rate.item())



def comm_compute_slowdown(ctx: RankContext) -> float:
    """Fraction of its rate a matmul loses while a collective is in flight, the engine's
    comm_compute_slowdown: 1 - t_alone / t_with. Each timed matmul runs entirely inside a
    64 MiB all_reduce (several times longer here), issued by every rank in the same
    order; on CPU the collective's threads compete with compute for the cores."""
    a = torch.randn(1024, 1024, device=ctx.device)
    alone = median_call_s(lambda: a @ a, 5)
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


def compute_comm_slowdown(ctx: RankContext) -> float:
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


def synchronisation(ctx: RankContext, segments: tuple[int, ...]) -> tuple[float, float]:
    """The engine's rank_skew and sync_overhead_s: every rank repeats [a compute segment;
    a tiny blocking all-gather], as FSDP on a synchronous host does. The all-gather waits
    for the slowest rank, which falls further behind the longer the segment: its extra
    time over the compute alone (median of rounds that alternate with and without it)
    grows with the segment's compute time; rank_skew is the least-squares slope of that
    line. Its intercept, the call after no compute at all, stands above the same call
    made back to back (segment 0): ranks that arrive apart pay a fixed cost beyond the
    wait (presumably the waiting rank's thread sleeping and being woken);
    sync_overhead_s is the difference (>= 0); on the 2-core development hosts it was
    of the order of a millisecond (figures per host in docs/log.md, 2026-12-02)."""
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
