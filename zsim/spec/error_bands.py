"""ErrorBands: how far a profile's predictions were from real runs, what those runs
covered, and the interval that puts around a new prediction (for users:
docs/error-bands.md).

Owns the `error_bands:` section of a hardware profile, the kinds of plan and the programs
it is keyed by (`plan_kind`, `program_of`), and the rules that turn a prediction into an
interval. A residual is predicted / measured - 1; a prediction p with residuals in
[lo, hi] puts the real value in [p / (1 + hi), p / (1 + lo)].

Per metric (BAND_METRICS) the section holds the [lowest, highest] residual of the
validation runs of each kind of plan together with the plain runs and the runs with
communication (`band_ranges`), and what those runs covered: the micro-batches, the
programs and, for the step time, the largest world whose communication whole steps
validated. A plan outside that domain gets a wider interval, each widening named in the
Interval's `extrapolated` (docs/error-bands.md):

- a kind with no run of its own: the plain range, doubled in ratio (`widen`);
- a micro-batch outside the validated ones: the range doubled in ratio;
- a program not validated on the profile: the range compounded with that program's
  error where every program was validated (the CPU validation; `other`, the widest of
  them, for a program it did not run either);
- a world beyond the validated one (step time only): the step's collective time is
  given the error of the profile's collective evidence (nccl-tests): slower collectives
  can lengthen the step by at most their extra time, faster ones shorten it by at most
  the time the step waited on them.

The section is generated (zsim calibrate bands) and checked against the
evidence by a test, so it moves with the model. Imports nothing above zsim.spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from zsim.errors import ConfigError
from zsim.spec.plan import Plan

KINDS: tuple[str, ...] = ("plain", "recompute", "offload", "fp32")
"""Kinds of plan: offloaded (host optimizer, PCIe copies), fp32/TF32 compute,
recomputation, and the rest."""

BAND_METRICS: tuple[str, ...] = ("step_time_s", "peak_memory_bytes")
"""The figures that carry a band."""

OTHER_PROGRAM = "other"
"""The program_errors entry for a program the cross-program evidence did not run."""

_METRIC_KEYS: tuple[str, ...] = ("kinds", "micro_batches", "programs", "program_errors")
_SECTION_KEYS: tuple[str, ...] = (*BAND_METRICS, "collectives", "runs", "evidence", "source")


def plan_kind(plan: Plan) -> str:
    """The KINDS entry of a plan, the first that applies: offload, fp32, recompute."""
    if plan.offload != "none":
        return "offload"
    if plan.compute_dtype in ("fp32", "tf32"):
        return "fp32"
    return "recompute" if plan.recompute != "none" else "plain"


def program_of(plan: Plan) -> str:
    """The program a plan runs, as the bands name it: "strategy[impl]" and "+tp", "+pp",
    "+cp" for each model-parallel axis in use (degrees left out), e.g. "zero3[deepspeed]",
    "fsdp[fsdp2]+tp"."""
    axes = "".join(f"+{axis}" for axis, degree in (("tp", plan.tp), ("pp", plan.pp),
                                                    ("cp", plan.cp)) if degree > 1)
    return f"{plan.strategy}[{plan.impl}]{axes}"


Range = tuple[float, float]
"""[lowest, highest] residual, as fractions (predicted / measured - 1)."""


def widen(r: Range) -> Range:
    """A range doubled in ratio, outwards from 0: (1 + r)^2 - 1 for each end beyond 0 (a
    prediction 10% slow becomes 21% slow, 10% fast 19% fast); an end on the near side of
    0 moves to 0."""
    return (1.0 + min(r[0], 0.0)) ** 2 - 1.0, (1.0 + max(r[1], 0.0)) ** 2 - 1.0


def compound(r: Range, by: Range) -> Range:
    """`r` compounded with a second error `by`, outwards only: each end of `r` moved by
    the end of `by` on its side of 0 (a ratio times a ratio)."""
    return ((1.0 + r[0]) * (1.0 + min(by[0], 0.0)) - 1.0,
            (1.0 + r[1]) * (1.0 + max(by[1], 0.0)) - 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """Where the real value lies, and why it is wider than the evidence's own range."""

    low: float
    high: float
    extrapolated: tuple[str, ...]
    """Short reasons, one per widening rule that applied; empty inside the domain."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricBand:
    """One metric's residual ranges and the domain of the runs they come from."""

    kinds: dict[str, Range]
    """Per kind of plan with runs of its own (plain at least)."""
    micro_batches: tuple[int, int]
    """Smallest and largest micro-batch (sequences per GPU) of the runs."""
    programs: tuple[str, ...]
    """Programs (program_of) the runs ran."""
    program_errors: dict[str, Range]
    """Per program, its error where every program was validated alike (OTHER_PROGRAM:
    the widest, for a program that evidence did not run)."""
    world_size: int | None = None
    """Step time only: the largest world whose communication whole steps validated (1:
    the runs had none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorBands:
    """A profile's error bands: per metric its ranges and domain, the collectives'
    residual range, and where they come from."""

    metrics: dict[str, MetricBand]
    collectives: Range
    """[lowest, highest] residual of collective times (nccl-tests evidence)."""
    runs: int
    """Validation runs (whole steps) the ranges come from."""
    evidence: tuple[str, ...]
    """Each part of the evidence: which runs or cases, how many, on what."""
    source: str
    """The command that generated the section."""

    def describe(self) -> str:
        """The bands' source in one line: the evidence and the command."""
        return f"{'; '.join(self.evidence)} (made by {self.source})"

    def interval(self, metric: str, plan: Plan, predicted: float, *,
                 collective_s: float = 0.0, exposed_collective_s: float = 0.0) -> Interval:
        """Where the real value of `metric` lies for a prediction of `predicted`.

        Args:
            metric: a BAND_METRICS entry.
            plan: the plan predicted.
            predicted: the prediction (seconds or bytes).
            collective_s: step time only: the time the step's collectives kept their
                streams busy, summed over streams (an upper bound on their share of any
                path through the step).
            exposed_collective_s: step time only: the time the compute stream waited on
                collectives.
        """
        band = self.metrics[metric]
        why: list[str] = []
        kind = plan_kind(plan)
        r = band.kinds.get(kind)
        if r is None:
            r = widen(band.kinds["plain"])
            why.append(f"kind {kind} not validated on this profile")
        program = program_of(plan)
        if program not in band.programs:
            err = band.program_errors.get(program, band.program_errors[OTHER_PROGRAM])
            r = compound(r, err)
            why.append(f"program {program} not validated on this profile "
                       f"({_pct(err[0])}..{_pct(err[1])} where validated)")
        low_mb, high_mb = band.micro_batches
        if not low_mb <= plan.micro_batch <= high_mb:
            r = widen(r)
            why.append(f"micro-batch {plan.micro_batch} outside {low_mb}-{high_mb} validated")
        low, high = predicted / (1.0 + r[1]), predicted / (1.0 + r[0])
        if band.world_size is not None and plan.world_size > band.world_size:
            c_low, c_high = self.collectives
            low -= min(exposed_collective_s,
                       collective_s * max(0.0, 1.0 - 1.0 / (1.0 + c_high)))
            high += collective_s * max(0.0, 1.0 / (1.0 + c_low) - 1.0)
            why.append(f"world {plan.world_size} > {band.world_size} validated with "
                       f"communication (collectives {_pct(c_low)}..{_pct(c_high)})")
        return Interval(low=low, high=high, extrapolated=tuple(why))

    def spread(self, plan: Plan) -> float:
        """Half the width of the step-time residual range of the plan's kind (the plain
        range doubled where the kind has no runs of its own), relative to the
        prediction: how far apart the profile's validation runs scattered around their
        predictions, so how close two predictions can be and still rank either way.
        The widenings for what the runs did not cover (world, program, micro-batch) are
        not in it: they say how far every plan of a kind may be off together, which
        moves plans alike rather than reorders them."""
        kinds = self.metrics["step_time_s"].kinds
        lo, hi = kinds.get(plan_kind(plan)) or widen(kinds["plain"])
        return (1.0 / (1.0 + lo) - 1.0 / (1.0 + hi)) / 2.0

    def to_dict(self) -> dict[str, Any]:
        """The YAML section's mapping (percent, as from_dict reads it)."""
        out: dict[str, Any] = {"runs": self.runs}
        for metric, band in self.metrics.items():
            m: dict[str, Any] = {"kinds": {k: _to_pct(v) for k, v in band.kinds.items()}}
            if band.world_size is not None:
                m["world_size"] = band.world_size
            m["micro_batches"] = list(band.micro_batches)
            m["programs"] = list(band.programs)
            m["program_errors"] = {p: _to_pct(v) for p, v in band.program_errors.items()}
            out[metric] = m
        out["collectives"] = _to_pct(self.collectives)
        out["evidence"] = list(self.evidence)
        out["source"] = self.source
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ErrorBands:
        """From the profile's `error_bands:` mapping (ranges in percent).

        Raises:
            ConfigError: an unknown or missing key, or a range that is not [low, high]
                with -100 < low <= high.
        """
        where = "error_bands"
        _keys(data, where, required=_SECTION_KEYS)
        source, runs, evidence = data["source"], data["runs"], data["evidence"]
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"{where}.source", source, "must be a non-empty string")
        if isinstance(runs, bool) or not isinstance(runs, int) or runs <= 0:
            raise ConfigError(f"{where}.runs", runs, "must be a positive integer")
        if (not isinstance(evidence, list) or not evidence
                or not all(isinstance(e, str) and e.strip() for e in evidence)):
            raise ConfigError(f"{where}.evidence", evidence,
                              "must be a non-empty list of non-empty strings")
        metrics = {m: _metric(data[m], f"{where}.{m}", step=m == "step_time_s")
                   for m in BAND_METRICS}
        return cls(metrics=metrics, collectives=_range(data["collectives"],
                                                       f"{where}.collectives"),
                   runs=runs, evidence=tuple(evidence), source=source)


