"""`zsim run`: a plan over days, end to end; its figures against their parts and the
closed forms they come from; its bad input (one line, exit 2, no traceback); its plot."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from zsim.analytic.young_daly import young_interval_s
from zsim.cli import app

SMALL = ["run", "--model", "7b", "--gpus", "64", "--strategy", "fsdp", "--ac", "full",
         "--days", "10"]


def _json(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def small() -> dict[str, Any]:
    return _json(SMALL)


def test_every_dcp_method_is_compared_and_the_parts_add_up(small: dict[str, Any]) -> None:
    assert [m["method"] for m in small["methods"]] == ["dcp", "dcp-async", "full"]
    for m in small["methods"]:
        parts = sum(m[k] for k in ("useful_frac", "straggler_frac", "checkpoint_stall_frac",
                                   "checkpoint_wait_frac", "lost_work_frac", "restart_frac"))
        assert parts == pytest.approx(1.0, abs=1e-9)
        assert m["goodput"] == pytest.approx(m["useful_frac"], abs=1e-12)
        # tokens per day = goodput x (tokens per step / step time) x a day
        ideal = small["step"]["tokens"] / small["step"]["time_s"] * 86_400
        assert m["tokens_per_day"] == pytest.approx(m["goodput"] * ideal, rel=1e-3)
    best = max(small["methods"], key=lambda m: m["tokens_per_day"])
    assert small["best_method"] == best["method"]


def test_young_interval_is_sqrt_of_twice_stall_times_mtbf(small: dict[str, Any]) -> None:
    mtbf_s = small["mtbf_h"] * 3600
    for m in small["methods"]:
        assert m["young_interval_min"] * 60 == pytest.approx(
            young_interval_s(m["save_stall_s"], mtbf_s), rel=1e-9)
        assert math.sqrt(2 * m["save_stall_s"] * mtbf_s) / 60 == pytest.approx(
            m["young_interval_min"], rel=1e-9)


def test_async_blocks_less_and_loses_less_than_a_full_state_dict(small: dict[str, Any]
                                                                  ) -> None:
    by = {m["method"]: m for m in small["methods"]}
    assert by["dcp-async"]["save_stall_s"] < by["dcp"]["save_stall_s"] \
        < by["full"]["save_stall_s"]
    assert by["dcp-async"]["goodput"] > by["full"]["goodput"]


def test_fsdp1_pays_its_state_dict_rebuild_on_every_save_and_says_so(
        small: dict[str, Any]) -> None:
    fsdp1 = _json([*SMALL, "--impl", "fsdp1"])
    by1 = {m["method"]: m for m in fsdp1["methods"]}
    by2 = {m["method"]: m for m in small["methods"]}
    assert all(m["state_dict_s"] == 0 for m in small["methods"])
    for method in ("dcp", "dcp-async"):
        assert by1[method]["state_dict_s"] > 0
        assert by1[method]["save_stall_s"] == pytest.approx(
            by2[method]["save_stall_s"] + by1[method]["state_dict_s"], rel=1e-6)
    assert by1["full"]["state_dict_s"] == 0  # FULL_STATE_DICT gathers as FSDP2's does
    text = CliRunner().invoke(app, [*SMALL, "--impl", "fsdp1"]).stdout
    assert "rebuilding the sharded state dict" in text


def test_the_run_is_deterministic() -> None:
    first = CliRunner().invoke(app, [*SMALL, "--format", "json"]).stdout
    assert first == CliRunner().invoke(app, [*SMALL, "--format", "json"]).stdout


def test_stragglers_slow_every_step_and_are_charged(small: dict[str, Any]) -> None:
    r = _json([*SMALL, "--straggler-prob", "0.02", "--checkpoint", "dcp"])
    # 64 ranks at 2%: 1 - 0.98^64 = 73% of the steps have a straggler, 20% slower on
    # the compute share of the step.
    assert r["step"]["p50_factor"] > 1.1
    m = r["methods"][0]
    assert m["straggler_frac"] > 0.05
    assert m["tokens_per_day"] < small["methods"][0]["tokens_per_day"]


def test_ones_own_restart_time_is_charged_per_failure_with_the_load(
        small: dict[str, Any]) -> None:
    """--restart-s replaces the fleet's assumed 600 s: each failure costs it plus the
    checkpoint's load (the seeds' failures are rare enough that none lands in a
    restart)."""
    assert small["fleet"]["restart_assumed"] and small["fleet"]["restart_s"] == 600
    r = _json([*SMALL, "--restart-s", "3600"])
    assert r["fleet"]["restart_s"] == 3600 and not r["fleet"]["restart_assumed"]
    wall = r["days"] * 86_400
    for m, before in zip(r["methods"], small["methods"], strict=True):
        assert m["failures"] > 0
        assert m["restart_frac"] * wall == pytest.approx(
            m["failures"] * (3600 + m["load_s"]), rel=0.02)
        assert m["restart_frac"] > before["restart_frac"]
    text = CliRunner().invoke(app, SMALL).stdout
    assert "600 s (assumed" in text
    assert "(assumed" not in CliRunner().invoke(app, [*SMALL, "--restart-s", "60"]).stdout


def test_a_fleet_file_with_llama3s_rates_runs_as_llama3(small: dict[str, Any],
                                                        tmp_path: Path) -> None:
    from zsim.spec.failures import failure_model

    llama3 = failure_model("llama3")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"gpu_failures_per_gpu_day: {llama3.gpu_failures_per_gpu_day!r}\n"
                     f"node_failures_per_node_day: {llama3.node_failures_per_node_day!r}\n"
                     "source: Llama 3's Table 5, copied\n")
    r = _json([*SMALL, "--fleet", str(fleet)])
    assert r["fleet"]["source"] == "Llama 3's Table 5, copied"
    assert r["methods"] == small["methods"] and r["mtbf_h"] == small["mtbf_h"]


def test_table_fits_120_columns_and_names_the_pick() -> None:
    result = CliRunner().invoke(app, ["run", "--model", "405b", "--gpus", "16384",
                                      "--strategy", "fsdp", "--ac", "full", "--tp", "8",
                                      "--days", "5"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120
    assert any(line.startswith("> dcp-async") for line in lines)
    # The card: a full state dict of 405B does not fit one host; save sharded, convert.
    assert any("full:" in line and "exceeds its memory" in line for line in lines)


def test_plot_is_written_with_both_panels(tmp_path: Path) -> None:
    out = tmp_path / "run.svg"
    result = CliRunner().invoke(app, [*SMALL, "--checkpoint", "dcp", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    svg = out.read_text()
    assert "checkpoint interval" in svg and "GPUs" in svg


@pytest.mark.parametrize(("extra", "field"), [
    (["--fleet", "nope"], "failures"),
    (["--checkpoint", "deepspeed"], "checkpoint"),
    (["--days", "0"], "days"),
    (["--restart-s", "-1"], "restart_s"),
    (["--fleet", "tests/data/no-such-fleet.yaml"], "fleet"),
    (["--hardware", "tests/data/no-such.yaml"], "hardware"),
])
def test_bad_input_is_one_line_and_exit_2(extra: list[str], field: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "zsim", *SMALL, *extra],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in proc.stderr


def test_llama3_scale_goodput_above_the_published_effective_training_time() -> None:
    # Llama 3 (Sec. 3.3.4): "higher than 90% effective training time" over 54 days on
    # 16,384 H100s with 419 unexpected interruptions. Its fleet's failure rates, a
    # sharded async checkpoint of 405B on dgx-h100 storage: above 90% as well (the
    # restart time, 600 s, is an assumption: at 1,200 s the restarts alone take 10.8%).
    # Llama 3's checkpointing is Meta's own, not DCP: its first save after a restart is
    # priced without DCP's coordinator planning. With that planning (2,757 s a restart
    # at this size, torch 2.13's uncached plan), the same run delivers less.
    from dataclasses import replace

    import yaml

    from zsim import run_api

    cases = yaml.safe_load((Path(__file__).parents[1] / "data" / "cases"
                            / "checkpoint-published.yaml").read_text())["cases"]
    case = next(c for c in cases if c["id"] == "CK-Llama3-effective-training-time")
    spec, hw, plan, _ = run_api.resolve_plan(
        model="405b", gpus=16_384, hardware="dgx-h100", strategy="fsdp", seq=None,
        micro_batch=None, grad_accum=None, ac="full", precision=None, offload="none",
        impl=None, parallel={"tp": 8})
    options = run_api.RunOptions(days=case["config"]["days"], methods=("dcp-async",),
                                 gpu_curve=False)
    assert hw.storage is not None
    unplanned = replace(hw, storage=replace(hw.storage, plan_item_s=0.0))
    r = run_api.run(spec, unplanned, plan, options)
    assert r["methods"][0]["goodput"] > case["stated"]["effective_training_time_min"]
    assert r["failures_per_day"] * 54 == pytest.approx(419, rel=1e-9)
    planned = run_api.run(spec, hw, plan, options)["methods"][0]
    assert planned["first_save_planning_s"] > 1000
    assert planned["goodput"] < r["methods"][0]["goodput"] - 0.05


def test_plan_run_days_adds_per_day_columns_to_every_fitting_plan() -> None:
    r = _json(["plan", "--model", "7b", "--gpus", "64", "--run-days", "10"])
    fitting = [c for c in r["candidates"] if c["fits"] and c["step_time_s"] is not None]
    assert fitting
    for c in fitting:
        assert c["run_checkpoint"] in ("dcp", "dcp-async", "full", "deepspeed")
        ideal = c["tokens_per_s_per_gpu"] * 64 * 86_400
        assert c["run_tokens_per_day"] == pytest.approx(c["run_goodput"] * ideal, rel=2e-3)
    best = max(fitting, key=lambda c: c["run_tokens_per_day"])
    assert r["run"]["most_tokens_per_day"] == best["plan"]
    for c in r["candidates"]:
        if not c["fits"]:
            assert "run_tokens_per_day" not in c


@pytest.mark.parametrize(("extra", "field"), [
    (["--run-days", "0"], "run_days"), (["--run-days", "3", "--fleet", "x"], "failures"),
    (["--run-days", "3", "--restart-s", "nan"], "restart_s")])
def test_plan_run_days_bad_input_is_one_line(extra: list[str], field: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "zsim", "plan", "--model", "7b", "--gpus",
                           "64", *extra], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and field in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_scenario_with_run_days_gives_each_row_its_per_day_columns(tmp_path: Path) -> None:
    scenario = tmp_path / "days.yaml"
    scenario.write_text("name: days\nmodel: 7b\nhardware: dgx-h100\ngpus: 64\n"
                        "recompute: full\nrun_days: 10\nplans:\n  fsdp: {strategy: fsdp}\n"
                        "  zero2: {strategy: zero2}\n")
    rows = {r["run"]: r for r in json.loads(CliRunner().invoke(
        app, ["sweep", "--scenario", str(scenario), "--format", "json"]).stdout)}
    assert rows["fsdp"]["run_checkpoint"] in ("dcp", "dcp-async")
    assert rows["zero2"]["run_checkpoint"] == "deepspeed"
    for r in rows.values():
        ideal = r["tokens_per_s"] * 86_400
        assert r["run_tokens_per_day"] == pytest.approx(r["run_goodput"] * ideal, rel=2e-3)
    own = tmp_path / "own.yaml"
    own.write_text(scenario.read_text().replace("run_days: 10\n",
                                                "run_days: 10\nrestart_s: 36000\n"))
    slower = {r["run"]: r for r in json.loads(CliRunner().invoke(
        app, ["sweep", "--scenario", str(own), "--format", "json"]).stdout)}
    assert all(slower[k]["run_goodput"] < rows[k]["run_goodput"] for k in rows)
    # The same restart from a fleet file beside the scenario (a path relative to it).
    from zsim.spec.failures import failure_model

    llama3 = failure_model("llama3")
    (tmp_path / "fleet.yaml").write_text(
        f"gpu_failures_per_gpu_day: {llama3.gpu_failures_per_gpu_day!r}\n"
        f"node_failures_per_node_day: {llama3.node_failures_per_node_day!r}\n"
        "source: copied\nrestart_s: 36000\n")
    filed = tmp_path / "filed.yaml"
    filed.write_text(scenario.read_text().replace("run_days: 10\n",
                                                  "run_days: 10\nfleet: fleet.yaml\n"))
    from_file = {r["run"]: r for r in json.loads(CliRunner().invoke(
        app, ["sweep", "--scenario", str(filed), "--format", "json"]).stdout)}
    assert all(from_file[k]["run_goodput"] == slower[k]["run_goodput"] for k in rows)
    plain = tmp_path / "plain.yaml"
    plain.write_text(scenario.read_text().replace("run_days: 10\n", ""))
    rows = json.loads(CliRunner().invoke(
        app, ["sweep", "--scenario", str(plain), "--format", "json"]).stdout)
    assert all("run_tokens_per_day" not in r for r in rows)


def test_a_sweeps_journal_ids_see_the_run_days_failure_model(tmp_path: Path) -> None:
    """An edited scenario recomputes the runs it changed: its restart_s, or its fleet
    file's rates, change the ids that journal rows are reused by."""
    from zsim.scenario import load_scenario
    from zsim.sweep import plan_ids

    fleet = tmp_path / "fleet.yaml"
    base = ("name: ids\nmodel: 7b\nhardware: dgx-h100\ngpus: 64\nrun_days: 10\n"
            "fleet: fleet.yaml\nplans:\n  fsdp: {strategy: fsdp}\n")
    scenario = tmp_path / "ids.yaml"

    def ids(rates: str, extra: str = "") -> list[str]:
        fleet.write_text(rates + "node_failures_per_node_day: 0.001\nsource: ours\n")
        scenario.write_text(base + extra)
        return plan_ids(load_scenario(scenario).runs)

    first = ids("gpu_failures_per_gpu_day: 0.0002\n")
    assert ids("gpu_failures_per_gpu_day: 0.0002\n") == first
    assert ids("gpu_failures_per_gpu_day: 0.0003\n") != first
    assert ids("gpu_failures_per_gpu_day: 0.0002\n", "restart_s: 60\n") != first
