"""A user's accelerate config (the YAML `accelerate config` writes) with distributed_type
FSDP, read as accelerate 1.15 reads it (accelerate/commands/config/config_args.py,
commands/launch.py, utils/dataclasses.py FullyShardedDataParallelPlugin).

Owns the mapping from its keys to a zsim plan: fsdp_version (1: FullyShardedDataParallel,
impl fsdp1; 2: fully_shard, impl fsdp2), the sharding strategy (fsdp_reshard_after_forward,
or the deprecated fsdp_sharding_strategy: FULL_SHARD -> fsdp, SHARD_GRAD_OP ->
fsdp-no-reshard, HYBRID_SHARD -> hsdp; FSDP2 takes a bool, and HSDP from
parallelism_config's dp_replicate_size), fsdp_backward_prefetch (accelerate's default is
NO_PREFETCH), fsdp_forward_prefetch, fsdp_offload_params, fsdp_activation_checkpointing
(full recomputation of each wrapped layer), fsdp_auto_wrap_policy (one unit per layer;
NO_WRAP: one unit for all layers) and mixed_precision. Top-level keys are checked as
accelerate checks them (an unknown one is an error, naming the nearest known key); an
fsdp_config key accelerate does not know, which it ignores (named with the nearest option
it knows, where one is near), and a key zsim reads but does not model draw one warning
line.
Imports only zsim.errors, zsim.spec and PyYAML (through zsim.spec.yaml_file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError
from zsim.spec.fsdp1 import Fsdp1Options
from zsim.spec.plan import Plan, precision_knobs
from zsim.spec.strict import nearest_key
from zsim.spec.yaml_file import read_yaml

TOP_KEYS: frozenset[str] = frozenset({
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug",
    "num_processes", "machine_rank", "num_machines", "gpu_ids", "main_process_ip",
    "main_process_port", "rdzv_backend", "same_network", "main_training_function",
    "enable_cpu_affinity", "fp8_config", "deepspeed_config", "fsdp_config",
    "parallelism_config", "megatron_lm_config", "mpirun_config", "downcast_bf16",
    "tpu_name", "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands",
    "tpu_vm", "tpu_env", "dynamo_config",
    "fp16", "dynamo_backend",  # older configs, converted by process_config
})
"""ClusterConfig's fields (accelerate 1.15), and the legacy keys it converts."""

FSDP_KEYS: frozenset[str] = frozenset({
    "fsdp_version", "fsdp_offload_params", "fsdp_min_num_params", "fsdp_sharding_strategy",
    "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap", "fsdp_backward_prefetch", "fsdp_state_dict_type",
    "fsdp_forward_prefetch", "fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading",
    "fsdp_sync_module_states", "fsdp_activation_checkpointing",
    "fsdp_activation_checkpointing_offload",
})
"""The fsdp_* options of `accelerate launch` (accelerate 1.15)."""

STRATEGIES = {"FULL_SHARD": "fsdp", "SHARD_GRAD_OP": "fsdp-no-reshard", "NO_SHARD": None,
              "HYBRID_SHARD": "hsdp", "HYBRID_SHARD_ZERO2": None}
"""accelerate's FSDP_SHARDING_STRATEGY (ShardingStrategy values 1-5) -> zsim strategy;
None: not modelled."""

PREFETCH = {"BACKWARD_PRE": "pre", "BACKWARD_POST": "post", "NO_PREFETCH": "none"}
PRECISION = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpRun:
    """What an accelerate FSDP config says about the plan."""

    impl: str
    """fsdp1 or fsdp2."""
    strategy: str
    """fsdp, fsdp-no-reshard or hsdp."""
    dp_replicate: int | None
    """FSDP2's HSDP replicas (parallelism_config dp_replicate_size); None: the default."""
    precision: str
    recompute: str
    """full (fsdp_activation_checkpointing) or none."""
    offload: str
    """params (fsdp_offload_params) or none."""
    whole_model_unit: bool
    """NO_WRAP: all layers in one unit."""
    num_processes: int | None
    options: Fsdp1Options | None
    """FSDP1's knobs (Plan.options of an fsdp1 plan); None for FSDP2, which has none."""
    warnings: tuple[str, ...] = field(default=())


def read_fsdp_config(path: Path) -> FsdpRun:
    """Read an accelerate config YAML with distributed_type FSDP.

    Raises:
        ConfigError: an unreadable file, malformed YAML, a top-level key accelerate would
            reject, a distributed_type other than FSDP, a wrong type or an impossible
            value (named as FILE:key.path).
    """
    data = read_yaml(Path(path), field="fsdp_config")
    return _Reader(str(path)).read(data)


