"""accelerate FSDP configs read as accelerate 1.15 reads them (zsim.spec.fsdp_config): the
keys it accepts, its defaults, the mapping to zsim's programs and knobs, and the shipped
configs in scenarios/configs/."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from zsim.api import simulate
from zsim.errors import ConfigError
from zsim.spec.fsdp1 import Fsdp1Options
from zsim.spec.fsdp_config import fsdp_plan, read_fsdp_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "scenarios" / "configs").glob("accelerate_*.yaml"))


def write(tmp_path: Path, fsdp: dict[str, Any], **top: Any) -> Path:
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE",
                                    "distributed_type": "FSDP", "fsdp_config": fsdp,
                                    "mixed_precision": "bf16", "num_processes": 8, **top}))
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zsim", "simulate", *args],
                          capture_output=True, text=True, timeout=120)


def test_accelerates_defaults(tmp_path: Path) -> None:
    """Nothing set: FSDP1, FULL_SHARD, NO_PREFETCH (accelerate's default, not torch's),
    forward prefetch off, limiter on, no recomputation, one unit per layer."""
    run = read_fsdp_config(write(tmp_path, {}))
    assert (run.impl, run.strategy, run.precision, run.recompute, run.offload) == (
        "fsdp1", "fsdp", "bf16", "none", "none")
    assert run.options == Fsdp1Options(backward_prefetch="none")
    assert run.warnings == ()


@pytest.mark.parametrize(("fsdp", "expected"), [
    ({"fsdp_sharding_strategy": "SHARD_GRAD_OP"}, ("fsdp1", "fsdp-no-reshard")),
    ({"fsdp_sharding_strategy": 4}, ("fsdp1", "hsdp")),  # ShardingStrategy(4)
    ({"fsdp_reshard_after_forward": "HYBRID_SHARD"}, ("fsdp1", "hsdp")),
    ({"fsdp_version": 2, "fsdp_reshard_after_forward": False}, ("fsdp2", "fsdp-no-reshard")),
    ({"fsdp_version": 2}, ("fsdp2", "fsdp")),
    ({"sharding_strategy": "FULL_SHARD"}, ("fsdp1", "fsdp")),  # launch adds the prefix
])
def test_strategy_and_version(tmp_path: Path, fsdp: dict[str, Any],
                              expected: tuple[str, str]) -> None:
    run = read_fsdp_config(write(tmp_path, fsdp))
    assert (run.impl, run.strategy) == expected


def test_knobs_reach_the_plan(tmp_path: Path) -> None:
    run = read_fsdp_config(write(tmp_path, {
        "fsdp_backward_prefetch": "BACKWARD_POST", "fsdp_forward_prefetch": True,
        "fsdp_activation_checkpointing": True, "fsdp_reshard_after_forward": "HYBRID_SHARD"},
        mixed_precision="fp16"))
    plan, warnings = fsdp_plan(run, where="c", gpus=32, gpus_per_node=8, seq_len=512,
                               num_layers=4, micro_batch=2, grad_accum=3)
    assert plan.options == Fsdp1Options(backward_prefetch="post", forward_prefetch=True)
    assert (plan.impl, plan.strategy, plan.dp_shard, plan.dp_replicate) == ("fsdp1", "hsdp",
                                                                          8, 4)
    assert (plan.recompute, plan.param_dtype, plan.micro_batch, plan.grad_accum) == (
        "full", "fp16", 2, 3)
    assert warnings == ("c: num_processes 8, simulated on --gpus 32",)


def test_fsdp2_hsdp_from_parallelism_config(tmp_path: Path) -> None:
    run = read_fsdp_config(write(tmp_path, {"fsdp_version": 2}, parallelism_config={
        "parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 8}))
    plan, _ = fsdp_plan(run, where="c", gpus=16, gpus_per_node=8, seq_len=512, num_layers=4)
    # FSDP2 takes the replicas from parallelism_config, not from a sharding strategy.
    assert plan.strategy == "fsdp" and run.dp_replicate == 2


def test_no_wrap_is_one_unit(tmp_path: Path) -> None:
    run = read_fsdp_config(write(tmp_path, {"fsdp_auto_wrap_policy": "NO_WRAP"}))
    plan, _ = fsdp_plan(run, where="c", gpus=8, gpus_per_node=8, seq_len=512, num_layers=12)
    assert plan.unit_size == 12


@pytest.mark.parametrize(("change", "named"), [
    (lambda d: d.update(fsdp_confg={}), "fsdp_confg={}"),
    (lambda d: d.update(distributed_type="DEEPSPEED"), "distributed_type='DEEPSPEED'"),
    (lambda d: d["fsdp_config"].update(fsdp_version=3), "fsdp_config.fsdp_version=3"),
    (lambda d: d["fsdp_config"].update(fsdp_sharding_strategy="ZERO3"),
     "fsdp_config.fsdp_sharding_strategy='ZERO3'"),
    (lambda d: d["fsdp_config"].update(fsdp_sharding_strategy="NO_SHARD"),
     "fsdp_config.fsdp_sharding_strategy='NO_SHARD'"),
    (lambda d: d["fsdp_config"].update(fsdp_backward_prefetch="BACKWARD_AFTER"),
     "fsdp_config.fsdp_backward_prefetch='BACKWARD_AFTER'"),
    (lambda d: d["fsdp_config"].update(fsdp_version=2, fsdp_reshard_after_forward="FULL_SHARD"),
     "fsdp_config.fsdp_reshard_after_forward='FULL_SHARD'"),
    (lambda d: d["fsdp_config"].update(fsdp_version=2, fsdp_forward_prefetch=True),
     "fsdp_config.fsdp_forward_prefetch=True"),
    (lambda d: d["fsdp_config"].update(fsdp_offload_params="sometimes"),
     "fsdp_config.fsdp_offload_params='sometimes'"),
    (lambda d: d.update(mixed_precision="fp4"), "mixed_precision='fp4'"),
    (lambda d: d["fsdp_config"].update(fsdp_offload_params=True),
     "fsdp_config.fsdp_offload_params=True"),
])
def test_bad_configs_are_one_line_naming_the_key(tmp_path: Path, change: Any,
                                                 named: str) -> None:
    data: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP",
                            "fsdp_config": {}, "mixed_precision": "bf16"}
    change(data)
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(data))
    result = cli("--model", "125m", "--gpus", "8", "--fsdp-config", str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert named in result.stderr


def test_unknown_fsdp_key_warns(tmp_path: Path) -> None:
    path = write(tmp_path, {"fsdp_limit_all_gather": True, "fsdp_version": 2,
                            "fsdp_backward_prefetch": "BACKWARD_PRE"})
    run = read_fsdp_config(path)
    assert len(run.warnings) == 1
    assert "fsdp_config.fsdp_limit_all_gather (accelerate ignores it)" in run.warnings[0]
    assert "fsdp_backward_prefetch (FSDP2 ignores it)" in run.warnings[0]


def test_a_misspelt_key_is_named_with_the_nearest_known_one(tmp_path: Path) -> None:
    """A misspelt top-level key is refused (accelerate refuses it) naming the
    nearest key accelerate knows; a misspelt fsdp_config option, which accelerate ignores,
    is warned about with the option it nearly is (the plan falls back to the default)."""
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump({"distributed_type": "FSDP", "fsdp_confg": {},
                                    "mixed_precision": "bf16"}))
    result = cli("--model", "125m", "--gpus", "8", "--fsdp-config", str(path))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: {path}:fsdp_confg={{}}: not an accelerate "
                                    "config key")
    assert result.stderr.rstrip().endswith("did you mean 'fsdp_config'?")
    run = read_fsdp_config(write(tmp_path, {"fsdp_versoin": 2, "limit_all_gather": True}))
    assert run.impl == "fsdp1"  # accelerate's default, as accelerate would run it
    assert ("fsdp_config.fsdp_versoin (accelerate ignores it; did you mean 'fsdp_version'?)"
            in run.warnings[0])
    assert "fsdp_config.limit_all_gather (accelerate ignores it)" in run.warnings[0]


def test_config_plan_is_the_flags_plan(tmp_path: Path) -> None:
    path = write(tmp_path, {"fsdp_sharding_strategy": "SHARD_GRAD_OP",
                            "fsdp_backward_prefetch": "BACKWARD_PRE"}, num_processes=16)
    from_config = simulate(model="125m", gpus=16, strategy=None, hardware="dgx-h100", seq=512,
                           fsdp_config=path)
    from_flags = simulate(model="125m", gpus=16, strategy="fsdp-no-reshard",
                          hardware="dgx-h100", seq=512, impl="fsdp1")
    assert from_config == from_flags


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_simulate(path: Path) -> None:
    result = simulate(model="1.3b", gpus=32, strategy=None, hardware="dgx-h100", seq=1024,
                      fsdp_config=path)
    assert result["fits"] and result["plan"]["impl"] in ("fsdp1", "fsdp2")


# Found by the fuzz campaign (bench/fuzz.py, target fsdp_config): each was a traceback, a
# silent wrong plan, an error not naming the config, or a message of millions of values.
BOMB = "".join(f"  {k}: &{k} [{', '.join([f'*{p}' if p else 'lol'] * 9)}]\n"
               for p, k in zip(["", *"abcdef"], "abcdefg", strict=True))


@pytest.mark.parametrize(("text", "named"), [
    ("distributed_type: FSDP\nfsdp_config:\n  1: x\n", "fsdp_config.1='x'"),  # AttributeError
    ("distributed_type: FSDP\n? [1, 2]\n: 3\n", "found unhashable key"),  # TypeError
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: true\n",  # plan.impl='fsdpTrue'
     "fsdp_config.fsdp_version=True"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2.0\n", "fsdp_version=2.0"),
    ("distributed_type: FSDP\nfsdp_config: " + "[" * 600 + "]" * 600 + "\n",
     "brackets nested 600 deep"),  # RecursionError
    ("distributed_type: FSDP\nfsdp_config: " + "[" * 3000 + "]" * 3000 + "\n",
     "brackets nested 3000 deep"),  # over 20 s in PyYAML's scanner
    ("distributed_type: FSDP\nfsdp_config:\n" + "".join(
        " " * i + f"k{i}:\n" for i in range(1, 1200)) + " " * 1200 + "v: 1\n",
     "nested too deeply"),  # RecursionError in block style
    ("distributed_type: FSDP\ntpu_env:\n" + BOMB + "fsdp_config: *g\n",  # 28 MB message
     "fsdp_config=[[[...], [...], [...], [...], [...], [...], ...], "),
])
def test_fuzz_findings_are_short_config_errors(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(named)) as info:
        read_fsdp_config(path)
    assert str(path) in str(info.value) and len(str(info.value)) < 1000


def test_a_file_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    """Was UnicodeDecodeError (zsim.spec.yaml_file read the text unguarded)."""
    path = tmp_path / "accelerate.yaml"
    path.write_bytes(b"distributed_type: FSDP\nfsdp_config: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_fsdp_config(path)


@pytest.mark.parametrize("replicas", [3, 16])
def test_replicas_must_divide_the_gpus(tmp_path: Path, replicas: int) -> None:
    """dp_replicate_size 3 on 8 GPUs was simulated as 4 replicas of 2 (gpus // 3 = 2 per
    shard group), and 16 failed on shard_group=0 without naming the config."""
    path = write(tmp_path, {"fsdp_sharding_strategy": "HYBRID_SHARD"},
                 parallelism_config={"parallelism_config_dp_replicate_size": replicas})
    with pytest.raises(ConfigError, match=re.escape(
            f"c:parallelism_config.dp_replicate_size={replicas}: must divide --gpus 8")):
        fsdp_plan(read_fsdp_config(path), where="c", gpus=8, gpus_per_node=8, seq_len=512,
                  num_layers=4)


def test_hybrid_shard_on_gpus_a_node_does_not_divide(tmp_path: Path) -> None:
    """HYBRID_SHARD on 12 GPUs of 8-GPU nodes failed on shard_group=8 without naming the
    config."""
    path = write(tmp_path, {"fsdp_sharding_strategy": "HYBRID_SHARD"})
    with pytest.raises(ConfigError, match=re.escape("c:fsdp_config.fsdp_sharding_strategy")):
        fsdp_plan(read_fsdp_config(path), where="c", gpus=12, gpus_per_node=8, seq_len=512,
                  num_layers=4)


def test_no_gpus_is_a_config_error_not_a_division_by_zero(tmp_path: Path) -> None:
    """HYBRID_SHARD on --gpus 0 divided by a shard group of min(8, 0) = 0 (found by the
    cli_config fuzz target, seed 3)."""
    path = write(tmp_path, {"fsdp_sharding_strategy": "HYBRID_SHARD"})
    with pytest.raises(ConfigError, match=re.escape("gpus=0: must be a positive integer")):
        fsdp_plan(read_fsdp_config(path), where="c", gpus=0, gpus_per_node=8, seq_len=512,
                  num_layers=4)
