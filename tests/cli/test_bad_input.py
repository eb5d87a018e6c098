"""Bad input to `zsim plan`: one line naming the field and the value, exit code 2, no
traceback. Files are written under tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from zsim.cli import app
from zsim.errors import ConfigError
from zsim.spec.consistency import check_plan
from zsim.spec.plan import Plan
from zsim.spec.presets import PRESETS
from zsim.spec.registry import PROFILES_DIR, hardware_names, model_names, resolve_hardware


def error_line(args: list[str]) -> str:
    """Run `zsim <args>`, check the failure contract, return the one error line."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def plan_args(*extra: str) -> list[str]:
    return ["plan", "--gpus", "8", *extra]


DS_ZERO3 = Path(__file__).resolve().parents[2] / "scenarios" / "configs" / "ds_zero3.json"


@pytest.mark.parametrize(("args", "field", "value"), [
    (["plan", "--model", "13b", "--gpus", "0"], "gpus", "0"),
    (["plan", "--model", "13b", "--gpus", "-4"], "gpus", "-4"),
    (plan_args("--model", "13b", "--seq", "0"), "seq", "0"),
    (plan_args("--model", "13b", "--seq", "-2048"), "seq", "-2048"),
    (plan_args("--model", "13b", "--micro-batch", "0"), "micro_batch", "0"),
    (plan_args("--model", "13b", "--micro-batch", "-1"), "micro_batch", "-1"),
    (plan_args("--params", "0"), "params", "0"),
    # A config's train_batch_size is divided by micro-batch x gpus: gpus 0 is refused first.
    (["simulate", "--model", "7b", "--gpus", "0", "--ds-config",
      str(DS_ZERO3)], "gpus", "0"),
    (["plan", "--model", "7b", "--gpus", "0", "--ds-config",
      str(DS_ZERO3)], "gpus", "0"),
], ids=["gpus-0", "gpus-negative", "seq-0", "seq-negative", "micro-batch-0",
        "micro-batch-negative", "params-0", "simulate-config-gpus-0", "plan-config-gpus-0"])
def test_non_positive_sizes(args: list[str], field: str, value: str) -> None:
    line = error_line(args)
    assert field in line and value in line, line


def test_unknown_model_suggests_the_nearest() -> None:
    # One line with the nearest preset, not every name (`zsim models` lists them).
    line = error_line(plan_args("--model", "gpt-9"))
    assert "model" in line and "gpt-9" in line and "config.json" in line
    assert "zsim models" in line and sum(name in line for name in model_names()) <= 1
    assert "nearest preset: llama2-13b;" in error_line(plan_args("--model", "lama2-13b"))


def test_unknown_hardware_lists_profiles() -> None:
    line = error_line(plan_args("--model", "13b", "--hardware", "tpu-v9"))
    assert "hardware" in line and "tpu-v9" in line
    assert "dgx-h100" in line
    for name in hardware_names():
        assert name in line


def test_malformed_config_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096,')
    line = error_line(plan_args("--model", str(path)))
    assert "model" in line and str(path) in line and "JSON" in line


def test_config_json_missing_a_key(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2,
                                "num_attention_heads": 4,
                                "intermediate_size": 64, "vocab_size": 100,
                                "max_position_embeddings": 128}))
    line = error_line(plan_args("--model", str(path)))
    assert "hidden_size" in line and "missing" in line


def test_hardware_yaml_with_unknown_key(tmp_path: Path) -> None:
    profile = yaml.safe_load((PROFILES_DIR / "dgx-h100.yaml").read_text())
    profile["gpu"]["hbm_tb"] = 7
    path = tmp_path / "odd.yaml"
    path.write_text(yaml.safe_dump(profile))
    line = error_line(plan_args("--model", "13b", "--hardware", str(path)))
    assert "hbm_tb" in line and "7" in line and "unknown key" in line


def test_malformed_hardware_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\ngpu: [1, 2\n  hbm_gib: : :\n")
    line = error_line(plan_args("--model", "13b", "--hardware", str(path)))
    assert "hardware" in line and str(path) in line and "YAML" in line


@pytest.mark.parametrize("shard_group", [3, 6, 0, -8])
def test_hsdp_shard_group_must_divide_gpus(shard_group: int) -> None:
    # `zsim plan` enumerates shard groups itself; the group size is a Plan argument.
    with pytest.raises(ConfigError) as info:
        Plan.for_strategy("hsdp", gpus=64, shard_group=shard_group, seq_len=4096)
    assert info.value.field == "shard_group" and info.value.value == shard_group
    assert str(info.value).count("\n") == 0 and f"shard_group={shard_group}" in str(info.value)


def test_hsdp_plan_not_matching_the_world_is_refused() -> None:
    plan = Plan(strategy="hsdp", dp_shard=6, dp_replicate=2, seq_len=4096)
    with pytest.raises(ConfigError) as info:
        check_plan(PRESETS["llama2-13b"], resolve_hardware("dgx-h100"), plan, gpus=64)
    assert info.value.field == "plan.dp_shard" and info.value.value == 6
