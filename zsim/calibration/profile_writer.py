"""`calibrate()`: measure this machine with the micro-benchmarks and write a hardware
profile YAML in the schema of zsim.spec.hardware, with provenance in every `source:`.

Owns the mapping from measured figures to profile keys (each key's comment in the output
says how it was obtained). On CPU, each rank plays one "GPU": its memory is host DRAM, its
"PCIe" is a memcpy, both network levels are gloo over loopback TCP (one host only). Link
line rate is the point-to-point send/recv bandwidth; efficiency is the fitted ring bandwidth
of all-gather over it, collective_efficiency each kind's fitted bandwidth relative to
all-gather's. Peaks are the best matmul rate per dtype measured; efficiencies are medians
over the block-shaped linear layers (forward + backward), attention relative to the bf16
peak, and a mix of bf16 memory-bound kernels relative to the copy rate; the kernels section
holds the validation grid's GEMMs, each timed from a cold cache, by shape and dtype
(zsim.spec.kernel_rates: a model's GEMMs then run at the rates of their shapes, not at one
efficiency). The host section (zsim.calibration.host_costs) comes from the nano model
(zsim.calibration.nano: kernels cost almost nothing there): the per-kernel overhead is its
block's step time over the kernels zsim.analytic.compute counts, FSDP2's hook time and the
cost of its collective calls are differences between its unsharded, 1-rank-mesh and all-rank
runs, checkpointing's host time the difference between its checkpointed and plain runs; rank
skew from collectives after compute; on a CPU host, the library programs' own host time
(DeepSpeed ZeRO, FSDP1, DTensor TP) is what their nano-model steps take beyond the
simulation of the same plans with the rest of the profile
(zsim.calibration.program_overhead). Imports torch.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import yaml

from zsim.atomic import write_files
from zsim.backend.reference_model import GELU_APPROXIMATE
from zsim.backend.runner import run_ranks
from zsim.calibration.bench_figures import BenchConfig, RankBench
from zsim.calibration.collective_fit import CollectiveSample, fit_alpha_beta
from zsim.calibration.host_costs import host_costs, synchronising_per_block
from zsim.calibration.kernel_bench import gemm_shapes, host_core_share
from zsim.calibration.machine import (
    DISK_TEST_BYTES,
    cpu_name,
    disk_rates,
    host_memory_bytes,
    machine_description,
)
from zsim.calibration.microbench import bench_rank, median_of_rounds
from zsim.calibration.program_overhead import fit
from zsim.errors import ConfigError
from zsim.spec.hardware import COLLECTIVES, OPTIONAL_COLLECTIVES, HardwareProfile
from zsim.spec.kernel_rates import PASSES
from zsim.units import GB, GiB, MiB

ROUND_DEADLINE_S = 450.0
"""Seconds allowed per round of the benchmarks, times the ranks that share a core
(core_share): a round's time grows with the share, so a fixed deadline whatever the rounds
and ranks cut short calibrations that were running normally (the round times measured on
the 2-core development host are in docs/log.md, 2026-12-03)."""


def calibrate(backend: str, nproc: int, out: Path, *, config: BenchConfig | None = None,
              timeout_s: float | None = None) -> Path:
    """Benchmark `nproc` ranks on `backend` and write the fitted hardware profile.

    Args:
        backend: "gloo" (CPU ranks) or "nccl" (one CUDA GPU per rank).
        nproc: ranks to run (>= 2: the collectives need a peer).
        out: YAML path to write; its stem becomes the profile name.
        config: benchmark sizes and repetitions (default: BenchConfig()).
        timeout_s: deadline for the benchmark run, seconds (None: ROUND_DEADLINE_S per
            round, times the ranks that share a core on gloo).

    Returns:
        `out`, after checking that it loads with HardwareProfile.from_yaml.

    Raises:
        ConfigError: unknown backend, nproc < 2, or nccl without CUDA.
        RankFailed: a benchmark rank failed or hung.
    """
    started = datetime.now(timezone.utc)
    cfg = config or BenchConfig()
    ranks = bench_ranks(backend, nproc, config=cfg, timeout_s=timeout_s)
    return write_profile([ranks], backend=backend, nproc=nproc, out=out, started=started,
                         config=cfg)


def bench_ranks(backend: str, nproc: int, *, config: BenchConfig,
                timeout_s: float | None = None) -> list[RankBench]:
    """`config.rounds` rounds of the benchmarks on `nproc` ranks of `backend`: each
    rank's figures (medians over the rounds), in rank order. Raises as calibrate()."""
    if backend not in ("gloo", "nccl"):
        raise ConfigError("backend", backend, "must be gloo or nccl")
    if nproc < 2:
        raise ConfigError("nproc", nproc, "must be >= 2 (collectives need a peer)")
    if backend == "nccl" and torch.cuda.device_count() < nproc:
        raise ConfigError("nproc", nproc, f"needs {nproc} CUDA devices, "
                                          f"found {torch.cuda.device_count()}")
    if timeout_s is None:
        share = host_core_share(nproc, config) if backend == "gloo" else 1.0
        timeout_s = ROUND_DEADLINE_S * config.rounds * share
    return run_ranks(bench_rank, config, nproc=nproc, backend=backend, timeout_s=timeout_s)


