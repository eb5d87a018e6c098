"""Engine resources: shared-rate servers (links, SMs) and the HBM memory ledger.

Owns `Fabric`, which runs transfers and compute kernels as fluid tasks whose rates are
re-evaluated at every start and finish (processor sharing: k transfers on one link each
get bandwidth / k; a compute kernel runs at 1 - comm_compute_slowdown of its rate while a
collective is active on its rank, and a collective at 1 - compute_comm_slowdown of its
rate while a compute kernel runs on one of its ranks), and `MemoryPool`, a counter with
peak, per-category breakdown at the peak, the memory curve and out-of-memory detection.
Imports only simpy.

Never a blocking `simpy.Container` for memory: it would deadlock silently and end the run
early with a short, wrong step time (STYLE.md section 5). The pool records the first
allocation that exceeds HBM and the simulation carries on, so the step time of a plan that
does not fit is still reported next to the OOM location.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import simpy


class _Task:
    """One fluid task: a transfer over links, or a compute kernel on a rank's SMs."""

    __slots__ = ("done", "finish_s", "keys", "label", "rank", "ranks", "rate", "remaining",
                 "weights")

    def __init__(self, done: simpy.Event, work: float, keys: tuple[Hashable, ...],
                 weights: tuple[float, ...], rank: Hashable | None,
                 ranks: tuple[Hashable, ...], label: str) -> None:
        self.done = done
        self.ranks = ranks
        """A transfer's ranks whose compute slows it."""
        self.remaining = work
        self.keys = keys
        self.weights = weights
        self.rank = rank
        self.label = label
        """The op the task belongs to (named when the engine stalls)."""
        self.rate = 0.0
        self.finish_s = float("inf")
        """When the task ends at its current rate: the clock value of its timer."""


class Fabric:
    """Processor-sharing server for every link and every rank's compute.

    Links are keyed by any hashable ((rank, "inter_node") for example). A transfer loads
    each of its links with `weight` link bytes per unit of work; on a link shared by k
    transfers each gets capacity / k, and a transfer progresses at the smallest
    share / weight over its links. Compute work is measured in seconds at full rate.

    Completion is decided by the clock, not by the work left: whenever rates change each
    task gets the clock value at which it ends (`now + remaining / rate`, the float SimPy
    computes for the timer), and a task ends when the clock reaches that value. A task
    whose remaining time is below the clock's resolution (at t = 1e7 s a step is 2e-9 s)
    thus ends at the next timer, at `now`, instead of being re-timed forever with
    `remaining` left over; every timer that is not superseded ends at least one task, so
    the events per task are bounded whatever the clock value and the task size.
    """

    def __init__(self, env: simpy.Environment, link_bytes_per_s: dict[Hashable, float], *,
                 comm_compute_slowdown: float, compute_comm_slowdown: float = 0.0) -> None:
        self._env = env
        self._capacity = dict(link_bytes_per_s)
        self._slowdown = comm_compute_slowdown
        self._comm_slowdown = compute_comm_slowdown
        self._tasks: list[_Task] = []
        self._comm_active: dict[Hashable, int] = {}
        self._last_s = 0.0
        self._generation = 0
        self._pending_at: float | None = None

    def transfer(self, loads: tuple[tuple[Hashable, float], ...], work_bytes: float, *,
                 ranks: tuple[Hashable, ...] = (), label: str = "") -> simpy.Event:
        """Start moving `work_bytes` over the links in `loads` ((key, weight) pairs); the
        event fires when done. Compute running on any of `ranks` slows it."""
        return self._add(tuple(k for k, _ in loads), tuple(w for _, w in loads),
                         work_bytes, None, ranks, label)

    def alone_rate(self, loads: tuple[tuple[Hashable, float], ...]) -> float:
        """Progress rate of a transfer with these loads if it had its links to itself."""
        return min(self._capacity[k] / w for k, w in loads)

    def compute(self, rank: Hashable, work_s: float, *, label: str = "") -> simpy.Event:
        """Start a compute kernel of `work_s` seconds at full rate on `rank`."""
        return self._add((), (), work_s, rank, (), label)

    def comm_started(self, rank: Hashable) -> None:
        """A collective became active on `rank` (its compute slows down)."""
        self._comm_changed(rank, +1)

    def comm_finished(self, rank: Hashable) -> None:
        """A collective on `rank` ended."""
        self._comm_changed(rank, -1)

    def _comm_changed(self, rank: Hashable, delta: int) -> None:
        # Only a compute kernel running on that rank changes rate.
        affected = self._slowdown > 0 and any(t.rank == rank for t in self._tasks)
        if affected:
            self._advance()
        self._comm_active[rank] = self._comm_active.get(rank, 0) + delta
        if affected:
            self._reschedule()

    def shared(self, key: Hashable) -> int:
        """Transfers currently on link `key`."""
        return sum(1 for t in self._tasks if key in t.keys)

    def in_flight(self) -> list[str]:
        """Labels of the running tasks, the next to end first."""
        return [t.label for t in sorted(self._tasks, key=lambda t: t.finish_s)]

    # ------------------------------------------------------------------ internals
    def _add(self, keys: tuple[Hashable, ...], weights: tuple[float, ...], work: float,
             rank: Hashable | None, ranks: tuple[Hashable, ...], label: str) -> simpy.Event:
        done = self._env.event()
        if work <= 0:
            done.succeed()
            return done
        self._advance()
        self._tasks.append(_Task(done, work, keys, weights, rank, ranks, label))
        self._reschedule()
        return done

    def _advance(self) -> None:
        """Progress every task to now at its current rate and finish the ones whose end
        the clock has reached."""
        now = self._env.now
        dt = now - self._last_s
        self._last_s = now
        if dt > 0:
            for t in self._tasks:
                t.remaining -= t.rate * dt
        if any(t.finish_s <= now for t in self._tasks):
            finished = [t for t in self._tasks if t.finish_s <= now]
            self._tasks = [t for t in self._tasks if t.finish_s > now]
            for t in finished:
                t.done.succeed()

    def _reschedule(self) -> None:
        if not self._tasks:
            return
        counts: dict[Hashable, int] = {}
        for t in self._tasks:
            for k in t.keys:
                counts[k] = counts.get(k, 0) + 1
        computing = {t.rank for t in self._tasks if t.rank is not None} \
            if self._comm_slowdown > 0 else set()
        now = self._env.now
        at, delay = float("inf"), 0.0
        for t in self._tasks:
            if t.rank is not None:
                t.rate = 1.0 - self._slowdown if self._comm_active.get(t.rank, 0) else 1.0
            else:
                t.rate = min(self._capacity[k] / (counts[k] * w)
                             for k, w in zip(t.keys, t.weights, strict=True))
                if any(r in computing for r in t.ranks):
                    t.rate *= 1.0 - self._comm_slowdown
            t_delay = max(t.remaining, 0.0) / t.rate
            # The float SimPy computes for a timeout of this delay, so the timer fires
            # exactly at the task's end.
            t.finish_s = now + t_delay
            if t.finish_s < at:
                at, delay = t.finish_s, t_delay
        if self._pending_at is not None and now <= self._pending_at <= at:
            return  # the pending timer fires first and re-evaluates then
        self._generation += 1
        self._pending_at = at
        gen = self._generation
        self._env.timeout(delay).callbacks.append(lambda _ev: self._on_timer(gen))

    def _on_timer(self, generation: int) -> None:
        if generation != self._generation:
            return  # superseded by an earlier completion
        self._pending_at = None
        self._advance()
        self._reschedule()


