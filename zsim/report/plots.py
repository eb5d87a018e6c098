"""DataFrame -> matplotlib Figure: the sweep report's plots.

Owns the figures of a scenario report: step time split into compute and exposed
communication per run, memory live at the peak by category against HBM, and the
allocated-memory curve over the step with the HBM line labelled clear of the legend. Each
is titled with the context of its runs (zsim.report.titles) and labelled in words with
units (zsim.report.labels). Uses matplotlib's object API only (Figure, never pyplot, so no
global state and no display); never simulates; figures are saved as SVG (svg_bytes). Reads
the columns zsim.report.dataframes produces. Only the sweep path imports this module.
"""

from __future__ import annotations

import io

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from zsim.analytic.memory import CATEGORIES
from zsim.report import labels
from zsim.report.titles import set_title

IDLE_FLOOR_S = 1e-9
"""Idle compute-stream time below this (seconds) is rounding, not a bar segment."""

NO_STEP_TIME = "does not fit in HBM: no step time"
"""Written in the step-time row of a run that does not fit (it has no bar)."""

LABEL_INCH_PER_CHAR = 0.075
"""Width of a run-name character on a bar figure's y axis (10 pt), inches, about."""

HEADROOM = 1.1
"""The memory curve's y axis ends this factor above the higher of HBM and the curves."""

LEGEND_WIDE_CHARS = 24
"""A run name longer than this puts the memory curve's legend in two columns, not four."""

_COLORS = {
    "compute": "#4c72b0", "exposed_comm": "#dd8452", "other_idle": "#bbbbbb",
    "params": "#4c72b0", "grads": "#55a868", "master_params": "#8172b3",
    "optimizer_states": "#937860", "gathered_params": "#64b5cd", "gathered_grads": "#8c8c8c",
    "activations": "#dd8452", "comm_buffers": "#c44e52", "workspace": "#da8bc3",
}


def _run_labels(frame: pd.DataFrame) -> list[str]:
    """The run names of a bar figure's y axis; a run that does not fit is labelled (OOM),
    and (OOM, closed form) when it was not simulated."""
    return [run if fits else f"{run} (OOM, closed form)" if how == "closed form"
            else f"{run} (OOM)"
            for run, fits, how in zip(frame["run"], frame["fits"], frame["evaluated"],
                                      strict=True)]


def _run_axis(ax: Axes, frame: pd.DataFrame) -> None:
    """Runs top to bottom on the y axis, labelled by _run_labels."""
    ax.set_yticks(range(len(frame)))
    ax.set_yticklabels(_run_labels(frame))
    ax.invert_yaxis()


def _bars_size(frame: pd.DataFrame) -> tuple[float, float]:
    """Width and height (inches) of a figure of one bar per run: a row per run, and wider
    where run names are long, so that the bars keep about 5 inches."""
    longest = max((len(label) for label in _run_labels(frame)), default=0)
    return max(8.0, 5.5 + LABEL_INCH_PER_CHAR * longest), 2.4 + 0.45 * len(frame)


def hbm_label(hbm_gib: float) -> str:
    """The legend entry of an HBM capacity line."""
    return f"HBM capacity {hbm_gib:.1f} GiB"


def step_time_figure(frame: pd.DataFrame, *, context: str) -> Figure:
    """Horizontal stacked bars per run: compute time, exposed communication, and any other
    idle time of the compute stream (host waits), summing to the step time.

    A run that does not fit in HBM has no bar, and NO_STEP_TIME in its row.

    Args:
        frame: zsim.report.dataframes.sweep_frame output (run, fits, evaluated, step_time_s,
            compute_time_s, exposed_comm_s).
        context: the runs' context lines (zsim.report.titles.context_text).
    """
    runs = list(frame["run"])
    compute = list(frame["compute_time_s"].fillna(0.0))
    exposed = list(frame["exposed_comm_s"].fillna(0.0))
    # Float residue of step - compute - exposed is not idle time.
    other = [x if x > IDLE_FLOOR_S else 0.0 for x in
             (s - c - e for s, c, e in zip(frame["step_time_s"].fillna(0.0), compute, exposed,
                                           strict=True))]
    fig = Figure(figsize=_bars_size(frame), layout="constrained")
    ax = fig.add_subplot()
    y = list(range(len(runs)))
    left = [0.0] * len(runs)
    for key, label, width in (("compute", "Compute", compute),
                              ("exposed_comm", "Exposed communication", exposed),
                              ("other_idle", "Other idle time (host)", other)):
        if key == "other_idle" and not any(w > 0 for w in width):
            continue
        ax.barh(y, width, left=left, color=_COLORS[key], label=label)
        left = [a + b for a, b in zip(left, width, strict=True)]
    for row, (fits, step) in enumerate(zip(frame["fits"], frame["step_time_s"], strict=True)):
        if not fits and pd.isna(step):  # no bar: say why rather than leave the row blank
            ax.annotate(NO_STEP_TIME, (0, row), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize="small", color="dimgrey")
    _run_axis(ax, frame)
    ax.set_xlabel(labels.COLUMNS["step_time_s"].label)
    set_title(fig, "Step time per run: compute and exposed communication", context)
    fig.legend(loc="outside lower center", ncols=3)
    return fig


