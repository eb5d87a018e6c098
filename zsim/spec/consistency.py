"""Consistency of a (model, hardware, plan) triple: the cross-object rules, in one place.

Owns `check_plan`: every check that needs more than one spec object (single-field ranges
live in each dataclass's `__post_init__`); raises zsim.errors.ConfigError naming the field
and its value. Imports only zsim.errors and zsim.spec. Positivity of sizes (micro-batch,
sequence, degrees) is already enforced by `Plan.__post_init__`, so micro_batch * seq_len is
positive for any Plan that exists. Checking a plan is not validating it: "validate" is
kept for comparing predictions with real runs (see "check vs validate" in
zsim/__init__.py).

References: Megatron-LM (Shoeybi et al. 2019, Sec. 3) splits attention heads across tensor-
parallel ranks, so heads and kv heads must divide by tp; pipeline stages hold whole blocks
(Narayanan et al. 2021), so layers must divide by pp x virtual stages; torchtitan's
ParallelDims checks that dp_shard * dp_replicate * cp * tp * pp equals the world size.
torch.distributed.pipelining: Schedule1F1B needs at least pp micro-batches,
ScheduleInterleaved1F1B a micro-batch count that divides into rounds of pp. torch's
context_parallel (_load_balancer.py, _HeadTailLoadBalancer) splits each sequence into
2 x cp chunks. TP lives inside a node (its all-reduces per block need NVLink) unless the
plan says otherwise.
"""

from __future__ import annotations

from zsim.errors import ConfigError
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


