"""Where the validation's step-time error comes from, over repeated batches of the same
cases: each case's own bias, each calibration's shift, and what is left.

A batch (`zsim validate grid --calibrate-here --batch NAME`, one batch of the evidence
folder: zsim.validation.evidence) calibrates a profile per world size, then times every
case; the table holds each case's error (predicted / measured - 1, in percent) with the
current simulator (zsim.validation.report.repredict_report keeps every batch so). Over
the batches of one report (BUDGET_REPORT: the repository's 2-core host's)
an error splits into three parts, fitted by least squares as

    error[case, group] = bias[case] + shift[group] + residual

where a group is one batch at one world size (the rows its one profile predicts): the
case's bias is what the model gets wrong about that program, the same in every batch; the
group's shift is what its calibration moved every prediction by (slow or fast spells of
the shared host while it ran, the host itself); the residual is the rest (the case's own
runs). Each world size's groups see only that world size's cases, so the shifts are
centred per world size (their mean over that world size's rows is 0) and the biases of
each world size keep its mean error.

    zsim validate error-budget FOLDER [--report NAME] [--out DIR] [--bound-pct 15]

reads the batches of report NAME (default BUDGET_REPORT) in the evidence folder FOLDER and
writes `error_budget_cases.csv` (per case: batches, mean error, bias, spread, range,
share within the bound), `error_budget_groups.csv` (per batch and world size: the host,
when its profile was calibrated, the rows and how many are within the bound, the shift)
and `error_budget.svg` into --out (default: FOLDER), and prints the summary:
the rows within the bound, each case's mean error, the three parts' spreads, the shifts
by host, and the chance that a batch of every case has all its rows within the bound
were its errors drawn from the budget (all_within_probability), also with the shifts
halved and with none. Imports no torch (and matplotlib only to draw).
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from zsim.atomic import write_files
from zsim.errors import ConfigError
from zsim.spec.yaml_file import read_yaml
from zsim.validation import evidence

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METRIC = "step_time_s"
BOUND_PCT = 15.0
"""The report's step-time bound (zsim.validation.comparison.BOUNDS_PCT, which imports
torch)."""
BUDGET_REPORT = "validation-cpu2"
"""The report whose batches the committed budget is over: the library and parallel plans
timed again and again on the repository's 2-core hosts, each batch with its own profiles."""
FILES = ("error_budget_cases.csv", "error_budget_groups.csv", "error_budget.svg")

CASE_FIELDS = ("world_size", "case", "batches", "mean_error_pct", "bias_pct",
               "std_error_pct", "min_error_pct", "max_error_pct", "within_bound_pct")
GROUP_FIELDS = ("batch", "world_size", "host", "calibrated_utc", "rows", "within_bound",
                "shift_pct")

_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}) UTC")


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One step-time row of one batch."""

    batch: str
    """The batch's name."""
    world_size: int
    case: str
    """'<model> <plan label>'."""
    error_pct: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """One batch at one world size: the rows one calibrated profile predicted."""

    batch: str
    world_size: int
    host: str
    """The profile's CPU (its gpu.name before ', one torch.distributed rank')."""
    calibrated_utc: str
    """When the profile was calibrated (from its gpu.source), 'YYYY-MM-DD HH:MM'."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """The fit: per case (world size, case) its bias, per group its shift, percent."""

    bias_pct: dict[tuple[int, str], float]
    shift_pct: dict[tuple[str, int], float]
    residual_std_pct: float
    """Standard deviation of the residuals, on the fit's degrees of freedom."""

    def spread_pct(self) -> tuple[float, float]:
        """Standard deviations of the biases (over cases) and of the shifts (over groups)."""
        return (float(np.std(list(self.bias_pct.values()))),
                float(np.std(list(self.shift_pct.values()))))


