"""A user's DeepSpeed JSON config (ds_config.json) read as DeepSpeed 0.19 reads it, with the
"auto" values the Hugging Face integration fills in.

Owns the mapping from the config's keys to a zsim plan: the ZeRO stage (-> zero1, zero2,
zero3), batch sizes, precision, offload and zsim.spec.deepspeed.DeepSpeedZero's knobs.
`zero_optimization` is checked as strictly as DeepSpeed checks it (its pydantic model
forbids unknown keys); a top-level key DeepSpeed 0.19 removed is refused, as DeepSpeed
refuses it; a top-level key it does not read at all, which it would ignore, is refused
too, named with the nearest key it reads (a misspelt "zero_optimisation" would otherwise
run as ZeRO stage 0); a key zsim reads but does not model is collected as a warning.
"bfloat16" is DeepSpeed's older name of the "bf16" section (read when "bf16" is absent).
"auto" (transformers' integrations/deepspeed.py, HfTrainerDeepSpeedConfig): batch sizes
and precision come from the caller (the CLI's flags); reduce_bucket_size = hidden^2,
stage3_prefetch_bucket_size = 0.9 hidden^2, stage3_param_persistence_threshold = 10 hidden,
gradient_clipping = 1.0 (TrainingArguments.max_grad_norm's default). `ds_plan` merges a
config with the command line's flags into a Plan. Imports only zsim.errors and zsim.spec.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError
from zsim.spec.deepspeed import DeepSpeedZero, is_clipping
from zsim.spec.json_file import read_json
from zsim.spec.plan import Plan, precision_knobs
from zsim.spec.strict import nearest_key

ZERO_KEYS: frozenset[str] = frozenset({
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
    "use_multi_rank_bucket_allreduce", "allgather_partitions", "allgather_bucket_size",
    "overlap_comm", "compute_grad_norm", "load_from_fp32_weights", "elastic_checkpoint",
    "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
    "cpu_offload_use_pin_memory", "cpu_offload", "prefetch_bucket_size",
    "stage3_prefetch_bucket_size", "param_persistence_threshold",
    "stage3_param_persistence_threshold", "model_persistence_threshold",
    "stage3_model_persistence_threshold", "max_live_parameters", "stage3_max_live_parameters",
    "max_reuse_distance", "stage3_max_reuse_distance", "gather_16bit_weights_on_model_save",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "module_granularity_threshold", "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params",
    "allgather_sequential", "stage3_allgather_sequential", "ignore_unused_parameters",
    "legacy_stage1", "round_robin_gradients", "parameter_alignment", "zero_hpz_partition_size",
    "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "memory_efficient_linear", "pipeline_loading_checkpoint",
    "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
    "save_muon_momentum_buffer_in_memory", "leaf_module",
})
"""Every key DeepSpeed 0.19's DeepSpeedZeroConfig accepts, aliases included (a test checks
it against the library)."""

OFFLOAD_KEYS: frozenset[str] = frozenset({
    "device", "pin_memory", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu",
    "pipeline_read", "pipeline_write", "fast_init", "ratio", "super_offload",
    "cpuadam_cores_perc",
})
"""The keys of DeepSpeed 0.19's offload_param and offload_optimizer sections."""

MODELLED_ZERO = {
    "stage": "stage", "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size", "overlap_comm": "overlap_comm",
    "contiguous_gradients": "contiguous_gradients",
    "prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "param_persistence_threshold": "param_persistence_threshold",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "max_live_parameters": "max_live_parameters",
    "stage3_max_live_parameters": "max_live_parameters",
    "max_reuse_distance": "max_reuse_distance", "stage3_max_reuse_distance": "max_reuse_distance",
    "offload_optimizer": "offload_optimizer", "offload_param": "offload_param",
    "sub_group_size": "sub_group_size",
}
"""zero_optimization keys zsim models -> the DeepSpeedZero field (or the offload section)."""

HARMLESS_ZERO = frozenset({
    "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "load_from_fp32_weights", "elastic_checkpoint",
    "ignore_unused_parameters", "log_trace_cache_warnings", "enable_sanity_checks",
})
"""Keys that only affect checkpoints or checks, never a training step: read silently."""

