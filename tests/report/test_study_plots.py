"""Study figures (Pareto front, scaling curves, exposed communication, heatmap, stream
Gantt chart) and SVG output, tested through their axes' data and labels, never pixels.
Frames are built by hand, so each expected line, point and cell is known in advance."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from zsim.errors import ConfigError
from zsim.report.gantt import KIND_COLORS, gantt_figure
from zsim.report.plots import svg_bytes
from zsim.report.study_plots import (
    exposed_comm_figure,
    heatmap_figure,
    pareto_figure,
    pareto_front,
    scaling_figure,
)
from zsim.scenario import Run
from zsim.schedule.ops import STREAMS
from zsim.simulate import simulate


def row(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {"fits": True, "step_time_s": 1.0, "hbm_gib": 79.1,
                               "plan_name": kw.get("strategy", "p")}
    return base | kw


def test_pareto_front_by_hand_and_by_definition() -> None:
    memory = [10, 8, 12, 9, 12, 8]
    speed = [5, 3, 9, 4, 2, 3.5]
    # Memory ascending, ties by speed descending: (8, 3.5) (8, 3) (9, 4) (10, 5) (12, 9)
    # (12, 2); kept while speed rises.
    assert pareto_front(memory, speed) == [5, 3, 0, 2]
    rng = np.random.default_rng(0)
    mem, spd = list(rng.integers(1, 20, 200).astype(float)), list(rng.random(200))
    dominated = {i for i, j in itertools.permutations(range(200), 2)
                 if mem[j] <= mem[i] and spd[j] >= spd[i] and (mem[j], spd[j]) != (mem[i], spd[i])}
    front = pareto_front(mem, spd)
    assert set(front) == set(range(200)) - dominated
    assert [mem[i] for i in front] == sorted(mem[i] for i in front)


def test_pareto_figure_marks_each_strategy_and_draws_the_front() -> None:
    frame = pd.DataFrame([
        row(run="a", strategy="fsdp", peak_memory_gib=10.0, tokens_per_s_per_gpu=900.0),
        row(run="b", strategy="zero1", peak_memory_gib=30.0, tokens_per_s_per_gpu=1000.0),
        row(run="c", strategy="fsdp", peak_memory_gib=20.0, tokens_per_s_per_gpu=800.0),
        row(run="d", strategy="ddp", peak_memory_gib=90.0, tokens_per_s_per_gpu=None,
            fits=False, step_time_s=None),
    ])
    fig = pareto_figure(frame)
    ax = fig.axes[0]
    scatters = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
    assert scatters == {"fsdp": [[10.0, 900.0], [20.0, 800.0]], "zero1": [[30.0, 1000.0]]}
    markers = {c.get_label(): c.get_paths()[0].vertices.tolist() for c in ax.collections}
    assert markers["fsdp"] != markers["zero1"]
    front = next(ln for ln in ax.get_lines() if ln.get_label() == "Pareto front")
    assert (list(front.get_xdata()), list(front.get_ydata())) == ([10.0, 30.0], [900.0, 1000.0])
    assert [t.get_text() for t in ax.texts] == ["a", "b"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("peak memory per GPU (GiB)",
                                                  "throughput per GPU (tokens/s)")
    assert ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "fsdp", "zero1", "Pareto front", "HBM 79.1 GiB"]


def test_scaling_curves_per_plan_against_gpus() -> None:
    rows = [row(run=f"{p} gpus={g}", plan_name=p, gpus=g, tokens_per_s=t, mfu=m)
            for p, g, t, m in [("fsdp", 16, 2.0e5, 0.40), ("fsdp", 8, 1.0e5, 0.41),
                               ("hsdp", 8, 1.0e5, 0.41), ("hsdp", 16, 1.9e5, 0.39)]]
    rows.append(row(run="ddp gpus=8", plan_name="ddp", gpus=8, tokens_per_s=None, mfu=None,
                    fits=False, step_time_s=None))
    fig = scaling_figure(pd.DataFrame(rows))
    speed_ax, mfu_ax = fig.axes
    speed = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()))
             for ln in speed_ax.get_lines()}
    assert speed == {"fsdp": ([8, 16], [1.0e5, 2.0e5]), "hsdp": ([8, 16], [1.0e5, 1.9e5]),
                     "ddp": ([], [])}
    mfu = {ln.get_label(): list(ln.get_ydata()) for ln in mfu_ax.get_lines()}
    assert mfu["fsdp"] == pytest.approx([41.0, 40.0])
    for ax in (speed_ax, mfu_ax):
        assert ax.get_xscale() == "log" and ax.get_xlabel() == "GPUs"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "16"]
    assert speed_ax.get_ylabel() == "throughput (tokens/s, whole job)"
    assert mfu_ax.get_ylabel() == "MFU (%)"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["fsdp", "hsdp", "ddp"]


def test_exposed_comm_lines_per_prefetch_against_unit_size() -> None:
    rows = [row(run=f"u={u} p={p}", plan_name="fsdp", unit_size=u, prefetch=p,
                exposed_comm_s=0.1 * u + p)
            for u in (4, 1, 2) for p in (1, 0)]
    fig = exposed_comm_figure(pd.DataFrame(rows))
    ax = fig.axes[0]
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()))
             for ln in ax.get_lines()}
    assert list(lines) == ["prefetch=0", "prefetch=1"]
    assert lines["prefetch=1"][0] == [1, 2, 4]
    assert lines["prefetch=1"][1] == pytest.approx([1.1, 1.2, 1.4])
    assert ax.get_xlabel() == "unit size (blocks per FSDP unit)"
    assert ax.get_ylabel() == "exposed communication per step (s)"


def heat_frame() -> pd.DataFrame:
    return pd.DataFrame([
        row(run=f"{p} gpus={g} bw={b}", plan_name=p, gpus=g, bw=b,
            mfu=None if (g, b) == (64, 12.5) else g / 100 + b / 1000,
            fits=(g, b) != (64, 12.5))
        for p in ("fsdp", "hsdp") for g in (8, 64) for b in (50.0, 12.5)])


def test_heatmap_cells_ticks_and_oom() -> None:
    fig = heatmap_figure(heat_frame(), x="gpus", y="bw", value="mfu", plan="fsdp")
    ax = fig.axes[0]
    grid = ax.images[0].get_array()
    # Rows: bw ascending (12.5, 50); columns: gpus ascending (8, 64).
    assert grid.mask.tolist() == [[False, True], [False, False]]
    assert grid.data[0, 0] == pytest.approx(0.08 + 0.0125)
    assert grid.data[1].tolist() == pytest.approx([0.08 + 0.05, 0.64 + 0.05])
    assert [t.get_text() for t in ax.texts] == ["0.0925", "OOM", "0.13", "0.69"]
    big = heatmap_figure(heat_frame().assign(mfu=12345.6), x="gpus", y="bw", value="mfu",
                         plan="hsdp")
    assert [t.get_text() for t in big.axes[0].texts] == ["12,346", "OOM", "12,346", "12,346"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "64"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["12.5", "50"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("gpus", "bw")
    assert fig.axes[1].get_ylabel() == "mfu"  # the colour bar
    assert ax.get_title() == "mfu by gpus and bw (fsdp)"


@pytest.mark.parametrize(("kwargs", "field", "needle"), [
    ({"x": "gpuz", "y": "bw", "value": "mfu"}, "report.heatmap.x", "not a column"),
    ({"x": "gpus", "y": "bw", "value": "mfu"}, "report.heatmap", "two runs at"),
    ({"x": "gpus", "y": "bw", "value": "mfu", "plan": "ddp"}, "report.heatmap.plan",
     "no such plan"),
])
def test_heatmap_errors(kwargs: dict[str, str], field: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        heatmap_figure(heat_frame(), **kwargs)
    assert e.value.field == field and needle in e.value.reason


def test_gantt_bars_are_the_spans_of_rank_0(toy_pairs: list[tuple[Run, object]]) -> None:
    run = toy_pairs[0][0]
    result = simulate(run.model, run.hardware, run.plan, trace=True)
    fig = gantt_figure(result.spans, title="fsdp")
    ax = fig.axes[0]
    spans0 = [sp for sp in result.spans if sp.rank == 0]
    streams = [s for s in STREAMS if any(sp.stream == s for sp in spans0)]
    assert [t.get_text() for t in ax.get_yticklabels()] == streams
    drawn = 0
    for bars in ax.containers:
        kind = bars.get_label()
        ops = [sp for sp in spans0 if sp.kind == kind]
        assert [p.get_x() for p in bars.patches] == pytest.approx([sp.start_s for sp in ops])
        assert [p.get_width() for p in bars.patches] == pytest.approx(
            [sp.end_s - sp.start_s for sp in ops])
        assert [p.get_y() + p.get_height() / 2 for p in bars.patches] == pytest.approx(
            [streams.index(sp.stream) for sp in ops])
        drawn += len(ops)
    assert drawn == len(spans0)  # every op of rank 0 has its bar
    assert {b.get_label() for b in ax.containers} <= set(KIND_COLORS)
    assert ax.get_xlabel() == "time in the step (s)" and ax.get_title() == "fsdp"


def test_svg_is_deterministic_without_date_or_version() -> None:
    first = svg_bytes(exposed_comm_figure(pd.DataFrame([
        row(run="a", plan_name="fsdp", unit_size=1, prefetch=0, exposed_comm_s=0.5)])))
    second = svg_bytes(exposed_comm_figure(pd.DataFrame([
        row(run="a", plan_name="fsdp", unit_size=1, prefetch=0, exposed_comm_s=0.5)])))
    assert first == second
    assert first.startswith(b"<?xml") and b"<dc:date>" not in first
    assert b"Matplotlib v" not in first


def test_pareto_labels_skip_a_point_that_would_overprint_the_last() -> None:
    # Front: a (10, 100), b (11, 101), c (12, 200). b is within 3% of the range (100) of a.
    frame = pd.DataFrame([
        row(run=n, strategy="fsdp", peak_memory_gib=m, tokens_per_s_per_gpu=t)
        for n, m, t in (("a", 10.0, 100.0), ("b", 11.0, 101.0), ("c", 12.0, 200.0))])
    ax = pareto_figure(frame).axes[0]
    front = next(ln for ln in ax.get_lines() if ln.get_label() == "Pareto front")
    assert list(front.get_xdata()) == [10.0, 11.0, 12.0]
    assert [t.get_text() for t in ax.texts] == ["a", "c"]
