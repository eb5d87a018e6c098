"""Trace records of one simulated step, and their Chrome/Perfetto JSON export.

Owns `OpSpan` (when an op ran, on which stream of which rank), `Wait` (an interval in
which the compute stream waited on a collective, with the reason), `Trace` (everything the
engine observed) and `chrome_trace_events`, which turns spans and the memory curve into the
Trace Event Format (Google, "Trace Event Format" document: "X" complete events, "C"
counter events, "M" metadata) that chrome://tracing and ui.perfetto.dev open. Pure data;
never writes files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from zsim.schedule.ops import STREAMS

US_PER_S = 1e6


class OpSpan(NamedTuple):
    """One op's execution. A NamedTuple rather than a frozen dataclass: the engine makes
    one for every op of every rank, and the dataclass's __init__ (an object.__setattr__ per
    field) took a fifth of the engine's time."""

    index: int
    """Op index in the schedule."""
    name: str
    kind: str
    stream: str
    rank: int
    start_s: float
    end_s: float
    bus_bytes: float = 0.0
    """Collectives: bytes each rank moved."""
    link: str = ""
    algorithm: str = ""
    """Collectives: the algorithm/protocol the library ran it with."""
    link_shared: bool = False
    """Collectives: the transfer shared its link with another one at some point."""
    gate: str = ""
    """What the op waited for before it started: "issue" (its prefetch/issue point),
    "stream" (the previous op on its stream), "data" (a data dependency) or "" (nothing)."""
    gated_by: str = ""
    """Name of the op it waited for last."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """The compute stream of `rank` sat idle from start_s to end_s waiting for `blocking`."""

    rank: int
    start_s: float
    end_s: float
    op: str
    """The compute op that could not start."""
    blocking: str
    """The collective (or host<->device copy) it waited for last."""
    collective: str
    """Its kind (all_gather, reduce_scatter, all_reduce, h2d, d2h), or "host" for the
    offloaded optimizer step."""
    reason: str
    """prefetch_too_shallow (the collective could not be issued earlier), queued (it waited
    behind another collective on its stream), critical_path (it needs the compute that just
    ran, e.g. gradients or the optimizer step), straggler (rank-level: another rank was
    late), blocking_call (a synchronous host issued it without async_op and waited for
    it) or host_optimizer (the offloaded CPU step; not communication)."""
    link_shared: bool
    """The collective shared its link, which made it slower than alone."""

    @property
    def wait_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """Everything the engine observed in one run."""

    spans: tuple[OpSpan, ...]
    waits: tuple[Wait, ...]
    step_time_s: float
    memory_curve: tuple[tuple[float, int], ...]
    """(time_s, allocated bytes) after every allocation and free (rank 0)."""
    events: int
    """SimPy events processed."""


def chrome_trace_events(trace: Trace, *, title: str) -> dict[str, Any]:
    """Trace Event Format JSON: one thread per (rank, stream), plus a memory counter.

    Timestamps are microseconds, as the format requires.
    """
    tid = {s: i for i, s in enumerate(STREAMS)}
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": title}}]
    for rank, stream in sorted({(sp.rank, tid[sp.stream]) for sp in trace.spans}):
        events.append({"name": "thread_name", "ph": "M", "pid": 0,
                       "tid": rank * len(STREAMS) + stream,
                       "args": {"name": f"rank {rank} {STREAMS[stream]}"}})
    for sp in trace.spans:
        args: dict[str, Any] = {"kind": sp.kind}
        if sp.bus_bytes:
            args.update(bus_bytes=sp.bus_bytes, link=sp.link, link_shared=sp.link_shared)
        if sp.algorithm:
            args["algorithm"] = sp.algorithm
        events.append({"name": sp.name, "cat": sp.kind, "ph": "X", "pid": 0,
                       "tid": sp.rank * len(STREAMS) + tid[sp.stream],
                       "ts": sp.start_s * US_PER_S, "dur": sp.duration_s * US_PER_S,
                       "args": args})
    for t, nbytes in trace.memory_curve:
        events.append({"name": "HBM allocated (GiB)", "ph": "C", "pid": 0,
                       "ts": t * US_PER_S, "args": {"allocated": nbytes / 2**30}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
