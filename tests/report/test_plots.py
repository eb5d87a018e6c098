"""Plots, tested through their axes' data and labels (never pixels);
the memory curve's legend against its HBM line in display coordinates."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from zsim.analytic.memory import CATEGORIES
from zsim.report.dataframes import memory_curve_frame, sweep_frame
from zsim.report.labels import CATEGORIES as CATEGORY_WORDS
from zsim.report.plots import (
    NO_STEP_TIME,
    memory_curve_figure,
    memory_figure,
    step_time_figure,
)
from zsim.result import Result
from zsim.scenario import Run

CONTEXT = "tiny (0.0B parameters) on 16 GPUs of dgx-h100 (H100 SXM5 80GB)"


def bars_by_label(fig: Figure) -> dict[str, list[tuple[float, float]]]:
    """Legend label -> [(left, width)] of each bar, top run first."""
    ax = fig.axes[0]
    return {c.get_label(): [(p.get_x(), p.get_width()) for p in c.patches]
            for c in ax.containers}


def test_step_time_bars_split_compute_and_exposed_comm(
        toy_pairs: list[tuple[Run, Result]]) -> None:
    frame = sweep_frame(toy_pairs)
    fig = step_time_figure(frame, context=CONTEXT)
    ax = fig.axes[0]
    bars = bars_by_label(fig)
    assert list(bars) == ["Compute", "Exposed communication"]
    results = [r for _, r in toy_pairs]
    # A run not simulated (the closed form rules it out) has no bar.
    assert [w for _, w in bars["Compute"]] == [r.compute_time_s or 0.0 for r in results]
    # Exposed communication starts where compute ends; together they make the step.
    for (left, width), r in zip(bars["Exposed communication"], results, strict=True):
        # matplotlib stores a bar as x0 and x1 = x0 + width; get_width() is x1 - x0.
        assert left == (r.compute_time_s or 0.0)
        assert width == pytest.approx(r.exposed_comm_s or 0.0, rel=1e-12)
        assert left + width == pytest.approx(r.step_time_s or 0.0, rel=1e-9)
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "fsdp", "hsdp", "ddp-huge (OOM, closed form)"]
    # The row without a bar says why, at the run's row (2: the third run, ddp-huge).
    assert [(t.get_text(), t.xy) for t in ax.texts] == [(NO_STEP_TIME, (0, 2))]
    assert ax.get_xlabel() == "Step time (s)"
    assert ax.yaxis_inverted()
    assert fig.get_suptitle().splitlines()[1] == CONTEXT


def test_memory_bars_stack_the_categories_up_to_the_peak_with_the_hbm_line(
        toy_pairs: list[tuple[Run, Result]]) -> None:
    frame = sweep_frame(toy_pairs)
    fig = memory_figure(frame, context=CONTEXT)
    ax = fig.axes[0]
    bars = bars_by_label(fig)
    live = {cat for _, r in toy_pairs for cat, b in r.memory_at_peak.items() if b > 0}
    # Categories in words, in CATEGORIES order; none is a raw identifier.
    assert list(bars) == [CATEGORY_WORDS[c] for c in CATEGORIES if c in live]
    assert not any("_" in label for label in bars)
    for i, (_, r) in enumerate(toy_pairs):
        right = max(left + width for stack in bars.values() for left, width in [stack[i]])
        assert right * 2**30 == pytest.approx(r.peak_memory_bytes, rel=1e-9)
        assert bars["Activations"][i][1] * 2**30 == r.memory_at_peak["activations"]
    hbm_lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("HBM")]
    assert [ln.get_xdata()[0] for ln in hbm_lines] == [pytest.approx(79.1)]
    assert ax.get_xlabel() == "Memory allocated at the peak, per GPU (GiB)"


def test_memory_curve_lines_follow_the_ledger(toy_pairs: list[tuple[Run, Result]]) -> None:
    curves = memory_curve_frame({run.name: r.memory_curve for run, r in toy_pairs},
                                ["fsdp", "hsdp"])
    fig = memory_curve_figure(curves, hbm_gib=79.1, context=CONTEXT)
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines) == ["fsdp", "hsdp", "HBM capacity 79.1 GiB"]
    fsdp = toy_pairs[0][1]
    assert list(lines["fsdp"].get_xdata()) == [t for t, _ in fsdp.memory_curve]
    assert list(lines["fsdp"].get_ydata()) == [b / 2**30 for _, b in fsdp.memory_curve]
    assert lines["fsdp"].get_drawstyle() == "steps-post"
    assert list(lines["HBM capacity 79.1 GiB"].get_ydata()) == [79.1, 79.1]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Time in the step (s)",
                                                  "Allocated memory per GPU (GiB)")


def assert_legends_clear_of_hbm(fig: Figure, hbm_gib: float) -> None:
    """Every legend of `fig` (its own or its axes') lies outside the axes, and so off the
    HBM line, which lies inside them: checked on the drawn figure in display pixels."""
    ax = fig.axes[0]
    fig.draw_without_rendering()
    box = ax.get_window_extent()
    hbm_y = ax.transData.transform((0.0, hbm_gib))[1]
    assert box.y0 < hbm_y < box.y1
    legends = [*fig.legends, *([ax.get_legend()] if ax.get_legend() else [])]
    assert legends
    for legend in legends:
        extent = legend.get_window_extent()
        assert not extent.overlaps(box), (extent, box)
        assert not extent.y0 <= hbm_y <= extent.y1


def test_the_check_catches_a_legend_on_the_hbm_line() -> None:
    """The old memory curve's legend (inside the axes, upper right, under curves that
    leave the top free) sat on the HBM line: the check above fails on it."""
    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([0, 1, 2], [1, 71.2, 1], label="fsdp")
    ax.axhline(79.1, label="HBM 79.1 GiB")
    ax.legend(loc="upper right")
    with pytest.raises(AssertionError):
        assert_legends_clear_of_hbm(fig, 79.1)


@pytest.mark.parametrize("names", [["fsdp", "hsdp"], ["a run name longer than the line"]])
def test_memory_curve_legend_never_covers_the_hbm_line(names: list[str]) -> None:
    """Drawn, in display coordinates: the HBM line lies inside the axes, below their top
    (the y axis ends above it), and the legend lies wholly outside the axes; the line is
    also labelled on the axes, at its own height."""
    import pandas as pd

    # Curves that reach 90% of HBM: a legend inside the axes at "upper right" (the old
    # place) would sit on the line.
    curves = pd.DataFrame([{"run": n, "time_s": t, "allocated_gib": g}
                           for n in names for t, g in ((0.0, 1.0), (1.0, 71.2), (2.0, 1.0))])
    fig = memory_curve_figure(curves, hbm_gib=79.1, context=CONTEXT)
    ax = fig.axes[0]
    assert_legends_clear_of_hbm(fig, 79.1)
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 79.1
    assert "HBM capacity 79.1 GiB" in [t.get_text() for t in fig.legends[0].get_texts()]
    (label,) = [t for t in ax.texts if t.get_text() == "HBM capacity 79.1 GiB"]
    assert label.xy[1] == 79.1


def test_idle_time_beyond_compute_and_comm_gets_its_own_segment() -> None:
    import pandas as pd

    frame = pd.DataFrame([{"run": "offload", "fits": True, "evaluated": "simulated",
                           "step_time_s": 3.0,
                           "compute_time_s": 2.0, "exposed_comm_s": 0.25}])
    bars = bars_by_label(step_time_figure(frame, context=CONTEXT))
    assert bars == {"Compute": [(0.0, 2.0)], "Exposed communication": [(2.0, 0.25)],
                    "Other idle time (host)": [(2.25, 0.75)]}