class _Reader:
    def __init__(self, where: str) -> None:
        self.where = where
        self.unmodelled: list[str] = []

    def error(self, key: str, value: object, reason: str) -> ConfigError:
        return ConfigError(f"{self.where}:{key}", value, reason)

    def read(self, data: Any) -> FsdpRun:
        if not isinstance(data, dict):
            raise self.error("", data, "an accelerate config is a YAML mapping")
        for key in data:
            if key not in TOP_KEYS:
                raise self.error(key, data[key], "not an accelerate config key (accelerate "
                                 f"rejects unknown keys){nearest_key(key, TOP_KEYS)}")
        if data.get("distributed_type") != "FSDP":
            raise self.error("distributed_type", data.get("distributed_type"),
                             "zsim reads FSDP configs (for DeepSpeed give --ds-config)")
        fsdp = data.get("fsdp_config") or {}
        if not isinstance(fsdp, dict):
            raise self.error("fsdp_config", fsdp, "must be a mapping")
        for key in fsdp:
            if not isinstance(key, str):
                raise self.error(f"fsdp_config.{key}", fsdp[key], "keys are option names")
            name = key if key.startswith("fsdp_") else f"fsdp_{key}"  # launch adds fsdp_
            if name not in FSDP_KEYS:
                self.unmodelled.append(f"fsdp_config.{key} (accelerate ignores it"
                                       f"{nearest_key(name, FSDP_KEYS)})")
        get = {(k if k.startswith("fsdp_") else f"fsdp_{k}"): v for k, v in fsdp.items()}
        version = get.get("fsdp_version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or version not in (1, 2):
            raise self.error("fsdp_config.fsdp_version", version, "must be 1 or 2")
        strategy = self.strategy(get, version)
        prefetch = self.choice(get, "fsdp_backward_prefetch", PREFETCH, "NO_PREFETCH")
        if version == 2 and prefetch != "none":
            self.unmodelled.append("fsdp_config.fsdp_backward_prefetch (FSDP2 ignores it)")
        forward_prefetch = self.flag(get, "fsdp_forward_prefetch")
        if version == 2 and forward_prefetch:
            raise self.error("fsdp_config.fsdp_forward_prefetch", True,
                             "accelerate refuses forward_prefetch with fsdp_version 2")
        offload = self.flag(get, "fsdp_offload_params")
        if version == 1 and offload:
            raise self.error("fsdp_config.fsdp_offload_params", True,
                             "FSDP1's CPUOffload is not modelled: use fsdp_version 2")
        wrap = self.choice(get, "fsdp_auto_wrap_policy",
                           {"TRANSFORMER_BASED_WRAP": "layer", "SIZE_BASED_WRAP": "size",
                            "NO_WRAP": "none"}, "TRANSFORMER_BASED_WRAP")
        if wrap == "size":
            self.unmodelled.append("fsdp_config.fsdp_auto_wrap_policy=SIZE_BASED_WRAP "
                                   "(modelled as one unit per layer)")
        if self.flag(get, "fsdp_activation_checkpointing_offload"):
            self.unmodelled.append("fsdp_config.fsdp_activation_checkpointing_offload")
        precision = self.choice(data, "mixed_precision", PRECISION, "no", where="")
        processes = data.get("num_processes")
        if processes is not None and (isinstance(processes, bool)
                                      or not isinstance(processes, int) or processes < 1):
            raise self.error("num_processes", processes, "must be a positive integer")
        warnings = ()
        if self.unmodelled:
            warnings = (f"{self.where}: read but not modelled: {', '.join(self.unmodelled)}",)
        return FsdpRun(
            impl=f"fsdp{version}", strategy=strategy,
            dp_replicate=self.replicas(data.get("parallelism_config")),
            precision=precision,
            recompute="full" if self.flag(get, "fsdp_activation_checkpointing") else "none",
            offload="params" if offload else "none",
            whole_model_unit=wrap == "none", num_processes=processes,
            options=Fsdp1Options(backward_prefetch=prefetch, forward_prefetch=forward_prefetch)
            if version == 1 else None,
            warnings=warnings)

    def strategy(self, get: dict[str, Any], version: int) -> str:
        if version == 2:
            reshard = get.get("fsdp_reshard_after_forward", True)
            if isinstance(reshard, str) and reshard.lower() in ("true", "false"):
                reshard = reshard.lower() == "true"
            if not isinstance(reshard, bool):
                raise self.error("fsdp_config.fsdp_reshard_after_forward", reshard,
                                 "FSDP2 takes true or false")
            return "fsdp" if reshard else "fsdp-no-reshard"
        key = ("fsdp_sharding_strategy" if "fsdp_sharding_strategy" in get
               else "fsdp_reshard_after_forward")
        value = get.get(key, "FULL_SHARD")
        names = list(STRATEGIES)
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(names):
            value = names[value - 1]
        if not isinstance(value, str) or value.upper() not in STRATEGIES:
            raise self.error(f"fsdp_config.{key}", value,
                             f"FSDP1 takes one of {', '.join(names)} (or 1-5)")
        strategy = STRATEGIES[value.upper()]
        if strategy is None:
            raise self.error(f"fsdp_config.{key}", value,
                             "zsim models FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD")
        return strategy

    def choice(self, d: dict[str, Any], key: str, options: dict[str, str], default: str, *,
               where: str = "fsdp_config.") -> str:
        value = d.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, str) or (value not in options and value.upper() not in options):
            raise self.error(f"{where}{key}", value, f"must be one of {', '.join(options)}")
        return options.get(value, options.get(value.upper(), default))

    def flag(self, d: dict[str, Any], key: str) -> bool:
        value = d.get(key, False)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise self.error(f"fsdp_config.{key}", value, "must be true or false")
        return value

    def replicas(self, section: Any) -> int | None:
        if section is None:
            return None
        if not isinstance(section, dict):
            raise self.error("parallelism_config", section, "must be a mapping")
        value = section.get("parallelism_config_dp_replicate_size",
                            section.get("dp_replicate_size"))
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error("parallelism_config.dp_replicate_size", value,
                             "must be a positive integer")
        return value


