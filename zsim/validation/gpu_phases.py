"""Where the time of a published FSDP2 step goes, phase by phase: how much of the forward,
the backward and the optimizer step keeps the GPU busy and how much waits on the host
(Python, FSDP2's hooks, kernel launches), and which kernels the busy time is made of.

    python -m zsim.validation.gpu_phases --out DIR [--budget-s 135] [--quick]

Runs a few of the runs of shared/cases/h200-fsdp2-runs.yaml, most wanted first (runs()):
each is built as zsim.validation.gpu_report builds it (zsim.backend.training.prepare,
rank 0 of N on the fake process group, so collectives are no-ops), one process per world
size, the runs of a world size in turn. A run does warm-up steps, then steps synchronised
after each phase (the wall, host-issue and synchronise-wait times of each phase, and the
GPU SM clock sampled meanwhile when torch.cuda.clock_rate works), then one or two such
steps under torch.profiler (CPU and CUDA activities, input shapes recorded), after one
profiled warm-up step. From the profiled steps, per phase: device-busy time (the union of
the device's kernel, memcpy and memset intervals over all streams, not their sum), idle
time, kernels, launches, ATen ops, time blocked in CUDA synchronise calls, the busiest
stream's ("compute stream's") idle gaps; device time by kernel class (KERNEL_CLASSES);
every GEMM ATen op's device time by input shape (its kernels, attributed by the
profiler's correlation ids). On CPU (--quick: a tiny model at world 8) the "kernels" are
the outermost ATen op calls (those no other ATen op makes; their union is the time the
host spends in ATen) and the "streams" the threads.

Outputs in DIR, appended as each run finishes (a killed command keeps the finished runs):
phases.csv (PHASE_FIELDS), kernel_classes.csv (CLASS_FIELDS), gemm_shapes.csv
(GEMM_FIELDS), kernel_names.csv (KERNEL_FIELDS: every kernel, by stream and launching op),
runs.jsonl (each run's status and seconds, its warm-up steps' time and
host issue time without synchronisation, events read, SM clock range) and provenance.yaml
(environment, command, budget, what ran, what was skipped; rewritten after each world
size). The budget: a world size's process gets a share of the time left (by the runs'
estimated seconds), starts a run only if its estimate (scaled by how the process's
earlier runs compared with theirs) fits in the share, and is killed at the budget's end
less STOP_S. Imports torch.
"""

from __future__ import annotations

import argparse
import csv
import gc
import math
import statistics
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import torch
import yaml
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from zsim.backend import programs, training
from zsim.backend.runner import RankContext, RankFailed, run_fake_rank, sync_device
from zsim.calibration import gpu_bench
from zsim.calibration.gpu_bench import (
    _LAUNCHES,
    Deadline,
    _autocast,
    append_jsonl,
    read_jsonl,
    timed_step,
)
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.validation import gpu_report
from zsim.validation.gpu_report import P7B, Run
from zsim.validation.report import backend_knobs

PHASES = ("forward", "backward", "optimizer")
"""The phases of a step, in order; the tables also have a "step" row (the whole step)."""

KERNEL_CLASSES = ("gemm", "attention", "elementwise", "copies", "optimizer", "other")
"""Kernel classes of kernel_classes.csv: GEMMs, SDPA, memory-bound elementwise and
reduction kernels (norms, casts, the loss, embedding), copies (memcpy, memset and FSDP2's
copy-in/out: foreach copy, chunk_cat, split_with_sizes_copy), the optimizer's foreach
kernels, the rest."""

