"""A simulated step's op spans -> a stream Gantt chart (matplotlib Figure).

Owns the timeline figure of one plan: a row per stream of rank 0 (compute, the collective
streams, copies, host; zsim.schedule.ops.STREAMS order), a bar per run of back-to-back ops
of one kind from the first's start to the last's end (merged_bars: the same ink as a bar
per op, without the hairline seams between them and with a fraction of the SVG), coloured
by op kind, and the exposed communication made visible: each interval in
which the compute stream waited on a collective (zsim.engine.trace.Wait) is a hatched span
in the compute row with a marker above it (seen even where the span is narrower than a
pixel), their total is in the title, and a second panel zooms on a few blocks around the
longest wait. The same spans `zsim simulate --trace` exports to Perfetto
(zsim.engine.trace.OpSpan). Object API only (Figure, never pyplot); never simulates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from zsim.engine.trace import OpSpan, Wait
from zsim.report import labels
from zsim.report.titles import set_title
from zsim.schedule.ops import STREAMS

KIND_COLORS: dict[str, str] = {
    "forward": "#4c72b0", "backward": "#55a868", "optimizer": "#8172b3", "sync": "#8c8c8c",
    "all_gather": "#64b5cd", "reduce_scatter": "#c44e52", "all_reduce": "#dd8452",
    "h2d": "#937860", "d2h": "#da8bc3",
}
"""Colour of each op kind (zsim.schedule.ops.OpKind)."""

EXPOSED_COLOR = "#ffd92f"
"""Fill of an exposed-communication span and its marker (no op kind is yellow)."""

EXPOSED_LABEL = "Exposed communication (compute waits)"
HOST_WAIT_LABEL = "Compute waits on the host optimizer step"
EXPOSED_MARKERS_GID = "exposed-markers"
"""gid of the marker line above the compute row: one marker per exposed wait."""

BAR_HEIGHT = 0.8
"""Height of a stream's row of bars, in rows."""

WHOLE_MARGIN = 0.01
"""Share of the step left blank at either end of the whole-step panel (so a marker at
time 0 shows whole)."""

MARKER_ROW = -0.6
"""Row of the exposed-wait markers: just above the compute row (row 0)."""

ZOOM_STEP_FRACTION = 1 / 16
"""Width of the zoom panel's window, as a share of the step: a few blocks' ops."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Zoom:
    """The zoom panel's window around the longest exposed wait."""

    start_s: float
    end_s: float
    wait: Wait
    """The longest exposed wait (the first of equals)."""


def gantt_figure(spans: Sequence[OpSpan], *, waits: Sequence[Wait] = (), title: str,
                 context: str) -> Figure:
    """A Gantt chart of the spans of rank 0: one row per stream that ran an op (top to
    bottom in STREAMS order), one bar per run of back-to-back ops of a kind (merged_bars;
    the zoom panel draws only those in its window), one legend entry per op kind; the compute
    stream's waits of rank 0 as spans in the compute row (on a collective or a copy:
    exposed communication; on the host optimizer step: apart), a marker above each exposed
    wait, and, where there is one, a second panel zoomed on the longest (zoom_window).

    Args:
        spans: the step's op spans (zsim.result.Result.spans of a run simulated with
            trace=True).
        waits: its compute-stream waits (zsim.result.Result.waits).
        title: the figure's first title line (names the run).
        context: the run's context lines (zsim.report.titles.context_text).
    """
    spans0 = [sp for sp in spans if sp.rank == 0]
    streams = [s for s in STREAMS if any(sp.stream == s for sp in spans0)]
    exposed = [w for w in waits if w.rank == 0 and w.collective != "host"]
    host = [w for w in waits if w.rank == 0 and w.collective == "host"]
    zoom = zoom_window(spans0, exposed)
    rows_in = 1.0 + 0.5 * len(streams)
    fig = Figure(figsize=(11, 2.6 + rows_in * (2 if zoom else 1)), layout="constrained")
    axes = list(fig.subplots(2 if zoom else 1, 1, squeeze=False)[:, 0])
    bars = merged_bars(spans0)
    for ax, window in zip(axes, [None, zoom], strict=False):
        _draw(ax, bars, streams, exposed, host, window)
    step_s = max((sp.end_s for sp in spans0), default=0.0)
    whole = axes[0]
    whole.set_xlim(-WHOLE_MARGIN * step_s, (1 + WHOLE_MARGIN) * step_s)
    if zoom is not None:
        zoomed = axes[1]
        zoomed.set_xlim(zoom.start_s, zoom.end_s)
        w = zoom.wait
        zoomed.set_title(
            f"Zoom on {zoom.start_s:.4g}–{zoom.end_s:.4g} s, the longest exposed wait: "
            f"{w.wait_s * 1e3:.3g} ms on {labels.words(w.collective, labels.KINDS).lower()}"
            f" before “{w.op}” ({labels.words(w.reason, labels.REASONS)})",
            fontsize="small")
        whole.axvspan(zoom.start_s, zoom.end_s, facecolor="none", edgecolor="black",
                      linestyle=":", linewidth=1, label="Zoomed below")
        whole.set_title("Whole step", fontsize="small")
    exposed_s = sum(w.wait_s for w in exposed)
    summary = (f"exposed communication {exposed_s * 1e3:.3g} ms in {len(exposed)} "
               f"wait{'' if len(exposed) == 1 else 's'}"
               f" ({100 * exposed_s / step_s if step_s else 0.0:.1f}% of the {step_s:.4g} s "
               "step), marked in yellow on the compute row")
    set_title(fig, f"{title}\n{summary[:1].upper()}{summary[1:]}", context)
    handles, names = whole.get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=5, fontsize="small")
    return fig


