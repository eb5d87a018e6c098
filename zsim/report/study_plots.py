"""DataFrame -> matplotlib Figure: the figures of a study across many runs.

Owns the Pareto front of memory per GPU against tokens/s per GPU (each strategy its own
marker, both axes from zero), scaling curves (throughput and MFU against GPU count per
plan), exposed communication against unit size and prefetch, and a heatmap of one column
over two swept axes; each names in its legend the plans that fit in HBM in no run, rather
than leaving them out silently, is titled with the context of its runs
(zsim.report.titles) and labelled in words with units (zsim.report.labels). Reads the
columns zsim.report.dataframes.sweep_frame produces; uses matplotlib's object API only (Figure,
never pyplot) and never simulates. Only the report path imports it.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from zsim.errors import ConfigError
from zsim.report import labels
from zsim.report.plots import hbm_label
from zsim.report.titles import set_title

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
"""Marker of each strategy (or plan), in order of first appearance."""

HEADROOM = 1.08
"""The Pareto figure's axes end this factor above their largest value (HBM included)."""

NOTE_WIDTH_CHARS = 48
"""A legend note (the plans that do not fit) wraps at this many characters a line."""


def _fitting(frame: pd.DataFrame) -> pd.DataFrame:
    """Runs simulated to the end of their step that fit in HBM."""
    return frame[frame["fits"].astype(bool) & frame["step_time_s"].notna()]


def never_fitting_plans(frame: pd.DataFrame) -> list[str]:
    """Plans (names under `plans:`) none of whose runs fits in HBM and runs to the end of
    its step, in scenario order: a figure of fitting runs shows nothing of them."""
    drawn = set(_fitting(frame)["plan_name"])
    return [str(p) for p in dict.fromkeys(frame["plan_name"]) if p not in drawn]


def does_not_fit_note(plans: Sequence[str]) -> str:
    """The legend entry naming plans that never fit, wrapped to NOTE_WIDTH_CHARS."""
    return textwrap.fill(f"Does not fit in HBM: {', '.join(plans)}", NOTE_WIDTH_CHARS)


def _note(ax: Axes, text: str) -> None:
    """A legend entry with a grey cross and no data: something the axes do not show."""
    ax.plot([], [], linestyle="none", marker="x", color="grey", label=text)


