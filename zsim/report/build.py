"""A simulated scenario -> its report files (CSV, markdown, PNGs), written all or nothing.

Owns the report's file names (`<scenario>.csv`, `<scenario>.md`, `<scenario>-<figure>.png`),
the markdown table's columns, and the all-or-nothing write. Never simulates (see
zsim.sweep). Only the sweep path imports this module (pandas, matplotlib).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure

from zsim.report.frame import csv_text, memory_curve_frame
from zsim.report.markdown import DEFAULT_TEMPLATE, markdown_table, render_report
from zsim.report.plots import memory_curve_figure, memory_figure, png_bytes, step_time_figure
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
}
"""Figure key -> (file name suffix, caption)."""


REPORT_MAX_RUNS = 500
"""Runs a sweep's report (markdown table, per-run bar charts, memory curves) is drawn for
at most: beyond, one row and one bar per run is unreadable and slow to draw (5,040 bars
took over ten minutes), and the results files alone are written."""

RESULTS_CSV = "results.csv"
RESULTS_PARQUET = "results.parquet"


def results_files(frame: pd.DataFrame) -> dict[str, bytes]:
    """A sweep's results table as files: RESULTS_CSV (zsim.report.frame.csv_text), and
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
                 curves: Mapping[str, Sequence[tuple[float, int]]]) -> dict[str, bytes]:
    """Every report file of a simulated scenario, by file name, in memory.

    Args:
        scenario: the scenario (name, description, template, runs whose curve is plotted).
        frame: its rows (zsim.report.frame.sweep_frame columns), in scenario order.
        curves: run name -> memory curve, for every run in scenario.memory_curves.

    Returns:
        {"<name>.csv": every sweep_frame column, "<name>.md": the template (or
        DEFAULT_TEMPLATE) filled in, "<name>-<figure>.png": one per FIGURES entry}.

    Raises:
        ConfigError: a template placeholder that names no run, column or section.
    """
    figures = _figures(scenario, frame, curves)
    files = {f"{scenario.name}-{FIGURES[key][0]}.png": png_bytes(fig)
             for key, fig in figures.items()}
    links = {key: f"![{FIGURES[key][1]}]({scenario.name}-{FIGURES[key][0]}.png)"
             for key in FIGURES}
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


def _figures(scenario: Scenario, frame: pd.DataFrame,
             curves: Mapping[str, Sequence[tuple[float, int]]]) -> dict[str, Figure]:
    curve_frame = memory_curve_frame(curves, scenario.memory_curves)
    first = frame.loc[frame["run"] == scenario.memory_curves[0], "hbm_gib"].iloc[0]
    makers: dict[str, Callable[[], Figure]] = {
        "step_time": lambda: step_time_figure(frame),
        "memory": lambda: memory_figure(frame),
        "memory_curve": lambda: memory_curve_figure(curve_frame, hbm_gib=float(first)),
    }
    return {key: makers[key]() for key in FIGURES}
