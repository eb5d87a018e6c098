"""Plots, tested through their axes' data and labels (never pixels), and PNG determinism."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from zsim.report.frame import memory_curve_frame, sweep_frame
from zsim.report.plots import memory_curve_figure, memory_figure, png_bytes, step_time_figure
from zsim.result import Result
from zsim.scenario import Run


def bars_by_label(fig: Figure) -> dict[str, list[tuple[float, float]]]:
    """Legend label -> [(left, width)] of each bar, top run first."""
    ax = fig.axes[0]
    return {c.get_label(): [(p.get_x(), p.get_width()) for p in c.patches]
            for c in ax.containers}


def test_step_time_bars_split_compute_and_exposed_comm(
        toy_pairs: list[tuple[Run, Result]]) -> None:
    frame = sweep_frame(toy_pairs)
    fig = step_time_figure(frame)
    ax = fig.axes[0]
    bars = bars_by_label(fig)
    assert list(bars) == ["compute", "exposed communication"]
    results = [r for _, r in toy_pairs]
    # A run not simulated (the closed form rules it out) has no bar.
    assert [w for _, w in bars["compute"]] == [r.compute_time_s or 0.0 for r in results]
    # Exposed communication starts where compute ends; together they make the step.
    for (left, width), r in zip(bars["exposed communication"], results, strict=True):
        # matplotlib stores a bar as x0 and x1 = x0 + width; get_width() is x1 - x0.
        assert left == (r.compute_time_s or 0.0)
        assert width == pytest.approx(r.exposed_comm_s or 0.0, rel=1e-12)
        assert left + width == pytest.approx(r.step_time_s or 0.0, rel=1e-9)
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "fsdp", "hsdp", "ddp-huge (OOM, closed form)"]
    assert ax.get_xlabel() == "step time (s)"
    assert ax.yaxis_inverted()


def test_memory_bars_stack_the_categories_up_to_the_peak_with_the_hbm_line(
        toy_pairs: list[tuple[Run, Result]]) -> None:
    frame = sweep_frame(toy_pairs)
    fig = memory_figure(frame)
    ax = fig.axes[0]
    bars = bars_by_label(fig)
    live = {cat for _, r in toy_pairs for cat, b in r.memory_at_peak.items() if b > 0}
    assert set(bars) == live
    for i, (_, r) in enumerate(toy_pairs):
        right = max(left + width for stack in bars.values() for left, width in [stack[i]])
        assert right * 2**30 == pytest.approx(r.peak_memory_bytes, rel=1e-9)
        assert bars["activations"][i][1] * 2**30 == r.memory_at_peak["activations"]
    hbm_lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("HBM")]
    assert [ln.get_xdata()[0] for ln in hbm_lines] == [pytest.approx(79.1)]
    assert ax.get_xlabel() == "allocated at the peak (GiB)"


def test_memory_curve_lines_follow_the_ledger(toy_pairs: list[tuple[Run, Result]]) -> None:
    curves = memory_curve_frame({run.name: r.memory_curve for run, r in toy_pairs},
                                ["fsdp", "hsdp"])
    fig = memory_curve_figure(curves, hbm_gib=79.1)
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines) == ["fsdp", "hsdp", "HBM 79.1 GiB"]
    fsdp = toy_pairs[0][1]
    assert list(lines["fsdp"].get_xdata()) == [t for t, _ in fsdp.memory_curve]
    assert list(lines["fsdp"].get_ydata()) == [b / 2**30 for _, b in fsdp.memory_curve]
    assert lines["fsdp"].get_drawstyle() == "steps-post"
    assert list(lines["HBM 79.1 GiB"].get_ydata()) == [79.1, 79.1]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("time in the step (s)", "allocated (GiB)")


def test_png_is_deterministic_and_carries_no_version(
        toy_pairs: list[tuple[Run, Result]]) -> None:
    frame = sweep_frame(toy_pairs)
    first = png_bytes(step_time_figure(frame))
    assert first == png_bytes(step_time_figure(frame))
    assert first.startswith(b"\x89PNG") and b"Matplotlib" not in first


def test_idle_time_beyond_compute_and_comm_gets_its_own_segment() -> None:
    import pandas as pd

    frame = pd.DataFrame([{"run": "offload", "fits": True, "evaluated": "simulated",
                           "step_time_s": 3.0,
                           "compute_time_s": 2.0, "exposed_comm_s": 0.25}])
    bars = bars_by_label(step_time_figure(frame))
    assert bars == {"compute": [(0.0, 2.0)], "exposed communication": [(2.0, 0.25)],
                    "other idle (host)": [(2.25, 0.75)]}
