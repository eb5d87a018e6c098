"""The scenario loader is strict: every unknown, missing or bad key or value, and malformed
YAML, raises ConfigError naming the YAML field path and the value."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from zsim.errors import ConfigError
from zsim.scenario import load_scenario, scenario_from_dict
from zsim.spec.plan import Plan, precision_knobs
from zsim.spec.registry import PROFILES_DIR, resolve_hardware, resolve_model
from zsim.units import MiB

REPO = Path(__file__).resolve().parents[2]


def error(data: dict[str, Any], tmp_path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(data, base_dir=tmp_path)
    return e.value


@pytest.mark.parametrize(("edit", "field", "value"), [
    (lambda d: d.update(colour="blue"), "colour", "blue"),
    (lambda d: d.pop("model"), "model", None),
    (lambda d: d.pop("plans"), "plans", None),
    (lambda d: d.update(plans={}), "plans", {}),
    (lambda d: d.update(name=""), "name", ""),
    (lambda d: d.update(model="13q"), "model", "13q"),
    (lambda d: d["model"].update(num_layers=0), "model.num_layers", 0),
    (lambda d: d["model"].update(n_layers=2), "model.n_layers", 2),
    (lambda d: d.update(hardware="dgx-z9"), "hardware", "dgx-z9"),
    (lambda d: d["plans"]["fsdp"].update(unit_sise=2), "plans.fsdp.unit_sise", 2),
    (lambda d: d["plans"]["fsdp"].pop("strategy"), "plans.fsdp.strategy", None),
    (lambda d: d["plans"]["fsdp"].update(strategy="zero4"), "plans.fsdp.strategy", "zero4"),
    (lambda d: d["plans"]["fsdp"].update(unit_size=0), "plans.fsdp.unit_size", 0),
    (lambda d: d["plans"]["fsdp"].update(unit_size=3), "plans.fsdp.unit_size", 3),
    (lambda d: d["plans"]["fsdp"].update(micro_batch=1.5), "plans.fsdp.micro_batch", 1.5),
    (lambda d: d["plans"]["fsdp"].update(recompute="some"), "plans.fsdp.recompute", "some"),
    (lambda d: d["plans"]["fsdp"].update(bucket_mib=-25), "plans.fsdp.bucket_mib", -25),
    (lambda d: d["plans"]["fsdp"].update(seq_len=0), "plans.fsdp.seq_len", 0),
    (lambda d: d["plans"]["hsdp"].update(shard_group=3), "plans.hsdp.shard_group", 3),
    (lambda d: d["plans"]["fsdp"].update(shard_group=8), "plans.fsdp.shard_group", 8),
    (lambda d: d["plans"]["fsdp"].update(reduce_dtype="fp7"), "plans.fsdp.reduce_dtype",
     "fp7"),
    (lambda d: d.update(gpus=0), "gpus", 0),
    (lambda d: d.pop("gpus"), "plans.fsdp.gpus", None),
    (lambda d: d.update(precision="fp4"), "precision", "fp4"),
    (lambda d: d.update(precision={}), "precision", {}),  # fuzz: was a TypeError
    (lambda d: d.update(plans=["fsdp"]), "plans", ["fsdp"]),
    (lambda d: d["plans"].update(ddp="ddp"), "plans.ddp", "ddp"),
    (lambda d: d.update(sweep={"prefetch": 1}), "sweep.prefetch", 1),
    (lambda d: d.update(sweep={"prefetch": []}), "sweep.prefetch", []),
    (lambda d: d.update(sweep={"prefetch": [0, 0]}), "sweep.prefetch", 0),
    (lambda d: d.update(sweep={"prefetch": [1, -1]}), "sweep.prefetch", -1),
    (lambda d: d.update(sweep={"prefech": [1]}), "sweep.prefech", [1]),
    (lambda d: d.update(sweep={}), "sweep", {}),
    (lambda d: d.update(sweep={"gpus": [16, 0]}), "sweep.gpus", 0),
    (lambda d: d.update(sweep={"gpus": [16, 20]}), "plans.hsdp.shard_group", 8),
    (lambda d: d.update(report={"memory_curves": ["fsdp", "zero9"]}),
     "report.memory_curves[1]", "zero9"),
    (lambda d: d.update(report={"template": "missing.md"}), "report.template", "missing.md"),
    (lambda d: d.update(report={"colour": 1}), "report.colour", 1),
])
def test_bad_key_or_value_names_its_field_path(
        toy: dict[str, Any], tmp_path: Path, edit: Callable[[dict[str, Any]], object],
        field: str, value: object) -> None:
    edit(toy)
    e = error(toy, tmp_path)
    assert (e.field, e.value) == (field, value)
    assert e.reason


def test_a_swept_bad_value_names_the_run(toy: dict[str, Any], tmp_path: Path) -> None:
    toy["sweep"] = {"unit_size": [1, 2, 3]}
    e = error(toy, tmp_path)
    assert (e.field, e.value) == ("sweep.unit_size", 3)
    assert "'fsdp unit_size=3'" in str(e)


def test_a_key_both_swept_and_set_in_a_plan_is_refused(toy: dict[str, Any],
                                                        tmp_path: Path) -> None:
    toy["plans"]["fsdp"]["prefetch"] = 2
    toy["sweep"] = {"prefetch": [0, 1]}
    e = error(toy, tmp_path)
    assert (e.field, e.value) == ("plans.fsdp.prefetch", 2)
    assert "sweep.prefetch" in e.reason


def test_inline_hardware_errors_carry_the_hardware_prefix(toy: dict[str, Any],
                                                          tmp_path: Path) -> None:
    profile = yaml.safe_load((PROFILES_DIR / "dgx-h100.yaml").read_text())
    profile["gpu"]["hbm_gib"] = -80
    toy["hardware"] = profile
    e = error(toy, tmp_path)
    assert (e.field, e.value) == ("hardware.gpu.hbm_gib", -80)


@pytest.mark.parametrize(("text", "needle"), [
    ("name: toy\nplans: {fsdp: {strategy: fsdp}\n", "line"),
    ("name: toy\nname: again\n", "duplicate key 'name'"),
    ("plans:\n  fsdp: {strategy: fsdp}\n  fsdp: {strategy: ddp}\n", "duplicate key 'fsdp'"),
    ("name: [unclosed\n", "malformed YAML"),
])
def test_malformed_yaml_is_a_config_error(write: Callable[..., Path], text: str,
                                          needle: str) -> None:
    path = write(text)
    with pytest.raises(ConfigError) as e:
        load_scenario(path)
    assert (e.value.field, e.value.value) == ("scenario", str(path))
    assert needle in str(e.value)


def test_a_scenario_that_is_not_a_mapping_is_refused(write: Callable[..., Path]) -> None:
    with pytest.raises(ConfigError) as e:
        load_scenario(write("- fsdp\n- hsdp\n"))
    assert (e.value.field, e.value.value) == ("scenario", ["fsdp", "hsdp"])


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_scenario(tmp_path / "nope.yaml")
    assert e.value.field == "scenario" and "no such file" in e.value.reason


def test_seed_scenario_builds_the_plans_the_card_describes() -> None:
    """Independent: each plan built by hand from the card's words (13B, 128 GPUs, 8k)."""
    scenario = load_scenario(REPO / "scenarios" / "seed-13b-128.yaml")
    assert scenario.run_names == ("ddp", "zero1", "fsdp", "hsdp", "zero1-selective-mb2",
                                  "fsdp-selective-mb2", "hsdp-selective",
                                  "hsdp-selective-mb2")
    by_name = {r.name: r for r in scenario.runs}
    knobs = {"seq_len": 8192, **precision_knobs("bf16")}
    assert by_name["hsdp-selective-mb2"].plan == Plan.for_strategy(
        "hsdp", gpus=128, shard_group=8, recompute="selective", micro_batch=2, **knobs)
    assert by_name["ddp"].plan == Plan(strategy="ddp", dp_shard=1, dp_replicate=128, **knobs)
    assert by_name["fsdp"].plan == Plan(strategy="fsdp", dp_shard=128, **knobs)
    for run in scenario.runs:
        assert run.model == resolve_model("13b")
        assert run.hardware == resolve_hardware("dgx-h100")
        assert run.plan.world_size == run.gpus == 128
    assert scenario.template is not None and "{{ table }}" in scenario.template


