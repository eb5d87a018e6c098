"""DeepSpeed ZeRO-3's parameter fetching, replayed on a step's trace: which parameters each
submodule's pre-hook gathers on demand, which it prefetches, and which its post-hook
releases.

Read from deepspeed/runtime/zero/partitioned_param_coordinator.py (0.19), steady state
(the trace of the previous step is complete):
- fetch_sub_module: the submodule's parameters that are not available are all-gathered
  in one coalesced call and waited for; then parameters of the upcoming submodules in
  trace order are prefetched in one more coalesced call, skipping those available, until
  `prefetch_bucket_size` elements (or what `max_live_parameters` leaves) are in flight.
- release_sub_module: the submodule's parameters are released (re-partitioned) unless
  they are persistent (whole on every rank), or used again within `max_reuse_distance`
  elements of the trace ahead, or were already prefetched for a later use.
Pure functions of the trace; imports nothing beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    """One parameter as the coordinator sees it."""

    name: str
    numel: int
    persistent: bool
    """Below the persistence threshold: never partitioned, never fetched."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchStep:
    """What the coordinator does at one submodule of the trace."""

    on_demand: tuple[str, ...]
    """Parameters gathered in the pre-hook and waited for (one coalesced call)."""
    prefetch: tuple[str, ...]
    """Parameters of later submodules gathered right after (one coalesced call)."""
    release: tuple[str, ...]
    """Parameters released in the post-hook."""


def replay(trace: list[tuple[str, ...]], params: dict[str, Param], *, prefetch_bucket: int,
           max_live: int, max_reuse: int) -> list[FetchStep]:
    """The coordinator's actions at each submodule of `trace` (the parameter names each
    submodule uses, in call order over one step), starting with nothing gathered.

    Args:
        trace: per submodule call, the names of its parameters.
        params: every parameter by name.
        prefetch_bucket: stage3_prefetch_bucket_size, elements.
        max_live: stage3_max_live_parameters, elements.
        max_reuse: stage3_max_reuse_distance, elements.
    """
    # Elements of the parameters of the submodules before each step, and each use's next
    # use: a parameter is reused soon when the submodules between the next one and its
    # next use hold fewer than max_reuse elements (__params_to_release walks the trace
    # from the next submodule on, stopping once it has passed max_reuse elements).
    numel = {name: p.numel for name, p in params.items()}
    fetched = {name for name, p in params.items() if not p.persistent}
    """The parameters the coordinator gathers (persistent ones stay whole)."""
    before = [0]
    for names in trace:
        before.append(before[-1] + sum(numel[n] for n in names))
    next_use: list[dict[str, int]] = [{} for _ in trace]
    seen: dict[str, int] = {}
    for t in range(len(trace) - 1, -1, -1):
        next_use[t] = {n: seen[n] for n in trace[t] if n in seen}
        for n in trace[t]:
            seen[n] = t

    def reused_soon(name: str, t: int) -> bool:
        u = next_use[t].get(name)
        return u is not None and before[u] - before[t + 1] < max_reuse

    available: set[str] = set()
    n_available = 0
    fetched_for: dict[str, int] = {}
    """Per parameter, the last trace step its current gather covers (a prefetch covers
    the uses it skipped)."""
    queue = [(t, name) for t, names in enumerate(trace) for name in names if name in fetched]
    head = 0
    out = []
    for t, names in enumerate(trace):
        wanted = dict.fromkeys(n for n in names if n in fetched)
        on_demand = tuple(n for n in wanted if n not in available)
        for n in on_demand:
            available.add(n)
            n_available += numel[n]
        # Pop this submodule's own uses off the queue (they may have been popped by an
        # earlier prefetch already).
        while head < len(queue) and queue[head][0] <= t:
            use_t, n = queue[head]
            fetched_for[n] = max(fetched_for.get(n, -1), use_t)
            head += 1
        budget = min(max_live - n_available, prefetch_bucket)
        prefetch: list[str] = []
        in_flight = 0
        while head < len(queue) and in_flight < budget:
            use_t, n = queue[head]
            head += 1
            fetched_for[n] = max(fetched_for.get(n, -1), use_t)
            if n not in available and n not in prefetch:
                prefetch.append(n)
                in_flight += numel[n]
        for n in prefetch:
            available.add(n)
            n_available += numel[n]
        # A use at t + 1 or earlier does not hold a parameter back; a later prefetched
        # use does (the step counter has moved on by one when the post-hook runs).
        release = tuple(n for n in wanted
                        if fetched_for.get(n, -1) <= t + 1 and not reused_soon(n, t))
        for n in release:
            available.discard(n)
            n_available -= numel[n]
        out.append(FetchStep(on_demand=on_demand, prefetch=tuple(prefetch), release=release))
    return out