_CLASS_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("copies", ("memcpy", "memset", "chunk_cat", "split_with_sizes_copy", "copyfunctor",
                "_foreach_copy")),
    ("attention", ("flash", "fmha", "efficient_attention", "attention", "sdpa")),
    ("gemm", ("gemm", "sm90_xmma", "cutlass", "nvjet", "aten::mm", "aten::addmm", "aten::bmm",
              "aten::baddbmm", "aten::linear", "aten::matmul")),
    ("optimizer", ("multi_tensor_apply", "aten::_foreach", "adam")),
    ("elementwise", ("elementwise", "reduce", "norm", "softmax", "cat", "copy", "index",
                     "embedding", "nll_loss", "fill", "scatter", "gather", "add", "mul", "div",
                     "sub", "silu", "sigmoid", "rsqrt", "sqrt", "pow", "mean", "sum", "neg",
                     "exp", "log", "where", "clamp", "cross_entropy", "aten::to")),
)
"""Lower-case name fragments of each class, tried in order (FlashAttention's names contain
"cutlass"; FSDP2's foreach copy is a multi_tensor_apply kernel); CUDA kernel names and
ATen op names (the CPU's "kernels") alike."""

GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
"""ATen ops whose kernels gemm_shapes.csv lists by input shape."""

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

KERNEL_NAME_CHARS = 200
"""Kernel names are cut to this many characters (templates make them long)."""

STOP_S = 8.0
"""Seconds kept at the budget's end for stopping a process and writing provenance."""
STARTUP_S = 8.0
"""A process's start-up (torch import, CUDA and process group initialisation), seconds
(18 runs in 4 processes of gpu_report on the H200 took 33 s beyond their runs)."""
GAP_US = 10.0
"""Gaps on the compute stream longer than this are counted, microseconds."""
CLOCK_PERIOD_S = 0.05
"""How often the SM clock is sampled during the phase-synchronised steps, seconds."""

P13B = ModelSpec(name="13b", num_layers=40, d_model=5120, num_heads=40, num_kv_heads=40,
                 ffn_hidden=13824, vocab_size=32000, max_seq_len=8192)
