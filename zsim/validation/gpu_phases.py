"""Where the time of a published FSDP2 step goes, phase by phase: how much of the forward,
the backward and the optimizer step keeps the GPU busy and how much waits on the host
(Python, FSDP2's hooks, kernel launches), and which kernels the busy time is made of.

    zsim calibrate gpu-phases --out DIR [--budget-s 135] [--quick]

Runs a few of the runs of tests/data/cases/h200-fsdp2-runs.yaml, most wanted first (runs()):
each is built as the GPU report builds it (zsim.validation.gpu_runs, rank 0 of N on the fake
process group, so collectives are no-ops), one process per world size, the runs of a world
size in turn (zsim.validation.budgeted_runs). A run does warm-up steps, then steps
synchronised after each phase (the wall, host-issue and synchronise-wait times of each
phase, and the GPU SM clock sampled meanwhile when torch.cuda.clock_rate works), then one or
two such steps under torch.profiler (CPU and CUDA activities, input shapes recorded), after
one profiled warm-up step. From the profiled steps, per phase: device-busy time (the union
of the device's kernel, memcpy and memset intervals over all streams, not their sum), idle
time, kernels, launches, ATen ops, time blocked in CUDA synchronise calls, the busiest
stream's ("compute stream's") idle gaps; device time by kernel class (KERNEL_CLASSES); every
GEMM ATen op's device time by input shape (its kernels, attributed by the profiler's
correlation ids; zsim.validation.kernel_trace reads the profile). On CPU (--quick: a tiny
model at world 8) the "kernels" are the outermost ATen op calls (those no other ATen op
makes; their union is the time the host spends in ATen) and the "streams" the threads.

Outputs in DIR, appended as each run finishes (a killed command keeps the finished runs):
phases.csv (PHASE_FIELDS), kernel_classes.csv (CLASS_FIELDS), gemm_shapes.csv (GEMM_FIELDS),
kernel_names.csv (KERNEL_FIELDS: every kernel, by stream and launching op), runs.jsonl (each
run's status and seconds, its warm-up steps' time and host issue time without
synchronisation, events read, SM clock range) and provenance.yaml (environment, command,
budget, what ran, what was skipped; written at the start and the end). The budget: a world
size's process gets a share of the time left (by the runs' estimated seconds), starts a run
only if its estimate (scaled by how the process's earlier runs compared with theirs) fits in
the share, and is stopped at the budget's end less STOP_S (zsim.validation.budgeted_runs).
Imports torch.
"""

from __future__ import annotations

import csv
import math
import statistics
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
import yaml
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from zsim.backend import programs, training
from zsim.backend.runner import RankContext, read_jsonl, sync_device
from zsim.backend.step_timing import timed_step
from zsim.calibration.gpu_kernel_bench import matmul_precision
from zsim.calibration.machine import environment
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.validation.budgeted_runs import Group, Run, run_groups
from zsim.validation.comparison import backend_knobs
from zsim.validation.gpu_runs import P7B, groups
from zsim.validation.kernel_trace import (
    PHASES,
    class_rows,
    gemm_rows,
    kernel_rows,
    phase_stats,
    read_trace,
)

PHASE_FIELDS = (
    "run", "world_size", "device", "step", "phase", "wall_s", "host_issue_s", "sync_wait_s",
    "sm_clock_mhz", "profiled_wall_s", "profiled_host_issue_s", "device_busy_s",
    "device_idle_s", "busy_fraction", "lead_s", "tail_s", "kernels", "launches", "aten_ops",
    "blocked_s", "streams", "compute_stream", "compute_busy_s", "compute_idle_s",
    "compute_gaps_over_10us", "compute_idle_over_10us_s", "note")