def write_profile(sessions: list[list[RankBench]], *, backend: str, nproc: int, out: Path,
                  started: datetime, config: BenchConfig) -> Path:
    """Write the profile of one or more benchmark sessions (bench_ranks' results, each
    of `config.rounds` rounds), each rank's figures the median over the sessions (the
    validation report spreads its sessions between its passes over the cases, so that
    the profile samples the host over the same minutes as the runs it predicts).

    Returns:
        `out`, after checking that it loads with HardwareProfile.from_yaml.
    """
    ranks = [median_of_rounds([s[i] for s in sessions]) for i in range(nproc)]
    cfg = replace(config, rounds=config.rounds * len(sessions))
    disk = disk_rates(out.parent)
    data = profile_dict(ranks, name=Path(out).stem, backend=backend, nproc=nproc,
                        started=started, disk_bytes_per_s=disk, config=cfg)
    with_program_overhead(data, ranks, nproc=nproc, layers=cfg.host_layers)
    out = Path(out)
    HardwareProfile.from_dict(data, name=out.stem)  # never write a profile that won't load
    (written,) = write_files(out.parent, {
        out.name: yaml.safe_dump(data, sort_keys=False, width=100).encode()})
    return written


def profile_dict(ranks: list[RankBench], *, name: str, backend: str, nproc: int,
                 started: datetime, disk_bytes_per_s: tuple[float, float],
                 config: BenchConfig | None = None) -> dict[str, Any]:
    """The profile YAML structure (hardware.py's schema, human units) from the ranks'
    figures."""
    cfg = config or BenchConfig()
    samples = [s for s in ranks[0].collectives if s.dtype == "fp32"]
    link = fit_alpha_beta(samples)
    ar = [s for s in samples if s.op == "all_reduce"]
    ar_busbw = max(s.bus_bytes_per_s for s in ar)
    line_rate = max(ranks[0].p2p_bytes_per_s, link.bandwidth_bytes_per_s)
    peaks = {d: statistics.median([max(r.matmul_flop_per_s[d]) for r in ranks])
             for d in ("fp32", "bf16")}
    matmul_eff = statistics.median(
        [rate / peaks[d] for r in ranks for d in peaks for rate in r.linear_flop_per_s[d]])
    attention = statistics.median(r.attention_flop_per_s for r in ranks)
    copy = statistics.median(r.copy_bytes_per_s for r in ranks)
    elementwise = statistics.median(r.elementwise_bytes_per_s for r in ranks)
    foreach = "multi_tensor_apply" if backend == "nccl" else "per_tensor"
    host = host_costs(ranks, link, nproc, foreach)
    adam = statistics.median(r.adam_params_per_s for r in ranks)
    ds_adam = statistics.median(r.deepspeed_adam_params_per_s for r in ranks)
    slowdown = statistics.mean(r.comm_compute_slowdown for r in ranks)
    comm_slowdown = statistics.mean(r.compute_comm_slowdown for r in ranks)
    skew = statistics.mean(r.rank_skew for r in ranks)
    sync_s = statistics.mean(r.sync_overhead_s for r in ranks)
    launch_how = ("CUDA streams" if backend == "nccl"
                  else "CPU ranks run their kernels on the calling thread")
    mem_gib = host_memory_bytes() / GiB
    when = started.strftime("%Y-%m-%d %H:%M UTC")
    prov = (f"zsim calibrate profile --backend {backend} --nproc {nproc}, {when}, "
            f"torch {torch.__version__}, {machine_description()}, "
            f"{max(1, (os.cpu_count() or 1) // nproc)} torch threads per rank, "
            f"each figure the median of {cfg.rounds} rounds")
    share = ranks[0].core_share
    shared = (f"; the kernels timed on rank 0 alone (the others waiting) and each rate "
              f"divided by {share:g}, the ranks that share each core "
              f"(zsim.calibration.kernel_bench.core_share)" if share > 1 else "")
    device = (torch.cuda.get_device_name(0) if backend == "nccl"
              else f"{cpu_name()}, one torch.distributed rank")
    link_name = "NCCL" if backend == "nccl" else "gloo over loopback TCP"
    link_source = (f"{prov}; alpha-beta fit of all_gather_into_tensor, "
                   f"reduce_scatter_tensor, all_reduce and broadcast {_sizes(samples)} (one "
                   f"alpha, one bandwidth per kind: efficiency is all_gather's, "
                   f"collective_efficiency each kind's relative to it), max fit error "
                   f"{link.max_rel_error:.0%}; line rate = send/recv 64 MiB; all_reduce "
                   f"best bus bandwidth {ar_busbw / GB:.3g} GB/s")
    efficiency = _r(min(link.bandwidth_bytes_per_s / line_rate, 1.0))
    # A kind's rate may not pass the line rate (rounded down to stay within it).
    kinds = {k: min(_r(link.kind_factor.get(k, 1.0)), math.floor(1e3 / efficiency) / 1e3)
             for k in COLLECTIVES + OPTIONAL_COLLECTIVES}
    hbm_gib = (torch.cuda.get_device_properties(0).total_memory / GiB if backend == "nccl"
               else mem_gib)
    kernels = ({"kernels": _kernel_table(ranks, cfg, prov + shared)}
               if all(r.gemm_flop_per_s for r in ranks) else {})
    data = {
        "name": name,
        "description": f"{nproc} {backend} ranks on {platform.node() or 'this machine'} "
                       f"({device}), measured by zsim calibrate",
        "gpu": {
            "name": device,
            "hbm_gib": _r(hbm_gib),
            "hbm_bandwidth_gb_per_s": _r(copy / GB),
            "peak_tflops": {d: _r(p / 1e12) for d, p in peaks.items()},
            "source": f"{prov}; peak = best matmul per dtype (median over ranks), "
                      f"bandwidth = copy_ of 128 MiB bytes read + written per second"
                      f"{shared}",
        },
        "node": {
            "gpus_per_node": nproc,
            "host_memory_gib": _r(mem_gib),
            "pcie_gb_per_s": _r(copy / 2 / GB),
            "nvme_read_gb_per_s": _r(disk_bytes_per_s[0] / GB),
            "nvme_write_gb_per_s": _r(disk_bytes_per_s[1] / GB),
            "source": f"{prov}; pcie = memcpy rate (bytes copied per second); disk = "
                      f"{DISK_TEST_BYTES // MiB} MiB O_DIRECT read, write + fsync",
        },
        "intra_node": {
            "name": link_name,
            "bandwidth_gb_per_s": _r(line_rate / GB),
            "latency_us": _r(link.latency_s * 1e6),
            "efficiency": efficiency,
            "collective_efficiency": kinds,
            "source": link_source,
        },
        "inter_node": {
            "name": f"{link_name} (single host: stands in for a second node)",
            "bandwidth_gb_per_s": _r(line_rate / GB),
            "latency_us": _r(link.latency_s * 1e6),
            "efficiency": efficiency,
            "collective_efficiency": dict(kinds),
            "source": f"copies intra_node (one host); {link_source}",
        },
        "collectives": {
            "model": "ring",
            "nvls_busbw_gb_per_s": 0,
            "measured_us": _measured_us(ranks, nproc),
            "source": f"{backend} measured: every call charged as a ring with the fitted "
                      f"per-step latency and bandwidth above, except a call of {nproc} "
                      f"ranks, which takes the time interpolated between measured_us: "
                      f"the calls of the fit (each the mean of its timed calls less the "
                      f"slowest tenth: a step pays gloo's stalls), median over ranks "
                      f"([full buffer bytes, us]), "
                      f"in fp32 (the reductions also in bf16, under bf16: a reduction in "
                      f"bf16 takes those)",
        },
        "efficiency": {
            "matmul": _r(min(matmul_eff, 1.0)),
            "attention": _r(min(attention / peaks["bf16"], 1.0)),
            "memory_bound": _r(min(elementwise / copy, 1.0)),
            "pcie": 1.0,
            "host_adam_params_per_s": _r(adam * nproc),
            **({"deepspeed_adam_params_per_s": _r(ds_adam * nproc)} if ds_adam > 0 else {}),
            "comm_compute_slowdown": _r(min(slowdown, 0.99)),
            "compute_comm_slowdown": _r(min(comm_slowdown, 0.99)),
            "kernel_overhead_us": _r(host.kernel_s * 1e6),
            "foreach_kernels": foreach,
            "source": f"{prov}{shared}; matmul = median over block-shaped linear layers, "
                      f"forward + backward (3 GEMMs), of rate / peak; "
                      f"attention = causal SDPA bf16 fwd+bwd at "
                      f"(b, h, s, d) = {cfg.attention_shape} (3 x 4bhs^2d/2 FLOPs), each "
                      f"call after writing {cfg.cache_flush_bytes // MiB} MiB, / bf16 "
                      f"peak; memory_bound = bf16 add, mul, silu, cat, upcast and fp32 "
                      f"log_softmax on {cfg.elementwise_numels} elements (total bytes / "
                      f"total time) / copy bytes per second; kernel_overhead = step time "
                      f"per block of the width-16 reference Llama (bf16, unsharded, "
                      f"{cfg.host_layers[0]} vs {cfg.host_layers[1]} blocks) / its "
                      f"{host.kernels_per_block:g} kernels (fwd, bwd, AdamW); host "
                      f"AdamW(foreach) on 4 Mi params x ranks (deepspeed_adam: "
                      f"DeepSpeedCPUAdam, where DeepSpeed imports), each step after "
                      f"writing {cfg.cache_flush_bytes // MiB} MiB; "
                      f"comm_compute_slowdown = a 1024^3 matmul inside a 64 MiB all_reduce "
                      f"vs alone; "
                      f"compute_comm_slowdown = a 64 MiB all_reduce while 256^3 matmuls run "
                      f"vs alone; both means over ranks",
        },
        "host": {
            "launch": "async" if backend == "nccl" else "synchronous",
            "collective_overhead_us": _r(host.collective_s() * 1e6),
            "rank_skew": _r(skew),
            "sync_overhead_us": _r(sync_s * 1e6),
            "fsdp_unit_overhead_us": _r(host.fsdp_unit_s * 1e6),
            "checkpoint_overhead_us": {mode: {ph: _r(v * 1e6) for ph, v in phases.items()}
                                       for mode, phases in host.checkpoint_s.items()},
            "source": f"{prov}; launch: {launch_how}; "
                      f"rank_skew: every rank repeats [{'/'.join(map(str, cfg.sync_segments))} "
                      f"256^3 matmuls; a 2 KiB-per-rank all_gather_into_tensor], slope of the "
                      f"all-gather's extra time over the compute time (median of 5 fits, "
                      f"mean over ranks); sync_overhead: the line's intercept less the same "
                      f"all-gather back to back (median of the 5 fits, mean over ranks); "
                      f"per block of the width-16 reference Llama "
                      f"({cfg.host_layers[0]} vs {cfg.host_layers[1]} blocks, median over "
                      f"ranks): fsdp_unit_overhead = step time under fully_shard on a 1-rank "
                      f"mesh - unsharded bf16; collective_overhead = (step time on all "
                      f"{nproc} ranks - on the 1-rank mesh - the fitted link time of its "
                      f"collectives - sync_overhead x the calls the simulator's lowering "
                      f"finds synchronising) / collectives, mean of resharding after "
                      f"forward or not; checkpoint_overhead per forward kernel "
                      f"({host.fwd_kernels:g} "
                      f"per block) = forward alone with each block checkpointed (full: "
                      f"torch.utils.checkpoint, selective: op-level SAC) - unsharded; "
                      f"backward: the same for (step - forward), less its re-run kernels "
                      f"at kernel_overhead",
        },
        **kernels,
    }
    if sync_s > 0:
        # The FSDP2 calls the nano runs made pay sync_overhead where the simulator
        # charges it: collective_overhead is what each call costs beyond that.
        synced = synchronising_per_block(data, nproc, cfg.host_layers)
        data["host"]["collective_overhead_us"] = _r(host.collective_s(synced, sync_s) * 1e6)
    return data


