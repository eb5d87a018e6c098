"""Interrupted sweeps resume, for real: `zsim sweep --out` in a subprocess killed with
SIGKILL part-way (its journal then also given a torn last line), or stopped with Ctrl-C,
and run again, simulates only the runs missing, and its finished files are the same bytes
as an uninterrupted serial run's; no run is lost or duplicated in the journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zsim.journal import JOURNAL_NAME

RUNS = 4 * 2 * 3 * 2 * 2
"""Runs of the grid scenario (tests/sweep/conftest.py)."""
FINISHED = ("results.csv", "grid.csv", "grid.md", "grid-step-time.svg", "grid-memory.svg",
            "grid-memory-curve.svg")


def _interruptible() -> None:
    """In the child before exec: Ctrl-C as a terminal delivers it. A process started in
    the background by a non-interactive shell (as CI may run the suite) inherits SIGINT
    ignored, and Python then keeps ignoring it (as zsim sweep does, like any program
    under nohup)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def zsim(scenario: Path, out: Path, workers: str) -> subprocess.Popen[str]:
    env = {**os.environ, "ZSIM_WORKERS": workers}
    return subprocess.Popen(
        [sys.executable, "-m", "zsim", "sweep", "--scenario", str(scenario), "--out",
         str(out), "--format", "csv"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_interruptible)


def finish(proc: subprocess.Popen[str]) -> str:
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    return stderr


def interrupt_part_way(scenario: Path, out: Path, sig: signal.Signals) -> int:
    """Start a 2-worker sweep, send `sig` to its process group once some runs are in the
    journal and before all are; return how many whole lines the journal then holds."""
    proc = zsim(scenario, out, "2")
    journal = out / JOURNAL_NAME
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_bytes().count(b"\n") >= 8:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the sweep ended before it could be interrupted"
    os.killpg(proc.pid, sig)
    proc.communicate(timeout=60)
    lines = journal.read_bytes().count(b"\n")
    assert 8 <= lines < RUNS, lines
    assert not (out / "results.csv").exists()
    return lines


def resumed(stderr: str) -> tuple[int, int]:
    """(simulated, read back) from the rerun's summary line."""
    line = next(ln for ln in stderr.splitlines() if ln.startswith("simulated "))
    words = line.split()
    return int(words[1]), int(words[3])


@pytest.fixture(scope="module")
def uninterrupted(module_grid_path: Path) -> Path:
    """An uninterrupted serial sweep of the grid scenario (run once for the module)."""
    out = module_grid_path.parent / "whole"
    finish(zsim(module_grid_path, out, "1"))
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_an_interrupted_sweep_resumes_to_the_same_bytes(
        module_grid_path: Path, tmp_path: Path, uninterrupted: Path,
        sig: signal.Signals) -> None:
    grid_path = module_grid_path
    out = tmp_path / "cut"
    kept = interrupt_part_way(grid_path, out, sig)
    journal = out / JOURNAL_NAME
    if sig is signal.SIGKILL:  # as if killed in the middle of a line
        with open(journal, "ab") as f:
            f.write(b'{"id":"0123","row":{"run":"fsdp gp')
    simulated, read_back = resumed(finish(zsim(grid_path, out, "2")))
    assert (simulated, read_back) == (RUNS - kept, kept)
    for name in FINISHED + ("results.parquet",) * (uninterrupted / "results.parquet").exists():
        assert (out / name).read_bytes() == (uninterrupted / name).read_bytes(), name
    ids = [json.loads(line)["id"] for line in journal.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == RUNS
    # Once finished, a rerun simulates nothing and rewrites the same bytes.
    assert resumed(finish(zsim(grid_path, out, "2"))) == (0, RUNS)
    assert (out / "results.csv").read_bytes() == (uninterrupted / "results.csv").read_bytes()