"""Columns of phases.csv, one row per (run, profiled step, phase or "step"). wall_s,
host_issue_s (wall less the synchronise at the phase's end), sync_wait_s and
sm_clock_mhz: medians over the unprofiled phase-synchronised steps (the same on every
profiled step's row). The rest come from the profiled step `step`: its wall
(profiler overhead included) and host issue time; device_busy_s, the union of device
activity in the phase; device_idle_s = profiled_wall_s - device_busy_s; lead_s, from the
phase's start to its first device activity; tail_s, from its last device activity to the
phase's end; blocked_s, host time in CUDA synchronise calls; compute_*: the busiest
stream's busy time, its idle time between its first and last kernel, and its gaps over
10 us (count and seconds)."""

CLASS_FIELDS = ("run", "world_size", "device", "step", "phase", "kernel_class", "kernels",
                "device_s", "busy_s", "top_kernels")
"""Columns of kernel_classes.csv: device_s, the summed durations; busy_s, their union;
top_kernels, the class's three costliest names with their summed seconds."""

GEMM_FIELDS = ("run", "world_size", "device", "step", "phase", "op", "shapes", "calls",
               "kernels", "device_s", "flops", "tflops", "kernel")
"""Columns of gemm_shapes.csv, one row per (run, step, phase, ATen op, input shapes):
device_s, the summed durations of the kernels the calls launched (CPU: the calls' own
time); flops, 2*m*k*n (times the batch) per call, summed; kernel, the name with the most
device time among the calls' longest kernels."""

KERNEL_FIELDS = ("run", "world_size", "device", "step", "phase", "stream", "aten_op",
                 "kernel", "kernel_class", "calls", "device_s")
"""Columns of kernel_names.csv, one row per (run, step, phase, stream, the ATen op that
launched the kernel, kernel name): every kernel of the phase, so that a class's time can
be taken apart (which elementwise kernels RoPE, the norms or the loss run, and on which
stream)."""

STOP_S = 8.0
"""Seconds kept at the budget's end for stopping a process and writing provenance."""
CLOCK_PERIOD_S = 0.05
"""How often the SM clock is sampled during the phase-synchronised steps, seconds."""

P13B = ModelSpec(name="13b", num_layers=40, d_model=5120, num_heads=40, num_kv_heads=40,
                 ffn_hidden=13824, vocab_size=32000, max_seq_len=8192)
