"""A simulated step's op spans -> a stream Gantt chart (matplotlib Figure).

Owns the timeline figure of one plan: a row per stream of rank 0 (compute, the collective
streams, copies, host; zsim.schedule.ops.STREAMS order), a bar per op from its start to its
end, coloured by op kind. The same spans `zsim simulate --trace` exports to Perfetto
(zsim.engine.trace.OpSpan). Object API only (Figure, never pyplot); never simulates.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from zsim.engine.trace import OpSpan
from zsim.schedule.ops import STREAMS

KIND_COLORS: dict[str, str] = {
    "forward": "#4c72b0", "backward": "#55a868", "optimizer": "#8172b3", "sync": "#8c8c8c",
    "all_gather": "#64b5cd", "reduce_scatter": "#c44e52", "all_reduce": "#dd8452",
    "h2d": "#937860", "d2h": "#da8bc3",
}
"""Colour of each op kind (zsim.schedule.ops.OpKind)."""

BAR_HEIGHT = 0.8
"""Height of a stream's row of bars, in rows."""


def gantt_figure(spans: Sequence[OpSpan], *, title: str) -> Figure:
    """A Gantt chart of the spans of rank 0: one row per stream that ran an op (top to
    bottom in STREAMS order), one bar per op, one legend entry per op kind.

    Args:
        spans: the step's op spans (zsim.result.Result.spans of a run simulated with
            trace=True).
        title: the figure's title (names the run).
    """
    spans0 = [sp for sp in spans if sp.rank == 0]
    streams = [s for s in STREAMS if any(sp.stream == s for sp in spans0)]
    fig = Figure(figsize=(11, 1.6 + 0.5 * len(streams)), layout="constrained")
    ax = fig.add_subplot()
    for kind, color in KIND_COLORS.items():
        ops = [sp for sp in spans0 if sp.kind == kind]
        if not ops:
            continue
        ax.barh([streams.index(sp.stream) for sp in ops], [sp.duration_s for sp in ops],
                left=[sp.start_s for sp in ops], height=BAR_HEIGHT, color=color,
                edgecolor="none", label=kind)
    ax.set_yticks(range(len(streams)), streams)
    ax.invert_yaxis()
    ax.set_xlabel("time in the step (s)")
    ax.set_ylabel("stream (rank 0)")
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncols=min(len(KIND_COLORS), 5),
               fontsize="small")
    return fig
