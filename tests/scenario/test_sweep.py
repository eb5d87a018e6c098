"""Sweep expansion: one run per plan and combination, named and ordered predictably, with
sweep > plan > top level precedence; simulate_runs reports progress and gives the same
results as simulating each plan directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zsim.scenario import scenario_from_dict, simulate_runs
from zsim.simulate import simulate
from zsim.spec.plan import Plan, precision_knobs


def test_cartesian_expansion_counts_names_and_order(toy: dict[str, Any],
                                                    tmp_path: Path) -> None:
    toy["sweep"] = {"unit_size": [1, 2], "prefetch": [0, 1, 2]}
    runs = scenario_from_dict(toy, base_dir=tmp_path).runs
    assert len(runs) == 2 * 2 * 3
    assert [r.name for r in runs[:6]] == [
        f"fsdp unit_size={u} prefetch={p}" for u in (1, 2) for p in (0, 1, 2)]
    assert runs[6].name == "hsdp unit_size=1 prefetch=0"
    for run in runs:
        swept = dict(run.swept)
        assert (run.plan.unit_size, run.plan.prefetch) == (swept["unit_size"],
                                                          swept["prefetch"])
        assert run.plan_name == run.name.split()[0]
    assert len({r.name for r in runs}) == len(runs)


def test_without_a_sweep_runs_are_the_plans(toy: dict[str, Any], tmp_path: Path) -> None:
    runs = scenario_from_dict(toy, base_dir=tmp_path).runs
    assert [(r.name, r.swept) for r in runs] == [("fsdp", ()), ("hsdp", ())]


def test_precedence_sweep_over_plan_over_top_level(toy: dict[str, Any],
                                                   tmp_path: Path) -> None:
    toy |= {"recompute": "selective", "micro_batch": 2, "precision": "fp32",
            "seq_len": 256, "sweep": {"gpus": [8, 32]}}
    toy["plans"]["fsdp"] |= {"micro_batch": 4, "reduce_dtype": "bf16"}
    runs = {r.name: r for r in scenario_from_dict(toy, base_dir=tmp_path).runs}
    assert list(runs) == ["fsdp gpus=8", "fsdp gpus=32", "hsdp gpus=8", "hsdp gpus=32"]
    fp32 = precision_knobs("fp32")
    assert runs["fsdp gpus=32"].plan == Plan(
        strategy="fsdp", dp_shard=32, seq_len=256, recompute="selective", micro_batch=4,
        **(fp32 | {"reduce_dtype": "bf16"}))
    assert runs["hsdp gpus=32"].plan == Plan(
        strategy="hsdp", dp_shard=8, dp_replicate=4, seq_len=256, recompute="selective",
        micro_batch=2, **fp32)
    assert runs["hsdp gpus=8"].gpus == runs["hsdp gpus=8"].plan.world_size == 8


def test_seq_len_defaults_to_the_models(toy: dict[str, Any], tmp_path: Path) -> None:
    runs = scenario_from_dict(toy, base_dir=tmp_path).runs
    assert {r.plan.seq_len for r in runs} == {toy["model"]["max_seq_len"]}


def test_simulate_runs_reports_progress_and_matches_direct_simulation(
        toy: dict[str, Any], tmp_path: Path) -> None:
    toy["sweep"] = {"prefetch": [0, 1]}
    scenario = scenario_from_dict(toy, base_dir=tmp_path)
    calls: list[tuple[int, int, str]] = []
    pairs = simulate_runs(scenario, progress=lambda *a: calls.append(a))
    assert calls == [(i + 1, 4, r.name) for i, r in enumerate(scenario.runs)]
    for run, result in pairs:
        direct = simulate(run.model, run.hardware, run.plan)
        assert (result.step_time_s, result.peak_memory_bytes) == (
            direct.step_time_s, direct.peak_memory_bytes)
    # The sweep axis has the effect it should: no prefetch exposes more communication.
    by_name = {run.name: r for run, r in pairs}
    assert by_name["fsdp prefetch=0"].exposed_comm_s > by_name["fsdp prefetch=1"].exposed_comm_s


def test_example_sweep_scenario_expands_unit_size_by_prefetch() -> None:
    from zsim.scenario import load_scenario

    path = Path(__file__).resolve().parents[2] / "scenarios" / "sweep-13b-128-unit-prefetch.yaml"
    scenario = load_scenario(path)
    assert len(scenario.runs) == 4 * 3
    assert {(r.plan.unit_size, r.plan.prefetch) for r in scenario.runs} == {
        (u, p) for u in (1, 2, 4, 8) for p in (0, 1, 2)}
    assert all(r.plan.recompute == "selective" and r.gpus == 128 for r in scenario.runs)
    assert scenario.memory_curves == ("fsdp unit_size=1 prefetch=1",
                                      "fsdp unit_size=8 prefetch=1")
