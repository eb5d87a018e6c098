"""The micro-benchmarks every rank runs at once, round by round: the communication
benchmarks (zsim.calibration.comm_bench), the compute kernels (kernel_bench), the nano
model's per-block host time (host_bench) and, on a CPU host, the library programs' host
time (program_overhead), into one RankBench per rank.

Owns the rounds: the whole set runs BenchConfig.rounds times, spread over the run, and
every figure is its median over the rounds (a shared host has slow spells of seconds to
minutes); zsim.calibration.profile_writer turns the figures into a hardware profile.
Imports torch.
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import fields, replace
from typing import Any

from zsim.backend.runner import RankContext
from zsim.calibration import comm_bench, kernel_bench
from zsim.calibration.bench_figures import BenchConfig, RankBench
from zsim.calibration.collective_fit import CollectiveSample
from zsim.calibration.host_bench import block_step_s
from zsim.calibration.program_overhead import program_steps_s


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



def _bench_round(ctx: RankContext, cfg: BenchConfig) -> RankBench:
    # torch 2.13 deprecates the *_tensor spellings that FSDP2 itself still calls.
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    out = RankBench(collectives=comm_bench.collective_samples(ctx, cfg))
    out.p2p_bytes_per_s = comm_bench.p2p_bytes_per_s(ctx)
    kernel_bench.kernel_rates(ctx, cfg, out)
    out.adam_params_per_s = kernel_bench.adam_params_per_s(cfg.adam_params,
                                                           cfg.cache_flush_bytes)
    out.comm_compute_slowdown = comm_bench.comm_compute_slowdown(ctx)
    out.compute_comm_slowdown = comm_bench.compute_comm_slowdown(ctx)
    # The shared host is noisy: each the median of five fits.
    fits = [comm_bench.synchronisation(ctx, cfg.sync_segments) for _ in range(5)]
    out.rank_skew = statistics.median(slope for slope, _ in fits)
    out.sync_overhead_s = statistics.median(sync for _, sync in fits)
    out.block_step_s = block_step_s(ctx, cfg.host_layers)
    if cfg.programs and ctx.device == "cpu":
        out.program_step_s = program_steps_s(ctx, cfg.host_layers)
        out.deepspeed_adam_params_per_s = kernel_bench.deepspeed_adam_params_per_s(
            cfg.adam_params, cfg.cache_flush_bytes)
    return out
