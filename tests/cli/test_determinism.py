"""Determinism across processes: the same inputs give byte-identical JSON, CSV,
traces and report files in two fresh interpreters with different hash seeds (set and dict
orders keyed by strings change with PYTHONHASHSEED, so a result that depended on one would
differ here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIO = """name: twice
model: 7b
hardware: dgx-h100
gpus: 64
seq_len: 2048
plans:
  fsdp: {strategy: fsdp}
  hsdp: {strategy: hsdp, shard_group: 8, recompute: selective}
  zero1: {strategy: zero1, recompute: full}
sweep:
  micro_batch: [1, 2]
"""


def _run_all(out: Path, scenario: Path, hash_seed: str) -> dict[str, bytes]:
    """Every output of a few commands in a fresh interpreter, by name."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    zsim = [sys.executable, "-m", "zsim"]
    runs = {
        "plan.json": ["plan", "--model", "13b", "--gpus", "128", "--format", "json"],
        "plan.csv": ["plan", "--model", "70b", "--gpus", "256", "--seq", "8192",
                     "--format", "csv"],
        "simulate.json": ["simulate", "--model", "13b", "--gpus", "128", "--strategy", "hsdp",
                          "--ac", "selective", "--grad-accum", "2", "--format", "json",
                          "--trace", str(out / "trace.json")],
        "simulate-offload.json": ["simulate", "--model", "7b", "--gpus", "8", "--strategy",
                                  "fsdp", "--offload", "optimizer", "--format", "json"],
        "sweep.csv": ["sweep", "--scenario", str(scenario), "--out", str(out / "report"),
                      "--format", "csv"],
    }
    got = {}
    for name, args in runs.items():
        proc = subprocess.run([*zsim, *args], env=env, capture_output=True, timeout=300,
                              cwd=out)
        assert proc.returncode == 0, proc.stderr.decode()[-1000:]
        got[name] = proc.stdout
    for path in sorted(out.rglob("*.*")):
        got[str(path.relative_to(out))] = path.read_bytes()
    return got


@pytest.mark.slow
def test_two_fresh_processes_give_the_same_bytes(tmp_path: Path) -> None:
    scenario = tmp_path / "twice.yaml"
    scenario.write_text(SCENARIO)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    a = _run_all(first, scenario, "1")
    b = _run_all(second, scenario, "2")
    assert sorted(a) == sorted(b)
    assert "trace.json" in a and "report/twice.md" in a and "report/twice-memory.svg" in a
    different = [name for name in a if a[name] != b[name]]
    assert not different, f"differ between processes: {different}"
