"""The nano model: the reference model at a width where its kernels cost almost nothing,
so that its step time is the host's (dispatch, autograd, hooks, collective calls), and
the plans it is timed under. The one nano model of every host-time measurement: the
micro-benchmarks' per-block host costs (zsim.calibration.host_bench), the library
programs' host time (zsim.calibration.program_overhead), the profile's check of which
nano calls synchronise (zsim.calibration.host_costs) and the GPU host sweep
(zsim.calibration.gpu_host_sweep).

Owns its shape (width 16, 2 heads, micro-batch 1 of 8 tokens; Llama's block or GPT's)
and its plans: FSDP2's by strategy (nano_plan), each library program's
(program_plans) and the GPU host sweep's configs (sweep_plan). Imports no torch.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any, Literal

from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.hardware import overhead_programs
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

NANO_TOKENS: tuple[int, int] = (1, 8)
"""(micro-batch, sequence) of the nano model's steps."""

NanoBlock = Literal["llama", "gpt"]


def nano_model(num_layers: int, *, block: NanoBlock = "llama") -> ModelSpec:
    """The reference Llama at width 16 (8 tokens): its kernels cost almost nothing, so
    its step time is the host's (dispatch, autograd, hooks, collective calls). With
    block="gpt", GPT's block at the same width (LayerNorm and linears with biases, GELU
    MLP, learned positions, tied embeddings): 16 parameter tensors a block to Llama's 9."""
    llama = ModelSpec(name="nano", num_layers=num_layers, d_model=16, num_heads=2,
                      num_kv_heads=2, ffn_hidden=32, vocab_size=64, max_seq_len=NANO_TOKENS[1])
    if block == "gpt":
        return replace(llama, name="nano-gpt", ffn_hidden=64, mlp="gelu", norm="layernorm",
                       bias=True, learned_pos_emb=True, tied_embeddings=True)
    return llama


def nano_plan(strategy: str, world_size: int, **changes: Any) -> Plan:
    """Plan.for_strategy(strategy) at world `world_size` on the nano model's tokens, with
    `changes` (Plan.for_strategy's keyword arguments)."""
    micro_batch, seq_len = NANO_TOKENS
    return Plan.for_strategy(strategy, gpus=world_size, seq_len=seq_len,
                             micro_batch=micro_batch, **changes)


NANO_DS = DeepSpeedZero(reduce_bucket_size=500_000, allgather_bucket_size=500_000,
                        prefetch_bucket_size=500_000, param_persistence_threshold=0)
"""DeepSpeed knobs of the nano runs: every parameter partitioned and fetched under ZeRO-3
(DeepSpeed's default threshold, 1e5 elements, would keep all of the nano model's whole),
and buckets that hold the whole nano model (the defaults' 5e8-element buckets are 1 GB
buffers allocated every backward)."""


def program_plans(world_size: int) -> dict[str, Plan]:
    """The plan timed for each program of zsim.spec.hardware.OVERHEAD_PROGRAMS this
    machine can run at `world_size`: ZeRO-1/2/3 under DeepSpeed, and ZeRO-2 with
    offload_optimizer (when DeepSpeed imports), FSDP1's FULL_SHARD and SHARD_GRAD_OP,
    TP over 2 ranks (alone at world 2, under FSDP2 over the other ranks at an even world
    above)."""
    mb, seq = NANO_TOKENS
    plans = [nano_plan(s, world_size, impl="fsdp1") for s in ("fsdp", "fsdp-no-reshard")]
    if importlib.util.find_spec("deepspeed") is not None:
        plans += [nano_plan(s, world_size, ds=NANO_DS) for s in ("zero1", "zero2", "zero3")]
        plans.append(nano_plan("zero2", world_size, ds=NANO_DS, offload="optimizer"))
    if world_size % 2 == 0:
        plans.append(Plan(strategy="ddp" if world_size == 2 else "fsdp",
                          dp_shard=world_size // 2, tp=2, seq_len=seq, micro_batch=mb))
    # Each plan runs one program: keyed as the lowering looks it up (its first key).
    return {overhead_programs(p)[0][0]: p for p in plans}


SWEEP_CONFIGS: tuple[str, ...] = ("plain", "fsdp", "fsdp_unit4", "fsdp_no_reshard",
                                  "fsdp_ac_full", "fsdp_ac_selective", "fsdp_offload")
"""Programs of the GPU host sweep: "plain" is the unsharded bf16 model with
AdamW(foreach); the rest FSDP2 as the backend applies it (zsim.backend.fsdp2): per block,
per 4 blocks, without resharding, with full or selective recomputation, with
CPUOffloadPolicy. (DDP cannot run on the fake process group: its communication hook gets
no tensor back.)"""

QUICK_SWEEP_CONFIGS: tuple[str, ...] = ("plain", "fsdp", "fsdp_unit4")

_SWEEP_CHANGES: dict[str, dict[str, Any]] = {
    "fsdp_unit4": {"unit_size": 4}, "fsdp_no_reshard": {"strategy": "fsdp-no-reshard"},
    "fsdp_ac_full": {"recompute": "full"}, "fsdp_ac_selective": {"recompute": "selective"},
    "fsdp_offload": {"offload": "params"}}


def sweep_plan(config: str, world_size: int) -> Plan:
    """The Plan a SWEEP_CONFIGS entry runs (plain: its dtypes only)."""
    return replace(nano_plan("fsdp", world_size), **_SWEEP_CHANGES.get(config, {}))
