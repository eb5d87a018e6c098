"""DeepSpeed JSON configs read as DeepSpeed 0.19 reads them (zsim.spec.ds_config): the keys
it accepts, the Hugging Face "auto" values, conflicts with the command line, warnings for
what zsim does not model, and the shipped configs in scenarios/configs/."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import KeysView
from pathlib import Path
from typing import Any

import pytest

from zsim.api import simulate
from zsim.errors import ConfigError
from zsim.schedule.programs.deepspeed import _sub_groups
from zsim.simulate import simulate as simulate_plan
from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.ds_config import REMOVED_TOP, TOP_KEYS, ZERO_KEYS, ds_plan, read_ds_config
from zsim.spec.registry import resolve_hardware, resolve_model

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "scenarios" / "configs").glob("*.json"))


def write(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zsim", "simulate", *args],
                          capture_output=True, text=True, timeout=120)


def test_zero_keys_are_deepspeeds() -> None:
    """The strict key list is DeepSpeedZeroConfig's fields and their aliases."""
    config = pytest.importorskip("deepspeed.runtime.zero.config")
    fields = config.DeepSpeedZeroConfig.model_fields
    names = set(fields) | {f.alias for f in fields.values() if f.alias}
    assert names == ZERO_KEYS


class _Looked(KeysView):
    """The keys view of a _Recording: `key in config.keys()` is recorded too."""

    def __contains__(self, key: object) -> bool:
        self._mapping.seen.add(key)  # type: ignore[attr-defined]
        return dict.__contains__(self._mapping, key)  # type: ignore[arg-type]


class _Recording(dict):
    """A config that records every key DeepSpeed looks up in it (copies share the
    record: DeepSpeedConfig parses a copy)."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.seen: set[object] = set()

    def __contains__(self, key: object) -> bool:
        self.seen.add(key)
        return super().__contains__(key)

    def __getitem__(self, key: str) -> Any:
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def keys(self) -> _Looked:  # type: ignore[override]
        return _Looked(self)

    def __copy__(self) -> _Recording:
        copy = _Recording(dict(self.items()))
        copy.seen = self.seen
        return copy


def test_top_keys_are_the_keys_deepspeed_reads() -> None:
    """TOP_KEYS is every top-level key DeepSpeedConfig looks up while parsing a config
    (recorded by the dict given to it), less those it refuses as removed features
    (REMOVED_TOP, its _REMOVED_TOP_LEVEL_CONFIG_KEYS), plus the two mesh sizes
    deepspeed.initialize reads before it (sequence_parallel_size, data_parallel_size)."""
    runtime = pytest.importorskip("deepspeed.runtime.config")
    seen: set[object] = set()
    for config in ({"train_micro_batch_size_per_gpu": 1},
                   {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                    "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}}):
        recording = _Recording(config)
        runtime.DeepSpeedConfig(recording)
        seen |= recording.seen
    assert set(runtime._REMOVED_TOP_LEVEL_CONFIG_KEYS) == REMOVED_TOP
    assert (seen - REMOVED_TOP) | {"sequence_parallel_size", "data_parallel_size"} == TOP_KEYS
    for key in REMOVED_TOP:  # refused by DeepSpeed itself
        with pytest.raises(runtime.DeepSpeedConfigError):
            runtime.DeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, key: {}})


@pytest.mark.parametrize(("config", "named", "hint"), [
    ({"zero_optimisation": {"stage": 3}}, "zero_optimisation={'stage': 3}",
     "which would ignore it; did you mean 'zero_optimization'?"),
    ({"zero_optimization": {"stage": 3}, "gradient_acumulation_steps": 4},
     "gradient_acumulation_steps=4", "did you mean 'gradient_accumulation_steps'?"),
    ({"zero_optimization": {"stage": 3}, "my_notes": "x"}, "my_notes='x'",
     "not a key of DeepSpeed 0.19's config, which would ignore it"),
    ({"zero_optimization": {"stage": 3}, "elasticity": {}}, "elasticity={}",
     "DeepSpeed 0.19 removed this feature and refuses the key"),
    ({"zero_optimization": {"stage": 3, "overlap_com": True}},
     "zero_optimization.overlap_com=True", "did you mean 'overlap_comm'?"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memroy": 1}}},
     "zero_optimization.offload_param.pin_memroy=1", "did you mean 'pin_memory'?"),
    ({"train_micro_batch_size_per_gpu": 1}, "zero_optimization.stage=0",
     "(no zero_optimization.stage: DeepSpeed's default); stage 0 is DeepSpeed's data "
     "parallelism without ZeRO"),
])
def test_an_unknown_key_is_named_with_the_nearest_known_one(
        tmp_path: Path, config: dict[str, Any], named: str, hint: str) -> None:
    """A misspelt "zero_optimisation" was once read as no ZeRO section, and the
    error said stage 0 is unsupported. A key DeepSpeed does not read at all is refused
    (DeepSpeed would ignore it), naming the nearest key it reads; the stage-0 error says
    where the 0 came from."""
    path = write(tmp_path, config)
    result = cli("--model", "125m", "--gpus", "8", "--ds-config", str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"error: {path}:{named}: ")
    assert hint in result.stderr


def test_bfloat16_is_deepspeeds_older_name_of_bf16(tmp_path: Path) -> None:
    """DeepSpeed's get_bfloat16_config reads "bfloat16" where "bf16" is absent: so does
    zsim (it read such a config as fp32)."""
    precision = pytest.importorskip("deepspeed.runtime.precision_config")
    for section, expected in (({"bfloat16": {"enabled": True}}, "bf16"),
                              ({"bfloat16": {"enabled": True}, "bf16": {"enabled": False}},
                               "fp32")):
        config = {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}, **section}
        run = read_ds_config(write(tmp_path, config), hidden_size=64)
        assert precision.get_bfloat16_config(section).enabled == (expected == "bf16")
        assert (run.precision, run.warnings) == (expected, ())
    config = {"zero_optimization": {"stage": 2}, "bfloat16": {"check_grad_overflow": "no"}}
    with pytest.raises(ConfigError) as e:
        read_ds_config(write(tmp_path, config), hidden_size=64)
    assert e.value.field.endswith(":bfloat16.check_grad_overflow")


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_pass_deepspeeds_own_check(path: Path) -> None:
    """Every config zsim ships is one DeepSpeed accepts ("auto" filled as the HF Trainer
    fills it)."""
    config = pytest.importorskip("deepspeed.runtime.zero.config")
    zero = json.loads(path.read_text())["zero_optimization"]
    zero = {k: (10 if v == "auto" else v) for k, v in zero.items()}
    config.DeepSpeedZeroConfig(**zero)


def test_auto_values_follow_the_hf_trainer(tmp_path: Path) -> None:
    """transformers' trainer_config_finalize: hidden^2, int(0.9 hidden^2), 10 hidden."""
    path = write(tmp_path, {"zero_optimization": {
        "stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto"}})
    run = read_ds_config(path, hidden_size=5120)
    assert run.ds.reduce_bucket_size == 5120 * 5120
    assert run.ds.prefetch_bucket_size == 23_592_960  # 0.9 x 5120^2
    assert run.ds.param_persistence_threshold == 51_200
    assert run.strategy == "zero3" and run.precision == "fp32"  # neither bf16 nor fp16 on


