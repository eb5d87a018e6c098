"""The nano model: the reference model at a width where its kernels cost almost nothing,
so that its step time is the host's (dispatch, autograd, hooks, collective calls), and
the plans it is timed under. The one nano model of every host-time measurement: the
micro-benchmarks' per-block host costs (zsim.calibration.host_bench), the library
programs' host time (zsim.calibration.program_overhead), the profile's check of which
nano calls synchronise (zsim.calibration.host_costs) and the GPU host sweep
(zsim.calibration.gpu_host_sweep).

Owns its shape (width 16, 2 heads, micro-batch 1 of 8 tokens; Llama's block or GPT's)
and its plans: FSDP2's by strategy (nano_plan), the plan of each key of the profile's
program overhead (program_plans, from the program registry) and the GPU host sweep's
configs (sweep_plan). Imports no torch.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any, Literal

from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.hardware import TP_OVERHEAD_KEY
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.programs import ProgramOptions, programs

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


NANO_OPTIONS: dict[type, ProgramOptions] = {DeepSpeedZero: NANO_DS}
"""The options of the nano runs, by options type (zsim.spec.programs.ProgramEntry.options);
a type not here runs with its defaults."""


def program_plans(world_size: int) -> dict[str, Plan]:
    """The plan timed for each key of host.program_overhead_us
    (zsim.spec.hardware.overhead_keys) this machine can run at `world_size`, by key: each
    program's overhead keys (zsim.spec.programs.OverheadKey: ZeRO-1/2/3 under DeepSpeed
    and ZeRO-2 with offload_optimizer, when DeepSpeed imports; FSDP1's FULL_SHARD and
    SHARD_GRAD_OP), with NANO_OPTIONS, and TP over 2 ranks (alone at world 2, under FSDP2
    over the other ranks at an even world above)."""
    mb, seq = NANO_TOKENS
    plans: dict[str, Plan] = {}
    for entry in programs():
        if entry.requires is not None and importlib.util.find_spec(entry.requires) is None:
            continue
        options = NANO_OPTIONS.get(entry.options) if entry.options is not None else None
        for key in entry.overhead_keys:
            plans[key.name] = nano_plan(key.strategy, world_size, impl=entry.name,
                                        offload=key.offload, options=options)
    if world_size % 2 == 0:
        plans[TP_OVERHEAD_KEY] = Plan(strategy="ddp" if world_size == 2 else "fsdp",
                                      dp_shard=world_size // 2, tp=2, seq_len=seq,
                                      micro_batch=mb)
    return plans


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
