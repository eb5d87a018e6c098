"""SimPy replay of a Schedule: streams as in-order processes, collectives on shared links,
compute slowed while collectives run, and a memory ledger.

Owns `run(schedule)`. Each stream of a rank is one SimPy process that takes its ops in issue
order (CUDA stream semantics: a stream is a FIFO queue, so it behaves as a capacity-1
resource served in arrival order), waits for each op's dependencies, then runs it (with
Schedule.collective_threads above 1, gloo's worker threads: that many processes take a
data-parallel collective stream's ops in turn, and a rank's process group runs at most
that many collectives at once):
compute kernels and transfers progress on the shared `Fabric`, so concurrent transfers on
one link slow each other and compute slows while a collective is active; every allocation
and free goes to the `MemoryPool`. Symmetric mode simulates one representative rank (all
ranks of a data-parallel job run the same schedule); rank-level mode simulates every rank
with per-rank compute jitter, and each collective starts only when all ranks of its group
have reached it. Imports only simpy and the standard library; never does I/O.
"""

from __future__ import annotations

import math
import random
from collections.abc import Generator, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import simpy

from zsim.engine.resources import Fabric, MemoryPool
from zsim.engine.trace import OpSpan, Trace, Wait
from zsim.schedule.ops import COLLECTIVE_KINDS, Op, Schedule

EVENTS_PER_OP = 64
"""Bound on the SimPy events one op of one rank may take. An op takes a handful (its
dependencies, latency, its task on the Fabric, the Fabric's timers as rates change: about
4 per op in practice); a run over the bound is an engine bug, never a slow plan."""


class EngineStalled(RuntimeError):
    """The engine went past its event budget without finishing the step: a livelock in
    the engine (no user input may cause one), named by the ops in flight."""

    def __init__(self, time_s: float, events: int, in_flight: list[str]) -> None:
        names = ", ".join(repr(n) for n in in_flight[:3]) or "none"
        super().__init__(f"engine stalled at t={time_s!r} s after {events} events "
                         f"(budget {EVENTS_PER_OP} per op); next to end: {names}")
        self.time_s = time_s
        self.in_flight = in_flight