"""Llama-2-13B as in tests/data/cases/h200-fsdp2-runs.yaml (sequence 8192)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Steps:
    """Steps of a run: warm-up, phase-synchronised, and profiled (after one profiled
    warm-up step)."""

    warmup: int
    phased: int
    profiled: int
    long_step_s: float
    """A run whose last warm-up step took at least this long gets one profiled step."""


FULL_STEPS = Steps(warmup=3, phased=3, profiled=2, long_step_s=1.0)
QUICK_STEPS = Steps(warmup=1, phased=2, profiled=2, long_step_s=math.inf)


def runs(quick: bool, device_type: str) -> list[Run]:
    """The runs, most wanted first, their specs with the device's kernel knobs, each with
    its expected seconds on an H200 (build, every step, profile and analysis; the GPU
    report's runs of the same models took 6-9 s for about ten steps): those the GPU report
    defines (zsim.validation.gpu_runs) taken from it, 7b_n8 and 13b_n128_mb1 added; the
    CPU-offloaded run last (it was profiled after the others: docs/log.md)."""
    known = {r.name: r for g in groups(quick, device_type) for r in g.runs}
    if quick:
        return [replace(known["tiny_n8"], estimate_s=5.0)]
    knobs = backend_knobs(device_type)
    common = {"micro_batch": 1, "reduce_dtype": "fp32"}
    p7b = Run(name="7b_n8", spec=replace(P7B, **knobs), published="7b_n8", estimate_s=14.0,
              plan=Plan.for_strategy("fsdp", gpus=8, seq_len=4096, **common))
    p13b = Run(name="13b_n128_mb1", spec=replace(P13B, **knobs), published="13b_n128_mb1",
               estimate_s=26.0,
               plan=Plan.for_strategy("fsdp", gpus=128, seq_len=8192, **common))
    return [replace(known["1p3b_n8"], estimate_s=12.0),
            replace(known["1p3b_n64"], estimate_s=12.0), p7b, p13b,
            replace(known["1p3b_n8_ac"], estimate_s=12.0),
            replace(known["1p3b_n8_raf0"], estimate_s=10.0),
            replace(known["1p3b_n8_fp32"], estimate_s=14.0),
            # Its forward is 30% longer than zsim's: the profile should say where.
            replace(known["1p3b_n8_offload"], estimate_s=20.0)]


def by_world_size(planned: list[Run]) -> list[Group]:
    """The runs grouped by world size (one process each, rank 0 of N on the fake process
    group), the groups in the order of their first run, the runs in their given order."""
    out: dict[int, list[Run]] = {}
    for run in planned:
        out.setdefault(run.plan.world_size, []).append(run)
    return [Group(key=f"n{n}", backend="fake", world_size=n, runs=tuple(group))
            for n, group in out.items()]


# -------------------------------------------------------------------- timing a step
class Mark(NamedTuple):
    """One phase of a phase-synchronised step, time.perf_counter() seconds."""

    phase: str
    start: float
    issued: float
    """When the phase's Python returned (before the synchronise)."""
    end: float
    """When the synchronise after it returned."""


@contextmanager
def _phase(name: str, device: str, marks: list[Mark]) -> Iterator[None]:
    """A phase: a profiler range named zsim::<name> around its body and the synchronise
    that ends it, and its Mark."""
    with record_function(f"zsim::{name}"):
        start = time.perf_counter()
        yield
        issued = time.perf_counter()
        sync_device(device)
        end = time.perf_counter()
    marks.append(Mark(name, start, issued, end))


def phased_step(prep: training.Prepared, micro: list[tuple[torch.Tensor, torch.Tensor]],
                device: str) -> list[Mark]:
    """One training step (zsim.backend.training.train_step, its losses not read back)
    synchronised after each forward, backward and the optimizer step; the whole step is a
    "step" Mark."""
    sync_device(device)
    marks: list[Mark] = []
    with _phase("step", device, marks):
        training.train_step(prep, micro, phase=partial(_phase, device=device, marks=marks),
                            read_loss=False)
    return marks


def _wall_and_wait(marks: list[Mark], phase: str) -> tuple[float, float]:
    """A step's wall and synchronise-wait seconds in `phase` (summed over micro-batches;
    the step's wait is every phase's)."""
    wall = sum(m.end - m.start for m in marks if m.phase == phase)
    wait = sum(m.end - m.issued for m in marks if phase in ("step", m.phase))
    return wall, wait


class ClockSampler:
    """The GPU SM clock (torch.cuda.clock_rate, MHz; it needs pynvml) sampled from a
    thread while in the context; `available` is False where it cannot be read (CPU, no
    pynvml), and then nothing is sampled."""

    def __init__(self, device: str) -> None:
        self.samples: list[tuple[float, int]] = []
        self.available = False
        self._device = device
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if device.startswith("cuda"):
            try:
                torch.cuda.clock_rate(device)
                self.available = True
            except Exception:  # no pynvml or no NVML: no clock figures
                self.available = False

    def _sample(self) -> None:
        while not self._stop.wait(CLOCK_PERIOD_S):
            try:
                self.samples.append((time.perf_counter(),
                                     torch.cuda.clock_rate(self._device)))
            except Exception:  # NVML failed mid-run: keep the samples taken so far
                return

    def __enter__(self) -> ClockSampler:
        if self.available:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def median_in(self, windows: Iterable[tuple[float, float]]) -> float | str:
        """The median of the samples taken in any of `windows` ("" if none)."""
        spans = list(windows)
        got = [mhz for t, mhz in self.samples if any(a <= t <= b for a, b in spans)]
        return float(statistics.median(got)) if got else ""


# -------------------------------------------------------------------- one run
def measure_run(ctx: RankContext, run: Run, *, steps: Steps, out_dir: str) -> dict[str, Any]:
    """Build the run, time and profile it (see the module docstring), and append its rows
    to the tables in `out_dir` (FILES).

    Returns:
        Its summary: warm-up step and host issue times, profiled steps, events read, SM
        clock range.
    """
    with matmul_precision("tf32") if run.tf32 else nullcontext():
        result = _measure_run(ctx, run, steps)
    for key, (name, fields) in FILES.items():
        append_csv(Path(out_dir) / name, fields, result[key])
    return result["summary"][0]


def _measure_run(ctx: RankContext, run: Run, steps: Steps) -> dict[str, list[dict[str, Any]]]:
    device = ctx.device
    cuda = device.startswith("cuda")
    prep = programs.prepare(run.spec, run.plan, device=device, world_size=ctx.world_size)
    micro = training.batches(run.spec, run.plan, device=device, rank=ctx.rank, step=2)
    warm = [timed_step(prep, micro, device, phases=False) for _ in range(steps.warmup)]
    clock = ClockSampler(device)
    with clock:
        phased = [phased_step(prep, micro, device) for _ in range(steps.phased)]
    active = steps.profiled if warm[-1]["step_s"] < steps.long_step_s else 1
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    profiled = []
    with profile(activities=activities, record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=active, repeat=1)) as prof:
        for _ in range(1 + active):
            profiled.append(phased_step(prep, micro, device))
            prof.step()
    parse_start = time.perf_counter()
    events = prof.profiler.kineto_results.events()
    trace = read_trace(events, cuda)
    del prep, prof
    # The profiled steps are the last `active` ones; a profile holding another number of
    # steps (not expected) is read as far as it goes, and said so.
    note = ("" if len(trace.steps) == active else
            f"the profile holds {len(trace.steps)} steps, not {active}")
    common = {"run": run.name, "world_size": ctx.world_size, "device": device}
    out: dict[str, list[dict[str, Any]]] = {"phases": [], "classes": [], "gemms": [],
                                            "kernels": []}
    for k, windows in enumerate(trace.steps[:active]):
        marks = profiled[1 + k]
        for phase in (*PHASES, "step"):
            walls = [_wall_and_wait(m, phase) for m in phased]
            _, wait = _wall_and_wait(marks, phase)
            stats = phase_stats(trace, windows[phase])
            out["phases"].append({
                **common, "step": k, "phase": phase,
                "wall_s": statistics.median(w for w, _ in walls),
                "host_issue_s": statistics.median(w - s for w, s in walls),
                "sync_wait_s": statistics.median(s for _, s in walls),
                "sm_clock_mhz": clock.median_in((m.start, m.end) for ms in phased
                                                for m in ms if m.phase == phase
                                                or phase == "step"),
                "profiled_host_issue_s": stats["profiled_wall_s"] - wait,
                **stats, "note": note})
            out["classes"] += [{**common, "step": k, "phase": phase, **row}
                               for row in class_rows(trace, windows[phase])]
            if phase != "step":
                out["kernels"] += [{**common, "step": k, "phase": phase, **row}
                                   for row in kernel_rows(trace, windows[phase])]
                out["gemms"] += [{**common, "step": k, "phase": phase, **row}
                                 for row in gemm_rows(trace, windows[phase])]
    clock_mhz = [mhz for _, mhz in clock.samples]
    out["summary"] = [{
        "warmup_step_s": [round(w["step_s"], 6) for w in warm],
        "warmup_host_issue_s": [round(w["host_issue_s"], 6) for w in warm],
        "profiled_steps": active,
        "events": len(events), "parse_s": round(time.perf_counter() - parse_start, 2),
        "sm_clock_mhz": ({"min": min(clock_mhz), "median": statistics.median(clock_mhz),
                          "max": max(clock_mhz)} if clock_mhz else
                         "available, no sample" if clock.available else "unavailable")}]
    return out


