"""DataFrame -> matplotlib Figure: the sweep report's plots.

Owns the figures of a scenario report: step time split into compute and exposed
communication per run, memory live at the peak by category against HBM, and the
allocated-memory curve over the step. Uses matplotlib's object API only (Figure, never
pyplot, so no global state and no display: the Agg canvas renders PNGs); never simulates.
Reads the columns zsim.report.frame produces. Only the sweep path imports this module.
"""

from __future__ import annotations

import io

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from zsim.analytic.memory import CATEGORIES

PNG_DPI = 100
"""Resolution of the saved PNGs, dots per inch."""

IDLE_FLOOR_S = 1e-9
"""Idle compute-stream time below this (seconds) is rounding, not a bar segment."""

_COLORS = {
    "compute": "#4c72b0", "exposed_comm": "#dd8452", "other_idle": "#bbbbbb",
    "params": "#4c72b0", "grads": "#55a868", "master_params": "#8172b3",
    "optimizer_states": "#937860", "gathered_params": "#64b5cd", "gathered_grads": "#8c8c8c",
    "activations": "#dd8452", "comm_buffers": "#c44e52", "workspace": "#da8bc3",
}


def _run_axis(ax: Axes, frame: pd.DataFrame) -> None:
    """Runs top to bottom on the y axis; a run that does not fit is labelled (OOM), and
    (OOM, closed form) when it was not simulated."""
    labels = [run if fits else f"{run} (OOM, closed form)" if how == "closed form"
              else f"{run} (OOM)"
              for run, fits, how in zip(frame["run"], frame["fits"], frame["evaluated"],
                                        strict=True)]
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()


def step_time_figure(frame: pd.DataFrame) -> Figure:
    """Horizontal stacked bars per run: compute time, exposed communication, and any other
    idle time of the compute stream (host waits), summing to the step time.

    A run not simulated to the end of its step has no bar.

    Args:
        frame: zsim.report.frame.sweep_frame output (run, fits, evaluated, step_time_s,
            compute_time_s, exposed_comm_s).
    """
    runs = list(frame["run"])
    compute = list(frame["compute_time_s"].fillna(0.0))
    exposed = list(frame["exposed_comm_s"].fillna(0.0))
    # Float residue of step - compute - exposed is not idle time.
    other = [x if x > IDLE_FLOOR_S else 0.0 for x in
             (s - c - e for s, c, e in zip(frame["step_time_s"].fillna(0.0), compute, exposed,
                                           strict=True))]
    fig = Figure(figsize=(8, 1.8 + 0.45 * len(runs)), layout="constrained")
    ax = fig.add_subplot()
    y = list(range(len(runs)))
    left = [0.0] * len(runs)
    for key, label, width in (("compute", "compute", compute),
                              ("exposed_comm", "exposed communication", exposed),
                              ("other_idle", "other idle (host)", other)):
        if key == "other_idle" and not any(w > 0 for w in width):
            continue
        ax.barh(y, width, left=left, color=_COLORS[key], label=label)
        left = [a + b for a, b in zip(left, width, strict=True)]
    _run_axis(ax, frame)
    ax.set_xlabel("step time (s)")
    ax.set_title("Step time: compute vs exposed communication")
    fig.legend(loc="outside lower center", ncols=3)
    return fig


def memory_figure(frame: pd.DataFrame) -> Figure:
    """Horizontal stacked bars per run of the memory live at the peak, by category (GiB),
    with a vertical line at each distinct HBM capacity.

    Args:
        frame: sweep_frame output (run, fits, evaluated, hbm_gib, at_peak_<category>_gib).
    """
    runs = list(frame["run"])
    fig = Figure(figsize=(8, 1.8 + 0.45 * len(runs)), layout="constrained")
    ax = fig.add_subplot()
    y = list(range(len(runs)))
    left = [0.0] * len(runs)
    for cat in CATEGORIES:
        width = list(frame[f"at_peak_{cat}_gib"])
        if not any(w > 0 for w in width):
            continue
        ax.barh(y, width, left=left, color=_COLORS[cat], label=cat)
        left = [a + b for a, b in zip(left, width, strict=True)]
    for hbm in sorted(set(frame["hbm_gib"])):
        ax.axvline(hbm, color="black", linestyle="--", linewidth=1,
                   label=f"HBM {hbm:.1f} GiB")
    _run_axis(ax, frame)
    ax.set_xlabel("allocated at the peak (GiB)")
    ax.set_title("Peak memory by category")
    fig.legend(loc="outside lower center", ncols=4, fontsize="small")
    return fig


def memory_curve_figure(curves: pd.DataFrame, *, hbm_gib: float) -> Figure:
    """Allocated memory over the simulated step, one step line per run, and the HBM line.

    Args:
        curves: zsim.report.frame.memory_curve_frame output (run, time_s, allocated_gib).
        hbm_gib: HBM capacity to draw, GiB.
    """
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for run, points in curves.groupby("run", sort=False):
        ax.plot(list(points["time_s"]), list(points["allocated_gib"]),
                drawstyle="steps-post", linewidth=1, label=str(run))
    ax.axhline(hbm_gib, color="black", linestyle="--", linewidth=1,
               label=f"HBM {hbm_gib:.1f} GiB")
    ax.set_xlabel("time in the step (s)")
    ax.set_ylabel("allocated (GiB)")
    ax.set_title("Memory over one optimizer step")
    ax.legend(loc="upper right", fontsize="small")
    return fig


def svg_bytes(fig: Figure) -> bytes:
    """The figure as SVG bytes, deterministic for the same figure: element ids hashed with
    a fixed salt, no date and no "Creator" (matplotlib version) metadata."""
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "zsim"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return buf.getvalue()


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes, deterministic for the same figure: fixed dpi and no
    "Software" (matplotlib version) metadata; PNGs carry no date."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PNG_DPI, metadata={"Software": None})
    return buf.getvalue()