def _metric(data: Any, where: str, *, step: bool) -> MetricBand:
    required = (*_METRIC_KEYS, "world_size") if step else _METRIC_KEYS
    _keys(data, where, required=required)
    kinds = data["kinds"]
    if not isinstance(kinds, dict) or "plain" not in kinds:
        raise ConfigError(f"{where}.kinds", kinds,
                          "must map kinds of plan (plain at least) to [low, high] %")
    for kind in kinds:
        if kind not in KINDS:
            raise ConfigError(f"{where}.kinds.{kind}", kind,
                              f"unknown kind; expected {', '.join(KINDS)}")
    mb = data["micro_batches"]
    if (not isinstance(mb, list) or len(mb) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in mb)
            or not 1 <= mb[0] <= mb[1]):
        raise ConfigError(f"{where}.micro_batches", mb, "must be [low, high] with 1 <= low <= high")
    programs = data["programs"]
    if not isinstance(programs, list) or not programs or not all(
            isinstance(p, str) for p in programs):
        raise ConfigError(f"{where}.programs", programs, "must be a non-empty list of programs")
    errors = data["program_errors"]
    if not isinstance(errors, dict) or OTHER_PROGRAM not in errors:
        raise ConfigError(f"{where}.program_errors", errors,
                          f"must map programs ({OTHER_PROGRAM} at least) to [low, high] %")
    world = None
    if step:
        world = data["world_size"]
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ConfigError(f"{where}.world_size", world, "must be an integer >= 1")
    return MetricBand(
        kinds={k: _range(v, f"{where}.kinds.{k}") for k, v in kinds.items()},
        micro_batches=(mb[0], mb[1]), programs=tuple(programs),
        program_errors={p: _range(v, f"{where}.program_errors.{p}") for p, v in errors.items()},
        world_size=world)