def _kernel_table(ranks: list[RankBench], cfg: BenchConfig, prov: str) -> dict[str, Any]:
    """kernels: the cold GEMMs of gemm_shapes(cfg) per dtype, [m, k, n, TFLOP/s], the
    median over ranks; causal attention's forward and backward at cfg.attention_shape
    where the ranks timed them apart (bf16 [seq, head_dim, forward, backward TFLOP/s],
    the forward's FLOPs per second of each pass, the median over ranks: on a CPU the
    backward runs about 7x the forward, not the 2x the flat efficiency assumes); and
    GELU's rate by pass where the ranks timed it (the one memory-bound class measured
    apart here: the others run at efficiency.memory_bound)."""
    shapes = gemm_shapes(cfg)
    table = {d: [[*shape, _r(statistics.median(r.gemm_flop_per_s[d][i] for r in ranks) / 1e12)]
                 for i, shape in enumerate(shapes)]
             for d in ranks[0].gemm_flop_per_s}
    out: dict[str, Any] = {"matmul_tflops": table}
    measured = ""
    if all(r.attention_pass_flop_per_s for r in ranks):
        _, _, seq, head_dim = cfg.attention_shape
        out["attention"] = {"bf16": [[seq, head_dim, *(
            _r(statistics.median(r.attention_pass_flop_per_s[p] for r in ranks) / 1e12)
            for p in PASSES)]]}
        measured = (f"attention = causal SDPA bf16 at (b, h, s, d) = {cfg.attention_shape}, "
                    f"forward and backward apart (forward + backward less the forward), "
                    f"each after writing {cfg.cache_flush_bytes // MiB} MiB, median of 7 "
                    f"calls, median over ranks, in forward FLOPs (4bhs^2d/2) per second "
                    f"of each pass; ")
    flat = measured + ("attention at other shapes" if measured else "attention")
    source = f"{flat} and memory-bound kernels at the efficiencies above"
    if all(r.gelu_bytes_per_s for r in ranks):
        out["memory_gb_per_s"] = {"gelu": {
            p: _r(statistics.median(r.gelu_bytes_per_s[p] for r in ranks) / GB)
            for p in PASSES}}
        source = (f"GELU (approximate={GELU_APPROXIMATE!r}) on {max(cfg.elementwise_numels)} "
                  f"bf16 elements, forward and gelu_backward, bytes as zsim.analytic.compute "
                  f"counts them (backward twice the forward's) per second, median of 7 "
                  f"calls, median over ranks; {flat} and the other memory-bound kernels "
                  f"at the efficiencies above")
    return out | {"source": f"{prov}; each GEMM (m x k) @ (k x n) of the validation grid's "
                            f"linear layers (forward, input gradient, weight gradient), timed "
                            f"after writing {cfg.cache_flush_bytes // MiB} MiB so that it "
                            f"reads its operands from memory, median of 9 calls, median over "
                            f"ranks; {source}"}