def test_explicit_values_and_aliases(tmp_path: Path) -> None:
    path = write(tmp_path, {
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
        "fp16": {"enabled": True, "loss_scale": 0}, "communication_data_type": "fp32",
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 2e8, "overlap_comm": False,
                              "offload_optimizer": {"device": "cpu", "pin_memory": True}}})
    run = read_ds_config(path, hidden_size=768)
    plan = ds_plan(run, where="c", gpus=8, seq_len=1024)
    assert (plan.strategy, plan.impl, plan.micro_batch, plan.grad_accum) == (
        "zero2", "deepspeed", 2, 4)
    assert (plan.param_dtype, plan.reduce_dtype, plan.offload) == ("fp16", "fp32", "optimizer")
    ds = plan.options
    assert (ds.reduce_bucket_size, ds.overlap_comm, ds.offload_device) == (
        200_000_000, False, "cpu")
    assert run.warnings == ()


def test_train_batch_size_sets_accumulation(tmp_path: Path) -> None:
    path = write(tmp_path, {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                            "zero_optimization": {"stage": 1}})
    plan = ds_plan(read_ds_config(path, hidden_size=768), where="c", gpus=8, seq_len=512)
    assert plan.grad_accum == 4
    with pytest.raises(ConfigError, match="train_batch_size"):
        ds_plan(read_ds_config(path, hidden_size=768), where="c", gpus=6, seq_len=512)