@dataclass(frozen=True, slots=True, kw_only=True)
class Jitter:
    """Per-rank, per-kernel compute-time noise for rank-level mode (assumed, not
    calibrated): each compute kernel takes a lognormal factor (mean 1, coefficient of
    variation `cv`) times its nominal time, and with probability `straggler_prob` a rank
    is a straggler for the whole step, slower by `straggler_slowdown`."""

    cv: float = 0.02
    """Coefficient of variation of one kernel's time."""
    straggler_prob: float = 0.01
    """Probability that a rank is slow for a whole step."""
    straggler_slowdown: float = 0.2
    """Extra fraction of time a straggler takes on every kernel."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineRun:
    """What `run` returns: the trace and the ledger of rank 0."""

    trace: Trace
    memory: MemoryPool
    stopped_at_oom: bool = False
    """The run was asked to stop at the first allocation over HBM, and did."""


class _Collective:
    """One collective instance of one group in rank-level mode: a barrier, then the
    transfer shared by all members."""

    __slots__ = ("arrived", "done", "last_rank", "members", "release_s")

    def __init__(self, env: simpy.Environment, members: int) -> None:
        self.members = members
        self.arrived = 0
        self.last_rank = -1
        self.release_s = 0.0
        self.done = env.event()


class _Run:
    """State of one simulation."""

    def __init__(self, schedule: Schedule, *, num_ranks: int, rng: random.Random | None,
                 jitter: Jitter) -> None:
        self.schedule = schedule
        self.env = simpy.Environment()
        self.num_ranks = num_ranks
        links: dict[Hashable, float] = {}
        for name, bw in schedule.link_bytes_per_s.items():
            for r in range(num_ranks):
                links[(r, name)] = bw
        self.fabric = Fabric(self.env, links,
                             comm_compute_slowdown=schedule.comm_compute_slowdown,
                             compute_comm_slowdown=schedule.compute_comm_slowdown)
        self.memory = MemoryPool(schedule.hbm_bytes)
        for b in schedule.baseline:
            self.memory.alloc(b.name, b.category, b.bytes, pieces=b.pieces, pool="baseline",
                              time_s=0.0, where="model state")
        n = len(schedule.ops)
        waited = {d for op in schedule.ops for d in (*op.after, *op.issue_after)}
        self.end_ev: list[dict[int, simpy.Event]] = [
            {i: self.env.event() for i in sorted(waited)} for _ in range(num_ranks)]
        """Per rank, the end event of each op another op waits for."""
        needs_start = {d for op in schedule.ops for d in op.after_start}
        self.start_ev: list[dict[int, simpy.Event]] = [
            {i: self.env.event() for i in sorted(needs_start)} for _ in range(num_ranks)]
        self.start_s = [[0.0] * n for _ in range(num_ranks)]
        self.end_s = [[0.0] * n for _ in range(num_ranks)]
        self.spans: list[OpSpan] = []
        self.span_of: list[dict[int, OpSpan]] = [{} for _ in range(num_ranks)]
        """Per rank, each finished op's span by op index."""
        self.ends_after = [op.after + op.issue_after for op in schedule.ops]
        """Per op, the ops whose end it waits for (data dependencies and issue points)."""
        self.is_transfer = [op.is_transfer for op in schedule.ops]
        """Per op, Op.is_transfer (asked once per op, not once per op per rank)."""
        self.host_busy: dict[int, list[tuple[float, float]]] = {}
        self.waits: list[Wait] = []
        self.collectives: dict[tuple[int, str, int], _Collective] = {}
        self.threads: dict[tuple[int, str], simpy.PriorityResource] = {}
        """Per (rank, process group), its worker threads (collective_threads above 1),
        each taking the earliest-issued call waiting (gloo's queue: issue order)."""
        self.scale = self._draw_scales(rng, jitter)

    def _draw_scales(self, rng: random.Random | None, jitter: Jitter
                     ) -> list[list[float]] | None:
        if rng is None:
            return None
        n = len(self.schedule.ops)
        sigma = math.sqrt(math.log1p(jitter.cv ** 2))
        out = []
        for _ in range(self.num_ranks):
            slow = 1.0 + (jitter.straggler_slowdown
                          if rng.random() < jitter.straggler_prob else 0.0)
            out.append([slow * rng.lognormvariate(-sigma * sigma / 2, sigma)
                        for _ in range(n)])
        return out

    # ------------------------------------------------------------------ groups
    def _group_key(self, op: Op, rank: int) -> tuple[int, str, int]:
        d = self.schedule.dp_shard
        return (op.index, op.group, rank // d if op.group == "shard" else rank % d)

    def _group_members(self, op: Op, rank: int) -> list[int]:
        d = self.schedule.dp_shard
        if op.group == "shard":
            base = rank // d * d
            return [base + i for i in range(d) if base + i < self.num_ranks]
        return list(range(rank % d, self.num_ranks, d))

    # ------------------------------------------------------------------ processes
    def stream(self, rank: int, ops: Iterable[Op]) -> Generator[simpy.Event, Any, None]:
        """Run `ops` in order, each once its dependencies have ended (several of these
        processes sharing one iterator: a stream that runs that many ops at once)."""
        env, mem, fabric = self.env, self.memory, self.fabric
        ends, starts = self.end_ev[rank], self.start_ev[rank]
        start_s, end_s = self.start_s[rank], self.end_s[rank]
        span_of, ends_after, is_transfer = self.span_of[rank], self.ends_after, self.is_transfer
        ops_all = self.schedule.ops
        scale = None if self.scale is None else self.scale[rank]
        ledger = rank == 0  # ranks are alike in memory: the ledger follows rank 0
        pooled = self.schedule.collective_threads > 1
        prev: Op | None = None
        for op in ops:
            i = op.index
            t_free = env.now
            # An event not processed yet still has its callback list.
            pending = [ends[d] for d in ends_after[i] if ends[d].callbacks is not None]
            if op.after_start:
                pending += [starts[d] for d in op.after_start if starts[d].callbacks is not None]
            gate, gated_by = "", ""
            if pending:
                yield pending[0] if len(pending) == 1 else env.all_of(pending)
            # What held the op back last: its issue point, a data dependency, or its stream.
            last_t, last_dep, last_kind = -1.0, None, ""
            for d in op.after:
                if end_s[d] > last_t:
                    last_t, last_dep, last_kind = end_s[d], d, "data"
            for d in op.issue_after:
                if end_s[d] > last_t:
                    last_t, last_dep, last_kind = end_s[d], d, "issue"
            for d in op.after_start:
                if start_s[d] > last_t:
                    last_t, last_dep, last_kind = start_s[d], d, "issue"
            if last_dep is not None and last_t >= t_free:
                feeder = ops_all[last_dep]
                gate, gated_by = last_kind, feeder.name
                if last_kind == "data" and feeder.stream == op.stream \
                        and not is_transfer[last_dep]:
                    # Held by its own stream's preparation (an all-gather's copy-in):
                    # what held that back held this one.
                    span = span_of[last_dep]
                    gate, gated_by = span.gate, span.gated_by
            elif prev is not None:
                gate, gated_by = "stream", prev.name
            thread = None
            if pooled and op.is_collective:
                threads = self.threads.get((rank, op.group))
                if threads is None:
                    threads = self.threads[rank, op.group] = simpy.PriorityResource(
                        env, capacity=self.schedule.collective_threads)
                thread = threads.request(priority=i)
                ready_s = env.now
                yield thread
                if env.now > ready_s:
                    gate, gated_by = "stream", f"{op.group} group's worker threads"
            t0 = env.now
            if op.stream == "compute" and t0 > t_free and last_dep is not None:
                self._record_wait(rank, op, t_free, last_dep)
            # Start: memory effects, then the issue event other streams may wait on.
            start_s[i] = t0
            if ledger:
                for name in op.frees_at_start:
                    mem.free(name, time_s=t0)
                for b in op.allocs:
                    mem.alloc(b.name, b.category, b.bytes, pieces=b.pieces, pool=op.stream,
                              time_s=t0, where=op.name)
            if i in starts:
                starts[i].succeed()
            shared = False
            if is_transfer[i]:
                if op.is_collective and self.num_ranks > 1:
                    shared, waited_rank = yield from self._collective(rank, op)
                    if waited_rank is not None:
                        gate, gated_by = "straggler", f"rank {waited_rank}"
                else:
                    shared = yield from self._transfer(op, [rank])
                if thread is not None:
                    thread.resource.release(thread)
            elif op.stream == "host":
                yield env.timeout(op.compute_s)
                self.host_busy.setdefault(rank, []).append((t0, env.now))
            elif op.compute_s > 0:
                work = op.compute_s if scale is None else op.compute_s * scale[i]
                yield fabric.compute(rank, work, label=op.name)
            t1 = env.now
            end_s[i] = t1
            if ledger:
                for name in op.frees:
                    mem.free(name, time_s=t1)
            if i in ends:
                ends[i].succeed()
            # Positional, in OpSpan's field order (keywords cost a third of the span).
            span = OpSpan(i, op.name, op.kind, op.stream, rank, t0, t1, op.bus_bytes, op.link,
                          op.algorithm, shared, gate, gated_by)
            self.spans.append(span)
            span_of[i] = span
            prev = op

    def _collective(self, rank: int, op: Op
                    ) -> Generator[simpy.Event, Any, tuple[bool, int | None]]:
        """Run a collective of a multi-rank run; returns (link shared, rank waited for at
        the barrier)."""
        env = self.env
        members = self._group_members(op, rank)
        key = self._group_key(op, rank)
        found = self.collectives.get(key)
        inst = found if found is not None else _Collective(env, len(members))
        self.collectives[key] = inst
        inst.arrived += 1
        arrival = env.now
        if inst.arrived == inst.members:
            inst.last_rank = rank
            inst.release_s = arrival
            env.process(self._group_transfer(op, members, inst))
        result = yield inst.done
        waited = inst.last_rank if inst.release_s > arrival else None
        return bool(result), waited

    def _group_transfer(self, op: Op, members: list[int], inst: _Collective
                        ) -> Generator[simpy.Event, Any, None]:
        shared = yield from self._transfer(op, members)
        inst.done.succeed(shared)

    def _transfer(self, op: Op, members: list[int]) -> Generator[simpy.Event, Any, bool]:
        """Latency, then the bytes over every member's links; True if a link was shared.
        Collectives run on SMs and slow compute; copies run on copy engines."""
        env, fabric = self.env, self.fabric
        on_sms = op.is_collective
        for r in members if on_sms else ():
            fabric.comm_started(r)
        if op.latency_s > 0:
            yield env.timeout(op.latency_s)
        t0 = env.now
        shared = False
        if op.bus_bytes > 0:
            loads = tuple(((r, name), w) for r in members for name, w in op.link_loads)
            alone_s = op.bus_bytes / fabric.alone_rate(loads)
            yield fabric.transfer(loads, op.bus_bytes,
                                  ranks=tuple(members) if on_sms else (), label=op.name)
            shared = env.now - t0 > alone_s * (1 + 1e-6)
        for r in members if on_sms else ():
            fabric.comm_finished(r)
        return shared

    def trace(self, step_time_s: float, events: int) -> Trace:
        """What the run recorded, spans in time order."""
        spans = tuple(sorted(self.spans, key=lambda sp: (sp.start_s, sp.rank, sp.index)))
        return Trace(spans=spans, waits=tuple(self.waits), step_time_s=step_time_s,
                     memory_curve=tuple(self.memory.curve), events=events)

    def _record_wait(self, rank: int, op: Op, t_free: float, dep: int) -> None:
        """Attribute an idle interval of the compute stream: the part during which the
        host ran the offloaded optimizer step to the host, the rest to the transfer the
        op waited for last."""
        blocking = self.schedule.ops[dep]
        now = self.env.now
        host_s = sum(max(0.0, min(e, now) - max(s, t_free))
                     for s, e in self.host_busy.get(rank, ()))
        if blocking.stream == "host":
            # The host's share of the wait is the host's; before the host step began, the
            # op waited for what the step waited for.
            if host_s > 0:
                self._append_wait(rank, op, now - host_s, now, "host", "host",
                                  "host_optimizer")
            ends = self.end_s[rank]
            dep = max(blocking.after, key=lambda d: ends[d], default=None)
            if dep is None or not self.schedule.ops[dep].is_transfer:
                return
            blocking = self.schedule.ops[dep]
            now -= host_s
            host_s = 0.0
        while not blocking.is_transfer and blocking.stream not in ("compute", "host"):
            # A kernel on a collective's stream (the reduce-scatter's output cast): the
            # wait is on the transfer it finishes.
            ends = self.end_s[rank]
            dep = max(blocking.after, key=lambda d: ends[d], default=None)
            if dep is None:
                return
            blocking = self.schedule.ops[dep]
        if not blocking.is_transfer:
            return
        if host_s > 0:
            self._append_wait(rank, op, t_free, t_free + host_s, "host", "host",
                              "host_optimizer")
        span = self.span_of[rank][blocking.index]
        reason = {"issue": "prefetch_too_shallow", "stream": "queued",
                  "straggler": "straggler"}.get(span.gate, "critical_path")
        if (self.schedule.launch == "synchronous" and blocking.is_collective
                and not blocking.async_op):
            reason = "blocking_call"
        self._append_wait(rank, op, t_free + host_s, now, blocking.name, blocking.kind,
                          reason, shared=span.link_shared)

    def _append_wait(self, rank: int, op: Op, start_s: float, end_s: float, blocking: str,
                     kind: str, reason: str, *, shared: bool = False) -> None:
        self.waits.append(Wait(rank=rank, start_s=start_s, end_s=end_s, op=op.name,
                               blocking=blocking, collective=kind, reason=reason,
                               link_shared=shared))


def run(schedule: Schedule, *, num_ranks: int = 1, seed: int | None = None,
        jitter: Jitter | None = None, stop_at_oom: bool = False) -> EngineRun:
    """Simulate one optimizer step.

    Args:
        schedule: the ops of one rank (lowered by zsim.schedule.lower).
        num_ranks: 1 simulates the representative rank (symmetric mode); more simulates
            that many ranks, each collective waiting for all members of its group.
        seed: rank-level mode only: seeds the per-rank compute jitter (None: no jitter).
        jitter: distribution of the jitter (default `Jitter()`).
        stop_at_oom: end the run at the first allocation that takes rank 0's ledger over
            HBM (enough to say whether the plan fits, and where it does not).

    Returns:
        The trace (spans of every rank, compute waits, memory curve of rank 0) and rank 0's
        memory ledger. Step time is when the last op of any rank ends.
    """
    rng = random.Random(seed) if seed is not None and num_ranks > 1 else None
    state = _Run(schedule, num_ranks=num_ranks, rng=rng, jitter=jitter or Jitter())
    env, memory = state.env, state.memory
    streams = schedule.by_stream()
    for rank in range(num_ranks):
        for name, ops in streams.items():
            queue = iter(ops)
            lanes = schedule.collective_threads if name in COLLECTIVE_KINDS else 1
            for _ in range(lanes):
                env.process(state.stream(rank, queue))
    budget = EVENTS_PER_OP * max(1, len(schedule.ops)) * num_ranks
    events = 0
    step = env.step
    while True:
        try:
            step()
        except simpy.core.EmptySchedule:
            break
        events += 1
        if events > budget:
            raise EngineStalled(env.now, events, state.fabric.in_flight())
        if stop_at_oom and memory.oom is not None:
            return EngineRun(trace=state.trace(env.now, events), memory=state.memory,
                             stopped_at_oom=True)
    unfinished = [op.name for op in schedule.ops if op.index not in state.span_of[0]]
    assert not unfinished, f"deadlocked schedule, never ran: {unfinished[:3]}"
    step = max(max(row) for row in state.end_s) if schedule.ops else 0.0
    return EngineRun(trace=state.trace(step, events), memory=state.memory)
