"""`zsim calibrate` and `zsim validate`: the command tree and each command's options are
pinned (a new option or command is a decision, made here), the CLI passes its flags
through to zsim.calibrate_api / zsim.validate_api unchanged, renders what they return,
and turns bad input into one line with exit 2 (the real runs are exercised in
tests/backend and tests/validation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from zsim import calibrate_api, validate_api
from zsim.cli import app

COMMANDS: dict[str, dict[str, tuple[str, ...]]] = {
    "calibrate": {
        "profile": ("--out", "--backend", "--nproc"),
        "bands": ("--profile", "--write", "--cases", "--cpu"),
        "gpu-phases": ("--out", "--quick", "--budget-s"),
        "phase-rates": ("--phases", "--cases"),
    },
    "validate": {
        "plan": ("--model", "--nproc", "--strategy", "--shard-group", "--seq",
                 "--micro-batch", "--grad-accum", "--ac", "--precision", "--offload",
                 "--impl", "--profile", "--steps", "--out", "--format"),
        "grid": ("--out", "--profile", "--calibrate-here", "--only", "--no-time", "--runs",
                 "--steps", "--calibration-rounds", "--min-timed-s", "--repredict",
                 "--batch", "--report"),
        "figures": ("--out",),
        "gpu-report": ("--out", "--quick", "--budget-s", "--only", "--hardware"),
        "published-runs": ("--cases", "--hardware"),
        "error-budget": ("--report", "--out", "--bound-pct"),
        "checkpoint": ("--out", "--profile", "--nproc", "--dir"),
        "moe-ep": ("--out", "--steps"),
    },
}
"""The two command groups, their commands and each command's options (error-budget also
takes the evidence folder as an argument)."""


def test_the_command_tree_and_its_options_are_pinned() -> None:
    root = typer.main.get_command(app)
    for group, commands in COMMANDS.items():
        sub = root.commands[group]  # type: ignore[attr-defined]
        assert set(sub.commands) == set(commands), group
        for name, options in commands.items():
            params = sub.commands[name].params
            given = {o for p in params for o in p.opts if o.startswith("--")}
            assert given - {"--help"} == set(options), (group, name)
            arguments = [p.name for p in params if not any(o.startswith("-") for o in p.opts)]
            assert arguments == (["folder"] if name == "error-budget" else []), name


def _recording(monkeypatch: pytest.MonkeyPatch, module: Any, name: str,
               answer: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return answer

    monkeypatch.setattr(module, name, fake)
    return seen


def test_validate_plan_passes_flags_and_renders_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    canned = {"model": "m@d256", "profile": "local-cpu", "plan": "fsdp ac=full mb=2",
              "written": None, "rows": [{"metric": "step_time_s", "predicted": 1.0,
                                         "measured": 1.1, "error_pct": -9.09,
                                         "bound_pct": 15.0}]}
    seen = _recording(monkeypatch, validate_api, "plan", canned)
    args = ["validate", "plan", "--model", "8b", "--nproc", "2", "--strategy", "fsdp", "--ac",
            "full", "--micro-batch", "2", "--seq", "128", "--profile", "p"]
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "step_time_s" in table.stdout and "-9.09" in table.stdout
    assert seen == {"model": "8b", "nproc": 2, "strategy": "fsdp", "shard_group": None,
                    "profile": "p", "seq": 128, "micro_batch": 2, "grad_accum": 1,
                    "ac": "full", "precision": "bf16", "offload": "none", "impl": None,
                    "steps": None, "out": None}
    out = CliRunner().invoke(app, [*args, "--format", "json"])
    assert json.loads(out.stdout)["rows"] == canned["rows"]
    CliRunner().invoke(app, [*args, "--out", "somewhere", "--steps", "2"])
    assert seen["out"] == Path("somewhere") and seen["steps"] == 2


def test_validate_plan_steps_time_exactly_that_many(monkeypatch: pytest.MonkeyPatch) -> None:
    """--steps N times N steps (no minimum duration); without it, the default timing."""
    pytest.importorskip("torch")
    from zsim.validation import comparison

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(comparison, "validate_plan",
                        lambda spec, plan, **kw: calls.append(kw) or [])
    for steps in (4, None):
        validate_api.plan(model="125m", nproc=2, strategy="ddp", seq=32, steps=steps)
    assert {k: calls[0][k] for k in ("steps", "min_timed_s")} == {"steps": 4,
                                                                  "min_timed_s": 0.0}
    assert "steps" not in calls[1] and "min_timed_s" not in calls[1]


def test_validate_grid_passes_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _recording(monkeypatch, validate_api, "grid", {
        "written": "r/validation.csv", "figures": ["r/predicted_vs_measured-b.svg"]})
    result = CliRunner().invoke(app, [
        "validate", "grid", "--out", "r", "--calibrate-here", "--only", "llama-tiny zero1* n2",
        "--only", "gpt-tiny * n4", "--no-time", "--runs", "1", "--steps", "2",
        "--calibration-rounds", "1", "--min-timed-s", "3", "--batch", "b", "--report", "c"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "wrote r/validation.csv\n"
    assert result.stderr == "wrote r/predicted_vs_measured-b.svg\n"
    assert seen == {"out": Path("r"), "profile": None, "calibrate_here": True,
                    "only": ["llama-tiny zero1* n2", "gpt-tiny * n4"], "no_time": True,
                    "runs": 1, "steps": 2, "calibration_rounds": 1, "min_timed_s": 3.0,
                    "repredict": False, "batch": "b", "report": "c"}
    CliRunner().invoke(app, ["validate", "grid", "--out", "r", "--repredict"])
    assert seen == {"out": Path("r"), "profile": None, "calibrate_here": False, "only": [],
                    "no_time": False, "runs": None, "steps": 8, "calibration_rounds": None,
                    "min_timed_s": None, "repredict": True, "batch": None, "report": None}
    seen = _recording(monkeypatch, validate_api, "figures", {"written": ["r/a.svg"]})
    result = CliRunner().invoke(app, ["validate", "figures", "--out", "r"])
    assert result.exit_code == 0 and result.stdout == "wrote r/a.svg\n"
    assert seen == {"out": Path("r")}


def test_validate_gpu_report_and_published_runs_pass_flags(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _recording(monkeypatch, validate_api, "gpu_report", {"written": "g/validation.csv"})
    result = CliRunner().invoke(app, ["validate", "gpu-report", "--out", "g", "--quick",
                                      "--budget-s", "90", "--only", "tiny_n8",
                                      "--hardware", "local-cpu"])
    assert result.exit_code == 0 and "g/validation.csv" in result.stdout
    assert seen == {"out": Path("g"), "quick": True, "budget_s": 90.0, "only": ["tiny_n8"],
                    "hardware": "local-cpu"}
    seen = _recording(monkeypatch, validate_api, "published_runs", {"rows": [], "text": "T"})
    result = CliRunner().invoke(app, ["validate", "published-runs", "--cases", "c.yaml"])
    assert result.stdout == "T\n"
    assert seen == {"cases": Path("c.yaml"), "hardware": "hgx-h200"}


def test_calibrate_commands_pass_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    seen = _recording(monkeypatch, calibrate_api, "profile", out)
    result = CliRunner().invoke(app, ["calibrate", "profile", "--backend", "gloo", "--nproc",
                                      "2", "--out", str(out)])
    assert result.exit_code == 0 and str(out) in result.stdout
    assert seen == {"backend": "gloo", "nproc": 2, "out": out}

    seen = _recording(monkeypatch, calibrate_api, "bands",
                      {"sections": {"local-cpu": "error_bands:\n"}, "written": []})
    result = CliRunner().invoke(app, ["calibrate", "bands", "--profile", "local-cpu"])
    assert result.stdout == "# local-cpu\nerror_bands:\n\n"
    assert seen == {"profiles": ["local-cpu"], "write": False, "cases": None, "cpu": None}

    seen = _recording(monkeypatch, calibrate_api, "gpu_phases", {"written": "x/phases.csv"})
    CliRunner().invoke(app, ["calibrate", "gpu-phases", "--out", "x", "--quick"])
    assert seen == {"out": Path("x"), "quick": True, "budget_s": 135.0}

    seen = _recording(monkeypatch, calibrate_api, "phase_rates", {"text": "rates"})
    result = CliRunner().invoke(app, ["calibrate", "phase-rates", "--phases", "d",
                                      "--cases", "c.yaml"])
    assert result.stdout == "rates\n"
    assert seen == {"phases": Path("d"), "cases": Path("c.yaml")}


@pytest.mark.parametrize(("args", "named"), [
    (["calibrate", "profile", "--backend", "mpi", "--out", "x.yaml"], "backend"),
    (["calibrate", "profile", "--nproc", "0", "--out", "x.yaml"], "nproc"),
    (["calibrate", "bands", "--profile", "nope"], "profile"),
    (["calibrate", "gpu-phases", "--out", "x", "--budget-s", "-1"], "budget_s"),
    (["calibrate", "phase-rates", "--phases", "nowhere", "--cases", "c.yaml"], "phases"),
    (["validate", "plan", "--model", "nope", "--nproc", "2", "--strategy", "fsdp"], "model"),
    (["validate", "plan", "--model", "8b", "--nproc", "2", "--strategy", "fsdp",
      "--profile", "nope"], "hardware"),
    (["validate", "plan", "--model", "8b", "--nproc", "2", "--strategy", "fsdp",
      "--steps", "0"], "steps"),
    (["validate", "grid", "--out", "x", "--calibrate-here", "--profile", "local-cpu"],
     "profile"),
    (["validate", "grid", "--out", "x", "--calibrate-here", "--repredict"], "calibrate_here"),
    (["validate", "grid", "--out", "x", "--min-timed-s", "-1"], "min_timed_s"),
    (["validate", "grid", "--out", "x", "--calibration-rounds", "0"], "calibration_rounds"),
    (["validate", "grid", "--out", "x", "--runs", "0"], "runs"),
    (["validate", "grid", "--out", "x", "--profile", "nope"], "hardware"),
    (["validate", "grid", "--out", "x", "--repredict", "--profile", "local-cpu"], "profile"),
    (["validate", "grid", "--out", "x", "--repredict", "--report", "r"], "report"),
    (["validate", "grid", "--out", "x", "--repredict"], "folder"),
    (["validate", "grid", "--out", "x", "--batch", "a/b", "--no-time"], "batch"),
    (["validate", "figures", "--out", "nowhere"], "folder"),
    (["validate", "gpu-report", "--out", "x", "--budget-s", "-5"], "budget_s"),
    (["validate", "published-runs", "--cases", "nowhere.yaml"], "cases"),
    (["validate", "error-budget", "nowhere"], "folder"),
    (["validate", "checkpoint", "--out", "x", "--dir", "nowhere"], "dir"),
])
def test_bad_input_is_one_line(args: list[str], named: str, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0]
    assert not any(tmp_path.iterdir())