def zoom_window(spans0: Sequence[OpSpan], exposed: Sequence[Wait]) -> Zoom | None:
    """The window of the zoom panel: ZOOM_STEP_FRACTION of the step (or three times the
    wait, if longer) centred on the longest exposed wait, shifted to lie within the step;
    None without exposed waits.

    Args:
        spans0: rank 0's op spans.
        exposed: rank 0's compute-stream waits on collectives and copies.
    """
    if not exposed:
        return None
    wait = max(exposed, key=lambda w: w.wait_s)
    step_s = max(sp.end_s for sp in spans0)
    width_s = min(step_s, max(ZOOM_STEP_FRACTION * step_s, 3 * wait.wait_s))
    start_s = min(max(0.0, (wait.start_s + wait.end_s - width_s) / 2), step_s - width_s)
    return Zoom(start_s=start_s, end_s=start_s + width_s, wait=wait)


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    """One drawn bar: back-to-back ops of one kind on one stream."""

    stream: str
    start_s: float
    end_s: float


def merged_bars(spans0: Sequence[OpSpan]) -> dict[str, list[Bar]]:
    """Rank 0's spans as bars, by op kind: on each stream, the ops of a kind that start no
    later than the previous one of that kind ends are one bar (the union of their
    intervals), ordered by stream (STREAMS order), then start."""
    out: dict[str, list[Bar]] = {}
    for kind in KIND_COLORS:
        for stream in STREAMS:
            ops = sorted((sp for sp in spans0 if sp.kind == kind and sp.stream == stream),
                         key=lambda sp: sp.start_s)
            bars: list[Bar] = []
            for sp in ops:
                if bars and sp.start_s <= bars[-1].end_s:
                    last = bars[-1]
                    bars[-1] = Bar(stream=stream, start_s=last.start_s,
                                   end_s=max(last.end_s, sp.end_s))
                else:
                    bars.append(Bar(stream=stream, start_s=sp.start_s, end_s=sp.end_s))
            if bars:
                out.setdefault(kind, []).extend(bars)
    return out


def _draw(ax: Axes, bars: dict[str, list[Bar]], streams: Sequence[str],
          exposed: Sequence[Wait], host: Sequence[Wait], window: Zoom | None) -> None:
    """One panel: the op bars (those that reach into `window`, if given), the waits in the
    compute row and the exposed markers."""
    for kind, color in KIND_COLORS.items():
        drawn = [b for b in bars.get(kind, [])
                 if window is None or (b.end_s >= window.start_s and b.start_s <= window.end_s)]
        if not drawn:
            continue
        ax.barh([streams.index(b.stream) for b in drawn], [b.end_s - b.start_s for b in drawn],
                left=[b.start_s for b in drawn], height=BAR_HEIGHT, color=color,
                edgecolor="none", label=labels.words(kind, labels.KINDS))
    row = streams.index("compute") if "compute" in streams else 0
    for waits, label, color, hatch in ((exposed, EXPOSED_LABEL, EXPOSED_COLOR, "////"),
                                       (host, HOST_WAIT_LABEL, "#dddddd", "..")):
        if waits:
            ax.barh([row] * len(waits), [w.wait_s for w in waits],
                    left=[w.start_s for w in waits], height=BAR_HEIGHT, color=color,
                    edgecolor="black", linewidth=0.3, hatch=hatch, label=label)
    if exposed:
        (markers,) = ax.plot([(w.start_s + w.end_s) / 2 for w in exposed],
                             [row + MARKER_ROW] * len(exposed), linestyle="none",
                             marker="v", markersize=6, color=EXPOSED_COLOR,
                             markeredgecolor="black", markeredgewidth=0.5,
                             label="_exposed markers")
        markers.set_gid(EXPOSED_MARKERS_GID)
    ax.set_yticks(range(len(streams)), [labels.words(s, labels.STREAMS) for s in streams])
    ax.set_ylim(len(streams) - 0.5, MARKER_ROW - 0.3)  # inverted: compute on top
    ax.set_xlabel("Time in the step (s)")
    ax.set_ylabel("Stream of rank 0")
