"""How a micro-benchmark times a call: the one call timer of the CPU and NCCL
micro-benchmarks (zsim.calibration.microbench and the modules it runs) and of the GPU
fit's kernel measurements (zsim.calibration.gpu_kernel_bench).

Owns the timing of a repeated call. On the host, each call is timed on its own with
time.perf_counter after warm-up calls (with an optional `before` run untimed ahead of
each: a barrier, a cache flush); a figure is their median (median_call_s), or the mean
of all but the slowest tenth (trimmed_mean), or their mean (time_call). On CUDA,
time_call times `reps` back-to-back calls with CUDA events, queued behind a
torch.cuda._sleep so that the host has queued them all before the GPU starts and the
figure excludes launch gaps; the host time per call is then the wall time the queueing
took. A call that works on a device synchronises it itself where the timing must include
its device work (microbench's calls do; time_call's CUDA path needs them not to).
Imports torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SLEEP_CYCLES = 20_000_000
"""GPU clock cycles of the torch.cuda._sleep queued before each timed batch of calls
(about 10 ms on an H200 at 1.98 GHz): longer than the host needs to queue the calls."""


def call_times_s(fn: Callable[[], Any], iters: int, *, warmup: int = 1,
                 before: Callable[[], None] | None = None) -> list[float]:
    """Wall seconds of each of `iters` calls of `fn`, after `warmup` untimed calls;
    `before()` runs untimed ahead of every timed call."""
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


def median_call_s(fn: Callable[[], Any], iters: int, *, warmup: int = 1,
                  before: Callable[[], None] | None = None) -> float:
    """The median of call_times_s, seconds."""
    return statistics.median(call_times_s(fn, iters, warmup=warmup, before=before))


def trimmed_mean(times: list[float], trim: float = 0.1) -> float:
    """The mean of `times` without its slowest `trim` fraction (rounded down)."""
    kept = sorted(times)[:len(times) - int(len(times) * trim)]
    return statistics.fmean(kept)


@dataclass(frozen=True, slots=True)
class Timing:
    """Per-call seconds of a timed function."""

    device_s: float
    host_s: float


def time_call(fn: Callable[[], Any], device: str, *, reps: int, warmup: int = 2,
              queue: bool = True) -> Timing:
    """Time `fn` (see the module docstring): device seconds per call from CUDA events
    around `reps` calls queued behind a sleep kernel (without `queue`, for calls that
    block the host, no sleep), host seconds per call to queue them; off CUDA both are the
    mean wall seconds of `reps` calls."""
    for _ in range(warmup):
        fn()
    if not device.startswith("cuda"):
        per_call = statistics.fmean(call_times_s(fn, reps, warmup=0))
        return Timing(device_s=per_call, host_s=per_call)
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if queue:
        torch.cuda._sleep(SLEEP_CYCLES)
    host0 = time.perf_counter()
    begin.record()
    for _ in range(reps):
        fn()
    end.record()
    host_s = (time.perf_counter() - host0) / reps
    torch.cuda.synchronize()
    return Timing(device_s=begin.elapsed_time(end) * 1e-3 / reps, host_s=host_s)