def read_report(root: Path, report: str = BUDGET_REPORT) -> tuple[list[Row], list[Group]]:
    """Every step-time row of the report's batches that has an error (cases the simulator
    predicts), in the table's order, and the groups (from each batch's profile at each
    world size it has rows of).

    Raises:
        ConfigError: a report with no batch, a batch with rows at a world size it has no
            profile for, or no predicted step-time row at all.
    """
    batches = [b for b in evidence.read_batches(root) if b.report == report]
    if not batches:
        raise ConfigError("report", report, f"has no batch in {Path(root) / evidence.BATCHES}")
    table = evidence.by_batch(evidence.read_table(root))
    rows: list[Row] = []
    groups: list[Group] = []
    for b in batches:
        mine = [Row(batch=b.name, world_size=r["nproc"], case=f"{r['model']} {r['plan']}",
                    error_pct=r["error_pct"])
                for r in table.get(b.name, [])
                if r["metric"] == METRIC and r["error_pct"] is not None]
        for world in sorted({r.world_size for r in mine}):
            if world not in b.profiles:
                raise ConfigError(f"batches.{b.name}.profiles", sorted(b.profiles),
                                  f"has step-time rows at world size {world} but no profile")
            gpu = read_yaml(evidence.profile_path(root, b.profiles[world]),
                            field="profile")["gpu"]
            stamp = _STAMP.search(str(gpu.get("source", "")))
            groups.append(Group(batch=b.name, world_size=world,
                                host=str(gpu["name"]).split(", one ")[0],
                                calibrated_utc=stamp.group(1) if stamp else ""))
        rows += mine
    if not rows:
        raise ConfigError("report", report, "has no predicted step-time rows")
    return rows, groups


def fit(rows: list[Row]) -> Budget:
    """Least-squares biases and shifts of `rows` (module docstring): the minimum-norm
    solution of the additive model, then each world size's shifts moved by their mean
    over its rows (and its biases by the opposite), which leaves every fitted error as
    it was."""
    cases = sorted({(r.world_size, r.case) for r in rows})
    groups = sorted({(r.batch, r.world_size) for r in rows})
    ci = {c: i for i, c in enumerate(cases)}
    gi = {g: len(cases) + i for i, g in enumerate(groups)}
    design = np.zeros((len(rows), len(cases) + len(groups)))
    errors = np.array([r.error_pct for r in rows])
    for i, r in enumerate(rows):
        design[i, ci[(r.world_size, r.case)]] = 1.0
        design[i, gi[(r.batch, r.world_size)]] = 1.0
    coef, *_ = np.linalg.lstsq(design, errors, rcond=None)
    for world in sorted({w for w, _ in cases}):
        on = [i for i, r in enumerate(rows) if r.world_size == world]
        centre = float(np.mean([coef[gi[(rows[i].batch, world)]] for i in on]))
        for g in groups:
            if g[1] == world:
                coef[gi[g]] -= centre
        for c in cases:
            if c[0] == world:
                coef[ci[c]] += centre
    residuals = errors - design @ coef
    dof = len(rows) - np.linalg.matrix_rank(design)
    std = math.sqrt(float(residuals @ residuals) / dof) if dof > 0 else 0.0
    return Budget(bias_pct={c: float(coef[ci[c]]) for c in cases},
                  shift_pct={g: float(coef[gi[g]]) for g in groups}, residual_std_pct=std)


