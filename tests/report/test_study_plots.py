"""Study figures (Pareto front, scaling curves, exposed communication, heatmap, stream
Gantt chart) and SVG output, tested through their axes' data and labels, never pixels.
Frames are built by hand, so each expected line, point and cell is known in advance; the
Gantt chart's exposed spans are checked against the compute row's idle time worked out
from the op spans."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from zsim.errors import ConfigError
from zsim.report.gantt import (
    EXPOSED_LABEL,
    EXPOSED_MARKERS_GID,
    KIND_COLORS,
    gantt_figure,
    zoom_window,
)
from zsim.report.labels import KINDS
from zsim.report.labels import STREAMS as STREAM_WORDS
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

CONTEXT = "m (1.0B parameters) on 8 GPUs of hw (G)\nsequence 512 tokens"


def legend_texts(fig: Figure) -> list[str]:
    """Texts of the figure's legends (each figure here has one, on the figure)."""
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


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
    fig = pareto_figure(frame, context=CONTEXT)
    ax = fig.axes[0]
    scatters = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
    assert scatters == {"FSDP (full shard)": [[10.0, 900.0], [20.0, 800.0]],
                        "ZeRO-1": [[30.0, 1000.0]]}
    markers = {c.get_label(): c.get_paths()[0].vertices.tolist() for c in ax.collections}
    assert markers["FSDP (full shard)"] != markers["ZeRO-1"]
    front = next(ln for ln in ax.get_lines() if ln.get_label() == "Pareto front")
    assert (list(front.get_xdata()), list(front.get_ydata())) == ([10.0, 30.0], [900.0, 1000.0])
    assert [t.get_text() for t in ax.texts] == ["a", "b"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Peak memory per GPU (GiB)",
                                                  "Tokens/s per GPU")
    # Both axes from zero, the y axis above the fastest run, the x axis beyond HBM.
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 1000.0
    assert ax.get_xlim()[0] == 0 and ax.get_xlim()[1] > 79.1
    # Plan d never fits: it is named, with no point drawn.
    assert legend_texts(fig) == ["FSDP (full shard)", "ZeRO-1", "Pareto front",
                                 "HBM capacity 79.1 GiB", "Does not fit in HBM: ddp"]
    assert fig.get_suptitle().splitlines()[1:] == CONTEXT.splitlines()


def test_pareto_counts_the_runs_that_do_not_fit_of_plans_that_do() -> None:
    """A plan with one run that fits and one that does not: nothing to name as never
    fitting, but the run not drawn is counted."""
    frame = pd.DataFrame([
        row(run="fsdp seq=2", strategy="fsdp", peak_memory_gib=10.0,
            tokens_per_s_per_gpu=900.0),
        row(run="fsdp seq=8", strategy="fsdp", peak_memory_gib=99.0,
            tokens_per_s_per_gpu=None, fits=False, step_time_s=None),
        row(run="zero1 seq=2", strategy="zero1", peak_memory_gib=20.0,
            tokens_per_s_per_gpu=950.0),
        row(run="zero1 seq=4", strategy="zero1", peak_memory_gib=90.0,
            tokens_per_s_per_gpu=None, fits=False, step_time_s=None)])
    texts = legend_texts(pareto_figure(frame, context=CONTEXT))
    assert not any(t.startswith("Does not fit") for t in texts)
    assert texts[-1] == "2 runs do not fit in HBM (not drawn)"
    frame.loc[3, "plan_name"] = frame.loc[2, "plan_name"] = "ddp"
    frame.loc[2, ["fits", "step_time_s"]] = [False, None]
    texts = legend_texts(pareto_figure(frame, context=CONTEXT))
    assert texts[-2:] == ["Does not fit in HBM: ddp",
                          "1 run of other plans does not fit in HBM (not drawn)"]


def test_scaling_curves_per_plan_against_gpus() -> None:
    rows = [row(run=f"{p} gpus={g}", plan_name=p, gpus=g, tokens_per_s=t, mfu=m)
            for p, g, t, m in [("fsdp", 16, 2.0e5, 0.40), ("fsdp", 8, 1.0e5, 0.41),
                               ("hsdp", 8, 1.0e5, 0.41), ("hsdp", 16, 1.9e5, 0.39)]]
    rows.append(row(run="ddp gpus=8", plan_name="ddp", gpus=8, tokens_per_s=None, mfu=None,
                    fits=False, step_time_s=None))
    fig = scaling_figure(pd.DataFrame(rows), context=CONTEXT)
    speed_ax, mfu_ax = fig.axes
    speed = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()))
             for ln in speed_ax.get_lines()}
    assert speed == {"fsdp": ([8, 16], [1.0e5, 2.0e5]), "hsdp": ([8, 16], [1.0e5, 1.9e5]),
                     "ddp (does not fit in HBM)": ([], [])}
    mfu = {ln.get_label(): list(ln.get_ydata()) for ln in mfu_ax.get_lines()}
    assert mfu["fsdp"] == pytest.approx([41.0, 40.0])
    for ax in (speed_ax, mfu_ax):
        assert ax.get_xscale() == "log" and ax.get_xlabel() == "GPUs"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "16"]
    # The log axis cannot start at zero: its label says it is logarithmic.
    assert speed_ax.get_ylabel() == "Tokens/s, whole job (log scale)"
    assert speed_ax.get_yscale() == "log"
    assert mfu_ax.get_ylabel() == "MFU (%)" and mfu_ax.get_ylim()[0] == 0
    assert legend_texts(fig) == ["fsdp", "hsdp", "ddp (does not fit in HBM)"]


