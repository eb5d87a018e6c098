"""Apply a zsim Plan with tensor parallelism (plan.tp > 1): the reference Llama model
parallelised with torch.distributed.tensor.parallel.parallelize_module as torchtitan's
Llama plan does, alone or under FSDP2 on a 2-D DeviceMesh, and its step.

The TP plan (torchtitan parallelize_llama.apply_tp), per block: attention wq, wk, wv
ColwiseParallel (each rank holds num_heads/tp query heads and num_kv_heads/tp kv heads),
wo RowwiseParallel; feed_forward w1, w3 ColwiseParallel, w2 RowwiseParallel. Around the
blocks: tok_embeddings RowwiseParallel (the table sharded on the vocabulary, the lookup
all-reduced), output ColwiseParallel with a replicated output (the logits all-gathered,
no loss parallelism). The norms keep whole, replicated weights, and every rank computes
them on the whole sequence; with plan.sp (sequence parallelism, Korthikanti et al. 2022)
they are SequenceParallel instead: the residual stream is sharded on the sequence, the
embedding's and each row-wise projection's output reduce-scattered onto it, and
PrepareModuleInput all-gathers it before attention and the MLP, as torchtitan always runs.
Without SP attention and the MLP take a PrepareModuleInput too (replicated in,
replicated out), as torchtitan's: their column-wise projections share one DTensor input,
so its gradient is reduced once per module (Megatron-LM's f), not once per projection.

The mesh is ("dp", "tp") of dp_degree x tp ranks, TP innermost (torchtitan's
ParallelDims order: a rank's TP peers are its neighbours). With dp_shard 1 (strategy
"ddp", one data-parallel rank) the model trains in fp32 parameters under autocast to the
plan's param dtype, as the DDP runner does; with fsdp or fsdp-no-reshard, fully_shard
runs over the "dp" axis after parallelize_module over "tp" (zsim.backend.fsdp2.shard:
units, mixed precision, reshard after forward), so each weight is a 2-D DTensor sharded
on dim 0 over dp and on its TP dim over tp. Recomputation wraps the blocks between the
two (torchtitan's order: TP, activation checkpointing, FSDP). The data is the same on
every rank of a TP group (zsim.backend.training.data_rank). Imports torch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from zsim.backend.fsdp2 import (
    LEARNING_RATE,
    TORCH_DTYPES,
    apply_recompute,
    backward_loss,
    materialise,
    shard,
    stepper,
    syncer,
    units_of,
)
from zsim.backend.reference_model import Transformer
from zsim.backend.training import Prepared
from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


def check_plan(plan: Plan, world_size: int, spec: ModelSpec) -> None:
    """What this backend runs with tensor parallelism.

    Raises:
        ConfigError: pp > 1, a world size that differs from the plan's, a strategy other
            than ddp with one data-parallel rank, fsdp or fsdp-no-reshard (FSDP2), heads,
            kv heads, MLP width or vocabulary not divisible by tp, a GPT-style model
            (learned positions or tied embeddings: torchtitan's plan is Llama's), a unit
            size that does not divide the layers, or an optimizer other than adamw.
    """
    if plan.pp != 1:
        raise ConfigError("plan.pp", plan.pp, "the TP backend runs no pipeline (pp 1)")
    if plan.world_size != world_size:
        raise ConfigError("plan.world_size", plan.world_size,
                          f"must equal the number of processes ({world_size})")
    if plan.strategy == "ddp" and plan.dp_degree != 1:
        raise ConfigError("plan.dp_replicate", plan.dp_replicate,
                          "TP without FSDP runs one data-parallel rank (1)")
    if plan.strategy not in ("ddp", "fsdp", "fsdp-no-reshard") or plan.impl == "fsdp1":
        raise ConfigError("plan.strategy", plan.label,
                          "TP runs alone (ddp, one rank) or under FSDP2 (fsdp, "
                          "fsdp-no-reshard)")
    for name, size in (("num_heads", spec.num_heads), ("num_kv_heads", spec.num_kv_heads),
                       ("ffn_hidden", spec.ffn_hidden), ("vocab_size", spec.vocab_size)):
        if size % plan.tp:
            raise ConfigError("plan.tp", plan.tp, f"must divide model.{name}={size}")
    if spec.learned_pos_emb or spec.tied_embeddings:
        raise ConfigError("model.tied_embeddings" if spec.tied_embeddings
                          else "model.learned_pos_emb", True,
                          "the TP backend runs torchtitan's Llama plan (RoPE, untied output)")
    if spec.num_layers % plan.unit_size:
        raise ConfigError("plan.unit_size", plan.unit_size,
                          f"must divide num_layers={spec.num_layers}")
    if plan.optimizer != "adamw":
        raise ConfigError("plan.optimizer", plan.optimizer, "the TP backend runs adamw")


def tp_plan(inner: Transformer, *, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """torchtitan's Llama TP plan for `inner`, by module name (see the module docstring).

    Args:
        inner: the model (its blocks not yet wrapped for recomputation).
        sequence_parallel: shard the norms and the residual stream on the sequence.
    """
    stream = Shard(1) if sequence_parallel else Replicate()
    styles: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=stream),
        "output": ColwiseParallel(input_layouts=stream, output_layouts=Replicate()),
    }
    if sequence_parallel:
        styles["norm"] = SequenceParallel()
    for i in range(len(inner.layers)):
        block = f"layers.{i}"
        styles |= {f"{block}.attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")}
        styles |= {f"{block}.feed_forward.{w}": ColwiseParallel() for w in ("w1", "w3")}
        styles[f"{block}.attention.wo"] = RowwiseParallel(output_layouts=stream)
        styles[f"{block}.feed_forward.w2"] = RowwiseParallel(output_layouts=stream)
        if sequence_parallel:
            styles[f"{block}.attention_norm"] = SequenceParallel()
            styles[f"{block}.ffn_norm"] = SequenceParallel()
        # One replicated DTensor input per module, shared by its column-wise projections,
        # so that their input gradients are summed as partial DTensors and reduced once
        # (a reduce-scatter onto the sequence shards with SP, an all-reduce without);
        # each projection turning a plain tensor into its own DTensor would reduce its
        # gradient alone (five calls a block). The RoPE tables pass through (layout None).
        styles[f"{block}.attention"] = PrepareModuleInput(
            input_layouts=(stream, None), desired_input_layouts=(Replicate(), None))
        styles[f"{block}.feed_forward"] = PrepareModuleInput(
            input_layouts=(stream,), desired_input_layouts=(Replicate(),))
    return styles


def mesh_of(plan: Plan, device: str) -> DeviceMesh:
    """The ("dp", "tp") mesh of `plan`, TP innermost."""
    return init_device_mesh(device.split(":")[0], (plan.dp_degree, plan.tp),
                            mesh_dim_names=("dp", "tp"))


def prepare(spec: ModelSpec, plan: Plan, *, device: str, world_size: int) -> Prepared:
    """Build the model on the meta device, parallelise it over the TP axis, wrap its
    blocks for recomputation, fully_shard it over the DP axis (fsdp strategies), then
    allocate and initialise it on `device`.

    Raises:
        ConfigError: see check_plan.
    """
    check_plan(plan, world_size, spec)
    torch.manual_seed(0)
    mesh = mesh_of(plan, device)
    with torch.device("meta"):
        inner = Transformer(spec)
    parallelize_module(inner, mesh["tp"], tp_plan(inner, sequence_parallel=plan.sp))
    apply_recompute(inner, plan)
    fsdp = plan.strategy != "ddp"
    if fsdp:
        shard(inner, plan, mesh["dp"])
    materialise(inner, device)
    # Without SP the norm weights stay plain tensors, and foreach AdamW cannot mix them
    # with DTensors in one call: a param group each (AdamW steps group by group).
    params = list(inner.parameters())
    groups = [{"params": g} for g in ([p for p in params if isinstance(p, DTensor)],
                                      [p for p in params if not isinstance(p, DTensor)]) if g]
    optimizer = torch.optim.AdamW(groups, lr=LEARNING_RATE, foreach=True)
    dtype = TORCH_DTYPES[plan.param_dtype]
    autocast: Any = None if fsdp or dtype == torch.float32 else dtype
    return Prepared(model=inner, inner=inner, units=units_of(inner), backward=backward_loss,
                    step=stepper(optimizer), sync=syncer(inner), autocast_dtype=autocast)
