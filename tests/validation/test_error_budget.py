"""zsim.validation.error_budget: the split of step-time errors over repeated validation
batches into case biases, calibration shifts and the rest, checked on rows made from
known parts, on evidence folders written here, and on the committed batches of the
2-core host (report validation-cpu2 of reports/validation/), whose budget files must be
what the command (`zsim validate error-budget`) makes of them and whose every case must
be within the step-time bound on average over its batches."""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from zsim.cli import app
from zsim.validation import evidence
from zsim.validation.error_budget import (
    BOUND_PCT,
    CASE_FIELDS,
    FILES,
    GROUP_FIELDS,
    Budget,
    Row,
    all_within_probability,
    fit,
)

EVIDENCE = Path(__file__).resolve().parents[2] / "reports" / "validation"

BIASES = {(2, "a"): -6.0, (2, "b"): 3.0, (2, "c"): 11.0, (4, "a"): -2.0, (4, "d"): 7.5}
SHIFTS = {("x", 2): 4.0, ("y", 2): -1.0, ("z", 2): -3.0, ("x", 4): 6.0, ("y", 4): -6.0}
"""Known parts; each world size's shifts average 0 over its rows below (every case in
every batch of its world size)."""


def _rows(noise: dict[tuple[str, int, str], float] | None = None) -> list[Row]:
    rows = []
    for (batch, world), shift in SHIFTS.items():
        for (w, case), bias in BIASES.items():
            if w == world:
                extra = (noise or {}).get((batch, world, case), 0.0)
                rows.append(Row(batch=batch, world_size=world, case=case,
                                error_pct=bias + shift + extra))
    return rows


def test_fit_recovers_known_biases_and_shifts() -> None:
    budget = fit(_rows())
    for key, bias in BIASES.items():
        assert budget.bias_pct[key] == pytest.approx(bias, abs=1e-9)
    for key, shift in SHIFTS.items():
        assert budget.shift_pct[key] == pytest.approx(shift, abs=1e-9)
    assert budget.residual_std_pct == pytest.approx(0.0, abs=1e-9)


def test_fit_is_least_squares_with_shifts_centred_per_world() -> None:
    """With noise the fitted errors leave residuals that sum to 0 over every case and
    every group (the normal equations of the additive model), and each world size's
    shifts average 0 over its rows."""
    rng = np.random.default_rng(7)
    keys = [(b, w, c) for (b, w), (w2, c) in itertools.product(SHIFTS, BIASES) if w == w2]
    rows = _rows({k: float(rng.normal(0, 2)) for k in keys})
    budget = fit(rows)
    resid = {(r.batch, r.world_size, r.case):
             r.error_pct - budget.bias_pct[(r.world_size, r.case)]
             - budget.shift_pct[(r.batch, r.world_size)] for r in rows}
    zero = pytest.approx(0, abs=1e-9)
    for case in BIASES:
        assert sum(v for (_, w, c), v in resid.items() if (w, c) == case) == zero
    for group in SHIFTS:
        assert sum(v for (b, w, _), v in resid.items() if (b, w) == group) == zero
    for world in (2, 4):
        shifts = [budget.shift_pct[(r.batch, world)] for r in rows if r.world_size == world]
        assert np.mean(shifts) == pytest.approx(0, abs=1e-9)
    assert budget.residual_std_pct > 0


