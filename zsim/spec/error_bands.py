"""ErrorBands: how far a profile's predictions were from real runs, by kind of plan, and
the interval that puts around a new prediction (issue 11, item 7).

Owns the optional `error_bands:` section of a hardware profile, the kinds of plan it is
keyed by (`plan_kind`), and the intervals: a residual is predicted / measured - 1, and a
band is the [lowest, highest] residual of the validation runs of that kind together with
those of the plain kind (every kind has the plain runs' spread at least; a kind with no
run of its own has exactly it). A prediction p then puts the real value in
[p / (1 + highest), p / (1 + lowest)]. The section is generated from the residuals by
`bands_yaml` (python -m zsim.calibrate.published_runs --bands) and checked against them by
a test, so it moves with the model.
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


def plan_kind(plan: Plan) -> str:
    """The KINDS entry of a plan, the first that applies: offload, fp32, recompute."""
    if plan.offload != "none":
        return "offload"
    if plan.compute_dtype in ("fp32", "tf32"):
        return "fp32"
    return "recompute" if plan.recompute != "none" else "plain"


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorBands:
    """Residual ranges per metric (BAND_METRICS) and kind (KINDS), as fractions."""

    residuals: dict[str, dict[str, tuple[float, float]]]
    runs: int
    """Validation runs the ranges come from."""
    source: str

    def interval(self, metric: str, plan: Plan, predicted: float) -> tuple[float, float]:
        """Where the real value of `metric` lies for a prediction of `predicted`."""
        by_kind = self.residuals[metric]
        lowest, highest = by_kind.get(plan_kind(plan), by_kind["plain"])
        return predicted / (1.0 + highest), predicted / (1.0 + lowest)

    @classmethod
    def from_dict(cls, data: Any) -> ErrorBands:
        """From the profile's `error_bands:` mapping: per metric, per kind, [lowest,
        highest] residual in percent; `runs`; `source`.

        Raises:
            ConfigError: an unknown or missing key, or a range that is not [low, high]
                with -100 < low <= high.
        """
        where = "error_bands"
        if not isinstance(data, dict):
            raise ConfigError(where, data, "must be a mapping")
        for key in data:
            if key not in (*BAND_METRICS, "runs", "source"):
                raise ConfigError(f"{where}.{key}", data[key], "unknown key; expected one of "
                                  f"{', '.join((*BAND_METRICS, 'runs', 'source'))}")
        source, runs = data.get("source"), data.get("runs")
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"{where}.source", source, "must be a non-empty string")
        if isinstance(runs, bool) or not isinstance(runs, int) or runs <= 0:
            raise ConfigError(f"{where}.runs", runs, "must be a positive integer")
        residuals = {}
        for metric in BAND_METRICS:
            kinds = data.get(metric)
            if not isinstance(kinds, dict) or "plain" not in kinds:
                raise ConfigError(f"{where}.{metric}", kinds,
                                  "must map kinds of plan (plain at least) to [low, high] %")
            for kind in kinds:
                if kind not in KINDS:
                    raise ConfigError(f"{where}.{metric}.{kind}", kind,
                                      f"unknown kind; expected {', '.join(KINDS)}")
            residuals[metric] = {k: _range(v, f"{where}.{metric}.{k}") for k, v in kinds.items()}
        return cls(residuals=residuals, runs=runs, source=source)


def _range(v: Any, where: str) -> tuple[float, float]:
    ok = (isinstance(v, list) and len(v) == 2
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
          and -100 < v[0] <= v[1])
    if not ok:
        raise ConfigError(where, v, "must be [low, high] percent with -100 < low <= high")
    return v[0] / 100.0, v[1] / 100.0


def band_ranges(rows: list[dict[str, Any]]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per metric and kind, [lowest, highest] residual (percent, rounded out to 0.1) over
    the rows of that kind and the plain rows; `rows` carry "kind" and one residual per
    metric (zsim.calibrate.published_runs.residuals)."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for metric in BAND_METRICS:
        out[metric] = {}
        for kind in KINDS:
            own = [r[metric] for r in rows if r["kind"] == kind]
            if kind != "plain" and not own:
                continue
            values = own + [r[metric] for r in rows if r["kind"] == "plain"]
            out[metric][kind] = (_round(100 * min(values), down=True),
                                 _round(100 * max(values), down=False))
    return out


def _round(pct: float, *, down: bool) -> float:
    """Percent to 0.1, rounded outwards (the band never narrows by rounding)."""
    return (math.floor(pct * 10) if down else math.ceil(pct * 10)) / 10


def bands_yaml(rows: list[dict[str, Any]], *, source: str) -> str:
    """The `error_bands:` section of a profile for these residual rows."""
    lines = ["error_bands:",
             "  # [lowest, highest] residual (predicted / measured - 1, %) of the validation runs",
             "  # of each kind of plan together with the plain ones (zsim.spec.error_bands).",
             f"  runs: {len(rows)}"]
    for metric, kinds in band_ranges(rows).items():
        inner = ", ".join(f"{k}: [{lo:.1f}, {hi:.1f}]" for k, (lo, hi) in kinds.items())
        lines.append(f"  {metric}: {{{inner}}}")
    lines.append(f"  source: {source}")
    return "\n".join(lines) + "\n"


def band_pct(band: tuple[float, float] | None, value: float | None) -> str | None:
    """An interval relative to its prediction, e.g. "-11%..+6%" (None without one)."""
    if band is None or not value:
        return None
    low, high = (100.0 * (b / value - 1.0) for b in band)
    return f"{low:+.0f}%..{high:+.0f}%"