def check_plan(model: ModelSpec, hw: HardwareProfile, plan: Plan, *,
               gpus: int | None = None) -> None:
    """Check that `plan` can run `model` on `gpus` GPUs of `hw`.

    Rules: world size (dp_shard * dp_replicate * cp * tp * pp) equals `gpus` when given,
    expert parallelism only on an MoE model whose experts it divides (without a pipeline or
    TP),
    and the shard group divides it (an HSDP shard group may span nodes); attention heads
    and kv heads divide by tp; an HSDP shard group (with the model-parallel ranks
    inside it) divides a node or is whole nodes; a TP group fits in a node and divides it
    unless plan.tp_across_nodes; layers divide by pp x virtual stages; the pipeline's
    micro-batches (grad_accum) suit its schedule; the sequence divides by 2 x cp, and by
    tp with sequence parallelism; a unit holds at most all layers (of a stage); a model
    with learned position embeddings cannot train past its table, nor one with a sliding
    attention window past the window (not modelled); fp32 RoPE tables need a program
    that casts them or autocast; the compute dtype has a peak in `hw`.

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
    _check_placement(hw, plan)
    _check_pipeline(plan)
    _check_sequence(model, plan)
    _check_rope_tables(model, plan)
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
            f"plan world size is dp_shard*dp_replicate*cp*tp*pp = {plan.dp_shard}*"
            f"{plan.dp_replicate}*{plan.cp}*{plan.tp}*{plan.pp} = {plan.world_size}")


def _check_model_split(model: ModelSpec, plan: Plan) -> None:
    if plan.ep > 1 and model.moe is None:
        raise ConfigError("plan.ep", plan.ep, f"expert parallelism needs a mixture-of-"
                          f"experts model; {model.name or 'this model'} is dense")
    if model.moe is not None and model.moe.experts % plan.ep:
        raise ConfigError("plan.ep", plan.ep,
                          f"must divide the model's {model.moe.experts} experts")
    if plan.ep > 1 and plan.tp > 1 and not plan.sp:
        raise ConfigError("plan.sp", plan.sp, "expert parallelism with tensor parallelism "
                          "is modelled with sequence parallelism (torchtitan routes each TP "
                          "rank's sequence shard): set sp")
    if model.num_heads % plan.tp:
        raise ConfigError("plan.tp", plan.tp,
                          f"must divide model.num_heads={model.num_heads}")
    if model.num_kv_heads % plan.tp:
        raise ConfigError("plan.tp", plan.tp,
                          f"must divide model.num_kv_heads={model.num_kv_heads}")
    stages = plan.pp * plan.virtual_stages
    if model.num_layers % stages:
        field, value = (("plan.virtual_stages", plan.virtual_stages) if plan.virtual_stages > 1
                        else ("plan.pp", plan.pp))
        raise ConfigError(field, value,
                          f"pp x virtual stages = {stages} must divide model.num_layers="
                          f"{model.num_layers}")
    if plan.unit_size > model.num_layers // stages:
        raise ConfigError("plan.unit_size", plan.unit_size,
                          f"exceeds the {model.num_layers // stages} layers of a pipeline stage"
                          if stages > 1 else f"exceeds model.num_layers={model.num_layers}")


def _check_placement(hw: HardwareProfile, plan: Plan) -> None:
    per_node, node, key = hw.domain_gpus, hw.domain_name, "nvlink_domain_gpus"
    span = plan.tp * plan.cp * plan.pp * plan.dp_shard
    if plan.dp_replicate > 1 and plan.dp_shard > 1 and per_node % span and span % per_node:
        # Consecutive groups of `span` ranks: some would hold ranks of two nodes.
        named = "" if span == plan.dp_shard else " (tp x cp x pp x dp_shard)"
        raise ConfigError("plan.dp_shard", plan.dp_shard,
                          f"an HSDP shard group spans {span} GPUs{named}, {span / per_node:g} "
                          f"{node}s of {per_node} ({hw.name}): groups would straddle {node}s; "
                          f"it must divide a {node} or be whole {node}s")
    if plan.tp_across_nodes:
        return
    if plan.tp > per_node:
        raise ConfigError("plan.tp", plan.tp,
                          f"exceeds the {per_node} GPUs of a {hw.name} {node}: TP across "
                          f"{node}s needs plan.tp_across_nodes")
    if per_node % plan.tp:
        raise ConfigError("plan.tp", plan.tp,
                          f"must divide {'gpus_per_node' if node == 'node' else key}"
                          f"={per_node} (a TP group would straddle {node}s; "
                          "plan.tp_across_nodes allows it)")


def _check_pipeline(plan: Plan) -> None:
    m = plan.grad_accum
    if plan.pp_schedule == "1f1b" and plan.pp > 1 and m < plan.pp:
        raise ConfigError("plan.grad_accum", m,
                          f"1F1B needs at least pp={plan.pp} micro-batches")
    if plan.pp_schedule == "interleaved":
        rounds = max(1, m // plan.pp)
        if m % rounds:
            raise ConfigError("plan.grad_accum", m,
                              f"interleaved 1F1B needs a multiple of its {rounds} rounds")


def _check_rope_tables(model: ModelSpec, plan: Plan) -> None:
    """fp32 RoPE tables (ModelSpec.rope_table_dtype) reach a 16-bit block as the program
    hands them over: FSDP2's MixedPrecisionPolicy casts them at each block
    (Plan.casts_block_inputs), and under autocast (torch DDP and ZeroRedundancyOptimizer
    with master-dtype parameters: Plan.runs_autocast) the residual stream they multiply
    is fp32 anyway; any other program would rotate q and k in fp32 by type promotion,
    which is not modelled."""
    if (model.rope_table_dtype == "fp32" and not model.learned_pos_emb
            and plan.param_dtype != "fp32" and not plan.casts_block_inputs
            and not plan.runs_autocast):
        raise ConfigError("model.rope_table_dtype", model.rope_table_dtype,
                          f"modelled with FSDP2 (it casts each block's inputs) or autocast; "
                          f"{plan.impl} with {plan.param_dtype} compute would rotate q and k "
                          f"in fp32")


def _check_sequence(model: ModelSpec, plan: Plan) -> None:
    if plan.cp > 1 and plan.seq_len % (2 * plan.cp):
        raise ConfigError("plan.seq_len", plan.seq_len,
                          f"must divide into 2 x cp = {2 * plan.cp} chunks (load-balanced "
                          "ring attention)")
    if plan.sp and plan.seq_len % plan.tp:
        raise ConfigError("plan.seq_len", plan.seq_len,
                          f"sequence parallelism shards it over tp={plan.tp}: must divide")
    if model.sliding_window and plan.seq_len > model.sliding_window:
        raise ConfigError("plan.seq_len", plan.seq_len,
                          f"exceeds the model's sliding_window={model.sliding_window}: "
                          "attention over a window shorter than the sequence is not modelled "
                          "(zsim simulates full causal attention)")
    if model.learned_pos_emb and plan.seq_len > model.max_seq_len:
        raise ConfigError("plan.seq_len", plan.seq_len,
                          f"exceeds the learned position table, model.max_seq_len="
                          f"{model.max_seq_len}")
