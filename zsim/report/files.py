"""A simulated scenario -> its report files (CSV, markdown and SVG figures), in memory.

Owns the report's file names (`<scenario>.csv`, `<scenario>.md`,
`<scenario>-<figure>.svg`: the markdown shows the SVGs; no PNG, which would only repeat
them), the markdown table's columns and which figure function draws each of
zsim.scenario.REPORT_FIGURES, and a sweep's results files. Never
simulates (see zsim.sweep, and zsim.scenario.simulate_timeline for the Gantt chart's run)
and never writes (zsim.atomic does, all or nothing). Only the report path imports this
module (pandas, matplotlib).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure

from zsim.report.dataframes import csv_text, memory_curve_frame
from zsim.report.gantt import gantt_figure
from zsim.report.markdown import DEFAULT_TEMPLATE, markdown_table, render_report
from zsim.report.plots import (
    memory_curve_figure,
    memory_figure,
    step_time_figure,
    svg_bytes,
)
from zsim.report.study_plots import (
    exposed_comm_figure,
    heatmap_figure,
    pareto_figure,
    scaling_figure,
)
from zsim.report.titles import context_text
from zsim.result import Result
from zsim.scenario import Scenario

TABLE_COLUMNS: tuple[str, ...] = (
    "run", "fits", "evaluated", "step_time_s", "compute_time_s", "exposed_comm_s",
    "all_gather_busy_s", "reduce_scatter_busy_s", "all_reduce_busy_s", "peak_memory_gib",
    "reserved_memory_gib", "peak_op", "tokens_per_s_per_gpu", "mfu",
)
"""Columns of the markdown table (the CSV has every column of sweep_frame)."""

FIGURES: dict[str, tuple[str, str]] = {
    "step_time": ("step-time", "Step time: compute vs exposed communication"),
    "memory": ("memory", "Memory live at the peak, by category"),
    "memory_curve": ("memory-curve", "Allocated memory over the step"),
    "pareto": ("pareto", "Pareto front: memory per GPU against tokens/s per GPU"),
    "scaling": ("scaling", "Throughput and MFU against GPU count"),
    "exposed_comm": ("exposed-comm", "Exposed communication against unit size and prefetch"),
    "heatmap": ("heatmap", "Heatmap over two swept keys"),
    "gantt": ("gantt", "Streams of one step"),
}
"""Figure key (zsim.scenario.REPORT_FIGURES) -> (file name suffix, caption)."""


REPORT_MAX_RUNS = 500
"""Runs a sweep's report (markdown table, per-run bar charts, memory curves) is drawn for
at most: beyond, one row and one bar per run is unreadable and slow to draw (5,040 bars
took over ten minutes), and the results files alone are written."""

RESULTS_CSV = "results.csv"
RESULTS_PARQUET = "results.parquet"


def results_files(frame: pd.DataFrame) -> dict[str, bytes]:
    """A sweep's results table as files: RESULTS_CSV (zsim.report.dataframes.csv_text), and
    RESULTS_PARQUET where pyarrow is installed (without an index; the same bytes for the
    same rows)."""
    files = {RESULTS_CSV: csv_text(frame).encode()}
    try:
        import pyarrow  # noqa: F401 (pandas writes Parquet through it)
    except ImportError:
        return files
    buffer = io.BytesIO()
    frame.to_parquet(buffer, engine="pyarrow", index=False)
    files[RESULTS_PARQUET] = buffer.getvalue()
    return files


def report_files(scenario: Scenario, frame: pd.DataFrame,
                 curves: Mapping[str, Sequence[tuple[float, int]]], *,
                 timeline: Result | None = None) -> dict[str, bytes]:
    """Every report file of a simulated scenario, by file name, in memory.

    Args:
        scenario: the loaded scenario (its report settings choose the figures).
        frame: its rows (zsim.report.dataframes.sweep_frame columns), in scenario order.
        curves: run name -> memory curve, for every run in scenario.memory_curves.
        timeline: the gantt run simulated with its spans (zsim.scenario.simulate_timeline);
            required when the scenario's figures include gantt.

    Returns:
        {"<name>.csv": every sweep_frame column, "<name>.md": the template (or
        DEFAULT_TEMPLATE) filled in, "<name>-<figure>.svg": one per figure of the
        scenario}.

    Raises:
        ConfigError: a template placeholder that names no run, column or section, or a
            heatmap naming an unknown column or plan.
    """
    links: dict[str, str] = {}
    files: dict[str, bytes] = {}
    for key, fig in report_figures(scenario, frame, curves, timeline).items():
        stem = f"{scenario.name}-{FIGURES[key][0]}"
        files[f"{stem}.svg"] = svg_bytes(fig)
        links[key] = f"![{FIGURES[key][1]}]({stem}.svg)"
    sections = {
        "name": scenario.name, "description": scenario.description,
        "source": scenario.source or "-", "table": markdown_table(frame, TABLE_COLUMNS),
        "csv": f"[{scenario.name}.csv]({scenario.name}.csv)",
        "figures": "\n\n".join(links.values()),
        **{f"figure.{key}": link for key, link in links.items()},
    }
    markdown = render_report(scenario.template or DEFAULT_TEMPLATE, frame, sections)
    return {f"{scenario.name}.csv": csv_text(frame).encode(),
            f"{scenario.name}.md": markdown.encode(), **files}


def report_figures(scenario: Scenario, frame: pd.DataFrame,
                   curves: Mapping[str, Sequence[tuple[float, int]]],
                   timeline: Result | None) -> dict[str, Figure]:
    """The figures of scenario.figures, by key, in that order, each titled with the
    context of the runs it draws (zsim.report.titles.context_text): every run of the frame,
    the memory curves' runs, the heatmap's plan's runs, or the gantt run. Arguments as
    report_files's."""
    runs = {run.name: run for run in scenario.runs}

    def context(names: Iterable[object]) -> str:
        """The title context of the runs named (zsim.report.titles.context_text)."""
        return context_text([runs[str(n)] for n in names if str(n) in runs])

    every = context(frame["run"])

    def memory_curve() -> Figure:
        first = frame.loc[frame["run"] == scenario.memory_curves[0], "hbm_gib"].iloc[0]
        return memory_curve_figure(memory_curve_frame(curves, scenario.memory_curves),
                                   hbm_gib=float(first),
                                   context=context(scenario.memory_curves))

    def heatmap() -> Figure:
        spec = scenario.heatmap
        if spec is None:
            raise ValueError("a heatmap figure without report.heatmap")  # load checks it
        drawn = frame if spec.plan is None else frame[frame["plan_name"] == spec.plan]
        return heatmap_figure(frame, x=spec.x, y=spec.y, value=spec.value, plan=spec.plan,
                              context=context(drawn["run"]))

    def gantt() -> Figure:
        if timeline is None or scenario.gantt is None:
            raise ValueError("a gantt figure needs the timeline (simulate_timeline)")
        return gantt_figure(timeline.spans, waits=timeline.waits,
                            title=f"Streams of rank 0 over one step: {scenario.gantt}",
                            context=context([scenario.gantt]))

    makers: dict[str, Callable[[], Figure]] = {
        "step_time": lambda: step_time_figure(frame, context=every),
        "memory": lambda: memory_figure(frame, context=every),
        "memory_curve": memory_curve,
        "pareto": lambda: pareto_figure(frame, context=every),
        "scaling": lambda: scaling_figure(frame, context=every),
        "exposed_comm": lambda: exposed_comm_figure(frame, context=every),
        "heatmap": heatmap,
        "gantt": gantt,
    }
    return {key: makers[key]() for key in scenario.figures}
