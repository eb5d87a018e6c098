"""Scenario runs given by a user's DeepSpeed or accelerate FSDP config (`ds_config`,
`fsdp_config`): the same plan `zsim simulate --ds-config/--fsdp-config` builds, the run's
keys filling or overriding it, paths beside the scenario, errors naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from zsim.errors import ConfigError
from zsim.scenario import scenario_from_dict
from zsim.spec.ds_config import ds_plan, read_ds_config
from zsim.spec.fsdp_config import fsdp_plan, read_fsdp_config
from zsim.spec.registry import resolve_model

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "scenarios" / "configs"


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """A scenario folder with the shipped configs beside it, under configs/."""
    shutil.copytree(CONFIGS, tmp_path / "configs")
    return tmp_path


def scenario(plans: dict[str, Any]) -> dict[str, Any]:
    return {"name": "configs", "model": "1.3b", "hardware": "dgx-h100", "gpus": 16,
            "seq_len": 1024, "plans": plans}


def test_a_ds_config_run_is_the_config_plan(here: Path) -> None:
    loaded = scenario_from_dict(scenario({"ours": {"ds_config": "configs/ds_zero3.json",
                                                   "micro_batch": 2}}), base_dir=here)
    model = resolve_model("1.3b")
    expected = ds_plan(read_ds_config(CONFIGS / "ds_zero3.json", hidden_size=model.d_model),
                       where="x", gpus=16, seq_len=1024, micro_batch=2)
    assert loaded.runs[0].plan == expected


def test_an_fsdp_config_run_takes_other_keys_on_top(here: Path) -> None:
    loaded = scenario_from_dict(scenario({"ours": {
        "fsdp_config": "configs/accelerate_fsdp1.yaml", "unit_size": 2, "grad_accum": 4}}),
        base_dir=here)
    run = loaded.runs[0]
    expected, warnings = fsdp_plan(read_fsdp_config(CONFIGS / "accelerate_fsdp1.yaml"),
                                   where="configs/accelerate_fsdp1.yaml", gpus=16,
                                   gpus_per_node=8, seq_len=1024, num_layers=24, grad_accum=4)
    assert run.plan == expected.with_(unit_size=2)
    assert run.warnings == warnings and "num_processes 8" in warnings[0]


@pytest.mark.parametrize(("plans", "field", "value"), [
    ({"x": {"ds_config": "configs/ds_zero3.json", "fsdp_config": "configs/accelerate_fsdp2.yaml"}},
     "plans.x.fsdp_config", "configs/accelerate_fsdp2.yaml"),
    ({"x": {"ds_config": "configs/ds_zero3.json", "impl": "torch"}}, "plans.x.impl", "torch"),
    ({"x": {"ds_config": "configs/ds_zero3.json", "strategy": "zero2"}},
     "configs/ds_zero3.json:zero_optimization.stage", "zero3"),
    ({"x": {"fsdp_config": "configs/missing.yaml"}}, "plans.x.fsdp_config",
     "configs/missing.yaml"),
    ({"x": {"ds_config": 3}}, "plans.x.ds_config", 3),
    ({"x": {"micro_batch": 2}}, "plans.x.strategy", None),
])
def test_errors_name_the_field(here: Path, plans: dict[str, Any], field: str,
                               value: object) -> None:
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(scenario(plans), base_dir=here)
    assert e.value.field == field
    if value is not None:
        assert e.value.value == value


def test_config_paths_resolve_beside_the_scenario_only(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    monkeypatch.chdir(tmp_path / "cwd")
    (tmp_path / "scen").mkdir()
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(scenario({"x": {"ds_config": "ds.json"}}),
                           base_dir=tmp_path / "scen")
    assert e.value.reason == "no such file"