def test_exposed_comm_lines_per_prefetch_against_unit_size() -> None:
    rows = [row(run=f"u={u} p={p}", plan_name="fsdp", unit_size=u, prefetch=p,
                exposed_comm_s=0.1 * u + p)
            for u in (4, 1, 2) for p in (1, 0)]
    rows.append(row(run="ddp", plan_name="ddp", unit_size=1, prefetch=1, fits=False,
                    step_time_s=None, exposed_comm_s=None))
    fig = exposed_comm_figure(pd.DataFrame(rows), context=CONTEXT)
    ax = fig.axes[0]
    lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()))
             for ln in ax.get_lines()}
    assert list(lines) == ["fsdp, prefetch depth 0", "fsdp, prefetch depth 1",
                           "Does not fit in HBM: ddp"]
    assert lines["fsdp, prefetch depth 1"][0] == [1, 2, 4]
    assert lines["fsdp, prefetch depth 1"][1] == pytest.approx([1.1, 1.2, 1.4])
    assert lines["Does not fit in HBM: ddp"] == ([], [])
    assert ax.get_xlabel() == "FSDP unit size (blocks per unit)"
    assert ax.get_ylabel() == "Exposed communication per step (s)"
    assert ax.get_ylim()[0] == 0
    assert legend_texts(fig) == list(lines)


def heat_frame() -> pd.DataFrame:
    return pd.DataFrame([
        row(run=f"{p} gpus={g} bw={b}", plan_name=p, gpus=g, inter_node_gb_per_s=b,
            mfu=None if (g, b) == (64, 12.5) else g / 100 + b / 1000,
            fits=(g, b) != (64, 12.5))
        for p in ("fsdp", "hsdp") for g in (8, 64) for b in (50.0, 12.5)])


