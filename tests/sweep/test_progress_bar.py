"""The progress bar draws done/total, rate and time left on a terminal only, at most every
REDRAW_S (the last state always), and counts in its rate only what this process did."""

from __future__ import annotations

import io

from zsim.progress import REDRAW_S, ProgressBar, render


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_when_not_a_terminal() -> None:
    piped = io.StringIO()
    bar = ProgressBar(piped)
    for done in range(5):
        bar(done, 4, "x")
    assert piped.getvalue() == ""


def test_rate_and_eta_from_this_process_only() -> None:
    # 400 of 1,000 read back from a journal; then 150 more in 3 s: 50 plans/s, 450 left
    # at that rate is 9 s.
    assert render(550, 1000, 3.0, 150) == (
        "550/1,000 [#############...........]  55%  50 plans/s  ETA 0:09")
    assert render(0, 10_000, 0.0, 0).endswith("  - plans/s  ETA -")
    assert "ETA 1:01:40" in render(1, 3701, 1.0, 1)


def test_redraws_in_place_no_faster_than_redraw_s_and_ends_the_line() -> None:
    tty = Terminal()
    now = [0.0]
    bar = ProgressBar(tty, clock=lambda: now[0])
    bar(400, 1000, "")
    for done, t in ((450, 1.0), (460, 1.0 + REDRAW_S / 2), (1000, 1.0 + REDRAW_S / 2)):
        now[0] = t
        bar(done, 1000, "run")
    frames = tty.getvalue().split("\r")[1:]
    assert [f.split()[0] for f in frames] == ["400/1,000", "450/1,000", "1,000/1,000"]
    assert frames[1].strip().endswith("50 plans/s  ETA 0:11")  # 50 done here in 1 s
    assert frames[-1].endswith("\n") and "ETA 0:00" in frames[-1]