def test_chance_of_a_batch_within_the_bound_by_hand() -> None:
    """One case of bias 0: its error is the shift (sd 4, the two groups' +-4) plus the
    residual (sd 3), a normal of sd 5, within 5% with chance erf(1 / sqrt 2) = 68.27%;
    without the shift erf(5 / (3 sqrt 2)). A second world size's case multiplies in its
    own chance; a bias beyond the bound all but rules a batch out."""
    budget = Budget(bias_pct={(2, "a"): 0.0}, shift_pct={("x", 2): -4.0, ("y", 2): 4.0},
                    residual_std_pct=3.0)
    assert all_within_probability(budget, 5.0) == pytest.approx(math.erf(1 / math.sqrt(2)),
                                                                abs=1e-4)
    assert all_within_probability(budget, 5.0, shift_scale=0) == pytest.approx(
        math.erf(5 / (3 * math.sqrt(2))), abs=1e-9)
    two = Budget(bias_pct={(2, "a"): 0.0, (4, "b"): 0.0},
                 shift_pct={("x", 2): -4.0, ("y", 2): 4.0, ("x", 4): 0.0, ("y", 4): 0.0},
                 residual_std_pct=3.0)
    assert all_within_probability(two, 5.0) == pytest.approx(
        math.erf(1 / math.sqrt(2)) * math.erf(5 / (3 * math.sqrt(2))), abs=1e-4)
    far = Budget(bias_pct={(2, "a"): 30.0}, shift_pct={("x", 2): 0.0},
                 residual_std_pct=3.0)
    assert all_within_probability(far, 15.0) < 1e-6


def _batch(root: Path, name: str, errors: dict[tuple[int, str], float], host: str,
           stamp: str, report: str = "r") -> None:
    """Add a batch of `report` to the evidence folder `root`: a step-time row per (world
    size, plan) with its error, a peak-memory row and an unpredicted pipeline row beside
    them, and a profile per world size calibrated on `host` at `stamp`."""
    batches = evidence.read_batches(root) if (root / evidence.BATCHES).is_file() else []
    rows = evidence.by_batch(evidence.read_table(root))
    common = {"batch": name, "time_utc": stamp, "model": "m", "backend": "gloo", "run": "",
              "note": ""}
    rows[name] = []
    for (world, plan), err in errors.items():
        rows[name] += [
            {**common, "plan": plan, "nproc": world, "metric": "step_time_s",
             "predicted": 1 + err / 100, "measured": 1.0, "error_pct": err, "bound_pct": 15.0},
            {**common, "plan": plan, "nproc": world, "metric": "peak_memory_bytes",
             "predicted": 1.0, "measured": 1.0, "error_pct": 0.0, "bound_pct": 5.0}]
    rows[name].append({**common, "plan": "pp", "nproc": 2, "metric": "step_time_s",
                       "predicted": None, "measured": 1.0, "error_pct": None,
                       "bound_pct": 15.0, "note": "not simulated"})
    profiles = {}
    for world in sorted({w for w, _ in errors}):
        ref = f"profiles/{name}-n{world}.yaml"
        (root / "profiles").mkdir(parents=True, exist_ok=True)
        (root / ref).write_text(
            f"gpu:\n  name: {host}, one torch.distributed rank\n"
            f"  source: zsim calibrate profile --backend gloo --nproc {world}, {stamp} UTC, "
            f"torch\n")
        profiles[world] = ref
    batches.append(evidence.Batch(name=name, report=report, bounds="not held",
                                  cases=len(errors) + 1, profiles=profiles,
                                  passes=({"time_utc": stamp},)))
    evidence.write(root, batches, rows, {})


def _command(*args: str) -> Result:
    """`zsim validate error-budget ARGS`."""
    return CliRunner().invoke(app, ["validate", "error-budget", *args])