def all_within_probability(budget: Budget, bound_pct: float, *,
                           shift_scale: float = 1.0) -> float:
    """The chance that one batch of every case has all its rows within the bound, were
    its errors the budget's biases plus a shift per world size drawn from a normal of
    that world size's shifts' spread (times `shift_scale`: 0 for a calibration that
    never moves) plus a normal residual of the fitted spread. The world sizes' shifts
    independent; the integral over each shift on a fixed grid of +-6 spreads."""
    sd_r = max(budget.residual_std_pct, 1e-9)
    out = 1.0
    for world in sorted({w for w, _ in budget.bias_pct}):
        biases = np.array([b for (w, _), b in budget.bias_pct.items() if w == world])
        shifts = [v for (_, w), v in budget.shift_pct.items() if w == world]
        sd_s = float(np.std(shifts)) * shift_scale

        def inside(s: float, biases: np.ndarray = biases) -> float:
            hi = (bound_pct - biases - s) / (sd_r * math.sqrt(2))
            lo = (-bound_pct - biases - s) / (sd_r * math.sqrt(2))
            return float(np.prod([0.5 * (math.erf(h) - math.erf(x))
                                  for h, x in zip(hi, lo, strict=True)]))

        if sd_s == 0:
            out *= inside(0.0)
            continue
        grid = np.linspace(-6 * sd_s, 6 * sd_s, 1201)
        weights = np.exp(-0.5 * (grid / sd_s) ** 2)
        out *= float(sum(w * inside(float(s)) for s, w in zip(grid, weights, strict=True))
                     / weights.sum())
    return out


def case_rows(rows: list[Row], budget: Budget, bound_pct: float) -> list[dict[str, object]]:
    """Per case (world size, then case): its errors' statistics and its fitted bias."""
    out = []
    for key in sorted(budget.bias_pct):
        errs = np.array([r.error_pct for r in rows if (r.world_size, r.case) == key])
        out.append({"world_size": key[0], "case": key[1], "batches": len(errs),
                    "mean_error_pct": _pct(errs.mean()), "bias_pct": _pct(budget.bias_pct[key]),
                    "std_error_pct": _pct(errs.std()), "min_error_pct": _pct(errs.min()),
                    "max_error_pct": _pct(errs.max()),
                    "within_bound_pct": _pct(100 * np.mean(np.abs(errs) <= bound_pct))})
    return out


def group_rows(rows: list[Row], groups: list[Group], budget: Budget,
               bound_pct: float) -> list[dict[str, object]]:
    """Per group, in order of calibration: its host, rows, rows within the bound, shift."""
    out = []
    for g in sorted(groups, key=lambda g: (g.calibrated_utc, g.batch, g.world_size)):
        errs = [r.error_pct for r in rows if (r.batch, r.world_size) == (g.batch, g.world_size)]
        out.append({"batch": g.batch, "world_size": g.world_size, "host": g.host,
                    "calibrated_utc": g.calibrated_utc, "rows": len(errs),
                    "within_bound": sum(abs(e) <= bound_pct for e in errs),
                    "shift_pct": _pct(budget.shift_pct[(g.batch, g.world_size)])})
    return out


def summary(rows: list[Row], groups: list[Group], budget: Budget, bound_pct: float) -> str:
    """The figures a reader wants first, one per line."""
    within = sum(abs(r.error_pct) <= bound_pct for r in rows)
    bias_sd, shift_sd = budget.spread_pct()
    worst = max(budget.bias_pct.items(), key=lambda kv: abs(kv[1]))
    means = {k: np.mean([r.error_pct for r in rows if (r.world_size, r.case) == k])
             for k in budget.bias_pct}
    worst_mean = max(means.items(), key=lambda kv: abs(kv[1]))
    shifts_of = {h: [budget.shift_pct[(g.batch, g.world_size)] for g in groups if g.host == h]
                 for h in sorted({g.host for g in groups})}
    by_host = "; ".join(f"{h}: {len(s)} groups, mean shift {np.mean(s):+.1f}%"
                        for h, s in shifts_of.items())
    full = [b for b in sorted({r.batch for r in rows})
            if all(abs(r.error_pct) <= bound_pct for r in rows if r.batch == b)]
    return "\n".join([
        f"{len(rows)} step-time rows of {len(budget.bias_pct)} cases in "
        f"{len({r.batch for r in rows})} batches ({len(groups)} calibrations): {within} "
        f"within {bound_pct:g}% ({100 * within / len(rows):.1f}%)",
        f"batches with every row within: {len(full)}",
        f"per case, mean error over its batches: {min(means.values()):+.1f}% to "
        f"{max(means.values()):+.1f}% (largest |mean|: {worst_mean[0][1]} n{worst_mean[0][0]}, "
        f"{worst_mean[1]:+.1f}%)",
        f"spread of the case biases {bias_sd:.1f}% (largest: {worst[0][1]} n{worst[0][0]} "
        f"{worst[1]:+.1f}%), of the calibrations' shifts {shift_sd:.1f}%, of the rest "
        f"{budget.residual_std_pct:.1f}% (standard deviations)",
        f"shifts by host: {by_host}",
        f"a batch of every case with all rows within {bound_pct:g}%, were its errors drawn "
        f"from this budget: {100 * all_within_probability(budget, bound_pct):.0f}% "
        f"(with the calibrations' shifts halved "
        f"{100 * all_within_probability(budget, bound_pct, shift_scale=0.5):.0f}%, "
        f"without them {100 * all_within_probability(budget, bound_pct, shift_scale=0):.0f}%)",
    ])


