"""Replay of a pipeline step: each pipeline rank runs its actions (zsim.schedule.pipeline_order)
in order, one at a time; a stage's forward of a micro-batch starts once the previous
stage's forward of it has arrived (point-to-point send), a backward once the next
stage's backward of it has arrived and its own forward is done. Start times follow from
these dependencies alone, so the bubble (ranks idle while the pipeline fills and drains)
emerges from the schedule; nothing here knows a schedule's name.

Owns `run_pipeline`. Sends are asynchronous (isend/irecv batched by
torch.distributed.pipelining): the sender does not wait, the receiver waits for the
arrival. Sends do not share links with each other (one activation per hop at a time).
Deterministic, pure Python, no simpy needed: every rank's order is fixed, so the replay
is a worklist over ranks that starts each action once its dependencies have ended.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from zsim.errors import ConfigError
from zsim.schedule.pipeline_order import Action


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineTimeline:
    """When each action of each pipeline rank ran."""

    spans: tuple[tuple[tuple[Action, float, float], ...], ...]
    """Per rank, (action, start_s, end_s) in its order."""

    @property
    def step_time_s(self) -> float:
        return max((s[-1][2] for s in self.spans if s), default=0.0)

    def busy_s(self, rank: int) -> float:
        return sum(end - start for _, start, end in self.spans[rank])

    def bubble_fraction(self, rank: int) -> float:
        """Share of the step the rank is idle between its start and the step's end."""
        step = self.step_time_s
        return 0.0 if step <= 0 else 1.0 - self.busy_s(rank) / step


def run_pipeline(actions: Sequence[Sequence[Action]], *, forward_s: list[float],
                 backward_s: list[float], send_s: float) -> PipelineTimeline:
    """Replay the pipeline.

    Args:
        actions: per rank, its actions in order (stage s on rank s % len(actions)).
        forward_s, backward_s: per stage, one micro-batch's forward and backward time.
        send_s: time of one point-to-point send of a micro-batch's activations (or of
            their gradient) between neighbouring stages.

    Raises:
        ConfigError: the orders deadlock (an action waits on one that never runs).
    """
    pp = len(actions)
    last = len(forward_s) - 1
    done: dict[tuple[int, str, int], float] = {}
    pos = [0] * pp
    free = [0.0] * pp
    spans: list[list[tuple[Action, float, float]]] = [[] for _ in range(pp)]
    remaining = sum(len(a) for a in actions)
    # Ranks to try, each once at a time: a rank runs its actions until one waits on
    # another rank's; the action that ends that wait (a forward feeds the next stage's
    # rank, a backward the previous stage's) puts the waiting rank back.
    todo = deque(range(pp))
    queued = [True] * pp
    while todo:
        r = todo.popleft()
        queued[r] = False
        while pos[r] < len(actions[r]):
            a = actions[r][pos[r]]
            ready = _ready_s(a, done, last, send_s)
            if ready is None:
                break
            start = max(free[r], ready)
            end = start + (forward_s if a.phase == "F" else backward_s)[a.stage]
            done[(a.stage, a.phase, a.microbatch)] = end
            spans[r].append((a, start, end))
            free[r] = end
            pos[r] += 1
            remaining -= 1
            fed = (a.stage + (1 if a.phase == "F" else -1)) % pp
            if not queued[fed]:
                todo.append(fed)
                queued[fed] = True
    if remaining:
        stuck = next(actions[r][pos[r]] for r in range(pp) if pos[r] < len(actions[r]))
        raise ConfigError("plan.pp_schedule", f"{stuck}", "the pipeline order deadlocks")
    return PipelineTimeline(spans=tuple(tuple(s) for s in spans))


def _ready_s(a: Action, done: dict[tuple[int, str, int], float], last: int,
             send_s: float) -> float | None:
    """When action `a`'s inputs are there, or None if one has not run yet."""
    if a.phase == "F":
        if a.stage == 0:
            return 0.0
        prev = done.get((a.stage - 1, "F", a.microbatch))
        return None if prev is None else prev + send_s
    own = done.get((a.stage, "F", a.microbatch))
    if own is None:
        return None
    if a.stage == last:
        return own
    nxt = done.get((a.stage + 1, "B", a.microbatch))
    return None if nxt is None else max(own, nxt + send_s)