UNMODELLED_DEFAULTS: dict[str, object] = {
    "reduce_scatter": True, "use_multi_rank_bucket_allreduce": True,
    "allgather_partitions": True, "compute_grad_norm": True, "round_robin_gradients": False,
    "legacy_stage1": False, "parameter_alignment": False, "zero_hpz_partition_size": 1,
    "zero_quantized_weights": False, "zero_quantized_nontrainable_weights": False,
    "zero_quantized_gradients": False, "memory_efficient_linear": True,
    "pipeline_loading_checkpoint": False, "override_module_apply": True,
    "module_granularity_threshold": 0, "stage3_module_granularity_threshold": 0,
    "use_all_reduce_for_fetch_params": False, "stage3_use_all_reduce_for_fetch_params": False,
    "allgather_sequential": False, "stage3_allgather_sequential": False,
}
"""DeepSpeed 0.19's defaults of keys zsim does not model: a config that spells the default
out is run as zsim models it, so it draws no warning."""

TOP_KEYS: frozenset[str] = frozenset({
    "activation_checkpointing", "aio", "autotuning", "bf16", "bfloat16", "checkpoint", "comet",
    "comms_logger", "communication_data_type", "compile", "csv_monitor", "data_efficiency",
    "data_types", "dataloader_drop_last", "datastates_ckpt", "disable_allgather",
    "disable_python_gc", "dump_state", "expert_parallel", "flops_profiler", "fp16",
    "gradient_accumulation_steps", "gradient_allreduce_op", "gradient_clipping",
    "gradient_predivide_factor", "hybrid_engine", "log_level", "managed_gradient_accumulation",
    "memory_breakdown", "optimizer", "pipeline", "prescale_gradients", "scheduler",
    "seq_parallel_communication_data_type", "steps_per_print", "tensor_parallel", "tensorboard",
    "timers", "torch_autocast", "train_batch_size", "train_micro_batch_size_per_gpu",
    "use_data_before_expert_parallelism", "vocabulary_size", "wall_clock_breakdown", "wandb",
    "weight_quantization", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "zero_optimization",
    "sequence_parallel_size", "data_parallel_size",  # deepspeed.initialize's mesh sizes
})
"""Every top-level key DeepSpeed 0.19 reads (DeepSpeedConfig, and deepspeed.initialize's
mesh sizes); a test checks it against the library."""

REMOVED_TOP: frozenset[str] = frozenset({
    "amp", "compression_training", "curriculum_learning", "eigenvalue", "elasticity",
    "graph_harvesting", "nebula", "progressive_layer_drop", "quantize_training",
    "sparse_attention", "sparse_gradients",
})
"""Top-level keys of removed features, which DeepSpeed 0.19 refuses
(_REMOVED_TOP_LEVEL_CONFIG_KEYS)."""

MODELLED_TOP = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "bf16", "bfloat16", "fp16", "zero_optimization", "optimizer", "communication_data_type",
    "gradient_clipping",
})
HARMLESS_TOP = frozenset({
    "steps_per_print", "wall_clock_breakdown", "scheduler",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "tensorboard", "wandb",
    "csv_monitor", "comet", "flops_profiler", "checkpoint", "dump_state", "memory_breakdown",
    "dataloader_drop_last", "prescale_gradients", "gradient_predivide_factor",
})
"""Top-level keys that change no memory or time zsim models (logging, schedules, the
prescaling of gradients by a few kernels): read silently."""