def test_batches_give_the_budget_files(tmp_path: Path) -> None:
    root = tmp_path / "evidence"
    _batch(root, "b1", {(2, "p"): 13.0, (2, "q"): -11.0}, "CPU A", "2026-01-01 10:00")
    _batch(root, "b2", {(2, "p"): 4.0, (2, "q"): -20.0, (4, "p"): 1.0},
           "CPU B", "2026-01-01 09:00")
    _batch(root, "other", {(2, "p"): 90.0}, "CPU C", "2026-01-01 11:00", report="s")
    out = tmp_path / "out"
    result = _command(str(root), "--report", "r", "--out", str(out))
    assert result.exit_code == 0, result.output
    with (out / "error_budget_cases.csv").open() as f:
        cases = list(csv.DictReader(f))
    assert tuple(cases[0]) == CASE_FIELDS
    p2 = next(c for c in cases if c["case"] == "m p" and c["world_size"] == "2")
    assert (float(p2["mean_error_pct"]), float(p2["min_error_pct"]),
            float(p2["max_error_pct"]), p2["batches"]) == (8.5, 4.0, 13.0, "2")
    q2 = next(c for c in cases if c["case"] == "m q")
    assert float(q2["within_bound_pct"]) == 50.0  # -20% is out of 15%, -11% in
    with (out / "error_budget_groups.csv").open() as f:
        groups = list(csv.DictReader(f))
    assert tuple(groups[0]) == GROUP_FIELDS
    # In order of calibration: b2 (09:00) before b1 (10:00).
    assert [(g["batch"], g["world_size"], g["host"]) for g in groups] == [
        ("b2", "2", "CPU B"), ("b2", "4", "CPU B"), ("b1", "2", "CPU A")]
    assert [g["within_bound"] for g in groups] == ["1", "1", "2"]
    # b1's errors are 9 points above b2's on both cases: shifts +4.5 and -4.5.
    assert float(groups[2]["shift_pct"]) == pytest.approx(4.5)
    assert float(groups[0]["shift_pct"]) == pytest.approx(-4.5)
    assert "5 step-time rows of 3 cases in 2 batches (3 calibrations): 4 within 15%" in (
        result.stdout)
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert _command(str(root), "--report", "r", "--out", str(out)).exit_code == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first


@pytest.mark.parametrize("setup, field, message", [
    ("missing", "folder=", "is not a folder"),
    ("other-report", "report=", "has no batch"),
    ("no-profile", "batches.b.profiles=", "no profile"),
    ("unpredicted", "report=", "no predicted step-time rows"),
])
def test_bad_evidence_is_one_line_and_exit_2(tmp_path: Path, setup: str, field: str,
                                             message: str) -> None:
    root = tmp_path / "root"
    if setup != "missing":
        _batch(root, "b", {} if setup == "unpredicted" else {(2, "p"): 1.0}, "CPU",
               "2026-01-01 10:00", report="elsewhere" if setup == "other-report" else "r")
    if setup == "no-profile":
        batches = evidence.read_batches(root)
        batches = [evidence.Batch(**{**{f: getattr(b, f) for f in b.__slots__},
                                     "profiles": {}}) for b in batches]
        evidence.write(root, batches, evidence.by_batch(evidence.read_table(root)), {})
    out = tmp_path / "out"
    result = _command(str(root), "--report", "r", "--out", str(out))
    assert result.exit_code == 2
    err = result.stderr.strip()
    assert err.startswith(f"error: {field}") and message in err and "\n" not in err, err
    assert not out.exists()


def test_committed_budget_is_the_modules() -> None:
    """reports/validation/error_budget_*.csv are what the module makes of the committed
    batches of validation-cpu2 now."""
    from tempfile import TemporaryDirectory

    with TemporaryDirectory() as tmp:
        assert _command(str(EVIDENCE), "--out", tmp).exit_code == 0
        for name in FILES[:2]:
            assert (Path(tmp) / name).read_bytes() == (EVIDENCE / name).read_bytes(), name


def test_every_case_is_within_the_bound_on_average() -> None:
    """Over the committed batches, each case's mean step-time error is within the
    report's bound: what is left over a single batch is the calibration's shift and the
    runs' spread (the budget's other parts)."""
    with (EVIDENCE / "error_budget_cases.csv").open() as f:
        cases = list(csv.DictReader(f))
    assert len(cases) == 29
    over = [(c["case"], c["world_size"], c["mean_error_pct"]) for c in cases
            if abs(float(c["mean_error_pct"])) > BOUND_PCT]
    assert not over


def test_bound_is_the_reports() -> None:
    comparison = pytest.importorskip("zsim.validation.comparison")
    assert comparison.BOUNDS_PCT["step_time_s"] == BOUND_PCT