def pareto_front(memory_gib: Sequence[float], tokens_per_s: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats on both axes (less or equal memory and
    more or equal throughput, one of them strictly), by memory ascending.

    Args:
        memory_gib: peak memory per GPU of each point.
        tokens_per_s: throughput per GPU of each point.
    """
    order = sorted(range(len(memory_gib)), key=lambda i: (memory_gib[i], -tokens_per_s[i]))
    front: list[int] = []
    for i in order:
        if not front or tokens_per_s[i] > tokens_per_s[front[-1]]:
            front.append(i)
    return front


def pareto_figure(frame: pd.DataFrame, *, context: str) -> Figure:
    """Peak memory per GPU (x) against tokens/s per GPU (y) of every fitting run, both
    axes from zero, one marker per strategy, and the Pareto front through the runs nothing
    beats on both, labelled with their run names (a label within 3% of the throughput
    range of the previous one is left out). The legend, under the axes, names the plans
    that never fit and counts the other runs that do not.

    Args:
        frame: sweep_frame output (run, plan_name, strategy, fits, step_time_s,
            peak_memory_gib, tokens_per_s_per_gpu, hbm_gib).
        context: the runs' context lines (zsim.report.titles.context_text).
    """
    fits = _fitting(frame)
    fig = Figure(figsize=(8, 6.5), layout="constrained")
    ax = fig.add_subplot()
    for i, strategy in enumerate(dict.fromkeys(fits["strategy"])):
        group = fits[fits["strategy"] == strategy]
        ax.scatter(list(group["peak_memory_gib"]), list(group["tokens_per_s_per_gpu"]),
                   marker=MARKERS[i % len(MARKERS)], s=36,
                   label=labels.words(str(strategy), labels.STRATEGIES), zorder=3)
    memory, speed = list(fits["peak_memory_gib"]), list(fits["tokens_per_s_per_gpu"])
    front = pareto_front(memory, speed)
    ax.plot([memory[i] for i in front], [speed[i] for i in front], color="black",
            linewidth=1, linestyle="--", label="Pareto front", zorder=2)
    runs = list(fits["run"])
    gap = 0.03 * (max(speed, default=0.0) - min(speed, default=0.0))
    labelled: list[int] = []
    for i in front:  # a label per front point, skipping one that would overprint the last
        if labelled and abs(speed[i] - speed[labelled[-1]]) < gap:
            continue
        labelled.append(i)
        ax.annotate(runs[i], (memory[i], speed[i]), textcoords="offset points",
                    xytext=(4, 4), fontsize="x-small")
    for hbm in sorted(set(frame["hbm_gib"])):
        ax.axvline(hbm, color="grey", linestyle=":", linewidth=1, label=hbm_label(hbm))
    never = never_fitting_plans(frame)
    if never:
        _note(ax, does_not_fit_note(never))
    others = len(frame) - len(fits) - int(frame["plan_name"].isin(never).sum())
    if others:
        _note(ax, f"{others} run{'s' if others > 1 else ''}"
                  f"{' of other plans' if never else ''}"
                  f" {'do' if others > 1 else 'does'} not fit in HBM (not drawn)")
    ax.set_xlim(0, HEADROOM * max([*memory, *frame["hbm_gib"]]))
    ax.set_ylim(0, HEADROOM * max(speed, default=1.0))
    ax.set_xlabel(labels.COLUMNS["peak_memory_gib"].label)
    ax.set_ylabel(labels.COLUMNS["tokens_per_s_per_gpu"].label)
    ax.grid(True, linewidth=0.5, alpha=0.5)
    set_title(fig, "Peak memory per GPU against tokens/s per GPU, runs that fit", context)
    fig.legend(loc="outside lower center", ncols=3, fontsize="small")
    return fig


def scaling_figure(frame: pd.DataFrame, *, context: str) -> Figure:
    """Scaling curves: job throughput (tokens/s, log-log) and MFU (%, from zero) against
    GPU count, one line per plan (the scenario's plan names), fitting runs only; a plan
    that fits at no GPU count keeps its legend entry, marked as not fitting. Expects one
    run per plan and GPU count.

    Args:
        frame: sweep_frame output (plan_name, gpus, fits, step_time_s, tokens_per_s, mfu).
        context: the runs' context lines (zsim.report.titles.context_text).
    """
    fits = _fitting(frame)
    never = set(never_fitting_plans(frame))
    fig = Figure(figsize=(11, 5.4), layout="constrained")
    speed_ax, mfu_ax = fig.subplots(1, 2)
    mfu = labels.COLUMNS["mfu"]
    for i, plan in enumerate(dict.fromkeys(frame["plan_name"])):
        group = fits[fits["plan_name"] == plan].sort_values("gpus", kind="stable")
        marker = MARKERS[i % len(MARKERS)]
        gpus = list(group["gpus"])
        label = f"{plan} (does not fit in HBM)" if plan in never else str(plan)
        speed_ax.plot(gpus, list(group["tokens_per_s"]), marker=marker, label=label)
        mfu_ax.plot(gpus, [mfu.scale * m for m in group["mfu"]], marker=marker, label=label)
    for ax in (speed_ax, mfu_ax):
        _log2_axis(ax, list(fits["gpus"]))
        ax.set_xlabel(labels.COLUMNS["gpus"].label)
        ax.grid(True, which="major", linewidth=0.5, alpha=0.5)
    speed_ax.set_yscale("log")
    speed_ax.set_ylabel(f"{labels.COLUMNS['tokens_per_s'].label} (log scale)")
    speed_ax.set_title("Job throughput")
    mfu_ax.set_ylabel(mfu.label)
    mfu_ax.set_ylim(bottom=0)
    mfu_ax.set_title("Model FLOP utilisation")
    set_title(fig, "Throughput and MFU against GPU count", context)
    handles, names = speed_ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=min(len(names), 6),
               fontsize="small")
    return fig


def exposed_comm_figure(frame: pd.DataFrame, *, context: str) -> Figure:
    """Exposed communication per step (from zero) against unit size (blocks per FSDP
    unit), one line per plan and prefetch depth; runs simulated to the end of their step,
    and a legend entry naming the plans that never fit.

    Args:
        frame: sweep_frame output (plan_name, fits, step_time_s, unit_size, prefetch,
            exposed_comm_s).
        context: the runs' context lines (zsim.report.titles.context_text).
    """
    done = frame[frame["exposed_comm_s"].notna()]
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    several = len(set(frame["plan_name"])) > 1
    i = 0
    for plan in dict.fromkeys(frame["plan_name"]):
        for prefetch in sorted(set(done[done["plan_name"] == plan]["prefetch"])):
            group = done[(done["plan_name"] == plan) & (done["prefetch"] == prefetch)]
            group = group.sort_values("unit_size", kind="stable")
            label = (f"{plan}, prefetch depth {prefetch}" if several
                     else f"Prefetch depth {prefetch}")
            ax.plot(list(group["unit_size"]), list(group["exposed_comm_s"]),
                    marker=MARKERS[i % len(MARKERS)], label=label)
            i += 1
    never = never_fitting_plans(frame)
    if never:
        _note(ax, does_not_fit_note(never))
    _log2_axis(ax, list(done["unit_size"]))
    ax.set_ylim(bottom=0)
    ax.set_xlabel(labels.COLUMNS["unit_size"].label)
    ax.set_ylabel(labels.COLUMNS["exposed_comm_s"].label)
    set_title(fig, "Exposed communication against FSDP unit size and prefetch depth",
              context)
    fig.legend(loc="outside lower center", ncols=4, fontsize="small")
    return fig


def heatmap_figure(frame: pd.DataFrame, *, x: str, y: str, value: str,
                   plan: str | None = None, context: str) -> Figure:
    """`value` over two swept columns `x` and `y`: one cell per (x, y), annotated with the
    value in the figure's unit (labels.column_quantity: MFU in %); a run that does not fit
    (or was not simulated) is an empty cell marked OOM.

    Args:
        frame: sweep_frame output.
        x, y: columns of the frame swept by the scenario (ticks: their sorted values).
        value: the numeric column coloured.
        plan: only the runs of this plan (its name under `plans:`); None: every run.
        context: the context lines of the runs drawn (zsim.report.titles.context_text).

    Raises:
        ConfigError: field `report.heatmap.*`: an unknown column or plan, or two runs in
            one cell.
    """
    for key, column in (("x", x), ("y", y), ("value", value)):
        if column not in frame.columns:
            raise ConfigError(f"report.heatmap.{key}", column, "not a column of the sweep "
                              f"frame; columns: {', '.join(map(str, frame.columns))}")
    rows = frame if plan is None else frame[frame["plan_name"] == plan]
    if rows.empty:
        raise ConfigError("report.heatmap.plan", plan, "no such plan; plans: "
                          f"{', '.join(dict.fromkeys(map(str, frame['plan_name'])))}")
    quantity = labels.column_quantity(value)
    xs, ys = sorted(set(rows[x])), sorted(set(rows[y]))
    grid = np.full((len(ys), len(xs)), np.nan)
    seen: set[tuple[object, object]] = set()
    for _, row in rows.iterrows():
        cell = (row[x], row[y])
        if cell in seen:
            raise ConfigError("report.heatmap", {"x": x, "y": y}, f"two runs at {x}="
                              f"{cell[0]}, {y}={cell[1]}; set report.heatmap.plan or "
                              "sweep fewer keys")
        seen.add(cell)
        v = row[value]
        if bool(row["fits"]) and v is not None and not (isinstance(v, float) and math.isnan(v)):
            grid[ys.index(row[y]), xs.index(row[x])] = quantity.scale * float(v)
    fig = Figure(figsize=(1.6 + 1.1 * len(xs), 1.6 + 0.6 * len(ys)), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(grid), origin="lower", aspect="auto",
                      cmap="viridis")
    for (j, i), v in np.ndenumerate(grid):
        light = math.isnan(v) or float(image.norm(v)) > 0.6  # viridis is light at the top
        ax.text(i, j, "OOM" if math.isnan(v) else _cell(v), ha="center", va="center",
                fontsize="small", color="black" if light else "white")
    ax.set_xticks(range(len(xs)), [_tick(v) for v in xs])
    ax.set_yticks(range(len(ys)), [_tick(v) for v in ys])
    ax.set_xlabel(labels.column_quantity(x).label)
    ax.set_ylabel(labels.column_quantity(y).label)
    fig.colorbar(image, ax=ax, label=quantity.label)
    across = (_in_a_sentence(labels.column_quantity(x).name),
              _in_a_sentence(labels.column_quantity(y).name))
    set_title(fig, f"{quantity.name} by {across[0]} and {across[1]}"
              + (f", plan {plan}" if plan else ""), context)
    return fig


def _log2_axis(ax: Axes, values: Sequence[float]) -> None:
    """A log2 x axis ticked at the data's own values, written plainly (8, 16, ...)."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(values))
    ax.set_xticks(ticks, [_tick(v) for v in ticks])
    ax.minorticks_off()


def _in_a_sentence(name: str) -> str:
    """A capitalised quantity name inside a sentence: its first letter lowered unless it
    starts an acronym ("Sequence length" -> "sequence length", "GPUs" stays)."""
    return name[:1].lower() + name[1:] if name[1:2].islower() else name


def _cell(value: float) -> str:
    """A heatmap cell: 3 significant digits, whole numbers with thousands separators."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _tick(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