def test_heatmap_cells_ticks_and_oom() -> None:
    bw = "inter_node_gb_per_s"
    fig = heatmap_figure(heat_frame(), x="gpus", y=bw, value="mfu", plan="fsdp",
                         context=CONTEXT)
    ax = fig.axes[0]
    grid = ax.images[0].get_array()
    # Rows: bandwidth ascending (12.5, 50); columns: gpus ascending (8, 64). MFU, a
    # fraction in the frame, in % in the figure.
    assert grid.mask.tolist() == [[False, True], [False, False]]
    assert grid.data[0, 0] == pytest.approx(100 * (0.08 + 0.0125))
    assert grid.data[1].tolist() == pytest.approx([100 * (0.08 + 0.05), 100 * (0.64 + 0.05)])
    assert [t.get_text() for t in ax.texts] == ["9.25", "OOM", "13", "69"]
    big = heatmap_figure(heat_frame().assign(tflops_per_gpu=12345.6), x="gpus", y=bw,
                         value="tflops_per_gpu", plan="hsdp", context=CONTEXT)
    assert [t.get_text() for t in big.axes[0].texts] == ["12,346", "OOM", "12,346", "12,346"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "64"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["12.5", "50"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("GPUs", "Inter-node bandwidth per GPU (GB/s)")
    assert fig.axes[1].get_ylabel() == "MFU (%)"  # the colour bar
    assert fig.get_suptitle() == ("MFU by GPUs and inter-node bandwidth per GPU, plan fsdp\n"
                                  + CONTEXT)


@pytest.mark.parametrize(("kwargs", "field", "needle"), [
    ({"x": "gpuz", "y": "inter_node_gb_per_s", "value": "mfu"}, "report.heatmap.x",
     "not a column"),
    ({"x": "gpus", "y": "inter_node_gb_per_s", "value": "mfu"}, "report.heatmap",
     "two runs at"),
    ({"x": "gpus", "y": "inter_node_gb_per_s", "value": "mfu", "plan": "ddp"},
     "report.heatmap.plan", "no such plan"),
])
def test_heatmap_errors(kwargs: dict[str, str], field: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        heatmap_figure(heat_frame(), **kwargs, context=CONTEXT)
    assert e.value.field == field and needle in e.value.reason


def _drawn_bars(ax: Axes) -> dict[str, list[tuple[float, float, float]]]:
    """(start, end, row) of each op bar of a gantt panel, by op kind."""
    by_words = {KINDS[k]: k for k in KIND_COLORS}
    return {by_words[bars.get_label()]: [(p.get_x(), p.get_x() + p.get_width(),
                                          p.get_y() + p.get_height() / 2) for p in bars.patches]
            for bars in ax.containers if bars.get_label() != EXPOSED_LABEL}


def test_gantt_bars_are_the_spans_of_rank_0_run_together(
        toy_pairs: list[tuple[Run, object]]) -> None:
    """Each bar is a run of back-to-back ops of one kind on one stream: every op of rank 0
    lies inside a bar of its kind in its stream's row, each bar starts where one of them
    starts and ends where one ends, and no two bars of a kind in a row touch (else they
    would be one); so the bars are exactly the union of the ops' intervals."""
    run = toy_pairs[0][0]
    result = simulate(run.model, run.hardware, run.plan, trace=True)
    fig = gantt_figure(result.spans, waits=result.waits, title="fsdp", context=CONTEXT)
    ax = fig.axes[0]
    spans0 = [sp for sp in result.spans if sp.rank == 0]
    streams = [s for s in STREAMS if any(sp.stream == s for sp in spans0)]
    assert [t.get_text() for t in ax.get_yticklabels()] == [STREAM_WORDS[s] for s in streams]
    drawn = _drawn_bars(ax)
    assert set(drawn) == {sp.kind for sp in spans0}
    for kind, bars in drawn.items():
        for row, stream in enumerate(streams):
            ops = [sp for sp in spans0 if sp.kind == kind and sp.stream == stream]
            mine = sorted((a, b) for a, b, y in bars if y == pytest.approx(row))
            eps = 1e-12 * result.step_time_s  # a bar's end is its start plus its width
            for sp in ops:
                assert any(a - eps <= sp.start_s and sp.end_s <= b + eps
                           for a, b in mine), (kind, sp)
            for a, b in mine:
                assert any(abs(a - sp.start_s) <= eps for sp in ops), (kind, a)
                assert any(abs(b - sp.end_s) <= eps for sp in ops), (kind, b)
            assert all(b1 + eps < a2 for (_, b1), (a2, _) in itertools.pairwise(mine))
    # The toy step's compute stream runs its forward ops back to back: fewer bars than ops.
    assert sum(len(b) for b in drawn.values()) < len(spans0)
    assert ax.get_xlabel() == "Time in the step (s)"
    assert fig.get_suptitle().splitlines()[0] == "fsdp"
    assert fig.get_suptitle().splitlines()[2:] == CONTEXT.splitlines()


def test_gantt_zoom_draws_only_the_bars_in_its_window(
        toy_pairs: list[tuple[Run, object]]) -> None:
    run = toy_pairs[0][0]
    result = simulate(run.model, run.hardware, run.plan, trace=True)
    whole, zoomed = gantt_figure(result.spans, waits=result.waits, title="fsdp",
                                 context=CONTEXT).axes
    lo, hi = zoomed.get_xlim()
    everything, shown = _drawn_bars(whole), _drawn_bars(zoomed)
    inside = {k: [bar for bar in v if bar[1] >= lo and bar[0] <= hi]
              for k, v in everything.items()}
    assert shown == {k: v for k, v in inside.items() if v}
    assert sum(map(len, shown.values())) < sum(map(len, everything.values()))


def idle_intervals(spans0: list, step_s: float) -> list[tuple[float, float]]:
    """The compute stream's idle intervals in [0, step_s], from the op spans alone."""
    idle, t = [], 0.0
    for sp in sorted((sp for sp in spans0 if sp.stream == "compute"),
                     key=lambda sp: sp.start_s):
        if sp.start_s > t:
            idle.append((t, sp.start_s))
        t = max(t, sp.end_s)
    return idle + ([(t, step_s)] if step_s > t else [])


def test_gantt_marks_the_exposed_gaps_and_zooms_on_the_longest(
        toy_pairs: list[tuple[Run, object]]) -> None:
    """The toy FSDP step's compute stream idles only waiting on collectives (3 waits, 132
    us of an 11.4 ms step, most of it the host issuing FSDP2's two blocks: dgx-h100's
    2.3 ms a block at 16 ranks): the yellow spans are exactly its idle intervals worked
    out from the op spans, total the Result's exposed_comm_s, and the title says so."""
    run = toy_pairs[0][0]
    result = simulate(run.model, run.hardware, run.plan, trace=True)
    fig = gantt_figure(result.spans, waits=result.waits, title="fsdp", context=CONTEXT)
    whole, zoomed = fig.axes
    spans0 = [sp for sp in result.spans if sp.rank == 0]
    idle = idle_intervals(spans0, result.step_time_s)
    assert len(idle) == 3
    for ax in (whole, zoomed):
        (exposed,) = [c for c in ax.containers if c.get_label() == EXPOSED_LABEL]
        drawn = [(p.get_x(), p.get_x() + p.get_width()) for p in exposed.patches]
        assert [t for iv in drawn for t in iv] == pytest.approx(
            [t for iv in idle for t in iv], abs=1e-12)
        assert sum(b - a for a, b in drawn) == pytest.approx(result.exposed_comm_s, rel=1e-9)
        assert {p.get_y() + p.get_height() / 2 for p in exposed.patches} == {0}  # compute row
        (markers,) = [ln for ln in ax.get_lines() if ln.get_gid() == EXPOSED_MARKERS_GID]
        assert list(markers.get_xdata()) == pytest.approx([(a + b) / 2 for a, b in idle])
        assert all(y < -0.4 for y in markers.get_ydata())  # above the compute bars
    title = fig.get_suptitle().splitlines()[1]
    assert title.startswith(f"Exposed communication {result.exposed_comm_s * 1e3:.3g} ms in "
                            "3 waits")
    assert f"{result.exposed_comm_s * 1e3:.3g}" == "0.132"  # 132 us, as the docstring says
    # The zoom: around the longest wait (61 us, the reduce-scatter the optimizer step
    # waits on), a sixteenth of the step (more than three times the wait), within the step.
    longest = max(idle, key=lambda iv: iv[1] - iv[0])
    lo, hi = zoomed.get_xlim()
    assert lo <= longest[0] and longest[1] <= hi
    assert 3 * (longest[1] - longest[0]) < result.step_time_s / 16
    assert hi - lo == pytest.approx(result.step_time_s / 16)
    assert lo >= 0 and hi <= result.step_time_s * (1 + 1e-12)
    assert zoomed.get_title().startswith(f"Zoom on {lo:.4g}–{hi:.4g} s")


def test_zoom_window_by_hand() -> None:
    """A 16 s step: a 1 s window centred on the longest wait, slid into the step at its
    ends, or three times a wait longer than a sixteenth."""
    from zsim.engine.trace import OpSpan, Wait

    spans = [OpSpan(index=0, name="f", kind="forward", stream="compute", rank=0,
                    start_s=0.0, end_s=16.0)]

    def wait(start_s: float, end_s: float) -> Wait:
        return Wait(rank=0, start_s=start_s, end_s=end_s, op="f", blocking="ag",
                    collective="all_gather", reason="queued", link_shared=False)

    assert zoom_window(spans, []) is None
    for waits, window in (([wait(2.0, 2.1), wait(8.0, 8.2)], (7.6, 8.6)),
                          ([wait(0.0, 0.2)], (0.0, 1.0)),
                          ([wait(15.9, 16.0)], (15.0, 16.0)),
                          ([wait(4.0, 6.0)], (2.0, 8.0))):
        zoom = zoom_window(spans, waits)
        assert zoom is not None
        assert (zoom.start_s, zoom.end_s) == pytest.approx(window)
        assert zoom.wait == max(waits, key=lambda w: w.wait_s)


def test_svg_is_deterministic_without_date_or_version() -> None:
    first = svg_bytes(exposed_comm_figure(pd.DataFrame([
        row(run="a", plan_name="fsdp", unit_size=1, prefetch=0, exposed_comm_s=0.5)]),
        context=CONTEXT))
    second = svg_bytes(exposed_comm_figure(pd.DataFrame([
        row(run="a", plan_name="fsdp", unit_size=1, prefetch=0, exposed_comm_s=0.5)]),
        context=CONTEXT))
    assert first == second
    assert first.startswith(b"<?xml") and b"<dc:date>" not in first
    assert b"Matplotlib v" not in first
    # Text is SVG text in the figure's font, not a path per glyph.
    assert b"<text " in first and b'id="DejaVuSans-' not in first


def test_pareto_labels_skip_a_point_that_would_overprint_the_last() -> None:
    # Front: a (10, 100), b (11, 101), c (12, 200). b is within 3% of the range (100) of a.
    frame = pd.DataFrame([
        row(run=n, strategy="fsdp", peak_memory_gib=m, tokens_per_s_per_gpu=t)
        for n, m, t in (("a", 10.0, 100.0), ("b", 11.0, 101.0), ("c", 12.0, 200.0))])
    ax = pareto_figure(frame, context=CONTEXT).axes[0]
    front = next(ln for ln in ax.get_lines() if ln.get_label() == "Pareto front")
    assert list(front.get_xdata()) == [10.0, 11.0, 12.0]
    assert [t.get_text() for t in ax.texts] == ["a", "c"]
