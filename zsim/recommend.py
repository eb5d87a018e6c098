"""Recommendation: which fitting plan to run, told as honestly as zsim's error allows.

Owns the tie rule and the tie-break the planner's tables share. A ranking is only as good
as the evidence behind it: the profile's validation runs scattered around their
predictions by some amount (zsim.spec.error_bands.ErrorBands.spread), so plans predicted
closer than that to the fastest one are tied: zsim cannot tell them apart, and ranking
them by a difference inside its own scatter would be noise. Among tied plans the
recommendation is the one a team would rather run: first one whose peak, at the top of
its memory band, still fits (a plan that may run out of memory is no tie-break winner),
then the simplest (fewest of the things a team must also run and debug: a pipeline,
tensor or context parallelism, FSDP1 where FSDP2 is PyTorch's maintained FSDP, offload),
then the one with the most memory headroom, then the faster. Pure functions over plans
and figures; no simulation here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from zsim.result import Result
from zsim.spec.plan import Plan
from zsim.units import GiB

SAME_SPEED = 0.001
"""Relative speed difference below which two plans tie even on a profile without
validation runs (the simulator's own rounding of kernel times is finer than this)."""


class Ranked(Protocol):
    """A row of either planner table (zsim.planner.Choice, zsim.parallel_planner's
    ParallelChoice): what explaining one plan against another reads."""

    @property
    def plan(self) -> Plan: ...

    @property
    def result(self) -> Result | None: ...

    @property
    def tokens_per_s_per_gpu(self) -> float | None: ...

    @property
    def bubble_fraction(self) -> float: ...

    @property
    def peak_bytes(self) -> float: ...


def complications(plan: Plan) -> tuple[str, ...]:
    """What a plan asks a team to run beyond one data-parallel program, in words."""
    out = []
    if plan.pp > 1:
        out.append("pipeline parallelism")
    if plan.tp > 1:
        out.append("tensor parallelism")
    if plan.cp > 1:
        out.append("context parallelism")
    if plan.program.superseded_by:  # an older library (ProgramEntry.superseded_by)
        out.append(plan.program.title)
    if plan.offload != "none":
        out.append("offload")
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class Contender:
    """A fitting, simulated plan and the figures the recommendation weighs."""

    plan: Plan
    step_time_s: float
    tokens_per_s_per_gpu: float
    step_time_spread: float | None
    """How far apart the profile's validation runs scattered around their predictions,
    relative (Result.step_time_spread); None without a band."""
    peak_bytes: float
    peak_band_high_bytes: float | None
    """The top of the peak's memory band; None without a band."""
    hbm_bytes: float

    @property
    def headroom_bytes(self) -> float:
        return self.hbm_bytes - self.peak_bytes

    @property
    def may_not_fit(self) -> bool:
        """The peak fits as predicted, but not at the top of its memory band."""
        return (self.peak_band_high_bytes or self.peak_bytes) > self.hbm_bytes

    def slower_than(self, other: Contender) -> float:
        """How much slower this plan is predicted than `other`, as a fraction (negative:
        faster); both train the same tokens per step."""
        return other.tokens_per_s_per_gpu / self.tokens_per_s_per_gpu - 1.0


def contender(plan: Plan, result: Result | None) -> Contender | None:
    """The plan as a contender, or None where it is not one: not simulated to the end
    of its step, or out of memory."""
    if result is None or not result.simulated or not result.fits:
        return None
    assert result.step_time_s is not None and result.tokens_per_s_per_gpu is not None
    band = result.peak_memory_band_bytes
    return Contender(plan=plan, step_time_s=result.step_time_s,
                     tokens_per_s_per_gpu=result.tokens_per_s_per_gpu,
                     step_time_spread=result.step_time_spread,
                     peak_bytes=float(result.peak_memory_bytes),
                     peak_band_high_bytes=None if band is None else band[1],
                     hbm_bytes=result.hbm_bytes)


def tolerance(fastest: Contender) -> float:
    """The relative speed difference within which plans tie with `fastest`: the scatter
    of the profile's validation runs around their predictions for its kind of plan
    (Result.step_time_spread; SAME_SPEED at the least). Not its whole error band: what
    widens a band beyond the validated runs (a larger world, another program) says how
    far every such plan may be off, together, not how far apart two of them are."""
    if fastest.step_time_spread is None:
        return SAME_SPEED
    return max(SAME_SPEED, fastest.step_time_spread)


def _preference(c: Contender) -> tuple[bool, int, float, float]:
    return (c.may_not_fit, len(complications(c.plan)), c.peak_bytes,
            -c.tokens_per_s_per_gpu)


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    """The pick among the contenders, and the plans it was tied with."""

    pick: Contender
    fastest: Contender
    tied: tuple[Contender, ...]
    """Every plan tied with the fastest (pick and fastest among them), in the order of
    preference."""
    tolerance: float
    """Relative speed difference of a tie (see `tolerance`)."""

    def is_tied(self, c: Contender) -> bool:
        return any(c is t for t in self.tied)

    def reason(self) -> str:
        """Why the pick: one line."""
        others = len(self.tied) - 1
        scatter = (f"the ±{self.tolerance:.0%} scatter of this profile's validation runs"
                   if self.tolerance > SAME_SPEED else "0.1%")
        if others == 0:
            return f"the fastest, by more than {scatter}"
        if self.pick is self.fastest:
            return (f"the fastest; {others} other plan{'s' if others > 1 else ''} within "
                    f"{scatter} rank below it by simplicity and memory")
        ahead = self.pick.slower_than(self.fastest)
        more = f" and {others - 1} more" if others > 1 else ""
        return (f"tied with the fastest prediction ({self.fastest.plan.label}, {ahead:.1%} "
                f"faster, within {scatter}){more}; chosen for "
                f"{_advantage(self.pick, self.fastest)}")

    def why_tied(self, c: Contender) -> str:
        """Why a tied plan other than the pick is not recommended: one line."""
        diff = c.slower_than(self.pick)
        speed = (f"{diff:.1%} slower" if diff > 0 else f"{-diff:.1%} faster"
                 if diff < 0 else "as fast")
        return (f"tied: {speed} than the recommended plan, within the validation "
                f"scatter; not picked: {_advantage(c, self.pick, loser=True)}")


def _advantage(winner: Contender, other: Contender, *, loser: bool = False) -> str:
    """What `winner` has over `other` in the order of preference, in words (with
    `loser`, what `winner` has that makes it lose to `other`)."""
    a, b = (other, winner) if loser else (winner, other)
    if a.may_not_fit != b.may_not_fit:
        return ("its peak may not fit at the top of its memory band" if loser
                else "a peak that fits even at the top of its memory band")
    extra = [x for x in complications(b.plan) if x not in complications(a.plan)]
    fewer = len(complications(a.plan)) < len(complications(b.plan))
    if fewer:
        return (f"it runs {', '.join(extra) or 'more parts'}" if loser
                else f"simplicity (no {', '.join(extra) or 'extra parts'})")
    more = (b.peak_bytes - a.peak_bytes) / GiB
    if more > 0.005:
        return (f"{more:.1f} GiB more peak memory" if loser
                else f"memory headroom ({more:.1f} GiB less peak)")
    return "a slower prediction" if loser else "the faster prediction"


def recommend(contenders: Sequence[Contender]) -> Recommendation | None:
    """The recommendation among fitting, simulated plans (None without any): the
    fastest, and every plan within its tolerance tied with it; the pick is the first of
    the tied in the order of preference (fits at the top of its memory band, fewest
    complications, least peak memory, fastest; then the order of `contenders`)."""
    if not contenders:
        return None
    fastest = max(contenders, key=lambda c: c.tokens_per_s_per_gpu)
    tol = tolerance(fastest)
    tied = sorted((c for c in contenders if c.slower_than(fastest) <= tol),
                  key=_preference)
    return Recommendation(pick=tied[0], fastest=fastest, tied=tuple(tied), tolerance=tol)