def with_program_overhead(data: dict[str, Any], ranks: list[RankBench], *, nproc: int,
                          layers: tuple[int, int]) -> None:
    """Add host.program_overhead_us to the profile structure `data`, fitted against the
    simulator with the rest of `data` (zsim.calibration.program_overhead.fit), when the
    ranks timed the programs; its source goes into the host section's."""
    if not all(r.program_step_s for r in ranks):
        return
    overhead = fit([r.program_step_s for r in ranks], data, world_size=nproc, layers=layers)
    host = data["host"]
    host["program_overhead_us"] = {p: {k: _r(v) for k, v in parts.items()}
                                   for p, parts in overhead.items()}
    host["source"] += (
        f"; program_overhead per program (DeepSpeed ZeRO-1/2/3 with every parameter "
        f"partitioned, ZeRO-2 with the optimizer offloaded, FSDP1 FULL_SHARD and "
        f"SHARD_GRAD_OP, TP over 2 ranks), from the width-16 reference Llama and GPT "
        f"blocks (TP: Llama's) at {layers[0]} and {layers[1]} blocks on all {nproc} ranks "
        f"(median over ranks): the growth per block of the time to the loss (forward) and "
        f"of the rest of the step (backward), each less what the simulator gives the same "
        f"plan with the rest of this profile, split through the two blocks into a figure "
        f"per block (*_block) and per parameter tensor (*_tensor; 9 and 16 a block); "
        f"step = Llama's {layers[0]}-block step beyond its blocks")


def _measured_us(ranks: list[RankBench], nproc: int) -> dict[str, Any]:
    """collectives.measured_us: per kind, [size_bytes, median time over ranks in us] of
    every size timed in fp32, ascending; the reductions timed in another dtype the same
    way under that dtype's name."""
    calls: dict[str, dict[str, list[list[float]]]] = {}
    for i, sample in enumerate(ranks[0].collectives):
        t = statistics.median(r.collectives[i].time_s for r in ranks)
        calls.setdefault(sample.dtype, {}).setdefault(sample.op, []).append(
            [sample.size_bytes, _r(t * 1e6)])
    table: dict[str, Any] = {"ranks": nproc}
    for dtype, kinds in calls.items():
        rows = {op: sorted(r) for op, r in kinds.items()}
        table |= rows if dtype == "fp32" else {dtype: rows}
    return table


def _r(x: float) -> float:
    """Four significant digits: measurements are not better than that."""
    return float(f"{x:.4g}")


def _sizes(samples: list[CollectiveSample]) -> str:
    sizes = sorted({s.size_bytes for s in samples})
    return f"{sizes[0] // 1024} KiB-{sizes[-1] // MiB} MiB x{len(sizes)}"