def _keys(data: Any, where: str, *, required: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        raise ConfigError(where, data, "must be a mapping")
    for key in data:
        if key not in required:
            raise ConfigError(f"{where}.{key}", data[key],
                              f"unknown key; expected one of {', '.join(required)}")
    for key in required:
        if key not in data:
            raise ConfigError(f"{where}.{key}", None, "missing")


def _range(v: Any, where: str) -> Range:
    ok = (isinstance(v, list) and len(v) == 2
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
          and -100 < v[0] <= v[1])
    if not ok:
        raise ConfigError(where, v, "must be [low, high] percent with -100 < low <= high")
    return v[0] / 100.0, v[1] / 100.0


def _to_pct(r: Range) -> list[float]:
    return [round(100 * r[0], 1), round(100 * r[1], 1)]


def _pct(r: float) -> str:
    return f"{100 * r:+.0f}%"


def pct_range(values: list[float]) -> Range:
    """[lowest, highest] of residuals (fractions), rounded outwards to 0.1% (a band never
    narrows by rounding)."""
    return (math.floor(1000 * min(values) + 1e-9) / 1000,
            math.ceil(1000 * max(values) - 1e-9) / 1000)


def band_ranges(rows: list[dict[str, Any]], metric: str) -> dict[str, Range]:
    """Per kind, the [lowest, highest] residual of `metric` (pct_range) over the rows of
    that kind, the plain rows and the rows with communication: a plain run measures what
    every kind shares, and a whole step on several GPUs (the collectives' overlap, the
    clocks the GPUs ran at) too. A kind has an entry only where it has rows of its own
    with the metric. Rows carry "kind", "communication" and a residual per metric they
    measured."""
    have = [r for r in rows if metric in r]
    out: dict[str, Range] = {}
    for kind in KINDS:
        if not any(r["kind"] == kind for r in have):
            continue
        values = [r[metric] for r in have
                  if r["kind"] in (kind, "plain") or r["communication"]]
        out[kind] = pct_range(values)
    if "plain" not in out:
        raise ConfigError(f"error_bands.{metric}", "no plain runs",
                          "the evidence must hold a plain run with this metric")
    return out


def band_pct(band: tuple[float, float] | None, value: float | None) -> str | None:
    """An interval relative to its prediction, e.g. "-11%..+6%" (None without one)."""
    if band is None or not value:
        return None
    low, high = (100.0 * (b / value - 1.0) for b in band)
    return f"{low:+.0f}%..{high:+.0f}%"
