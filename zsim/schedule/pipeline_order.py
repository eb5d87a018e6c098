"""Pipeline schedules: the order in which each pipeline rank runs the forwards and
backwards of its stages' micro-batches, as torch.distributed.pipelining orders them.

Owns `rank_actions` (one rank's actions, in order) and what follows from the order alone:
the stages a rank holds, the stage that holds the embeddings (the first) and the loss
(the last), and the micro-batches whose activations a rank holds at once. Timing lives in
zsim.engine.pipeline_replay. Pure Python; imports only zsim.spec.

Read from torch/distributed/pipelining/schedules.py (torch 2.13):
- ScheduleGPipe: every forward, then every backward, micro-batches in order.
- Schedule1F1B: stage s runs min(m, pp - s) forwards (warmup), then alternates one
  backward and one forward (1B1F) until the forwards are done, then the remaining
  backwards (cooldown).
- ScheduleInterleaved1F1B (Narayanan et al. 2021, Sec. 2.2): v stages per rank, rank r
  holding stages r, r + pp, ..., r + (v-1) pp; micro-batches go in rounds of
  m / max(1, m // pp); _get_warmup_ops gives rank r (v - 1) * round + 2 (pp - 1 - r)
  warmup forwards (at most m v), then alternating forward and backward
  (_get_1f1b_rank_ops; its no-op padding only aligns ranks in time, which the timing
  here derives from dependencies instead), the forward's local stage advancing every
  round, the backward's going back from the last.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from zsim.spec.plan import Plan


@dataclass(frozen=True, slots=True)
class Action:
    """One stage's forward ("F") or backward ("B") of one micro-batch."""

    stage: int
    """Global stage index, 0 .. pp * virtual_stages - 1 (stage s lives on rank s % pp)."""
    phase: str
    """"F" or "B"."""
    microbatch: int


def num_stages(plan: Plan) -> int:
    """Stages of the pipeline: pp x virtual stages."""
    return plan.pp * plan.virtual_stages


def rank_stages(plan: Plan, rank: int) -> tuple[int, ...]:
    """The stages rank `rank` holds: rank, rank + pp, ... (one per virtual stage)."""
    return tuple(rank + i * plan.pp for i in range(plan.virtual_stages))


def rank_layers(plan: Plan, num_layers: int, rank: int) -> int:
    """Transformer blocks rank `rank` holds: num_layers / num_stages per stage it holds."""
    return num_layers // num_stages(plan) * len(rank_stages(plan, rank))


def rank_actions(plan: Plan, rank: int) -> tuple[Action, ...]:
    """Rank `rank`'s forwards and backwards in the order its schedule runs them; the
    micro-batches are plan.grad_accum."""
    return _actions(plan.pp_schedule, plan.grad_accum, plan.pp, plan.virtual_stages, rank)


@functools.cache
def _actions(schedule: str, m: int, pp: int, v: int, rank: int) -> tuple[Action, ...]:
    """rank_actions by what decides them (a planner asks for the same orders across
    thousands of plans)."""
    if schedule == "gpipe":
        return (*(Action(rank, "F", i) for i in range(m)),
                *(Action(rank, "B", i) for i in range(m)))
    if schedule == "1f1b":
        warmup = min(m, pp - rank)
        out = [Action(rank, "F", i) for i in range(warmup)]
        f = warmup
        for b in range(m):
            out.append(Action(rank, "B", b))
            if f < m:
                out.append(Action(rank, "F", f))
                f += 1
        return tuple(out)
    return tuple(_interleaved(m, pp, v, rank))


def _interleaved(m: int, pp: int, v: int, rank: int) -> list[Action]:
    """ScheduleInterleaved1F1B._calculate_single_rank_operations without its no-ops."""
    per_round = m // max(1, m // pp)
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), m * v)
    total = m * v

    def forward_stage(step: int) -> int:
        return (step // per_round) % v * pp + rank

    def backward_stage(step: int) -> int:
        return (v - 1 - ((step - warmup) // per_round) % v) * pp + rank

    fwd_mb: dict[int, int] = {}
    bwd_mb: dict[int, int] = {}

    def take(counter: dict[int, int], stage: int) -> int:
        counter[stage] = counter.get(stage, 0) + 1
        return counter[stage] - 1

    out: list[Action] = []
    for step in range(total + warmup):  # warmup + (total - warmup) 1F1B + warmup cooldown
        if step < warmup:
            s = forward_stage(step)
            out.append(Action(s, "F", take(fwd_mb, s)))
        elif step < total:
            s = forward_stage(step)
            out.append(Action(s, "F", take(fwd_mb, s)))
            s = backward_stage(step)
            out.append(Action(s, "B", take(bwd_mb, s)))
        else:
            s = backward_stage(step)
            out.append(Action(s, "B", take(bwd_mb, s)))
    return out


def peak_in_flight(actions: Sequence[Action], weight: Callable[[int], float] | None = None
                   ) -> float:
    """The most micro-batches whose activations the rank holds at once: a forward saves
    them until its backward frees them, in the rank's order. With `weight`, each stage's
    micro-batch counts its weight (e.g. its saved bytes) instead of 1."""
    held = peak = 0.0
    for a in actions:
        w = 1.0 if weight is None else weight(a.stage)
        held += w if a.phase == "F" else -w
        peak = max(peak, held)
    return peak