def files(rows: list[Row], groups: list[Group], budget: Budget,
          bound_pct: float) -> dict[str, bytes]:
    """The two CSVs and the figure (SVG), by file name (FILES)."""
    from zsim.report.plots import svg_bytes

    return {FILES[0]: _csv(case_rows(rows, budget, bound_pct), CASE_FIELDS),
            FILES[1]: _csv(group_rows(rows, groups, budget, bound_pct), GROUP_FIELDS),
            FILES[2]: svg_bytes(figure(rows, groups, budget, bound_pct))}


def write(out: Path, rows: list[Row], groups: list[Group], budget: Budget,
          bound_pct: float) -> list[Path]:
    """The two CSVs and the figure, into `out` together (zsim.atomic)."""
    return write_files(out, files(rows, groups, budget, bound_pct))


def _pct(x: float) -> float:
    return round(float(x), 2)


def _csv(rows: list[dict[str, object]], fields: tuple[str, ...]) -> bytes:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode()


def figure(rows: list[Row], groups: list[Group], budget: Budget,
           bound_pct: float) -> Figure:
    """Every row's error by case (one line per case, world 2 above world 4), coloured by
    the host that ran it, with the case's fitted bias and the bound."""
    from matplotlib.figure import Figure

    cases = sorted(budget.bias_pct)
    host_of = {(g.batch, g.world_size): g.host for g in groups}
    hosts = sorted(set(host_of.values()))
    fig = Figure(figsize=(10, 0.32 * len(cases) + 1.6))
    ax = fig.subplots()
    y = {c: len(cases) - 1 - i for i, c in enumerate(cases)}
    for k, host in enumerate(hosts):
        pts = [r for r in rows if host_of[(r.batch, r.world_size)] == host]
        ax.scatter([r.error_pct for r in pts], [y[(r.world_size, r.case)] for r in pts],
                   s=14, alpha=0.6, color=f"C{k}", label=host)
    ax.scatter([budget.bias_pct[c] for c in cases], [y[c] for c in cases], marker="|",
               s=260, color="black", label="case bias (fitted)")
    for x in (-bound_pct, bound_pct):
        ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
    ax.axvline(0, color="grey", linewidth=0.6)
    ax.set_yticks([y[c] for c in cases], [f"{c[1]} n{c[0]}" for c in cases], fontsize=7)
    ax.set_xlabel("step time error, predicted / measured - 1 (%)")
    bias_sd, shift_sd = budget.spread_pct()
    ax.set_title(f"{len(rows)} rows, {len({r.batch for r in rows})} batches: case biases "
                 f"sd {bias_sd:.1f}%, calibration shifts sd {shift_sd:.1f}%, rest sd "
                 f"{budget.residual_std_pct:.1f}%", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
