"""The validation evidence's figures (reports/validation/, zsim.validation.evidence), as
SVG: each report's own batch predicted against measured, one panel per metric
(`predicted_vs_measured-<report>.svg`), and the error budget of BUDGET_REPORT's batches
with its two tables (zsim.validation.error_budget). Every figure is drawn from the
committed tables alone, so that

    zsim validate figures --out reports/validation

regenerates them all (`zsim validate grid` runs it after each batch or re-prediction).
A report's own batch is drawn where it names its profiles: its rows are the current
simulator's predictions (a GPU report's rows, predicted where they ran, are not).
Imports matplotlib.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from zsim.atomic import write_files
from zsim.report.plots import svg_bytes
from zsim.validation import error_budget, evidence

MARKERS = ("o", "s", "^", "D", "v", "P")
"""Marker of each world size of a figure, smallest first."""


def figure_name(report: str) -> str:
    """The file of a report's predicted-against-measured figure."""
    return f"predicted_vs_measured-{report}.svg"


def figure_files(root: Path) -> dict[str, bytes]:
    """Every figure of the evidence folder `root` (and the error budget's tables), by
    file name.

    Raises:
        ConfigError: a bad evidence folder (zsim.validation.evidence).
    """
    batches = evidence.read_batches(root)
    table = evidence.by_batch(evidence.read_table(root))
    files = {figure_name(b.report): svg_bytes(predicted_vs_measured_figure(
                 table.get(b.name, []), title=f"{b.report}: predicted against measured"))
             for b in batches if b.name == b.report and b.profiles}
    if any(b.report == error_budget.BUDGET_REPORT for b in batches):
        rows, groups = error_budget.read_report(root)
        files |= error_budget.files(rows, groups, error_budget.fit(rows),
                                    error_budget.BOUND_PCT)
    return files


def write_figures(root: Path) -> list[Path]:
    """Write every figure (figure_files) into `root`, all or nothing, and remove the
    predicted-against-measured figures of reports that have none any more.

    Returns:
        The paths written.
    """
    files = figure_files(root)
    for old in Path(root).glob(figure_name("*")):
        if old.name not in files:
            old.unlink()
    return write_files(Path(root), files)


def predicted_vs_measured_figure(rows: list[dict[str, Any]], *, title: str) -> Figure:
    """One panel per metric with predicted rows: predicted against measured, a marker per
    world size, the line predicted = measured and, where the rows have one, their bound
    either side of it; log axes where the figures span more than a decade."""
    rows = [r for r in rows if r["predicted"] is not None]  # measured-only rows: no point
    metrics = sorted({r["metric"] for r in rows})
    worlds = sorted({r["nproc"] for r in rows})
    cols = 4
    nrows = max(1, -(-len(metrics) // cols))
    fig = Figure(figsize=(4.5 * cols, 4.2 * nrows + 0.4))
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    for ax, metric in zip(axes, metrics, strict=False):
        sel = [r for r in rows if r["metric"] == metric]
        for nproc, marker in zip(worlds, MARKERS * len(worlds), strict=False):
            pts = [r for r in sel if r["nproc"] == nproc]
            if pts:
                ax.scatter([r["measured"] for r in pts], [r["predicted"] for r in pts],
                           marker=marker, label=f"world {nproc}")
        lo = min(min(r["measured"], r["predicted"]) for r in sel)
        hi = max(max(r["measured"], r["predicted"]) for r in sel)
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, label="predicted = measured")
        bound = max((r["bound_pct"] or 0.0 for r in sel), default=0.0)
        if bound:
            for sign in (1, -1):
                f = 1 + sign * bound / 100
                ax.plot([lo, hi], [lo * f, hi * f], color="grey", linewidth=0.8,
                        linestyle="--", label=f"+-{bound:g}%" if sign > 0 else None)
        if lo > 0 and hi > 10 * lo:  # log axes across decades, labelled at decades only
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"measured {metric}")
        ax.set_ylabel(f"predicted {metric}")
        ax.set_title(metric + (f" (bound {bound:g}%)" if bound else ""))
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
