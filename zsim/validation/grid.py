"""The validation grid: the (model, plan) cases of the CPU validation report
(zsim.validation.report), by model and program family, and a case's name (case_key) for
`--only`. Imports torch (the reference model's scale_model).
"""

from __future__ import annotations

from typing import Any

from zsim.backend.reference_model import scale_model
from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.presets import PRESETS
from zsim.spec.programs import ProgramOptions, programs

GRID_STRATEGIES: tuple[str, ...] = ("ddp", "fsdp", "fsdp-no-reshard")
"""Strategies of the report grid run by torch (DDP, FSDP2), plus hsdp 2x2 at world 4."""

GRID_DS = DeepSpeedZero(reduce_bucket_size=500_000, allgather_bucket_size=500_000,
                        prefetch_bucket_size=500_000, param_persistence_threshold=1_000)
"""DeepSpeed knobs of the report's ZeRO plans, scaled to its d_model-256 models as
DeepSpeed's defaults are to billion-parameter ones: buckets of about half a million
elements (a block or two, not the whole model: the defaults' 5e8-element buckets are
1 GB buffers that would swamp every other term of the peak), and only the norms and
the d-wide biases whole (persistent) under ZeRO-3, not every 256 x 256 weight."""

KNOBS: dict[str, Any] = {"seq_len": 256, "micro_batch": 2}
"""Sequence and micro-batch of every plan of the grid."""


LLAMA_TINY = ModelSpec(name="llama-tiny", num_layers=4, d_model=256, num_heads=4,
                       num_kv_heads=2, ffn_hidden=688, vocab_size=2048, max_seq_len=256)
"""The report's small Llama block (GQA, SwiGLU, RMSNorm, RoPE, untied)."""
GPT_TINY = ModelSpec(name="gpt-tiny", num_layers=4, d_model=256, num_heads=4, num_kv_heads=4,
                     ffn_hidden=1024, mlp="gelu", norm="layernorm", bias=True,
                     vocab_size=2048, tied_embeddings=True, learned_pos_emb=True,
                     max_seq_len=256)
"""The report's small GPT block, GPT-3's structure at llama-tiny's size (LayerNorm with
biases, biased projections, GELU MLP of 4d, learned positions, tied embeddings)."""


def grid_models() -> list[ModelSpec]:
    """The models of the report's torch plans: a 4-block GQA Llama and Llama-3-8B scaled
    to d_model 256 (all 32 blocks kept), both small enough for 2 CPU cores."""
    return [LLAMA_TINY, scale_model(PRESETS["llama3-8b"], d_model=256, vocab_size=2048,
                                    max_seq_len=256)]


def grid_plans(world_sizes: tuple[int, ...] = (2, 4)) -> list[Plan]:
    """Torch plans of the report grid: every GRID_STRATEGIES entry at each world size,
    hsdp with shard groups of 2 where the world allows two groups, and fsdp with selective
    and full recomputation at the smallest world size."""
    plans = [Plan.for_strategy(s, gpus=n, **KNOBS)
             for n in world_sizes for s in GRID_STRATEGIES]
    plans += [Plan.for_strategy("hsdp", gpus=n, shard_group=2, **KNOBS)
              for n in world_sizes if n >= 4]
    plans += [Plan.for_strategy("fsdp", gpus=world_sizes[0], recompute=r, **KNOBS)
              for r in ("selective", "full")]
    return plans


GRID_OPTIONS: dict[type, ProgramOptions] = {DeepSpeedZero: GRID_DS}
"""The options of the grid's library plans, by options type
(zsim.spec.programs.ProgramEntry.options); a type not here runs with its defaults."""


def library_plans(world_sizes: tuple[int, ...] = (2, 4)) -> list[Plan]:
    """Plans of the report grid run by the library programs at each world size: the plan
    of each key of the profile's program overhead (zsim.spec.programs.OverheadKey, as
    zsim.calibration.nano.program_plans times them), with GRID_OPTIONS: ZeRO-1, ZeRO-2,
    ZeRO-3 and ZeRO-2 with the optimizer offloaded to the CPU under DeepSpeed, and
    FSDP1's FULL_SHARD (fsdp) and SHARD_GRAD_OP (fsdp-no-reshard)."""
    return [Plan.for_strategy(key.strategy, gpus=n, impl=entry.name, offload=key.offload,
                              options=GRID_OPTIONS.get(entry.options)
                              if entry.options is not None else None, **KNOBS)
            for n in world_sizes for entry in programs() for key in entry.overhead_keys]


def parallel_plans() -> list[Plan]:
    """Plans of the report grid with tensor or pipeline parallelism,
    one data-parallel rank unless said: TP over 2 ranks (zsim.backend.tensor_parallel),
    FSDP2 x TP on a 2 x 2 mesh of 4 ranks, and a 2-stage 1F1B pipeline over 4
    micro-batches (zsim.backend.pipelining)."""
    return [Plan(strategy="ddp", dp_shard=1, tp=2, **KNOBS),
            Plan(strategy="fsdp", dp_shard=2, tp=2, **KNOBS),
            Plan(strategy="ddp", dp_shard=1, pp=2, grad_accum=4, **KNOBS)]


def grid() -> list[tuple[ModelSpec, Plan]]:
    """Every (model, plan) of the report: the torch plans on both grid_models, the
    library plans on llama-tiny and gpt-tiny, the parallel plans on llama-tiny."""
    cases = [(m, p) for m in grid_models() for p in grid_plans()]
    cases += [(m, p) for m in (LLAMA_TINY, GPT_TINY) for p in library_plans()]
    return cases + [(LLAMA_TINY, p) for p in parallel_plans()]


def case_key(spec: ModelSpec, plan: Plan) -> str:
    """A case's name for --only, as its rows name it: "<model> <plan label> n<N>" (the
    label names a program other than the strategy's default, e.g. fsdp[fsdp1])."""
    return f"{spec.name} {plan.label} n{plan.world_size}"