PRECISION_KEYS = {
    "bf16": frozenset({"check_grad_overflow"}),
    "fp16": frozenset({"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                       "min_loss_scale", "consecutive_hysteresis", "auto_cast"}),
}
"""Keys of the bf16 and fp16 sections besides "enabled" that zsim reads, or that change
nothing it models (fp16's loss-scaler settings)."""

AUTO_HIDDEN = {"reduce_bucket_size": lambda h: h * h,
               "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
               "prefetch_bucket_size": lambda h: int(0.9 * h * h),
               "stage3_param_persistence_threshold": lambda h: 10 * h,
               "param_persistence_threshold": lambda h: 10 * h}
"""The hidden-size "auto" values of HfTrainerDeepSpeedConfig.trainer_config_finalize."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedRun:
    """What a ds_config.json says about the plan; None where it says "auto" (or nothing):
    the caller's value applies."""

    strategy: str
    """zero1, zero2 or zero3."""
    micro_batch: int | None
    grad_accum: int | None
    train_batch_size: int | None
    """Sequences per step over the whole job, to check against the plan."""
    precision: str | None
    """bf16, fp16 or fp32."""
    offload: str
    """none, optimizer or params (zsim.spec.plan.Offload)."""
    reduce_dtype: str | None
    """communication_data_type."""
    ds: DeepSpeedZero
    warnings: tuple[str, ...] = field(default=())
    """Keys read but not modelled, and keys DeepSpeed does not know (it ignores them)."""


def read_ds_config(path: Path, *, hidden_size: int) -> DeepSpeedRun:
    """Read a DeepSpeed JSON config; `hidden_size` resolves the hidden-size "auto"s.

    Raises:
        ConfigError: an unreadable file, malformed JSON, a zero_optimization key DeepSpeed
            would reject, a wrong type or an impossible value (named as FILE:key.path).
    """
    return DsConfigReader(str(path), hidden_size).read(read_json(path, field="ds_config"))


class DsConfigReader:
    """One config being read: its file name (for error messages) and the warnings."""

    def __init__(self, where: str, hidden_size: int) -> None:
        self.where = where
        self.hidden = hidden_size
        self.unmodelled: list[str] = []
        self.unknown: list[str] = []

    def error(self, key: str, value: object, reason: str) -> ConfigError:
        return ConfigError(f"{self.where}:{key}", value, reason)

    def read(self, data: Any) -> DeepSpeedRun:
        if not isinstance(data, dict):
            raise self.error("", data, "a DeepSpeed config is a JSON object")
        for key in data:
            if key in REMOVED_TOP:
                raise self.error(key, data[key], "DeepSpeed 0.19 removed this feature and "
                                 "refuses the key")
            if key not in TOP_KEYS:
                raise self.error(key, data[key], "not a key of DeepSpeed 0.19's config, "
                                 f"which would ignore it{nearest_key(key, TOP_KEYS)}")
            if key not in MODELLED_TOP and key not in HARMLESS_TOP:
                self.unmodelled.append(key)
        zero = data.get("zero_optimization", {})
        if not isinstance(zero, dict):
            raise self.error("zero_optimization", zero, "must be an object")
        stage = self.count(zero, "zero_optimization.stage", zero.get("stage", 0), low=0)
        if stage not in (1, 2, 3):
            absent = ("" if "stage" in zero else " (no zero_optimization.stage: DeepSpeed's "
                      "default)")
            raise self.error("zero_optimization.stage", stage,
                             f"zsim models ZeRO stages 1, 2 and 3{absent}; stage 0 is "
                             "DeepSpeed's data parallelism without ZeRO: use --strategy ddp")
        knobs, offload = self.zero(zero, stage)
        precision = self.precision(data)
        knobs = replace(knobs, **self.step_knobs(data))
        optimizer = data.get("optimizer", {})
        if not isinstance(optimizer, dict):
            raise self.error("optimizer", optimizer, "must be an object")
        if optimizer.get("type", "AdamW") not in ("Adam", "AdamW", "adam", "adamw"):
            self.unmodelled.append(f"optimizer.type={optimizer['type']} (modelled as AdamW)")
        params = optimizer.get("params", {})
        if isinstance(params, dict) and params.get("torch_adam") is True:
            self.unmodelled.append("optimizer.params.torch_adam=true (modelled as DeepSpeed's "
                                   "FusedAdam)")
        if "optimizer" not in data and offload == "none":
            # DeepSpeed then steps the optimizer the caller passes (offloaded, it insists
            # on DeepSpeedCPUAdam: zero_force_ds_cpu_optimizer).
            self.unmodelled.append("optimizer (absent: DeepSpeed steps the client's, "
                                   "modelled as its FusedAdam)")
        warnings = []
        if self.unmodelled:
            warnings.append(f"{self.where}: read but not modelled: {', '.join(self.unmodelled)}")
        return DeepSpeedRun(
            strategy=f"zero{stage}",
            micro_batch=self.batch(data, "train_micro_batch_size_per_gpu"),
            grad_accum=self.batch(data, "gradient_accumulation_steps"),
            train_batch_size=self.batch(data, "train_batch_size"),
            precision=precision, offload=offload,
            reduce_dtype=self.comm_dtype(data), ds=knobs, warnings=tuple(warnings))

    # ------------------------------------------------------------------ values
    def count(self, d: dict[str, Any], key: str, value: Any, *, low: int = 1) -> int:
        """An integer >= low; DeepSpeed (pydantic) also takes integral floats (5e8)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, value, f"must be an integer >= {low}")
        if isinstance(value, float) and not value.is_integer():
            raise self.error(key, value, f"must be an integer >= {low}")
        if value < low:
            raise self.error(key, value, f"must be an integer >= {low}")
        return int(value)

    def flag(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, value, "must be true or false")
        return value

    def batch(self, data: dict[str, Any], key: str) -> int | None:
        value = data.get(key)
        if value is None or value == "auto":
            return None
        return self.count(data, key, value)

    def precision(self, data: dict[str, Any]) -> str | None:
        """bf16 or fp16 when enabled, fp32 when both are off, None on "auto"."""
        found: dict[str, bool | None] = {}
        for name in ("bf16", "fp16"):
            where = bf16_key(data) if name == "bf16" else name
            section = data.get(where, {})
            if not isinstance(section, dict):
                raise self.error(where, section, "must be an object")
            value = section.get("enabled", False)
            found[name] = None if value == "auto" else self.flag(f"{where}.enabled", value)
            for key in section:
                if key != "enabled" and key not in PRECISION_KEYS[name]:
                    self.unmodelled.append(f"{where}.{key}")
        if found["bf16"] and found["fp16"]:
            raise self.error(f"{bf16_key(data)}.enabled", True,
                             "bf16 and fp16 cannot both be enabled")
        if found["bf16"]:
            return "bf16"
        if found["fp16"]:
            return "fp16"
        if found["bf16"] is None or found["fp16"] is None:
            return None
        return "fp32"

    def step_knobs(self, data: dict[str, Any]) -> dict[str, Any]:
        """gradient_clipping ("auto": 1.0, the HF Trainer's max_grad_norm) and
        bf16.check_grad_overflow, where the config gives them."""
        knobs: dict[str, Any] = {}
        clip = data.get("gradient_clipping")
        if clip == "auto":
            knobs["gradient_clipping"] = 1.0
        elif clip is not None:
            if not is_clipping(clip):
                raise self.error("gradient_clipping", clip, "must be a number >= 0")
            knobs["gradient_clipping"] = float(clip)
        where = bf16_key(data)
        check = data.get(where, {}).get("check_grad_overflow")
        if check is not None:
            knobs["check_grad_overflow"] = self.flag(f"{where}.check_grad_overflow", check)
        return knobs

    def comm_dtype(self, data: dict[str, Any]) -> str | None:
        value = data.get("communication_data_type")
        names = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "bfp16": "bf16"}
        if value is None:
            return None
        if not isinstance(value, str) or value not in names:
            raise self.error("communication_data_type", value, "must be fp32, fp16 or bf16")
        return names[value]

    def zero(self, zero: dict[str, Any], stage: int) -> tuple[DeepSpeedZero, str]:
        """The DeepSpeedZero knobs and what is offloaded."""
        knobs: dict[str, Any] = {}
        offload = "none"
        device = "none"
        for key, value in zero.items():
            path = f"zero_optimization.{key}"
            if key not in ZERO_KEYS:
                raise self.error(path, value, "not a DeepSpeed 0.19 zero_optimization key "
                                 "(DeepSpeed rejects unknown keys here)"
                                 + nearest_key(key, ZERO_KEYS))
            if key == "stage":
                continue
            if key in ("offload_optimizer", "offload_param"):
                where = self.offload_device(path, value)
                if key == "offload_optimizer" and "pin_memory" in value:
                    knobs["pin_memory"] = self.flag(f"{path}.pin_memory", value["pin_memory"])
                if where != "none":
                    offload = "params" if key == "offload_param" else (
                        "optimizer" if offload == "none" else offload)
                    device = where
                continue
            if key not in MODELLED_ZERO:
                if key not in HARMLESS_ZERO and not (
                        key in UNMODELLED_DEFAULTS and UNMODELLED_DEFAULTS[key] == value):
                    self.unmodelled.append(f"{path}={json.dumps(value)}")
                continue
            name = MODELLED_ZERO[key]
            if key in ("overlap_comm", "contiguous_gradients"):
                knobs[name] = self.flag(path, value)
            elif value == "auto" and key in AUTO_HIDDEN:
                knobs[name] = AUTO_HIDDEN[key](self.hidden)
            else:
                knobs[name] = self.count(zero, path, value, low=1 if key in (
                    "reduce_bucket_size", "sub_group_size") else 0)
        if offload == "params" and stage != 3:
            raise self.error("zero_optimization.offload_param", zero["offload_param"],
                             "DeepSpeed offloads parameters only with stage 3")
        if "offload_param" in zero and offload == "params" and \
                self.offload_device("", zero.get("offload_optimizer", {})) == "none":
            raise self.error("zero_optimization.offload_optimizer",
                             zero.get("offload_optimizer"),
                             "zsim models parameter offload with the optimizer offloaded too")
        return DeepSpeedZero(**knobs, offload_device=device), offload

    def offload_device(self, path: str, section: Any) -> str:
        if not isinstance(section, dict):
            raise self.error(path, section, "must be an object")
        device = section.get("device", "none")
        if device not in ("none", "cpu", "nvme"):
            raise self.error(f"{path}.device", device, "must be none, cpu or nvme")
        for key in section:
            if key not in OFFLOAD_KEYS:
                raise self.error(f"{path}.{key}", section[key],
                                 "not a DeepSpeed 0.19 offload key"
                                 + nearest_key(key, OFFLOAD_KEYS))
        return str(device)


def bf16_key(data: dict[str, Any]) -> str:
    """The config's bf16 section: "bf16", else the older "bfloat16" where only it is given
    (DeepSpeed's get_bfloat16_config)."""
    return "bfloat16" if "bf16" not in data and "bfloat16" in data else "bf16"


def ds_plan(run: DeepSpeedRun, *, where: str, gpus: int, seq_len: int,
            strategy: str | None = None, micro_batch: int | None = None,
            grad_accum: int | None = None, precision: str | None = None,
            recompute: str = "none", offload: str | None = None) -> Plan:
    """The plan a config describes, completed by the caller's values where it says
    "auto" or nothing (defaults: micro-batch 1, no accumulation, bf16).

    Raises:
        ConfigError: a caller's value that contradicts the config (naming the config's
            key), a train_batch_size that does not match micro-batch x accumulation x
            GPUs (DeepSpeed refuses it), or a plan that cannot exist.
    """
    def pick(key: str, config: object, flag: str, given: object, default: object) -> Any:
        if config is not None and given is not None and config != given:
            raise ConfigError(f"{where}:{key}", config, f"but the command line says {flag} "
                              f"{given}")
        return config if config is not None else given if given is not None else default

    stage = pick("zero_optimization.stage", run.strategy, "--strategy", strategy, None)
    micro = pick("train_micro_batch_size_per_gpu", run.micro_batch, "--micro-batch",
                 micro_batch, 1)
    accum = run.grad_accum if run.grad_accum is not None else grad_accum
    if accum is None and run.train_batch_size is not None:
        accum, rest = divmod(run.train_batch_size, micro * gpus)
        if rest or not accum:
            raise ConfigError(f"{where}:train_batch_size", run.train_batch_size,
                              f"is not micro-batch {micro} x gpus {gpus} x a whole number")
    accum = pick("gradient_accumulation_steps", run.grad_accum, "--grad-accum", grad_accum,
                 accum if accum is not None else 1)
    if run.train_batch_size is not None and run.train_batch_size != micro * accum * gpus:
        raise ConfigError(f"{where}:train_batch_size", run.train_batch_size,
                          f"must equal micro-batch {micro} x accumulation {accum} x gpus {gpus}")
    knobs = precision_knobs(pick("bf16.enabled", run.precision, "--precision", precision,
                                 "bf16"))
    if run.reduce_dtype is not None:
        knobs["reduce_dtype"] = run.reduce_dtype
    off = pick("zero_optimization.offload_optimizer", run.offload if run.offload != "none"
               else None, "--offload", offload if offload != "none" else None, "none")
    return Plan.for_strategy(stage, gpus=gpus, seq_len=seq_len, micro_batch=micro,
                             grad_accum=accum, recompute=recompute, offload=off,
                             impl="deepspeed", options=run.ds, **knobs)
