"""`zsim calibrate` and `zsim validate`: the CLI passes its flags through, renders the
rows, and turns bad input into one line with exit 2 (the real runs are exercised in
tests/backend and tests/validation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from zsim import api
from zsim.cli import app


def test_validate_passes_flags_and_renders_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    canned = {"model": "m@d256", "profile": "local-cpu", "plan": "fsdp ac=full mb=2",
              "written": None, "rows": [{"metric": "step_time_s", "predicted": 1.0, "measured": 1.1,
                        "error_pct": -9.09, "bound_pct": 15.0}]}

    def fake(**kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return canned

    monkeypatch.setattr(api, "validate", fake)
    args = ["validate", "--model", "8b", "--nproc", "2", "--strategy", "fsdp", "--ac", "full",
            "--micro-batch", "2", "--seq", "128", "--profile", "p"]
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


def test_validate_steps_time_exactly_that_many(monkeypatch: pytest.MonkeyPatch) -> None:
    """--steps N times N steps (no minimum duration); without it, the default timing."""
    pytest.importorskip("torch")
    import zsim.validation.report as module

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(module, "validate",
                        lambda spec, plan, **kw: calls.append(kw) or [])
    for steps in (4, None):
        api.validate(model="125m", nproc=2, strategy="ddp", seq=32, steps=steps)
    assert {k: calls[0][k] for k in ("steps", "min_timed_s")} == {"steps": 4,
                                                                  "min_timed_s": 0.0}
    assert "steps" not in calls[1] and "min_timed_s" not in calls[1]


def test_calibrate_passes_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def fake(**kwargs: Any) -> Path:
        seen.update(kwargs)
        return kwargs["out"]

    monkeypatch.setattr(api, "calibrate", fake)
    out = tmp_path / "p.yaml"
    result = CliRunner().invoke(app, ["calibrate", "--backend", "gloo", "--nproc", "2",
                                      "--out", str(out)])
    assert result.exit_code == 0 and str(out) in result.stdout
    assert seen == {"backend": "gloo", "nproc": 2, "out": out}


@pytest.mark.parametrize(("args", "named"), [
    (["calibrate", "--backend", "mpi", "--out", "x.yaml"], "backend"),
    (["calibrate", "--nproc", "0", "--out", "x.yaml"], "nproc"),
    (["validate", "--model", "nope", "--nproc", "2", "--strategy", "fsdp"], "model"),
    (["validate", "--model", "8b", "--nproc", "2", "--strategy", "fsdp",
      "--profile", "nope"], "hardware"),
    (["validate", "--model", "8b", "--nproc", "2", "--strategy", "fsdp",
      "--steps", "0"], "steps"),
])
def test_bad_input_is_one_line(args: list[str], named: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0]
    assert not (tmp_path / "x.yaml").exists()
