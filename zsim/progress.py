"""A one-line progress bar for long commands (`zsim sweep`): done/total, a bar, the rate
and the time left, redrawn in place on a terminal and silent anywhere else (a pipe, a
file, a test runner), so piped output and logs stay clean. Standard library only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

BAR_WIDTH = 24
"""Characters of the bar itself."""

REDRAW_S = 0.1
"""Least time between two redraws (the last one is always drawn)."""


class ProgressBar:
    """Called as zsim.sweep.Progress: (done, total, last name). The rate counts only what
    this process did (runs read back from a journal are done at the first call)."""

    def __init__(self, stream: TextIO, *, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._stream = stream
        self._on = stream.isatty()
        self._clock = clock
        self._start: tuple[float, int] | None = None
        self._drawn_s = -REDRAW_S
        self._width = 0

    def __call__(self, done: int, total: int, name: str) -> None:
        if not self._on:
            return
        now = self._clock()
        if self._start is None:
            self._start = (now, done)
        if done < total and now - self._drawn_s < REDRAW_S:
            return
        self._drawn_s = now
        line = render(done, total, now - self._start[0], done - self._start[1])
        self._stream.write("\r" + line.ljust(self._width))
        self._width = len(line)
        if done >= total:
            self._stream.write("\n")
        self._stream.flush()


def render(done: int, total: int, elapsed_s: float, done_here: int) -> str:
    """The bar's line: `  1,234/10,000 [#####...]  12%  215 plans/s  ETA 0:41`.

    Args:
        done, total: runs finished and in all.
        elapsed_s: seconds since this process started on them.
        done_here: of `done`, the runs this process finished in `elapsed_s` (the rate).
    """
    fraction = done / total if total else 1.0
    filled = round(BAR_WIDTH * fraction)
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    rate_per_s = done_here / elapsed_s if elapsed_s > 0 and done_here > 0 else None
    rate = "-" if rate_per_s is None else f"{rate_per_s:,.0f}"
    left = "-" if rate_per_s is None else _clock_text((total - done) / rate_per_s)
    return (f"{done:,}/{total:,} [{bar}] {fraction:4.0%}  {rate} plans/s  "
            f"ETA {left}")


def _clock_text(seconds: float) -> str:
    """h:mm:ss or m:ss."""
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