@pytest.mark.parametrize(("config", "named"), [
    ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket": 5}},
     "zero_optimization.stage3_prefetch_bucket=5"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage=4"),
    ({"zero_optimization": {"stage": 0}}, "zero_optimization.stage=0"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1.5}},
     "zero_optimization.reduce_bucket_size=1.5"),
    ({"zero_optimization": {"stage": 2, "overlap_comm": "yes"}},
     "zero_optimization.overlap_comm='yes'"),
    ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
     "zero_optimization.offload_param"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}},
     "zero_optimization.offload_optimizer.device='gpu'"),
    ({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
      "fp16": {"enabled": True}}, "bf16.enabled=True"),
    ({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 0},
     "train_micro_batch_size_per_gpu=0"),
    ({"zero_optimization": {"stage": 2}, "communication_data_type": "int8"},
     "communication_data_type='int8'"),
])
def test_bad_configs_name_the_key(tmp_path: Path, config: dict[str, Any], named: str) -> None:
    path = write(tmp_path, config)
    result = cli("--model", "125m", "--gpus", "8", "--ds-config", str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert f"{path}:{named}" in result.stderr


def test_malformed_json_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text('{"zero_optimization": {"stage": 2,}}')
    result = cli("--model", "125m", "--gpus", "8", "--ds-config", str(path))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "not valid JSON" in result.stderr


def test_command_line_conflicts_name_both(tmp_path: Path) -> None:
    path = write(tmp_path, {"train_micro_batch_size_per_gpu": 4,
                            "zero_optimization": {"stage": 3}})
    result = cli("--model", "125m", "--gpus", "8", "--ds-config", str(path),
                 "--micro-batch", "2")
    assert result.returncode == 2
    assert "train_micro_batch_size_per_gpu=4" in result.stderr and "--micro-batch 2" in (
        result.stderr)
    result = cli("--model", "125m", "--gpus", "8", "--ds-config", str(path),
                 "--strategy", "zero2")
    assert result.returncode == 2 and "zero_optimization.stage" in result.stderr


def test_unmodelled_keys_warn_once_defaults_do_not(tmp_path: Path) -> None:
    path = write(tmp_path, {"zero_optimization": {
        "stage": 2, "reduce_scatter": True, "round_robin_gradients": True},
        "activation_checkpointing": {"partition_activations": True}})
    run = read_ds_config(path, hidden_size=768)
    assert len(run.warnings) == 1
    assert "zero_optimization.round_robin_gradients=true" in run.warnings[0]
    assert "activation_checkpointing" in run.warnings[0]
    assert "reduce_scatter" not in run.warnings[0]  # DeepSpeed's default, as modelled
    result = cli("--model", "125m", "--gpus", "8", "--seq", "512", "--ds-config", str(path),
                 "--format", "json")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("warning:") == 1
    assert json.loads(result.stdout)["warnings"] == list(run.warnings)


@pytest.mark.parametrize(("params", "warned"), [({"torch_adam": True}, True),
                                                 ({"torch_adam": False, "lr": 1e-4}, False)])
def test_torch_adam_warns_that_fused_adam_is_modelled(tmp_path: Path, params: dict,
                                                       warned: bool) -> None:
    # "torch_adam": true makes DeepSpeed build torch.optim.AdamW instead of its FusedAdam,
    # which zsim models (one pass over the partition).
    path = write(tmp_path, {"zero_optimization": {"stage": 2},
                            "optimizer": {"type": "AdamW", "params": params}})
    warnings = read_ds_config(path, hidden_size=768).warnings
    assert (len(warnings) == 1 and "optimizer.params.torch_adam=true" in warnings[0]) == warned
    assert bool(warnings) == warned


@pytest.mark.parametrize(("config", "warned"), [
    ({}, True), ({"optimizer": {"type": "AdamW"}}, False),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, False)])
def test_a_config_without_an_optimizer_warns_that_the_clients_is_not_known(
        tmp_path: Path, config: dict, warned: bool) -> None:
    # Without an optimizer section DeepSpeed steps the one its caller passes (offloaded,
    # DeepSpeedCPUAdam, which zero_force_ds_cpu_optimizer insists on).
    path = write(tmp_path, {"zero_optimization": {"stage": 2}, **config})
    warnings = read_ds_config(path, hidden_size=768).warnings
    assert any("optimizer (absent: DeepSpeed steps the client's" in w
               for w in warnings) == warned


