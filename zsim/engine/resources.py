"""Engine resources: shared-rate servers (links, SMs) and the HBM memory ledger.

Owns `Fabric`, which runs transfers and compute kernels as fluid tasks whose rates are
re-evaluated at every start and finish (processor sharing: k transfers on one link each
get bandwidth / k; a compute kernel runs at 1 - comm_compute_slowdown of its rate while a
collective is active on its rank, and a collective at 1 - compute_comm_slowdown of its
rate while a compute kernel runs on one of its ranks), and `MemoryPool`, a counter with
peak, per-category breakdown at the peak, the memory curve, out-of-memory detection and
the reserved bytes PyTorch's caching allocator would hold for its sequence
(zsim.engine.allocator). Imports simpy and zsim.engine.allocator.

Never a blocking `simpy.Container` for memory: it would deadlock silently and end the run
early with a short, wrong step time. The pool records the first
allocation that exceeds HBM and the simulation carries on, so the step time of a plan that
does not fit is still reported next to the OOM location.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import simpy

from zsim.engine.allocator import Request, replay_reserved


class _Task:
    """One fluid task: a transfer over links, or a compute kernel on a rank's SMs."""

    __slots__ = ("done", "finish_s", "label", "links", "rank", "ranks", "rate", "remaining")

    def __init__(self, done: simpy.Event, work: float,
                 links: tuple[tuple[Hashable, float, float], ...], rank: Hashable | None,
                 ranks: tuple[Hashable, ...], label: str) -> None:
        self.done = done
        self.ranks = ranks
        """A transfer's ranks whose compute slows it."""
        self.remaining = work
        self.links = links
        """A transfer's (link, weight, link capacity) for each link it loads."""
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

    Every start, finish and change of a rank's collective count re-evaluates the rate of
    every running task (a handful at a time); the transfers on each link and the compute
    kernels on each rank are counted as tasks come and go, not recounted.
    """

    def __init__(self, env: simpy.Environment, link_bytes_per_s: dict[Hashable, float], *,
                 comm_compute_slowdown: float, compute_comm_slowdown: float = 0.0) -> None:
        self._env = env
        self._capacity = dict(link_bytes_per_s)
        self._slowdown = comm_compute_slowdown
        self._comm_slowdown = compute_comm_slowdown
        self._tasks: list[_Task] = []
        self._on_link: dict[Hashable, int] = {}
        """Transfers running on each link."""
        self._computing: dict[Hashable, int] = {}
        """Compute kernels running on each rank."""
        self._comm_active: dict[Hashable, int] = {}
        self._last_s = 0.0
        self._timer: simpy.Event | None = None
        """The timer that fires next; older ones are superseded."""
        self._pending_at: float | None = None

    def transfer(self, loads: tuple[tuple[Hashable, float], ...], work_bytes: float, *,
                 ranks: tuple[Hashable, ...] = (), label: str = "") -> simpy.Event:
        """Start moving `work_bytes` over the links in `loads` ((key, weight) pairs); the
        event fires when done. Compute running on any of `ranks` slows it."""
        cap = self._capacity
        return self._add(tuple((k, w, cap[k]) for k, w in loads), work_bytes, None, ranks,
                         label)

    def alone_rate(self, loads: tuple[tuple[Hashable, float], ...]) -> float:
        """Progress rate of a transfer with these loads if it had its links to itself."""
        return min(self._capacity[k] / w for k, w in loads)

    def compute(self, rank: Hashable, work_s: float, *, label: str = "") -> simpy.Event:
        """Start a compute kernel of `work_s` seconds at full rate on `rank`."""
        return self._add((), work_s, rank, (), label)

    def comm_started(self, rank: Hashable) -> None:
        """A collective became active on `rank` (its compute slows down)."""
        self._comm_changed(rank, +1)

    def comm_finished(self, rank: Hashable) -> None:
        """A collective on `rank` ended."""
        self._comm_changed(rank, -1)

    def _comm_changed(self, rank: Hashable, delta: int) -> None:
        # Only a compute kernel running on that rank changes rate.
        affected = self._slowdown > 0 and self._computing.get(rank, 0) > 0
        if affected:
            self._advance()
        self._comm_active[rank] = self._comm_active.get(rank, 0) + delta
        if affected:
            self._reschedule()

    def in_flight(self) -> list[str]:
        """Labels of the running tasks, the next to end first."""
        return [t.label for t in sorted(self._tasks, key=lambda t: t.finish_s)]

    # ------------------------------------------------------------------ internals
    def _add(self, links: tuple[tuple[Hashable, float, float], ...], work: float,
             rank: Hashable | None, ranks: tuple[Hashable, ...], label: str) -> simpy.Event:
        done = self._env.event()
        if work <= 0:
            done.succeed()
            return done
        self._advance()
        self._tasks.append(_Task(done, work, links, rank, ranks, label))
        if rank is None:
            on_link = self._on_link
            for k, _, _ in links:
                on_link[k] = on_link.get(k, 0) + 1
        else:
            self._computing[rank] = self._computing.get(rank, 0) + 1
        self._reschedule()
        return done

    def _advance(self) -> None:
        """Progress every task to now at its current rate and finish the ones whose end
        the clock has reached."""
        now = self._env.now
        dt = now - self._last_s
        self._last_s = now
        tasks = self._tasks
        ending = False
        for t in tasks:
            if dt > 0:
                t.remaining -= t.rate * dt
            if t.finish_s <= now:
                ending = True
        if not ending:
            return  # none ends now (the common case)
        finished = [t for t in tasks if t.finish_s <= now]
        self._tasks = [t for t in tasks if t.finish_s > now]
        on_link, computing = self._on_link, self._computing
        for t in finished:
            if t.rank is None:
                for k, _, _ in t.links:
                    on_link[k] -= 1
            else:
                computing[t.rank] -= 1
        for t in finished:
            t.done.succeed()

    def _reschedule(self) -> None:
        tasks = self._tasks
        if not tasks:
            return
        on_link, computing, comm_active = self._on_link, self._computing, self._comm_active
        comm_slowdown, slowed = self._comm_slowdown, 1.0 - self._slowdown
        now = self._env.now
        at, delay = float("inf"), 0.0
        for t in tasks:
            if t.rank is not None:
                t.rate = slowed if comm_active.get(t.rank, 0) else 1.0
            else:
                links = t.links
                if len(links) == 1:  # most transfers load one link
                    k, w, cap = links[0]
                    rate = cap / (on_link[k] * w)
                else:
                    rate = min([cap / (on_link[k] * w) for k, w, cap in links])
                if comm_slowdown > 0:
                    for r in t.ranks:
                        if computing.get(r, 0):
                            rate *= 1.0 - comm_slowdown
                            break
                t.rate = rate
            left = t.remaining
            t_delay = (0.0 if left < 0.0 else left) / t.rate
            # The float SimPy computes for a timeout of this delay, so the timer fires
            # exactly at the task's end.
            finish = t.finish_s = now + t_delay
            if finish < at:
                at, delay = finish, t_delay
        if self._pending_at is not None and now <= self._pending_at <= at:
            return  # the pending timer fires first and re-evaluates then
        self._pending_at = at
        timer = self._timer = self._env.timeout(delay)
        timer.callbacks.append(self._on_timer)

    def _on_timer(self, timer: simpy.Event) -> None:
        if timer is not self._timer:
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
    stream (allocator pool) it came from; and the reserved bytes PyTorch's CUDA caching
    allocator would hold for that sequence (zsim.engine.allocator)."""

    def __init__(self, capacity_bytes: float) -> None:
        self.capacity_bytes = capacity_bytes
        self.current_bytes = 0
        self.peak_bytes = 0
        self.peak_time_s = 0.0
        self.peak_where = ""
        self.by_category: dict[str, int] = {}
        self.peak_by_category: dict[str, int] = {}
        self.curve: list[tuple[float, int]] = []
        self.oom: OomEvent | None = None
        self._live: dict[str, tuple[int, str]] = {}
        self._state: list[tuple[Request, str]] = []
        """Buffers live before the step (pool "baseline"), with their categories."""
        self._step: list[Request | str] = []
        """The step's allocations and frees (by buffer name), in order."""
        self._states_made_at: int | None = None
        """Index in _step of the step's first optimizer-state allocation."""
        self._reserved: tuple[int, int] | None = None
        """(events replayed, reserved bytes): the last replay."""

    def alloc(self, name: str, category: str, nbytes: int, *, pool: str, time_s: float,
              where: str, pieces: tuple[int, ...] = ()) -> None:
        """Record an allocation of `nbytes` made by op `where` on stream `pool`; `pieces`
        are the tensors it stands for (zsim.schedule.ops.Buffer.pieces)."""
        assert name not in self._live, f"buffer {name} allocated twice"
        self._live[name] = (nbytes, category)
        if pool == "baseline":
            # Model state is created on the default (compute) stream.
            self._state.append((Request(name, nbytes, pieces, "compute"), category))
        else:
            if category == "optimizer_states" and self._states_made_at is None:
                self._states_made_at = len(self._step)
            self._step.append(Request(name, nbytes, pieces, pool))
        self.current_bytes += nbytes
        self.by_category[category] = self.by_category.get(category, 0) + nbytes
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
        nbytes, category = self._live.pop(name)
        self.current_bytes -= nbytes
        self.by_category[category] -= nbytes
        self._step.append(name)
        self.curve.append((time_s, self.current_bytes))

    @property
    def reserved_bytes(self) -> int:
        """`max_memory_reserved` of a steady-state step: the recorded step replayed on a
        model of the CUDA caching allocator (zsim.engine.allocator.replay_reserved) after
        the model state, until its segments stop growing, on a device of this pool's
        capacity (past it the allocator releases its unused cached segments and retries,
        as cudaMalloc's failure makes it). The optimizer states are
        created by the first step's optimizer, right before its first allocation of
        category optimizer_states, as torch.optim creates them lazily (into blocks the
        first step's activations left cached; a step with no such allocation finds them
        made before it). Never below the ledger's peak (the allocator hands out at least
        what is asked)."""
        events = len(self._state) + len(self._step)
        if self._reserved is None or self._reserved[0] != events:
            first = self._states_made_at
            states = [r for r, c in self._state if c == "optimizer_states"]
            lazy = first is not None and bool(states)
            reserved = replay_reserved(
                [r for r, c in self._state if not lazy or c != "optimizer_states"],
                self._step, created_in_first_step={first: states} if lazy else {},
                capacity_bytes=self.capacity_bytes)
            self._reserved = (events, max(reserved, self.peak_bytes))
        return self._reserved[1]