def fsdp_plan(run: FsdpRun, *, where: str, gpus: int, gpus_per_node: int, seq_len: int,
              num_layers: int, strategy: str | None = None, micro_batch: int = 1,
              grad_accum: int = 1, precision: str | None = None, recompute: str = "none",
              shard_group: int | None = None) -> tuple[Plan, tuple[str, ...]]:
    """The plan a config describes on `gpus` GPUs, with the caller's batch sizes; and the
    warnings (the config's, and a num_processes that differs from `gpus`).

    Raises:
        ConfigError: a caller's value that contradicts the config (naming its key), or a
            plan that cannot exist.
    """
    def conflict(key: str, config: object, flag: str, given: object) -> ConfigError:
        return ConfigError(f"{where}:{key}", config, f"but the command line says {flag} "
                           f"{given}")

    if strategy is not None and strategy != run.strategy:
        raise conflict("fsdp_config.fsdp_reshard_after_forward", run.strategy, "--strategy",
                       strategy)
    if precision is not None and precision != run.precision:
        raise conflict("mixed_precision", run.precision, "--precision", precision)
    if recompute != "none" and run.recompute != "none" and recompute != run.recompute:
        raise conflict("fsdp_config.fsdp_activation_checkpointing", True, "--ac", recompute)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
        raise ConfigError("gpus", gpus, "must be a positive integer")
    warnings = list(run.warnings)
    if run.num_processes is not None and run.num_processes != gpus:
        warnings.append(f"{where}: num_processes {run.num_processes}, simulated on --gpus "
                        f"{gpus}")
    if run.strategy == "hsdp" and shard_group is None and run.dp_replicate:
        if gpus % run.dp_replicate:
            raise ConfigError(f"{where}:parallelism_config.dp_replicate_size",
                              run.dp_replicate, f"must divide --gpus {gpus}")
        shard_group = gpus // run.dp_replicate
    elif run.strategy == "hsdp" and shard_group is None:
        shard_group = min(gpus_per_node, gpus)
        if gpus % shard_group:
            raise ConfigError(f"{where}:fsdp_config.fsdp_sharding_strategy", "HYBRID_SHARD",
                              f"shards within a node of {shard_group} GPUs, which does not "
                              f"divide --gpus {gpus} (give --shard-group)")
    plan = Plan.for_strategy(
        run.strategy, gpus=gpus, seq_len=seq_len, micro_batch=micro_batch,
        grad_accum=grad_accum, shard_group=shard_group if run.strategy == "hsdp" else None,
        recompute=run.recompute if recompute == "none" else recompute, offload=run.offload,
        impl=run.impl, options=run.options, unit_size=num_layers if run.whole_model_unit else 1,
        **precision_knobs(run.precision))
    return plan, tuple(warnings)