"""Llama-2-13B as in shared/cases/h200-fsdp2-runs.yaml (sequence 8192)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseRun:
    """A run to profile and what it is expected to take."""

    run: Run
    world_size: int
    estimate_s: float
    """Expected seconds on an H200: build, every step, profile and analysis (gpu_report's
    runs of the same models took 6-9 s for about ten steps)."""


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


def runs(quick: bool, device_type: str) -> list[PhaseRun]:
    """The runs, most wanted first, their specs with the device's kernel knobs: those
    gpu_report defines taken from it, 7b_n8 and 13b_n128_mb1 added; the CPU-offloaded
    run last (profiled after the others, 2026-12-01)."""
    known = {r.name: r for g in gpu_report.groups(quick, device_type) for r in g.runs}
    if quick:
        return [PhaseRun(run=known["tiny_n8"], world_size=8, estimate_s=5.0)]
    knobs = backend_knobs(device_type)
    common = {"micro_batch": 1, "reduce_dtype": "fp32"}
    p7b = Run(name="7b_n8", spec=replace(P7B, **knobs), published="7b_n8",
              plan=Plan.for_strategy("fsdp", gpus=8, seq_len=4096, **common))
    p13b = Run(name="13b_n128_mb1", spec=replace(P13B, **knobs), published="13b_n128_mb1",
               plan=Plan.for_strategy("fsdp", gpus=128, seq_len=8192, **common))
    return [PhaseRun(run=known["1p3b_n8"], world_size=8, estimate_s=12.0),
            PhaseRun(run=known["1p3b_n64"], world_size=64, estimate_s=12.0),
            PhaseRun(run=p7b, world_size=8, estimate_s=14.0),
            PhaseRun(run=p13b, world_size=128, estimate_s=26.0),
            PhaseRun(run=known["1p3b_n8_ac"], world_size=8, estimate_s=12.0),
            PhaseRun(run=known["1p3b_n8_raf0"], world_size=8, estimate_s=10.0),
            PhaseRun(run=known["1p3b_n8_fp32"], world_size=8, estimate_s=14.0),
            # Its forward is 30% longer than zsim's: the profile should say where.
            PhaseRun(run=known["1p3b_n8_offload"], world_size=8, estimate_s=20.0)]


def by_world_size(planned: list[PhaseRun]) -> list[tuple[int, list[PhaseRun]]]:
    """The runs grouped by world size (one process each), the groups in the order of
    their first run, the runs in their given order."""
    out: dict[int, list[PhaseRun]] = {}
    for p in planned:
        out.setdefault(p.world_size, []).append(p)
    return list(out.items())


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
    """One training step (gpu_bench.timed_step's, with phases) synchronised after each
    forward, backward and the optimizer step; the whole step is a "step" Mark."""
    sync_device(device)
    marks: list[Mark] = []
    with _phase("step", device, marks):
        for i, (tokens, labels) in enumerate(micro):
            last = i == len(micro) - 1
            with prep.sync(last):
                with _phase("forward", device, marks), _autocast(prep, device):
                    loss = prep.model(tokens, labels)
                with _phase("backward", device, marks):
                    prep.backward(loss, last)
        with _phase("optimizer", device, marks):
            prep.step()
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


# ----------------------------------------------------------------- reading a profile
class Span(NamedTuple):
    """An interval of profiler time (microseconds since the trace's start)."""

    start: float
    end: float
    name: str
    lane: int
    """The CUDA stream of a device activity, the thread of a CPU event."""
    op: str = ""
    """A device activity: the innermost ATen op that launched it ("" when none did:
    memcpys of the process group, the profiler's own); on CPU the op itself."""


def union_us(spans: Iterable[tuple[float, float]]) -> float:
    """Length of the union of intervals."""
    ordered = sorted(spans)
    if not ordered:
        return 0.0
    return max(end for _, end in ordered) - ordered[0][0] - sum(gaps_us(ordered))


def gaps_us(spans: Iterable[tuple[float, float]]) -> list[float]:
    """The idle gaps between the first start and the last end of intervals."""
    out = []
    reach = None
    for start, end in sorted(spans):
        if reach is not None and start > reach:
            out.append(start - reach)
        reach = end if reach is None else max(reach, end)
    return out


def kernel_class(name: str) -> str:
    """The KERNEL_CLASSES class of a CUDA kernel or ATen op name."""
    low = name.lower()
    for cls, markers in _CLASS_MARKERS:
        if any(m in low for m in markers):
            return cls
    return "other"


def gemm_flops(op: str, shapes: list[list[int]]) -> float:
    """2*m*k*n (times the batch) of a GEMM op from its recorded input shapes (0 when
    the shapes are not those of the op)."""
    dims = [s for s in shapes if len(s) >= 2]
    if op in ("aten::mm", "aten::addmm") and len(dims) >= 2 and len(dims[-2]) == 2:
        (m, k), (_, n) = dims[-2], dims[-1][-2:]
        return 2.0 * m * k * n
    if op in ("aten::bmm", "aten::baddbmm") and len(dims) >= 2 and len(dims[-2]) == 3:
        (b, m, k), n = dims[-2], dims[-1][-1]
        return 2.0 * b * m * k * n
    return 0.0


class GemmCall(NamedTuple):
    """One call of a GEMM ATen op."""

    start: float
    op: str
    shapes: list[list[int]]
    device_us: float
    """Its kernels' summed durations (CPU: the call's own time)."""
    kernels: int
    kernel: str
    """Its longest kernel's name (CPU: the op's)."""


@dataclass(frozen=True, slots=True)
class Trace:
    """What one profile holds, sorted out."""

    steps: list[dict[str, list[tuple[float, float]]]]
    """Per profiled step: phase (and "step") -> its windows."""
    activity: list[Span]
    """Device activity (CUDA kernels, memcpy, memset); on CPU the outermost ATen op
    calls."""
    aten: list[float]
    """Start times of every ATen op call (nested ones included)."""
    launches: list[float]
    """Start times of kernel launch calls."""
    blocking: list[Span]
    """CUDA synchronise calls on the host."""
    gemms: list[GemmCall]


_CUDA_SYNC_RECORDS = ("Stream ", "Event ", "Context ", "Device ")
"""Names of the device-side records of CUDA synchronisation (only with the profiler's
enable_cuda_sync_events, off by default): no device work."""


def read_trace(events: list[Any], cuda: bool) -> Trace:
    """Sort a profile's raw events (the _KinetoEvents of torch.profiler's kineto_results,
    read directly: building FunctionEvents took about 130 us per event here) into a
    Trace. A device event's linked correlation id is that of the innermost ATen op that
    launched it."""
    base = min((e.start_ns() for e in events), default=0)
    # record_function ranges (this module's, FSDP2's, the optimizer's, the profiler's
    # steps) show on the device's timeline too, spanning their kernels and the gaps
    # between them: they are no device work.
    annotations = {e.name() for e in events
                   if e.device_type() == DeviceType.CPU and e.is_user_annotation()}
    windows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    device: list[tuple[Span, int]] = []
    ops: list[tuple[Span, Any]] = []
    launches: list[float] = []
    blocking: list[Span] = []
    for e in events:
        name = e.name()
        start = (e.start_ns() - base) * 1e-3
        span = Span(start, start + e.duration_ns() * 1e-3, name, e.start_thread_id())
        if e.device_type() != DeviceType.CPU:
            if (cuda and not e.is_user_annotation() and name not in annotations
                    and not name.startswith(_CUDA_SYNC_RECORDS)):
                # Kernel names come demangled from kineto; any that do not are here.
                device.append((span._replace(name=torch._C._demangle(name) if
                                             name.startswith("_Z") else name,
                                             lane=e.device_resource_id()),
                               e.linked_correlation_id()))
        elif name.startswith("zsim::"):
            windows[name.removeprefix("zsim::")].append((span.start, span.end))
        elif name.startswith("aten::"):
            ops.append((span, e))
        elif name in _LAUNCHES:
            launches.append(start)
        elif "Synchronize" in name:
            blocking.append(span)
    op_names = {e.correlation_id(): s.name for s, e in ops}
    calls = {e.correlation_id(): GemmCall(s.start, s.name, [list(x) for x in e.shapes()],
                                          0.0 if cuda else s.end - s.start, 0 if cuda else 1,
                                          "" if cuda else s.name)
             for s, e in ops if s.name in GEMM_OPS}
    if cuda:
        activity = [s._replace(op=op_names.get(link, "")) for s, link in device]
        launched: dict[int, list[Span]] = defaultdict(list)
        for s, link in device:
            if link in calls:
                launched[link].append(s)
        for link, spans in launched.items():
            longest = max(spans, key=lambda s: s.end - s.start)
            calls[link] = calls[link]._replace(device_us=sum(s.end - s.start for s in spans),
                                               kernels=len(spans), kernel=longest.name)
    else:
        activity = [s._replace(op=s.name) for s in _outermost([s for s, _ in ops])]
    steps = []
    for s in sorted(windows.get("step", [])):
        inside = {p: [w for w in windows.get(p, []) if s[0] <= w[0] and w[1] <= s[1]]
                  for p in PHASES}
        steps.append({"step": [s], **inside})
    return Trace(steps=steps, activity=activity, aten=[s.start for s, _ in ops],
                 launches=launches, blocking=blocking, gemms=list(calls.values()))


def _outermost(ops: list[Span]) -> list[Span]:
    """The ATen op calls that no other ATen op call (on their thread) encloses."""
    out: list[Span] = []
    ends: dict[int, float] = {}
    for s in sorted(ops, key=lambda s: (s.lane, s.start, -s.end)):
        if s.start >= ends.get(s.lane, float("-inf")):
            out.append(s)
            ends[s.lane] = s.end
    return out


def _within(t: float, windows: list[tuple[float, float]]) -> bool:
    return any(a <= t <= b for a, b in windows)


def _clipped(spans: Iterable[Span], windows: list[tuple[float, float]]) -> list[Span]:
    """The spans whose midpoint lies in a window, clipped to it."""
    out = []
    for s in spans:
        mid = (s.start + s.end) / 2
        for a, b in windows:
            if a <= mid <= b:
                out.append(s._replace(start=max(s.start, a), end=min(s.end, b)))
                break
    return out


def phase_stats(trace: Trace, windows: list[tuple[float, float]]) -> dict[str, Any]:
    """phases.csv's profiled figures of one phase (windows: its profiler ranges)."""
    wall = sum(b - a for a, b in windows)
    act = _clipped(trace.activity, windows)
    busy = union_us((s.start, s.end) for s in act)
    lanes: dict[int, list[Span]] = defaultdict(list)
    for s in act:
        lanes[s.lane].append(s)
    out: dict[str, Any] = {
        "profiled_wall_s": wall * 1e-6, "device_busy_s": busy * 1e-6,
        "device_idle_s": (wall - busy) * 1e-6, "busy_fraction": busy / wall if wall else "",
        "kernels": len(act), "launches": sum(_within(t, windows) for t in trace.launches),
        "aten_ops": sum(_within(t, windows) for t in trace.aten),
        "blocked_s": 1e-6 * sum(s.end - s.start for s in _clipped(trace.blocking, windows)),
        "streams": len(lanes), "lead_s": "", "tail_s": "", "compute_stream": "",
        "compute_busy_s": "", "compute_idle_s": "", "compute_gaps_over_10us": "",
        "compute_idle_over_10us_s": ""}
    if not act:
        return out
    out["lead_s"] = 1e-6 * sum(min((s.start for s in act if a <= s.start <= b), default=b) - a
                               for a, b in windows)
    out["tail_s"] = 1e-6 * sum(b - max((s.end for s in act if a <= s.end <= b), default=a)
                               for a, b in windows)
    lane, spans = max(lanes.items(),
                      key=lambda kv: union_us((s.start, s.end) for s in kv[1]))
    gaps = gaps_us((s.start, s.end) for s in spans)
    big = [g for g in gaps if g > GAP_US]
    out |= {"compute_stream": lane,
            "compute_busy_s": 1e-6 * union_us((s.start, s.end) for s in spans),
            "compute_idle_s": 1e-6 * sum(gaps), "compute_gaps_over_10us": len(big),
            "compute_idle_over_10us_s": 1e-6 * sum(big)}
    return out


def class_rows(trace: Trace, windows: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """kernel_classes.csv's figures of one phase, one dict per class."""
    act = _clipped(trace.activity, windows)
    by_class: dict[str, list[Span]] = defaultdict(list)
    for s in act:
        by_class[kernel_class(s.name)].append(s)
    rows = []
    for cls in KERNEL_CLASSES:
        spans = by_class.get(cls, [])
        per_name: Counter[str] = Counter()
        for s in spans:
            per_name[s.name] += s.end - s.start
        top = "; ".join(f"{n[:100]}: {us * 1e-6:.4g}" for n, us in per_name.most_common(3))
        rows.append({"kernel_class": cls, "kernels": len(spans),
                     "device_s": 1e-6 * sum(s.end - s.start for s in spans),
                     "busy_s": 1e-6 * union_us((s.start, s.end) for s in spans),
                     "top_kernels": top})
    return rows


def kernel_rows(trace: Trace, windows: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """kernel_names.csv's figures of one phase: one dict per (stream, launching ATen op,
    kernel name), costliest first."""
    groups: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    for s in _clipped(trace.activity, windows):
        groups[s.lane, s.op, s.name].append(s.end - s.start)
    rows = [{"stream": lane, "aten_op": op, "kernel": name[:KERNEL_NAME_CHARS],
             "kernel_class": kernel_class(name), "calls": len(us),
             "device_s": 1e-6 * sum(us)}
            for (lane, op, name), us in groups.items()]
    return sorted(rows, key=lambda r: (-r["device_s"], r["stream"], r["aten_op"],
                                       r["kernel"]))


def gemm_rows(trace: Trace, windows: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """gemm_shapes.csv's figures of one phase, one dict per (op, shapes)."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for c in trace.gemms:
        if not _within(c.start, windows):
            continue
        text = str(c.shapes)
        g = groups.setdefault((c.op, text), {"op": c.op, "shapes": text, "calls": 0,
                                             "kernels": 0, "device_s": 0.0, "flops": 0.0,
                                             "names": Counter()})
        g["calls"] += 1
        g["kernels"] += c.kernels
        g["device_s"] += c.device_us * 1e-6
        g["flops"] += gemm_flops(c.op, c.shapes)
        if c.kernel:
            g["names"][c.kernel[:160]] += c.device_us
    rows = []
    for g in sorted(groups.values(), key=lambda g: -g["device_s"]):
        names: Counter[str] = g.pop("names")
        top = names.most_common(1)
        rows.append({**g, "kernel": top[0][0] if top else "",
                     "tflops": g["flops"] / g["device_s"] / 1e12
                     if g["device_s"] and g["flops"] else ""})
    return rows


# -------------------------------------------------------------------- one run
def measure_run(ctx: RankContext, run: Run, steps: Steps) -> dict[str, list[dict[str, Any]]]:
    """Build the run, time and profile it (see the module docstring).

    Returns:
        Rows for "phases", "classes", "gemms" and "kernels", and "summary" (one dict).
    """
    with gpu_bench.matmul_precision("tf32") if run.tf32 else nullcontext():
        return _measure_run(ctx, run, steps)


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


# ----------------------------------------------------------------- in the process
@dataclass(frozen=True, slots=True, kw_only=True)
class GroupJob:
    """What a world size's process runs."""

    runs: tuple[PhaseRun, ...]
    steps: Steps
    deadline: Deadline
    """When the process's share of the budget ends: no run starts that would not fit."""
    out_dir: str


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


def group_rank(ctx: RankContext, job: GroupJob) -> int:
    """Rank function (fake process group): the job's runs in turn, each one's rows
    appended to the tables and its status to runs.jsonl as it ends (a failure or a skip
    recorded in its place). Returns the number of runs measured."""
    out = Path(job.out_dir)
    ratio = 1.0
    done = 0
    for planned in job.runs:
        start = time.time()
        need = planned.estimate_s * ratio
        status: dict[str, Any] = {"run": planned.run.name, "world_size": ctx.world_size}
        if not job.deadline.allows(need):
            status |= {"status": "skipped",
                       "note": f"skipped: {need:.0f} s needed, "
                               f"{max(job.deadline.left_s(), 0):.0f} s left in its share"}
        else:
            try:
                result = measure_run(ctx, planned.run, job.steps)
                for key, (name, fields) in FILES.items():
                    append_csv(out / name, fields, result[key])
                status |= {"status": "ok", **result["summary"][0]}
                ratio = max(ratio, (time.time() - start) / planned.estimate_s)
                done += 1
            except Exception as e:  # one failed run must not end the process
                status |= {"status": "error",
                           "note": f"error: {type(e).__name__}: {e} | "
                                   + traceback.format_exc(limit=-4).replace("\n", " ")}
        status["seconds"] = round(time.time() - start, 2)
        append_jsonl(str(out / "runs.jsonl"), status)
        print(f"  [n={ctx.world_size}] {planned.run.name}: {status['status']} "
              f"({status['seconds']} s)", flush=True)
        gc.collect()
        if ctx.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return done


# ---------------------------------------------------------------------- the command
NOTES = [
    "Runs are rank 0 of N on the fake process group (collectives are no-ops), built as "
    "zsim.validation.gpu_report builds them; times have no communication.",
    "wall_s, host_issue_s, sync_wait_s, sm_clock_mhz: medians over unprofiled steps "
    "synchronised after each phase; host_issue_s = wall_s - sync_wait_s (the host's time "
    "to issue the phase, any wait inside it for a full launch queue or a hidden "
    "synchronise included).",
    "profiled_*: one profiled step (record_shapes=True, CPU+CUDA activities, after a "
    "profiled warm-up step): its wall includes the profiler's host overhead; device-busy "
    "is the union over all streams of kernels, memcpy and memset clipped to the phase; "
    "device activity belongs to the phase holding its midpoint.",
    "CPU (--quick): the 'kernels' are the outermost ATen op calls, the 'streams' threads.",
    "kernel classes: by name fragments (zsim.validation.gpu_phases._CLASS_MARKERS), first "
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
    groups = by_world_size(planned)
    steps = QUICK_STEPS if quick else FULL_STEPS
    failures: list[str] = []
    provenance: dict[str, Any] = {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": command, "environment": gpu_report.environment(), "quick": quick,
        "budget_s": budget_s, "steps": {"warmup": steps.warmup, "phased": steps.phased,
                                        "profiled": steps.profiled,
                                        "one_profiled_if_step_over_s": steps.long_step_s},
        "runs": [{"name": p.run.name, "world_size": p.world_size,
                  "published": p.run.published, "model": p.run.spec.name,
                  "plan": p.run.plan.label, "estimate_s": p.estimate_s} for p in planned],
        "notes": NOTES}

    def write_provenance(state: str) -> None:
        results = read_jsonl(out_dir / "runs.jsonl")
        provenance.update(state=state, elapsed_s=round(time.time() - start, 1),
                          results=results, failures=failures)
        (out_dir / "provenance.yaml").write_text(yaml.safe_dump(provenance, sort_keys=False))

    write_provenance("running")
    log(f"{len(planned)} runs in {len(groups)} processes, {budget_s:g} s budget")
    for i, (world_size, group) in enumerate(groups):
        cost = [STARTUP_S + sum(p.estimate_s for p in g) for _, g in groups[i:]]
        left = end - STOP_S - time.time()
        share = Deadline(time.time() + left * cost[0] / sum(cost))
        if not share.allows(STARTUP_S + min(p.estimate_s for p in group)):
            failures.append(f"n={world_size}: skipped, time budget spent")
            for p in group:
                append_jsonl(str(out_dir / "runs.jsonl"),
                             {"run": p.run.name, "world_size": world_size,
                              "status": "skipped", "note": "skipped: time budget spent"})
            continue
        log(f"n={world_size}: {', '.join(p.run.name for p in group)} "
            f"({share.left_s():.0f} s share)")
        job = GroupJob(runs=tuple(group), steps=steps, deadline=share, out_dir=str(out_dir))
        try:
            run_fake_rank(group_rank, job, world_size=world_size,
                          timeout_s=max(end - STOP_S - time.time(), 1.0))
        except RankFailed as e:
            failures.append(f"n={world_size}: process failed: {str(e)[-1500:]}")
            log(f"n={world_size} failed: {str(e)[-300:]}")
            # Runs the process never reported on (it died or was stopped in them).
            reported = {r["run"] for r in read_jsonl(out_dir / "runs.jsonl")}
            for p in group:
                if p.run.name not in reported:
                    append_jsonl(str(out_dir / "runs.jsonl"),
                                 {"run": p.run.name, "world_size": world_size,
                                  "status": "missing", "note": "its process failed"})
        write_provenance("running")
    write_provenance("done")
    log(f"wrote {out_dir}")
    return out_dir / "phases.csv"


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m zsim.validation.gpu_phases",
        description="Per-phase GPU-busy vs host-bound time and kernel classes of published "
                    "FSDP2 runs (rank 0 of N on the fake process group), under "
                    "torch.profiler.")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model at world 8 (a smoke test; runs on CPU)")
    parser.add_argument("--budget-s", type=float, default=135.0,
                        help="wall-clock budget, seconds, from the end of the imports "
                             "(default 135)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    print(run_phases(args.out, quick=args.quick, budget_s=args.budget_s,
                     command=" ".join([parser.prog, *argv])))
    return 0


if __name__ == "__main__":
    # Through the importable module, so the rank function and job pickled into the
    # spawned processes name zsim.validation.gpu_phases, not __main__.
    from zsim.validation.gpu_phases import main as module_main

    sys.exit(module_main())