def test_relative_paths_resolve_against_the_scenario_folder(
        toy: dict[str, Any], write: Callable[..., Path], tmp_path: Path) -> None:
    (tmp_path / "hw.yaml").write_text((PROFILES_DIR / "dgx-a100.yaml").read_text())
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(
        '{"model_type": "llama", "num_attention_heads": 4, "hidden_size": 256, '
        '"num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 1000, '
        '"max_position_embeddings": 512}')
    (tmp_path / "report.md").write_text("# {{ name }}\n")
    toy |= {"model": "tiny/config.json", "hardware": "hw.yaml",
            "report": {"template": "report.md"}}
    scenario = load_scenario(write(toy))
    assert scenario.runs[0].hardware.gpu_name == resolve_hardware("dgx-a100").gpu_name
    assert (scenario.runs[0].model.num_layers, scenario.runs[0].model.d_model) == (2, 256)
    assert scenario.template == "# {{ name }}\n"


def test_bucket_mib_is_converted_once_at_load(toy: dict[str, Any], tmp_path: Path) -> None:
    toy["plans"] = {"zero1": {"strategy": "zero1", "bucket_mib": 500}}
    run, = scenario_from_dict(toy, base_dir=tmp_path).runs
    assert run.plan.bucket_bytes == 500 * 2**20 == 500 * MiB