# ---------------------------------------------------------------------- the command
FILES = {"phases": ("phases.csv", PHASE_FIELDS), "classes": ("kernel_classes.csv", CLASS_FIELDS),
         "gemms": ("gemm_shapes.csv", GEMM_FIELDS),
         "kernels": ("kernel_names.csv", KERNEL_FIELDS)}
"""Output tables: rows key -> (file, columns)."""


def append_csv(path: Path, fields: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """Append rows (the header first if the file is new); floats to 6 significant
    digits."""
    new = not path.is_file() or path.stat().st_size == 0
    with path.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{row[k]:.6g}" if isinstance(row.get(k), float)
                             else row.get(k, "") for k in fields})


NOTES = [
    "Runs are rank 0 of N on the fake process group (collectives are no-ops), built as "
    "the GPU report builds them (zsim.validation.gpu_runs); times have no communication.",
    "wall_s, host_issue_s, sync_wait_s, sm_clock_mhz: medians over unprofiled steps "
    "synchronised after each phase; host_issue_s = wall_s - sync_wait_s (the host's time "
    "to issue the phase, any wait inside it for a full launch queue or a hidden "
    "synchronise included).",
    "profiled_*: one profiled step (record_shapes=True, CPU+CUDA activities, after a "
    "profiled warm-up step): its wall includes the profiler's host overhead; device-busy "
    "is the union over all streams of kernels, memcpy and memset clipped to the phase; "
    "device activity belongs to the phase holding its midpoint.",
    "CPU (--quick): the 'kernels' are the outermost ATen op calls, the 'streams' threads.",
    "kernel classes: by name fragments (zsim.validation.kernel_trace._CLASS_MARKERS), first "
    "match wins: copies, attention, gemm, optimizer, elementwise, else other; FSDP2's "
    "fp32->bf16 parameter cast is an elementwise copy kernel.",
    "gemm_shapes: per ATen mm/addmm/bmm/baddbmm call, the device time of the kernels the "
    "profiler correlates with it; flops 2*m*k*n per call.",
]


