"""Cross-object rules for a (model, hardware, plan) triple, in one place.

Owns every check that needs more than one spec object (single-field ranges live in each
dataclass's `__post_init__`); raises zsim.errors.ConfigError naming the field and its value.
Imports only zsim.errors and zsim.spec. Positivity of sizes (micro-batch, sequence, degrees)
is already enforced by `Plan.__post_init__`, so micro_batch * seq_len is positive for any
Plan that exists.

References: Megatron-LM (Shoeybi et al. 2019, Sec. 3) splits attention heads across tensor-
parallel ranks, so heads and kv heads must divide by tp; pipeline stages hold whole blocks
(Narayanan et al. 2021), so layers must divide by pp; torchtitan's ParallelDims checks that
dp_shard * dp_replicate * tp * pp equals the world size.
"""

from __future__ import annotations

from zsim.errors import ConfigError
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


def validate(model: ModelSpec, hw: HardwareProfile, plan: Plan, *,
             gpus: int | None = None) -> None:
    """Check that `plan` can run `model` on `gpus` GPUs of `hw`.

    Rules: world size (dp_shard * dp_replicate * tp * pp) equals `gpus` when given, and the
    shard group divides it (an HSDP shard group may span nodes); attention heads and kv heads
    divide by tp; layers divide by pp; a unit holds at most all layers; a model with learned
    position embeddings cannot train past its table; the compute dtype has a peak in `hw`.

    Args:
        model: the transformer.
        hw: the cluster; its peak table must cover plan.param_dtype.
        plan: the parallel plan.
        gpus: total GPUs of the job, or None to skip the world-size rules.

    Raises:
        ConfigError: the first rule that fails, naming the field and its value.
    """
    if gpus is not None:
        _check_world(plan, gpus)
    _check_model_split(model, plan)
    _check_sequence(model, plan)
    if plan.param_dtype not in hw.peak_flop_per_s:
        raise ConfigError("plan.param_dtype", plan.param_dtype,
                          f"hardware {hw.name} has no peak for it; it has "
                          f"{', '.join(sorted(hw.peak_flop_per_s))}")


def _check_world(plan: Plan, gpus: int) -> None:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
        raise ConfigError("gpus", gpus, "must be a positive integer")
    # Checked before the product so that a bad HSDP group is reported as such.
    if gpus % plan.dp_shard:
        raise ConfigError("plan.dp_shard", plan.dp_shard, f"must divide gpus={gpus}")
    if plan.world_size != gpus:
        raise ConfigError(
            "gpus", gpus,
            f"plan world size is dp_shard*dp_replicate*tp*pp = {plan.dp_shard}*"
            f"{plan.dp_replicate}*{plan.tp}*{plan.pp} = {plan.world_size}")


def _check_model_split(model: ModelSpec, plan: Plan) -> None:
    if model.num_heads % plan.tp:
        raise ConfigError("plan.tp", plan.tp,
                          f"must divide model.num_heads={model.num_heads}")
    if model.num_kv_heads % plan.tp:
        raise ConfigError("plan.tp", plan.tp,
                          f"must divide model.num_kv_heads={model.num_kv_heads}")
    if model.num_layers % plan.pp:
        raise ConfigError("plan.pp", plan.pp,
                          f"must divide model.num_layers={model.num_layers}")
    if plan.unit_size > model.num_layers:
        raise ConfigError("plan.unit_size", plan.unit_size,
                          f"exceeds model.num_layers={model.num_layers}")


def _check_sequence(model: ModelSpec, plan: Plan) -> None:
    if model.learned_pos_emb and plan.seq_len > model.max_seq_len:
        raise ConfigError("plan.seq_len", plan.seq_len,
                          f"exceeds the learned position table, model.max_seq_len="
                          f"{model.max_seq_len}")
