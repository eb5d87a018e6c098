"""`zsim sweep` end to end on the toy scenario: table, JSON and CSV on stdout (no progress
bar when stderr is not a terminal), the results and report files in --out, one-line errors
with exit code 2, and, when the sweep fails, nothing but the journal of the runs finished."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import zsim.simulate
from zsim.cli import app
from zsim.errors import ConfigError

FIGURES = {f"toy-{figure}.svg" for figure in ("step-time", "memory", "memory-curve")}
FILES = {"toy.csv", "toy.md", *FIGURES, "journal.jsonl", "results.csv",
         *(["results.parquet"] if importlib.util.find_spec("pyarrow") else [])}


def sweep(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["sweep", *args])
    return result.exit_code, result.stdout, result.stderr


def test_csv_on_stdout_equals_the_written_csv(toy_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = sweep("--scenario", str(toy_path), "--out", str(out),
                                 "--format", "csv")
    assert code == 0, stderr
    assert {p.name for p in out.iterdir()} == FILES
    assert stdout == (out / "toy.csv").read_text() == (out / "results.csv").read_text()
    assert stderr.splitlines() == ["simulated 3 runs, 0 read back from the journal"] + [
        f"wrote {out / name}" for name in (
        "results.csv", *(["results.parquet"] if "results.parquet" in FILES else []),
        "toy.csv", "toy.md", *(f"toy-{figure}.svg" for figure in (
            "step-time", "memory", "memory-curve")))]
    md = (out / "toy.md").read_text()
    assert "| fsdp | yes |" in md and "| ddp-huge | no |" in md
    assert "![Step time: compute vs exposed communication](toy-step-time.svg)" in md
    assert "A 2-layer model on 16 H100s." in md


def test_json_stdout_parses_despite_progress(toy_path: Path) -> None:
    code, stdout, _ = sweep("--scenario", str(toy_path), "--format", "json")
    assert code == 0
    rows = json.loads(stdout)
    assert [(r["run"], r["fits"]) for r in rows] == [
        ("fsdp", True), ("hsdp", True), ("ddp-huge", False)]
    assert rows[2]["oom"].startswith("does not fit (closed form")


def test_table_lists_every_run_and_writes_nothing_without_out(
        toy_path: Path, tmp_path: Path) -> None:
    code, stdout, stderr = sweep("--scenario", str(toy_path))
    assert code == 0
    lines = stdout.splitlines()
    assert lines[0].split() == ["run", "fits", "step_time_s", "exposed_comm_s",
                                "peak_memory_gib", "tokens_per_s_per_gpu", "mfu"]
    assert [ln.split()[:2] for ln in lines[2:]] == [["fsdp", "yes"], ["hsdp", "yes"],
                                                    ["ddp-huge", "NO"]]
    assert "wrote" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy.yaml"]


def test_a_bad_scenario_is_one_line_and_exit_2(toy_path: Path, tmp_path: Path) -> None:
    toy_path.write_text(toy_path.read_text().replace("shard_group: 8", "shard_group: 3"))
    code, stdout, stderr = sweep("--scenario", str(toy_path), "--out", str(tmp_path / "o"))
    assert (code, stdout) == (2, "")
    assert stderr.splitlines() == [
        f"error: plans.hsdp.shard_group=3: must divide gpus=16 (in {toy_path})"]
    assert not (tmp_path / "o").exists()


def test_a_sweep_failing_midway_leaves_nothing_in_out(
        toy_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = zsim.simulate.simulate
    calls = []

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise ConfigError("plan.offload", "params", "not modelled")
        return real(*args, **kwargs)

    monkeypatch.setattr(zsim.simulate, "simulate", failing)
    out = tmp_path / "out"
    out.mkdir()
    code, _, stderr = sweep("--scenario", str(toy_path), "--out", str(out))
    assert code == 2
    assert stderr.splitlines()[-1] == ("error: plan.offload='params': not modelled "
                                       "(run 'hsdp')")
    # The run finished before the failure is kept for a rerun; no results, no report.
    assert [p.name for p in out.iterdir()] == ["journal.jsonl"]
    assert len((out / "journal.jsonl").read_text().splitlines()) == 1


def test_a_failing_write_leaves_no_partial_files(tmp_path: Path) -> None:
    from zsim.atomic import write_files

    with pytest.raises(TypeError):
        write_files(tmp_path, {"a.csv": b"x\n", "b.md": "not bytes"})  # type: ignore[dict-item]
    assert list(tmp_path.iterdir()) == []
    assert write_files(tmp_path, {"a.csv": b"x\n"}) == [tmp_path / "a.csv"]
    assert (tmp_path / "a.csv").read_bytes() == b"x\n"


def test_cli_and_scenario_start_up_without_pandas_or_matplotlib() -> None:
    """`zsim plan` must stay fast: only the sweep path imports the report libraries."""
    import subprocess
    import sys

    code = ("import sys, zsim.cli, zsim.scenario; "
            "print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


def test_the_command_passes_its_options_to_api_sweep(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    from zsim import api

    seen: dict[str, object] = {}

    def fake(scenario: Path, out: Path | None, *, executor: str, ray_address: str | None,
             progress: object, overrides: list[str]) -> dict[str, object]:
        seen.update(scenario=scenario, out=out, executor=executor, ray_address=ray_address,
                    progress=callable(progress), overrides=overrides)
        return {"scenario": "s", "rows": [], "csv": "run\n", "written": [], "warnings": [],
                "simulated": 0}

    monkeypatch.setattr(api, "sweep", fake)
    code, stdout, _ = sweep("--scenario", "a.yaml", "--out", str(tmp_path), "--format", "csv",
                            "--set", "seq_len=4096", "--set", "sweep.gpus=[8, 16]")
    assert (code, stdout) == (0, "run\n")
    assert seen == {"scenario": Path("a.yaml"), "out": tmp_path, "executor": "local",
                    "ray_address": None, "progress": True,
                    "overrides": ["seq_len=4096", "sweep.gpus=[8, 16]"]}
    code, _, _ = sweep("--scenario", "a.yaml", "--executor", "ray", "--ray-address",
                       "10.0.0.1:6379")
    assert code == 0
    assert (seen["executor"], seen["ray_address"]) == ("ray", "10.0.0.1:6379")


def test_a_sweep_above_the_report_limit_writes_the_results_only(
        toy_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zsim.report.files

    monkeypatch.setattr(zsim.report.files, "REPORT_MAX_RUNS", 2)  # the toy has 3 runs
    out = tmp_path / "out"
    code, stdout, stderr = sweep("--scenario", str(toy_path), "--out", str(out),
                                 "--format", "csv")
    assert code == 0, stderr
    assert {p.name for p in out.iterdir()} == FILES - {"toy.csv", "toy.md", *FIGURES}
    assert stdout == (out / "results.csv").read_text()
    # No memory curve is kept when no report will plot it.
    assert '"curve":null' in (out / "journal.jsonl").read_text()
    assert '"curve":[' not in (out / "journal.jsonl").read_text()


def test_a_pipeline_plan_sweeps_and_reports_without_a_reserved_peak(tmp_path: Path) -> None:
    """A PP plan's Result is its pipeline replay, with no allocator replay (reserved
    memory None): its row says so, and the report is still written."""
    scenario = tmp_path / "pp.yaml"
    scenario.write_text("name: pp\nmodel: 7b\nhardware: dgx-h100\ngpus: 64\nseq_len: 4096\n"
                        "plans:\n  pp2: {strategy: fsdp, tp: 8, pp: 2, grad_accum: 2}\n")
    out = tmp_path / "out"
    code, stdout, stderr = sweep("--scenario", str(scenario), "--out", str(out),
                                 "--format", "json")
    assert code == 0, stderr
    (row,) = json.loads(stdout)
    assert row["fits"] and row["step_time_s"] > 0 and row["reserved_memory_gib"] is None
    assert (out / "pp.md").is_file()