def run_phases(out_dir: Path, *, quick: bool, budget_s: float, command: str = "") -> Path:
    """Profile the runs within `budget_s` seconds of wall time (see the module docstring).

    Returns:
        The phases.csv path.
    """
    start = time.time()
    end = start + budget_s
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (*(n for n, _ in FILES.values()), "runs.jsonl", "provenance.yaml"):
        (out_dir / name).unlink(missing_ok=True)

    def log(message: str) -> None:
        print(f"[{time.time() - start:6.1f} s] {message}", flush=True)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    planned = runs(quick, device)
    plan_groups = by_world_size(planned)
    steps = QUICK_STEPS if quick else FULL_STEPS
    failures: list[str] = []
    provenance: dict[str, Any] = {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": command, "environment": environment(), "quick": quick,
        "budget_s": budget_s, "steps": {"warmup": steps.warmup, "phased": steps.phased,
                                        "profiled": steps.profiled,
                                        "one_profiled_if_step_over_s": steps.long_step_s},
        "runs": [{"name": r.name, "world_size": r.plan.world_size, "published": r.published,
                  "model": r.spec.name, "plan": r.plan.label, "estimate_s": r.estimate_s}
                 for r in planned],
        "notes": NOTES}

    def write_provenance(state: str) -> None:
        results = read_jsonl(out_dir / "runs.jsonl")
        provenance.update(state=state, elapsed_s=round(time.time() - start, 1),
                          results=results, failures=failures)
        (out_dir / "provenance.yaml").write_text(yaml.safe_dump(provenance, sort_keys=False))

    write_provenance("running")
    log(f"{len(planned)} runs in {len(plan_groups)} processes, {budget_s:g} s budget")
    records = run_groups(plan_groups, partial(measure_run, steps=steps, out_dir=str(out_dir)),
                         until=end - STOP_S, stop_at=end - STOP_S,
                         log_path=out_dir / "runs.jsonl", log=log)
    failures += [f"{run.name} (n={group.world_size}): {record['note']}"
                 for run, group, record in records if record["status"] != "ok"]
    write_provenance("done")
    log(f"wrote {out_dir}")
    return out_dir / "phases.csv"