def test_config_plan_is_the_flags_plan(tmp_path: Path) -> None:
    """A config and the equivalent command line simulate the same step, byte for byte."""
    path = write(tmp_path, {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
                            "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}})
    from_config = simulate(model="125m", gpus=8, strategy=None, hardware="dgx-h100", seq=512,
                           ds_config=path)
    from_flags = simulate(model="125m", gpus=8, strategy="zero3", hardware="dgx-h100",
                          seq=512, micro_batch=2, impl="deepspeed")
    assert from_config == from_flags


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_simulate(path: Path) -> None:
    config = json.loads(path.read_text())
    result = simulate(model="1.3b", gpus=16, strategy=None, hardware="dgx-h100", seq=1024,
                      ds_config=path)
    assert result["plan"]["strategy"] == f"zero{config['zero_optimization']['stage']}"
    offloaded = config["zero_optimization"].get("offload_param", {}).get("device", "none")
    assert (result["plan"]["offload"] == "params") == (offloaded != "none")
    assert result["fits"]


# Found by the fuzz campaign (bench/fuzz.py, target ds_config).
@pytest.mark.parametrize(("text", "named"), [
    ('{"zero_optimization": {"stage": 2}, "communication_data_type": ["fp16"]}',
     "communication_data_type=['fp16']"),  # was TypeError: unhashable type: 'list'
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # was RecursionError
])
def test_fuzz_findings_are_config_errors(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(named)) as info:
        read_ds_config(path, hidden_size=768)
    assert str(path) in str(info.value)


def test_tiny_sub_groups_are_whole_parameters(tmp_path: Path) -> None:
    """sub_group_size 1 made one optimizer op per element (15.6 million for 125m on 8
    GPUs: a hang); DeepSpeed's sub-groups are whole parameter partitions
    (_create_fp16_sub_groups), so there is one per parameter at most."""
    path = write(tmp_path, {"zero_optimization": {"stage": 3, "sub_group_size": 1}})
    plan = ds_plan(read_ds_config(path, hidden_size=768), where="c", gpus=8, seq_len=512)
    model = resolve_model("125m")
    groups = _sub_groups(model, plan)
    assert len(groups) == len(list(model.parameter_tensors()))
    assert _sub_groups(model, plan.with_(options=DeepSpeedZero())) == [sum(groups)]
    result = simulate_plan(model, resolve_hardware("dgx-h100"), plan)
    assert result.step_time_s is not None


def test_offload_pin_memory_is_read_and_defaults_to_pageable(tmp_path: Path) -> None:
    """DeepSpeedZeroOffloadOptimizerConfig.pin_memory defaults to False."""
    def run(offload: dict[str, Any]) -> DeepSpeedZero:
        config = {"zero_optimization": {"stage": 2, "offload_optimizer": offload}}
        return read_ds_config(write(tmp_path, config), hidden_size=64).ds

    assert run({"device": "cpu"}).pin_memory is False
    assert run({"device": "cpu", "pin_memory": True}).pin_memory is True
    with pytest.raises(ConfigError) as e:
        run({"device": "cpu", "pin_memory": "yes"})
    assert e.value.field.endswith("zero_optimization.offload_optimizer.pin_memory")


def test_step_knobs_are_read_with_deepspeeds_defaults(tmp_path: Path) -> None:
    """gradient_clipping (top level; DeepSpeed's default 1.0, "auto" the HF Trainer's
    max_grad_norm 1.0) and bf16.check_grad_overflow (default true) change the ZeRO step:
    read silently, refused when mistyped."""
    def ds(config: dict[str, Any]) -> tuple[DeepSpeedZero, tuple[str, ...]]:
        config = {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}, **config}
        run = read_ds_config(write(tmp_path, config), hidden_size=64)
        return run.ds, run.warnings

    default, warnings = ds({"bf16": {"enabled": True}})
    assert (default.gradient_clipping, default.check_grad_overflow) == (1.0, True)
    got, warnings = ds({"gradient_clipping": 0, "bf16": {"enabled": True,
                                                        "check_grad_overflow": False}})
    assert (got.gradient_clipping, got.check_grad_overflow, warnings) == (0.0, False, ())
    assert ds({"gradient_clipping": "auto"})[0].gradient_clipping == 1.0
    for config, key in (({"gradient_clipping": -1}, "gradient_clipping"),
                        ({"gradient_clipping": "1.0"}, "gradient_clipping"),
                        ({"bf16": {"check_grad_overflow": "no"}}, "bf16.check_grad_overflow")):
        with pytest.raises(ConfigError) as e:
            ds(config)
        assert e.value.field.endswith(f":{key}")
    with pytest.raises(ConfigError) as e:
        DeepSpeedZero(gradient_clipping=float("nan"))
    assert e.value.field == "plan.ds.gradient_clipping"


def test_the_backend_passes_the_step_knobs_to_deepspeed() -> None:
    """The backend's config says what the plan says, in keys DeepSpeed's own config
    models take."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config

    from zsim.backend.deepspeed_zero import ds_config
    from zsim.spec.plan import Plan

    knobs = DeepSpeedZero(gradient_clipping=0.5, check_grad_overflow=False)
    config = ds_config(Plan.for_strategy("zero2", gpus=2, seq_len=64, options=knobs))
    assert config["gradient_clipping"] == 0.5
    assert DeepSpeedBF16Config(**config["bf16"]).check_grad_overflow is False
