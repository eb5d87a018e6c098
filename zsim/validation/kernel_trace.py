"""Reading a torch.profiler trace of training steps by phase: which device activity (or, on
CPU, which outermost ATen op call) falls in each phase's windows, their union (device-busy
time), the busiest stream's idle gaps, the kernels by class (KERNEL_CLASSES, from their
names) and by launching ATen op, and every GEMM call's device time by input shape
(attributed by the profiler's correlation ids). The per-phase profile
(zsim.validation.gpu_phases) writes its tables from these. Imports torch.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.autograd import DeviceType

from zsim.calibration.gpu_host_sweep import KERNEL_LAUNCHES

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

KERNEL_NAME_CHARS = 200
"""Kernel names are cut to this many characters (templates make them long)."""

GAP_US = 10.0
"""Gaps on the compute stream longer than this are counted, microseconds."""

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
        elif name in KERNEL_LAUNCHES:
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