@dataclass(frozen=True, slots=True, kw_only=True)
class OomEvent:
    """The first allocation that took the ledger above HBM."""

    time_s: float
    where: str
    """Name of the op that allocated."""
    buffer: str
    category: str
    allocated_bytes: int
    capacity_bytes: float


class MemoryPool:
    """HBM ledger of one rank: every allocation and free, with its category and the
    stream (allocator pool) it came from."""

    def __init__(self, capacity_bytes: float) -> None:
        self.capacity_bytes = capacity_bytes
        self.current_bytes = 0
        self.peak_bytes = 0
        self.peak_time_s = 0.0
        self.peak_where = ""
        self.by_category: dict[str, int] = {}
        self.peak_by_category: dict[str, int] = {}
        self.pool_bytes: dict[str, int] = {}
        self.pool_peak_bytes: dict[str, int] = {}
        self.curve: list[tuple[float, int]] = []
        self.oom: OomEvent | None = None
        self._live: dict[str, tuple[int, str, str]] = {}

    def alloc(self, name: str, category: str, nbytes: int, *, pool: str, time_s: float,
              where: str) -> None:
        """Record an allocation of `nbytes` made by op `where` on stream `pool`."""
        assert name not in self._live, f"buffer {name} allocated twice"
        self._live[name] = (nbytes, category, pool)
        self.current_bytes += nbytes
        self.by_category[category] = self.by_category.get(category, 0) + nbytes
        pb = self.pool_bytes.get(pool, 0) + nbytes
        self.pool_bytes[pool] = pb
        if pb > self.pool_peak_bytes.get(pool, 0):
            self.pool_peak_bytes[pool] = pb
        self.curve.append((time_s, self.current_bytes))
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            self.peak_time_s = time_s
            self.peak_where = where
            self.peak_by_category = {k: v for k, v in self.by_category.items() if v}
        if self.oom is None and self.current_bytes > self.capacity_bytes:
            self.oom = OomEvent(time_s=time_s, where=where, buffer=name, category=category,
                                allocated_bytes=self.current_bytes,
                                capacity_bytes=self.capacity_bytes)

    def free(self, name: str, *, time_s: float) -> None:
        """Release a live buffer."""
        nbytes, category, pool = self._live.pop(name)
        self.current_bytes -= nbytes
        self.by_category[category] -= nbytes
        self.pool_bytes[pool] -= nbytes
        self.curve.append((time_s, self.current_bytes))

    @property
    def reserved_bytes(self) -> int:
        """What a caching allocator with one block pool per stream would hold: the sum of
        each stream's own peak (cached blocks freed on one stream are not handed to
        another; PyTorch CUDACachingAllocator keys blocks by stream)."""
        return sum(self.pool_peak_bytes.values())
