"""The sweep language: range and zip axes, the `where:` filter, `--set` overrides and the
`inter_node_gb_per_s` hardware knob. Expected runs are enumerated by hand (itertools over
the written values), errors name the file, the field path and the value."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from zsim.errors import ConfigError
from zsim.scenario import apply_overrides, load_scenario, scenario_from_dict, simulate_runs
from zsim.spec.registry import PROFILES_DIR, resolve_hardware


def runs(data: dict[str, Any], tmp_path: Path) -> list[tuple[str, dict[str, Any]]]:
    return [(r.name, dict(r.swept)) for r in scenario_from_dict(data, base_dir=tmp_path).runs]


def error(data: dict[str, Any], tmp_path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(data, base_dir=tmp_path)
    return e.value


def test_geometric_and_arithmetic_ranges(toy: dict[str, Any], tmp_path: Path) -> None:
    toy["plans"] = {"fsdp": {"strategy": "fsdp"}}
    toy["sweep"] = {"gpus": {"from": 8, "to": 128, "times": 2},
                    "seq_len": {"from": 128, "to": 512, "step": 128}}
    got = scenario_from_dict(toy, base_dir=tmp_path).runs
    expected = list(itertools.product([8, 16, 32, 64, 128], [128, 256, 384, 512]))
    assert [(r.gpus, r.plan.seq_len) for r in got] == expected
    assert got[0].name == "fsdp gpus=8 seq_len=128"
    assert all(r.plan.world_size == r.gpus for r in got)


def test_a_range_counting_down_and_float_steps_print_as_written(toy: dict[str, Any],
                                                              tmp_path: Path) -> None:
    toy["sweep"] = {"inter_node_gb_per_s": {"from": 50, "to": 6, "times": 0.5},
                    "bucket_mib": {"from": 0.5, "to": 1.5, "step": 0.25}}
    swept = [s for _, s in runs(toy, tmp_path)[:20]]
    assert sorted({s["inter_node_gb_per_s"] for s in swept}, reverse=True) == [
        50.0, 25.0, 12.5, 6.25]
    assert sorted({s["bucket_mib"] for s in swept}) == [0.5, 0.75, 1.0, 1.25, 1.5]


def test_zip_moves_its_keys_together_inside_the_grid(toy: dict[str, Any],
                                                     tmp_path: Path) -> None:
    toy["sweep"] = {"prefetch": [0, 1],
                    "zip": {"seq_len": [128, 256, 512], "micro_batch": [4, 2, 1]}}
    got = scenario_from_dict(toy, base_dir=tmp_path).runs
    pairs = [(128, 4), (256, 2), (512, 1)]
    assert [(r.plan_name, r.plan.prefetch, r.plan.seq_len, r.plan.micro_batch)
            for r in got] == [(p, f, s, b) for p in ("fsdp", "hsdp") for f in (0, 1)
                              for s, b in pairs]
    assert got[0].name == "fsdp prefetch=0 seq_len=128 micro_batch=4"


def test_two_zip_groups_are_two_axes(toy: dict[str, Any], tmp_path: Path) -> None:
    toy["plans"] = {"fsdp": {"strategy": "fsdp"}}
    toy["sweep"] = {"zip": [{"seq_len": [128, 256], "micro_batch": [2, 1]},
                            {"unit_size": [1, 2], "prefetch": [2, 1]}]}
    assert [tuple(s.values()) for _, s in runs(toy, tmp_path)] == [
        (128, 2, 1, 2), (128, 2, 2, 1), (256, 1, 1, 2), (256, 1, 2, 1)]


def test_where_keeps_the_runs_it_is_true_for(toy: dict[str, Any], tmp_path: Path) -> None:
    toy["sweep"] = {"gpus": [8, 16, 32, 64], "unit_size": [1, 2]}
    toy["where"] = "gpus * unit_size <= 32 and (strategy == 'fsdp' or gpus >= 16)"
    expected = [(p, g, u) for p, s in (("fsdp", "fsdp"), ("hsdp", "hsdp"))
                for g in (8, 16, 32, 64) for u in (1, 2)
                if g * u <= 32 and (s == "fsdp" or g >= 16)]
    got = scenario_from_dict(toy, base_dir=tmp_path).runs
    assert [(r.plan_name, r.gpus, r.plan.unit_size) for r in got] == expected


def test_where_reads_defaults_for_keys_a_run_does_not_set(toy: dict[str, Any],
                                                           tmp_path: Path) -> None:
    # Neither plan sets prefetch or seq_len: Plan's default 1 and the model's 512.
    toy["where"] = "prefetch == 1 and seq_len == 512 and inter_node_gb_per_s == 50"
    assert len(runs(toy, tmp_path)) == 2
    toy["where"] = "shard_group == 8"  # None for fsdp: == is False
    assert [n for n, _ in runs(toy, tmp_path)] == ["hsdp"]


def test_where_filters_impossible_combinations_before_they_are_checked(
        toy: dict[str, Any], tmp_path: Path) -> None:
    toy["sweep"] = {"gpus": [16, 20]}  # 20 GPUs: no HSDP with shard groups of 8
    assert error(toy, tmp_path).field == "plans.hsdp.shard_group"
    toy["where"] = "gpus % 8 == 0"
    assert [n for n, _ in runs(toy, tmp_path)] == ["fsdp gpus=16", "hsdp gpus=16"]


@pytest.mark.parametrize(("edit", "field", "value", "needle"), [
    (lambda d: d.update(where="tpp * pp <= 64"), "where", "tpp * pp <= 64", "unknown name"),
    (lambda d: d.update(where="gpus"), "where", "gpus", "not true or false"),
    (lambda d: d.update(where="gpus > 1000"), "where", "gpus > 1000", "keeps no run"),
    (lambda d: d.update(where=["gpus > 1"]), "where", ["gpus > 1"], "expression string"),
    (lambda d: d.update(sweep={"gpus": {"from": 8, "to": 64}}), "sweep.gpus",
     {"from": 8, "to": 64}, "exactly one of times or step"),
    (lambda d: d.update(sweep={"gpus": {"from": 8, "times": 2}}), "sweep.gpus.to", None,
     "missing"),
    (lambda d: d.update(sweep={"gpus": {"from": 8, "to": 64, "times": 2, "by": 1}}),
     "sweep.gpus.by", 1, "unknown key"),
    (lambda d: d.update(sweep={"gpus": {"from": 8, "to": 64, "times": 1}}), "sweep.gpus",
     {"from": 8, "to": 64, "times": 1}, "not 1"),
    (lambda d: d.update(sweep={"gpus": {"from": 8, "to": 64, "step": 0}}),
     "sweep.gpus.step", 0, "must not be 0"),
    (lambda d: d.update(sweep={"gpus": {"from": 64, "to": 8, "times": 2}}), "sweep.gpus",
     {"from": 64, "to": 8, "times": 2}, "never reaches"),
    (lambda d: d.update(sweep={"gpus": {"from": "8", "to": 64, "times": 2}}),
     "sweep.gpus.from", "8", "finite number"),
    (lambda d: d.update(sweep={"gpus": {"from": 1, "to": 1e9, "step": 1}}), "sweep.gpus",
     {"from": 1, "to": 1e9, "step": 1}, "more than 10,000"),
    (lambda d: d.update(sweep={"zip": {"seq_len": [128, 256], "micro_batch": [1]}}),
     "sweep.zip", {"seq_len": 2, "micro_batch": 1}, "as many values"),
    (lambda d: d.update(sweep={"zip": {"seq_len": [128], "gpuz": [1]}}), "sweep.zip.gpuz",
     [1], "unknown key"),
    (lambda d: d.update(sweep={"seq_len": [128], "zip": {"seq_len": [256]}}),
     "sweep.zip.seq_len", [256], "also swept by sweep.seq_len"),
    (lambda d: d.update(sweep={"zip": []}), "sweep.zip", [], "mapping"),
    (lambda d: d.update(sweep={"zip": [{"prefetch": [0]}, {"seq_len": 3}]}),
     "sweep.zip[1].seq_len", 3, "non-empty list"),
    (lambda d: d.update(inter_node_gb_per_s=0), "inter_node_gb_per_s", 0, "positive"),
    (lambda d: d.update(model={"params": "7e9x"}), "model.params", "7e9x", "number"),
])
def test_bad_sweep_language_names_field_and_value(
        toy: dict[str, Any], tmp_path: Path, edit: Callable[[dict[str, Any]], object],
        field: str, value: object, needle: str) -> None:
    edit(toy)
    e = error(toy, tmp_path)
    assert (e.field, e.value) == (field, value)
    assert needle in e.reason


def test_too_many_runs_are_refused_before_any_is_built(toy: dict[str, Any],
                                                       tmp_path: Path) -> None:
    toy["plans"] = {f"p{i}": {"strategy": "fsdp"} for i in range(300)}
    toy["sweep"] = {"gpus": {"from": 1, "to": 399, "step": 1}, "prefetch": [0, 1]}
    e = error(toy, tmp_path)
    assert (e.field, e.value) == ("sweep", 300 * 399 * 2)


def test_zip_keys_count_as_swept_for_the_plans(toy: dict[str, Any], tmp_path: Path) -> None:
    toy["plans"]["fsdp"]["seq_len"] = 256
    toy["sweep"] = {"zip": {"seq_len": [128, 512], "micro_batch": [2, 1]}}
    e = error(toy, tmp_path)
    assert (e.field, e.value) == ("plans.fsdp.seq_len", 256)
    assert "sweep.zip.seq_len" in e.reason


def test_errors_from_a_file_name_the_file(toy: dict[str, Any],
                                          write: Callable[..., Path]) -> None:
    toy["where"] = "gpu > 8"
    path = write(toy)
    with pytest.raises(ConfigError) as e:
        load_scenario(path)
    assert str(e.value) == (f"where='gpu > 8': unknown name 'gpu'; names: "
                            f"{', '.join(__import__('zsim.scenario').scenario.RUN_KEYS)} "
                            f"(in {path})")


def test_set_overrides_the_file_and_creates_sections(toy: dict[str, Any],
                                                     write: Callable[..., Path]) -> None:
    path = write(toy)
    scenario = load_scenario(path, ["gpus=32", "plans.fsdp.unit_size=2",
                                    "sweep.prefetch=[0, 2]", "where=prefetch > 0"])
    assert [(r.name, r.gpus, r.plan.unit_size) for r in scenario.runs] == [
        ("fsdp prefetch=2", 32, 2), ("hsdp prefetch=2", 32, 1)]
    # The file is untouched and the parsed data too (overrides apply to a copy).
    assert yaml.safe_load(path.read_text()) == toy
    assert apply_overrides(toy, ["gpus=8"])["gpus"] == 8 and toy["gpus"] == 16


@pytest.mark.parametrize(("overrides", "field", "value", "needle"), [
    (["gpus"], "--set", "gpus", "KEY=VALUE"),
    (["=3"], "--set", "=3", "KEY=VALUE"),
    (["plans..x=1"], "--set", "plans..x=1", "KEY=VALUE"),
    (["gpus.x=1"], "--set", "gpus.x=1", "gpus is not a mapping"),
    (["sweep.gpus=[8"], "--set", "sweep.gpus=[8", "not YAML"),
    (["gpus=0"], "gpus", 0, "(--set gpus)"),
    (["plans.fsdp.unit_size=3"], "plans.fsdp.unit_size", 3,
     "(--set plans.fsdp.unit_size)"),
])
def test_bad_overrides_name_the_override(toy: dict[str, Any], write: Callable[..., Path],
                                         overrides: list[str], field: str, value: object,
                                         needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_scenario(write(toy), overrides)
    assert (e.value.field, e.value.value) == (field, value)
    assert needle in e.value.reason


def test_inter_node_bandwidth_knob_equals_editing_the_profile(
        toy: dict[str, Any], tmp_path: Path) -> None:
    """Independent path: the same profile with the bandwidth edited in its YAML."""
    toy["sweep"] = {"inter_node_gb_per_s": [50, 12.5]}
    pairs = simulate_runs(scenario_from_dict(toy, base_dir=tmp_path))
    by_name = {run.name: (run, r) for run, r in pairs}
    profile = yaml.safe_load((PROFILES_DIR / "dgx-h100.yaml").read_text())
    profile["inter_node"]["bandwidth_gb_per_s"] = 12.5
    edited = dict(toy, hardware=profile)
    del edited["sweep"]
    direct = {run.name: (run, r) for run, r in
              simulate_runs(scenario_from_dict(edited, base_dir=tmp_path))}
    for plan in ("fsdp", "hsdp"):
        run, r = by_name[f"{plan} inter_node_gb_per_s=12.5"]
        assert run.hardware == direct[plan][0].hardware
        assert r == direct[plan][1]
    assert by_name["fsdp inter_node_gb_per_s=50"][0].hardware == resolve_hardware("dgx-h100")
    # FSDP all-gathers cross nodes and slow down; HSDP's stay on NVLink.
    fsdp50, fsdp12 = (by_name[f"fsdp inter_node_gb_per_s={b}"][1] for b in (50, 12.5))
    hsdp50, hsdp12 = (by_name[f"hsdp inter_node_gb_per_s={b}"][1] for b in (50, 12.5))
    assert fsdp12.comm_busy_s["all_gather"] > fsdp50.comm_busy_s["all_gather"]
    assert hsdp12.comm_busy_s["all_gather"] == hsdp50.comm_busy_s["all_gather"]
    assert hsdp12.comm_busy_s["all_reduce"] > hsdp50.comm_busy_s["all_reduce"]


def test_params_model_is_the_synthetic_model_of_that_size(toy: dict[str, Any],
                                                          tmp_path: Path) -> None:
    toy["model"] = {"params": 7.0e9}
    run = scenario_from_dict(toy, base_dir=tmp_path).runs[0]
    assert run.model.num_params == 7_000_000_000
