"""Result of one simulated optimizer step, and its JSON-ready form.

Owns `Result` (frozen) and `summarize(schedule, run)`, which turns the engine's trace and
memory ledger into the figures the CLI, the planner and the calibration backend read:
step time, compute time, busy time per collective kind, exposed communication with the
reason for each wait, peak and reserved memory with what is live at the peak, the memory
curve, out-of-memory location, tokens/s, TFLOP/s per GPU and MFU. No pandas here.

Conventions: *busy* and *exposed* as zsim's vocabulary (zsim/__init__.py) states them.
MFU counts model FLOPs only (6N + attention), HFU counts the FLOPs executed
(recomputation included), as in tests/data/cases/published.yaml.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from zsim.engine.resources import MemoryPool
from zsim.engine.trace import OpSpan, Trace, Wait
from zsim.schedule.ops import COLLECTIVE_KINDS, TRANSFER_STREAMS, Schedule
from zsim.units import GiB

EVALUATED: tuple[str, ...] = ("simulated", "simulated until OOM", "closed form")
"""How a Result was obtained: the whole step simulated; the step simulated up to the
first allocation over HBM (asked for fit only), so no time figures; or not simulated
because the program's memory floor (zsim.schedule.lower.memory_floor_bytes) already
exceeds HBM, so no time figures and memory from the closed form."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageFigures:
    """One pipeline rank's figures (zsim.engine.pipeline_replay)."""

    rank: int
    """Pipeline rank (0 holds the embeddings, pp - 1 the loss)."""
    stages: tuple[int, ...]
    """The stages it holds (one, or one per virtual stage)."""
    step_time_s: float
    """When its last work of the step ends, seconds."""
    busy_s: float
    """Time its forwards and backwards ran, seconds."""
    bubble_fraction: float
    """Share of the step it is idle while the pipeline fills and drains."""
    in_flight_microbatches: float
    """The most micro-batches whose activations it holds at once (in stages' worth)."""
    peak_memory_bytes: int
    """Its peak allocated HBM."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """One simulated optimizer step of one plan (per GPU unless the name says otherwise).

    Time and throughput figures are None unless `evaluated` is "simulated": a step that
    did not run to its end has none."""

    model: str
    hardware: str
    plan_label: str
    evaluated: str = "simulated"
    """One of EVALUATED."""
    step_time_s: float | None
    """Wall time of one optimizer step (all micro-batches), seconds."""
    compute_time_s: float | None
    """Time the compute stream was busy (slowdown by concurrent collectives included)."""
    exposed_comm_s: float | None
    """Time the compute stream waited on collectives (and offload copies)."""
    exposed_by_reason_s: dict[str, float]
    """exposed_comm_s split by reason (see zsim.engine.trace.Wait.reason)."""
    exposed_by_kind_s: dict[str, float]
    """exposed_comm_s split by the collective kind waited for."""
    exposed_host_s: float | None
    """Time the compute stream waited on the offloaded CPU optimizer step."""
    host_busy_s: float | None
    """Host CPU optimizer time (offload), seconds."""
    waits: tuple[Wait, ...]
    """Every compute-stream wait on a collective, a copy or the host, in time order."""
    comm_busy_s: dict[str, float]
    """Busy time per collective kind and per copy direction (h2d, d2h: PCIe, offload),
    union of that stream's intervals (the kernels FSDP2 runs there around its
    collectives included), seconds."""
    comm_busy_total_s: float | None
    """Time at least one collective or copy was running, seconds."""
    comm_bus_bytes: dict[str, float]
    """Bytes each rank put on the wire (or PCIe) per collective kind / copy direction."""
    collective_calls: dict[str, int] = field(default_factory=dict)
    """Collective calls per step per rank, by kind."""
    collective_algorithms: dict[str, int] = field(default_factory=dict)
    """Collective calls per step per rank by "kind algorithm/protocol" (the library's
    choice for each, zsim.analytic.collectives)."""
    comm_bytes_by_link: dict[str, float] = field(default_factory=dict)
    """Bytes each GPU sends per step over NVLink ("intra_node") and over its NIC
    ("inter_node"): its collectives' bus bytes split as a ring splits them
    (Schedule.nic_share); empty without collectives."""
    comm_latency_share: float | None = None
    """Start-up latency of the step's collectives over their time each running alone
    (latency + bus bytes at the bottleneck link's rate): how latency-bound its
    communication is; None without collectives."""
    peak_memory_bytes: int
    """Peak allocated HBM (what torch.cuda.max_memory_allocated reports); until OOM, the
    level the first allocation over HBM reached; from the closed form, the floor."""
    reserved_memory_bytes: int | None
    """Peak reserved (torch.cuda.max_memory_reserved) of a steady-state step, from the
    step's allocations replayed on a model of the CUDA caching allocator
    (zsim.engine.allocator); None where not asked for (the planner ranks on allocated
    memory and skips the replay)."""
    memory_at_peak: dict[str, int]
    """Bytes live at the peak, by category."""
    peak_time_s: float | None
    peak_op: str
    """The op whose allocation made the peak ("" from the closed form)."""
    baseline_memory_bytes: int
    """Model state at rest (before and after the step)."""
    end_memory_bytes: int
    """Allocated bytes after the step (equals the baseline for a well-formed schedule)."""
    hbm_bytes: float
    phase_time_s: dict[str, float]
    """Compute-stream busy time by phase ("forward", "backward", "optimizer"; an offloaded
    optimizer step is host_busy_s instead), seconds; what the calibration backend times
    per phase."""
    time_to_loss_s: float | None
    """Wall time from the step's start to the end of the last forward kernel before the
    first backward one (the first micro-batch's loss), rank 0's: the forward's compute and
    every wait in it (blocking all-gathers of ZeRO-3 and FSDP1, TP's all-reduces), what a
    host times from the step's start to its loss. None for a pipeline, replayed without
    spans, and a step that did not run to its end."""
    phase_peak_bytes: dict[str, int]
    """Highest allocated bytes while a kernel of that phase ran (the backend's per-phase
    torch.cuda.max_memory_allocated)."""
    memory_curve: tuple[tuple[float, int], ...] = field(repr=False)
    """(time_s, allocated bytes) after every allocation and free."""
    oom: str | None
    """None, or where the ledger first exceeded HBM and why."""
    tokens_per_s: float | None
    """Job-wide training tokens per second."""
    tokens_per_s_per_gpu: float | None
    tflops_per_gpu: float | None
    """Model TFLOP/s per GPU (MFU numerator)."""
    mfu: float | None
    hfu: float | None
    world_size: int
    events: int
    """SimPy events processed (the benchmark's unit of work)."""
    num_ops: int
    step_time_p50_s: float | None = None
    """Rank-level mode: median step time over the sampled steps."""
    step_time_p99_s: float | None = None
    step_time_band_s: tuple[float, float] | None = None
    """Where the real step time lies given the profile's validation residuals for this
    kind of plan, widened where the plan is outside what they covered
    (zsim.spec.error_bands); None where the profile has none."""
    peak_memory_band_bytes: tuple[float, float] | None = None
    """Likewise for the peak allocated memory."""
    step_time_spread: float | None = None
    """How far apart the profile's validation runs scattered around their predictions
    for this kind of plan, relative (ErrorBands.spread): two predictions closer than
    this cannot be ranked by the evidence. None where the profile has no bands."""
    step_time_band_source: str | None = None
    """The evidence the bands come from and the command that made them (None: no band)."""
    step_time_band_extrapolated: tuple[str, ...] = ()
    """Why the step-time band is wider than its evidence's own range, one short reason
    per widening (e.g. "world 128 > 8 validated with communication ..."); empty inside
    the evidence's domain."""
    peak_memory_band_extrapolated: tuple[str, ...] = ()
    """Likewise for the peak memory band."""
    spans: tuple[OpSpan, ...] = field(default=(), repr=False)
    """Every op's execution (for the Chrome trace)."""
    notes: tuple[str, ...] = ()
    pipeline_stages: tuple[StageFigures, ...] = ()
    """With pipeline parallelism, every pipeline rank's figures (the Result's own are
    the worst rank's: the step ends with the last, the peak is the highest)."""

    @property
    def fits(self) -> bool:
        return self.oom is None

    @property
    def step_time_without_comm_s(self) -> float | None:
        """The step less the compute stream's waits on collectives (offload copies and
        the host stay in): what a run without communication (the fake process group)
        measures."""
        if self.step_time_s is None:
            return None
        return self.step_time_s - sum(self.exposed_by_kind_s.get(k, 0.0)
                                      for k in COLLECTIVE_KINDS)

    @property
    def simulated(self) -> bool:
        """The whole step ran in the engine: every figure is filled in."""
        return self.evaluated == "simulated"

    @property
    def trace(self) -> Trace:
        end_s = self.step_time_s if self.step_time_s is not None else max(
            (sp.end_s for sp in self.spans), default=0.0)
        return Trace(spans=self.spans, waits=self.waits, step_time_s=end_s,
                     memory_curve=self.memory_curve, events=self.events)

    def to_dict(self, *, curve: bool = False) -> dict[str, Any]:
        """JSON-ready summary: the keys `zsim simulate --format json` prints."""
        out: dict[str, Any] = {
            "model": self.model, "hardware": self.hardware, "plan_label": self.plan_label,
            "evaluated": self.evaluated, "fits": self.fits, "oom": self.oom,
            "step_time_s": self.step_time_s, "compute_time_s": self.compute_time_s,
            "exposed_comm_s": self.exposed_comm_s,
            "exposed_comm_by_reason_s": dict(self.exposed_by_reason_s),
            "exposed_comm_by_kind_s": dict(self.exposed_by_kind_s),
            "exposed_host_s": self.exposed_host_s, "host_busy_s": self.host_busy_s,
            "comm_busy_s": dict(self.comm_busy_s), "comm_busy_total_s": self.comm_busy_total_s,
            "comm_bus_bytes": dict(self.comm_bus_bytes),
            "collective_calls": dict(self.collective_calls),
            "collective_algorithms": dict(self.collective_algorithms),
            "comm_bytes_by_link": dict(self.comm_bytes_by_link),
            "comm_latency_share": self.comm_latency_share,
            "peak_memory_bytes": self.peak_memory_bytes,
            "reserved_memory_bytes": self.reserved_memory_bytes,
            "memory_at_peak": dict(self.memory_at_peak),
            "peak_op": self.peak_op, "peak_time_s": self.peak_time_s,
            "baseline_memory_bytes": self.baseline_memory_bytes,
            "hbm_bytes": self.hbm_bytes,
            "phase_time_s": dict(self.phase_time_s),
            "phase_peak_bytes": dict(self.phase_peak_bytes),
            "time_to_loss_s": self.time_to_loss_s,
            "tokens_per_s": self.tokens_per_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu, "hfu": self.hfu,
            "world_size": self.world_size,
            "step_time_p50_s": self.step_time_p50_s, "step_time_p99_s": self.step_time_p99_s,
            **_band("step_time_s", self.step_time_band_s),
            **_band("peak_memory_bytes", self.peak_memory_band_bytes),
            "step_time_spread": self.step_time_spread,
            "step_time_band_source": self.step_time_band_source,
            "step_time_band_extrapolated": list(self.step_time_band_extrapolated),
            "peak_memory_band_extrapolated": list(self.peak_memory_band_extrapolated),
            "top_waits": [
                {"op": w.op, "blocking": w.blocking, "collective": w.collective,
                 "reason": w.reason, "link_shared": w.link_shared, "wait_s": w.wait_s}
                for w in sorted(self.waits, key=lambda w: -w.wait_s)[:5]],
        }
        if self.pipeline_stages:
            out["pipeline_stages"] = [
                {"rank": st.rank, "stages": list(st.stages), "step_time_s": st.step_time_s,
                 "busy_s": st.busy_s, "bubble_fraction": st.bubble_fraction,
                 "in_flight_microbatches": st.in_flight_microbatches,
                 "peak_memory_bytes": st.peak_memory_bytes}
                for st in self.pipeline_stages]
        if curve:
            out["memory_curve"] = [list(p) for p in self.memory_curve]
        return out


def _union_s(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _phases(spans: list[OpSpan], curve: tuple[tuple[float, int], ...]
            ) -> tuple[dict[str, float], dict[str, int]]:
    """Busy time and peak allocated bytes per compute phase."""
    times = [t for t, _ in curve]
    busy: dict[str, float] = {}
    peak: dict[str, int] = {}
    for sp in spans:
        if sp.stream != "compute" or sp.kind not in ("forward", "backward", "optimizer"):
            continue
        busy[sp.kind] = busy.get(sp.kind, 0.0) + sp.duration_s
        # Changes stamped at the end time belong to the next op.
        lo, hi = bisect_left(times, sp.start_s), bisect_left(times, sp.end_s)
        # The level in force when the kernel started counts too.
        first = max(lo - 1, 0)
        level = max((b for _, b in curve[first:hi]), default=0)
        peak[sp.kind] = max(peak.get(sp.kind, 0), level)
    return busy, peak


def _to_loss_s(spans: list[OpSpan]) -> float | None:
    """End of the last forward compute span before the first backward one; None without
    a backward."""
    compute = [sp for sp in spans if sp.stream == "compute"]
    backward_s = min((sp.start_s for sp in compute if sp.kind == "backward"), default=None)
    if backward_s is None:
        return None
    return max((sp.end_s for sp in compute if sp.kind == "forward" and sp.end_s <= backward_s),
               default=None)


def _oom_message(memory: MemoryPool) -> str | None:
    o = memory.oom
    if o is None:
        return None
    return (f"OOM at {o.where}: allocating {o.buffer} ({o.category}) takes the ledger to "
            f"{o.allocated_bytes / GiB:.2f} GiB > {o.capacity_bytes / GiB:.2f} GiB HBM")


def summarize(schedule: Schedule, trace: Trace, memory: MemoryPool, *, model: str,
              hardware: str, plan_label: str, step_samples_s: list[float] | None = None,
              keep_spans: bool = True, stopped_at_oom: bool = False,
              reserved: bool = True) -> Result:
    """Reduce an engine run to a Result (rank 0's view; memory of rank 0). A run
    `stopped_at_oom` keeps its memory figures and has no time figures; without
    `reserved`, the allocator replay is skipped (reserved_memory_bytes None)."""
    spans0 = [sp for sp in trace.spans if sp.rank == 0]
    memory_fields = dict(
        model=model, hardware=hardware, plan_label=plan_label,
        peak_memory_bytes=memory.peak_bytes,
        reserved_memory_bytes=memory.reserved_bytes if reserved else None,
        memory_at_peak=dict(memory.peak_by_category), peak_time_s=memory.peak_time_s,
        peak_op=memory.peak_where,
        baseline_memory_bytes=sum(b.bytes for b in schedule.baseline),
        end_memory_bytes=memory.current_bytes, hbm_bytes=schedule.hbm_bytes,
        memory_curve=trace.memory_curve, oom=_oom_message(memory),
        world_size=schedule.world_size, events=trace.events, num_ops=len(schedule.ops),
        spans=trace.spans if keep_spans else (), notes=schedule.notes,
        **_collective_figures(schedule))
    if stopped_at_oom:
        return Result(evaluated="simulated until OOM", **_no_time_figures(),  # type: ignore[arg-type]
                      **memory_fields)
    compute = sum(sp.duration_s for sp in spans0 if sp.stream == "compute")
    busy: dict[str, float] = {}
    bus: dict[str, float] = {}
    # Each collective kind and copy direction has its own stream (named after it); its
    # busy time includes the kernels that prepare or finish its transfers there (FSDP2's
    # all-gather copy-in, the reduce-scatter output cast).
    # Tensor, context and expert parallelism's collectives have a stream each ("tp",
    # "cp", "ep"), counted under its name.
    for kind in TRANSFER_STREAMS:
        iv = [(sp.start_s, sp.end_s) for sp in spans0 if sp.stream == kind]
        if iv:
            busy[kind] = _union_s(iv)
            bus[kind] = sum(sp.bus_bytes for sp in spans0 if sp.stream == kind
                            and (sp.kind == kind or kind in ("tp", "cp", "ep")))
    comm_total = _union_s([(sp.start_s, sp.end_s) for sp in spans0
                           if sp.stream in TRANSFER_STREAMS])
    waits0 = [w for w in trace.waits if w.rank == 0]
    host_waits = [w for w in waits0 if w.collective == "host"]
    comm_waits = [w for w in waits0 if w.collective != "host"]
    by_reason: dict[str, float] = {}
    by_kind: dict[str, float] = {}
    for w in comm_waits:
        by_reason[w.reason] = by_reason.get(w.reason, 0.0) + w.wait_s
        by_kind[w.collective] = by_kind.get(w.collective, 0.0) + w.wait_s
    phase_time, phase_peak = _phases(spans0, trace.memory_curve)
    step = trace.step_time_s
    tokens_job = schedule.tokens_per_rank * schedule.world_size
    model_tflops = schedule.model_flops / step / 1e12 if step > 0 else 0.0
    p50 = p99 = None
    if step_samples_s:
        ordered = sorted(step_samples_s)
        p50 = _quantile(ordered, 0.5)
        p99 = _quantile(ordered, 0.99)
    return Result(
        step_time_s=step,
        compute_time_s=compute, exposed_comm_s=sum(w.wait_s for w in comm_waits),
        exposed_by_reason_s=by_reason, exposed_by_kind_s=by_kind,
        exposed_host_s=sum(w.wait_s for w in host_waits),
        host_busy_s=sum(sp.duration_s for sp in spans0 if sp.stream == "host"),
        waits=tuple(waits0),
        comm_busy_s=busy, comm_busy_total_s=comm_total, comm_bus_bytes=bus,
        phase_time_s=phase_time, phase_peak_bytes=phase_peak,
        time_to_loss_s=_to_loss_s(spans0),
        tokens_per_s=tokens_job / step if step > 0 else 0.0,
        tokens_per_s_per_gpu=schedule.tokens_per_rank / step if step > 0 else 0.0,
        tflops_per_gpu=model_tflops,
        mfu=model_tflops * 1e12 / schedule.peak_flop_per_s,
        hfu=schedule.hardware_flops / step / schedule.peak_flop_per_s if step > 0 else 0.0,
        step_time_p50_s=p50, step_time_p99_s=p99, **memory_fields)  # type: ignore[arg-type]


def _collective_figures(schedule: Schedule) -> dict[str, Any]:
    """Calls per step by kind and by algorithm, and the latency share of their time each
    running alone (from the schedule: the same whatever overlaps)."""
    calls: dict[str, int] = {}
    algorithms: dict[str, int] = {}
    by_link = {"intra_node": 0.0, "inter_node": 0.0}
    latency = alone = 0.0
    bandwidth = schedule.link_bytes_per_s
    for op in schedule.ops:
        if not op.is_collective or op.group_ranks <= 1:
            continue
        share = schedule.nic_share.get(op.group, 0.0)
        by_link["inter_node"] += op.bus_bytes * share
        by_link["intra_node"] += op.bus_bytes * (1.0 - share)
        calls[op.kind] = calls.get(op.kind, 0) + 1
        key = f"{op.kind} {op.algorithm}"
        algorithms[key] = algorithms.get(key, 0) + 1
        latency += op.latency_s
        alone += op.latency_s + op.bus_bytes * max(
            (w / bandwidth[link] for link, w in op.link_loads), default=0.0)
    return dict(collective_calls=calls, collective_algorithms=algorithms,
                comm_bytes_by_link=by_link if calls else {},
                comm_latency_share=latency / alone if alone > 0 else None)


def _no_time_figures() -> dict[str, object]:
    """The time and throughput fields of a Result whose step did not run to its end."""
    return dict(step_time_s=None, compute_time_s=None, exposed_comm_s=None,
                exposed_by_reason_s={}, exposed_by_kind_s={}, exposed_host_s=None,
                host_busy_s=None, waits=(), comm_busy_s={}, comm_busy_total_s=None,
                comm_bus_bytes={}, phase_time_s={}, phase_peak_bytes={},
                time_to_loss_s=None, tokens_per_s=None,
                tokens_per_s_per_gpu=None, tflops_per_gpu=None, mfu=None, hfu=None)


def _band(name: str, band: tuple[float, float] | None) -> dict[str, float | None]:
    low, high = band if band is not None else (None, None)
    return {f"{name}_low": low, f"{name}_high": high}


def closed_form_result(*, model: str, hardware: str, plan_label: str,
                       floor_bytes: dict[str, float], hbm_bytes: float, world_size: int,
                       notes: tuple[str, ...] = ()) -> Result:
    """The Result of a plan whose memory floor (the program's model state and the
    activations of one micro-batch, zsim.schedule.lower.memory_floor_bytes) exceeds HBM:
    it cannot fit, so it is not simulated."""
    by_cat = {c: math.ceil(v) for c, v in floor_bytes.items() if v > 0}
    total = sum(by_cat.values())
    acts = by_cat.get("activations", 0)
    gathered = by_cat.get("gathered_params", 0)
    state = total - acts - gathered
    parts = [f"model state {state / GiB:.2f} GiB"]
    if gathered:
        parts.append(f"gathered parameters {gathered / GiB:.2f} GiB")
    parts.append(f"activations of one micro-batch {acts / GiB:.2f} GiB")
    oom = (f"does not fit (closed form, not simulated): the program holds at least "
           f"{total / GiB:.2f} GiB at once ({' + '.join(parts)}) > {hbm_bytes / GiB:.2f} GiB "
           f"HBM")
    return Result(
        evaluated="closed form", model=model, hardware=hardware, plan_label=plan_label,
        peak_memory_bytes=total, reserved_memory_bytes=total, memory_at_peak=by_cat,
        peak_time_s=None, peak_op="", baseline_memory_bytes=state,
        end_memory_bytes=state, hbm_bytes=hbm_bytes, memory_curve=(), oom=oom,
        world_size=world_size, events=0, num_ops=0, notes=notes,
        **_no_time_figures())  # type: ignore[arg-type]


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