def memory_figure(frame: pd.DataFrame, *, context: str) -> Figure:
    """Horizontal stacked bars per run of the memory live at the peak, by category (GiB),
    with a vertical line at each distinct HBM capacity.

    Args:
        frame: sweep_frame output (run, fits, evaluated, hbm_gib, at_peak_<category>_gib).
        context: the runs' context lines (zsim.report.titles.context_text).
    """
    runs = list(frame["run"])
    fig = Figure(figsize=_bars_size(frame), layout="constrained")
    ax = fig.add_subplot()
    y = list(range(len(runs)))
    left = [0.0] * len(runs)
    for cat in CATEGORIES:
        width = list(frame[f"at_peak_{cat}_gib"])
        if not any(w > 0 for w in width):
            continue
        ax.barh(y, width, left=left, color=_COLORS[cat],
                label=labels.words(cat, labels.CATEGORIES))
        left = [a + b for a, b in zip(left, width, strict=True)]
    for hbm in sorted(set(frame["hbm_gib"])):
        ax.axvline(hbm, color="black", linestyle="--", linewidth=1, label=hbm_label(hbm))
    _run_axis(ax, frame)
    ax.set_xlabel("Memory allocated at the peak, per GPU (GiB)")
    set_title(fig, "Peak memory per GPU by category", context)
    fig.legend(loc="outside lower center", ncols=3, fontsize="small")
    return fig


def memory_curve_figure(curves: pd.DataFrame, *, hbm_gib: float, context: str) -> Figure:
    """Allocated memory over the simulated step, one step line per run, and the HBM line,
    labelled on the axes; the y axis from zero to above the HBM line, and the legend under
    the axes, where it cannot cover the line.

    Args:
        curves: zsim.report.dataframes.memory_curve_frame output (run, time_s, allocated_gib).
        hbm_gib: HBM capacity to draw, GiB.
        context: the runs' context lines (zsim.report.titles.context_text).
    """
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    for run, points in curves.groupby("run", sort=False):
        ax.plot(list(points["time_s"]), list(points["allocated_gib"]),
                drawstyle="steps-post", linewidth=1, label=str(run))
    ax.axhline(hbm_gib, color="black", linestyle="--", linewidth=1, label=hbm_label(hbm_gib))
    ax.annotate(hbm_label(hbm_gib), (1.0, hbm_gib), xycoords=("axes fraction", "data"),
                xytext=(-4, 3), textcoords="offset points", ha="right", va="bottom",
                fontsize="small")
    top = max([hbm_gib, *curves["allocated_gib"]])
    ax.set_ylim(0, HEADROOM * top)
    ax.set_xlabel("Time in the step (s)")
    ax.set_ylabel("Allocated memory per GPU (GiB)")
    set_title(fig, "Allocated memory over one optimizer step", context)
    longest = max((len(str(r)) for r in curves["run"]), default=0)
    fig.legend(loc="outside lower center", ncols=2 if longest > LEGEND_WIDE_CHARS else 4,
               fontsize="small")
    return fig


SVG_FONTS = ["DejaVu Sans", "Bitstream Vera Sans", "Verdana"]
"""The font an SVG's text names, then its fallbacks before the viewer's sans-serif:
matplotlib's own font (it lays the figure out with it), the font it derives from (the
same metrics), and the widest common one."""


def svg_bytes(fig: Figure) -> bytes:
    """The figure as SVG bytes, deterministic for the same figure: element ids hashed with
    a fixed salt, no date and no "Creator" (matplotlib version) metadata. Text is SVG
    text in SVG_FONTS, not a path per glyph: the file is a fifth of the size, and a
    viewer with DejaVu Sans draws it as matplotlib does."""
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "zsim", "svg.fonttype": "none",
                                "font.sans-serif": SVG_FONTS}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return buf.getvalue()
