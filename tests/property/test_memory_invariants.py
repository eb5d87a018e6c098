"""Property tests for closed-form memory (docs/validation.md, the ladder's invariants).

- Per-rank parameter + gradient + master + optimizer bytes never increase as the ZeRO
  stage rises (ddp -> zero1 -> zero2 -> fsdp) or as dp_shard rises.
- Sharded bytes x dp_shard >= unsharded bytes (padding could only add).
- On the same GPUs, more context parallelism never grows an FSDP plan's per-rank state
  (FSDP shards it over dp_shard x cp, torchtitan's dp_shard_cp), closed form and FSDP2's.
- A plan that fits with micro-batch 2 fits with micro-batch 1.
- Activation bytes: full <= selective <= none, and linear in the micro-batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st
from plan_strategies import build_plan, models, plan_knobs

from zsim.analytic.activations import block_activation_bytes
from zsim.analytic.memory import estimate_memory, model_state_bytes
from zsim.errors import ConfigError
from zsim.planner import evaluate
from zsim.schedule.lower import rank_model, state_at_rest_bytes
from zsim.spec.model import ModelSpec
from zsim.spec.registry import resolve_hardware
from zsim.units import GiB, dtype_bytes

NUM_PARAMS = st.integers(1, 10**12)
SHARDING = ("zero1", "zero2", "fsdp", "fsdp-no-reshard", "hsdp")
H100 = resolve_hardware("dgx-h100")


@given(num_params=NUM_PARAMS, gpus=st.integers(1, 1024), knobs=plan_knobs())
def test_state_never_grows_with_zero_stage(num_params: int, gpus: int,
                                           knobs: dict[str, Any]) -> None:
    ladder = [build_plan(strategy="ddp", dp_shard=1, dp_replicate=gpus, **knobs)]
    ladder += [build_plan(strategy=s, dp_shard=gpus, **knobs)
               for s in ("zero1", "zero2", "fsdp")]
    totals = [model_state_bytes(num_params, p).total for p in ladder]
    assert totals == sorted(totals, reverse=True), totals


@given(num_params=NUM_PARAMS, strategy=st.sampled_from(SHARDING),
       shards=st.lists(st.integers(1, 1024), min_size=2, max_size=2, unique=True),
       replicas=st.integers(1, 16), knobs=plan_knobs())
def test_state_never_grows_with_dp_shard(num_params: int, strategy: str, shards: list[int],
                                         replicas: int, knobs: dict[str, Any]) -> None:
    few, many = sorted(shards)
    small = model_state_bytes(num_params, build_plan(
        strategy=strategy, dp_shard=many, dp_replicate=replicas, **knobs))
    large = model_state_bytes(num_params, build_plan(
        strategy=strategy, dp_shard=few, dp_replicate=replicas, **knobs))
    for category, value in small.as_dict().items():
        assert value <= large.as_dict()[category], category
    assert small.total <= large.total


@given(num_params=NUM_PARAMS, strategy=st.sampled_from(SHARDING),
       dp_shard=st.integers(2, 4096), knobs=plan_knobs())
def test_shards_cover_the_whole_state(num_params: int, strategy: str, dp_shard: int,
                                      knobs: dict[str, Any]) -> None:
    sharded = model_state_bytes(num_params, build_plan(strategy=strategy, dp_shard=dp_shard,
                                                       **knobs))
    whole = model_state_bytes(num_params, build_plan(strategy=strategy, dp_shard=1, **knobs))
    for category, value in sharded.as_dict().items():
        assert value * dp_shard >= whole.as_dict()[category], category


@given(model=models(), strategy=st.sampled_from(("fsdp", "fsdp-no-reshard", "hsdp")),
       tp=st.sampled_from([1, 2, 4]), dp=st.integers(1, 16), shard=st.integers(1, 16),
       cps=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=2, max_size=2, unique=True),
       knobs=plan_knobs())
def test_state_never_grows_with_cp_on_the_same_gpus(model: ModelSpec, strategy: str, tp: int,
                                                   dp: int, shard: int, cps: list[int],
                                                   knobs: dict[str, Any]) -> None:
    assume(model.num_heads % tp == 0 and model.num_kv_heads % tp == 0)
    few, many = sorted(cps)
    gpus = tp * many * dp  # the world size of both plans
    plans = []
    for cp in (few, many):
        data = gpus // (tp * cp)
        # hsdp keeps its dp_shard (the shard group flag); fsdp shards every dp rank.
        s = shard if strategy == "hsdp" else data
        assume(data % s == 0)
        plans.append(build_plan(strategy=strategy, dp_shard=s, dp_replicate=data // s, tp=tp,
                                cp=cp, sp=tp > 1, **knobs))
    low, high = plans
    assert low.world_size == high.world_size == gpus
    local = rank_model(model, low)
    closed = [model_state_bytes(local.num_params, p) for p in plans]
    for category, value in closed[1].as_dict().items():
        assert value <= closed[0].as_dict()[category], category
    program = [sum(state_at_rest_bytes(model, p).values()) for p in plans]
    assert program[1] <= program[0]
    if strategy != "hsdp":  # the same dp_shard x cp ranks: the same state
        assert closed[1] == closed[0] and program[1] == program[0]


@given(model=models(), strategy=st.sampled_from(("ddp", *SHARDING)), gpus=st.integers(1, 64),
       knobs=plan_knobs(), hbm_gib=st.floats(0.01, 200))
def test_fits_with_micro_batch_2_implies_fits_with_1(model: ModelSpec, strategy: str,
                                                    gpus: int, knobs: dict[str, Any],
                                                    hbm_gib: float) -> None:
    hw = dataclasses.replace(H100, hbm_bytes=hbm_gib * GiB)
    knobs = {**knobs, "unit_size": min(knobs["unit_size"], model.num_layers)}
    degrees = ({"dp_shard": 1, "dp_replicate": gpus} if strategy == "ddp"
               else {"dp_shard": gpus})
    one = build_plan(strategy=strategy, **degrees, **{**knobs, "micro_batch": 1})
    two = dataclasses.replace(one, micro_batch=2)
    try:
        fits_two, fits_one = evaluate(model, hw, two).fits, evaluate(model, hw, one).fits
    except ConfigError:  # check_plan() refused the combination: not a plan a user can run
        return
    assert estimate_memory(model, one).peak_bytes <= estimate_memory(model, two).peak_bytes
    assert fits_one or not fits_two


@given(model=models(), micro_batch=st.integers(1, 8),
       seq_len=st.sampled_from([64, 256, 1024, 4096]), act_bytes=st.sampled_from([2, 4]))
def test_block_activations_full_le_selective_le_none(model: ModelSpec, micro_batch: int,
                                                     seq_len: int, act_bytes: int) -> None:
    full, selective, none = (
        block_activation_bytes(model, micro_batch=micro_batch, seq_len=seq_len,
                               recompute=r, act_bytes=act_bytes)
        for r in ("full", "selective", "none"))
    assert 0 < full <= selective <= none


@given(model=models(), knobs=plan_knobs())
def test_estimated_activations_full_le_selective_le_none(model: ModelSpec,
                                                         knobs: dict[str, Any]) -> None:
    base = build_plan(strategy="fsdp", dp_shard=8,
                      **{**knobs, "unit_size": min(knobs["unit_size"], model.num_layers)})
    act = {r: estimate_memory(model, dataclasses.replace(base, recompute=r))
           .by_category["activations"] for r in ("full", "selective", "none")}
    assert act["full"] <= act["selective"] <= act["none"]


@given(model=models(), knobs=plan_knobs(), factor=st.integers(2, 16),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_activations_linear_in_micro_batch(model: ModelSpec, knobs: dict[str, Any],
                                           factor: int, recompute: str) -> None:
    base = build_plan(strategy="fsdp", dp_shard=8, **{
        **knobs, "micro_batch": 1, "recompute": recompute,
        "unit_size": min(knobs["unit_size"], model.num_layers)})
    scaled = dataclasses.replace(base, micro_batch=factor)
    one = block_activation_bytes(model, micro_batch=1, seq_len=base.seq_len,
                                 recompute=recompute)
    many = block_activation_bytes(model, micro_batch=factor, seq_len=base.seq_len,
                                  recompute=recompute)
    assert many == factor * one
    # Everything scales with the micro-batch except the RoPE cos/sin tables, one pair per
    # step (2 x seq x head_dim in the compute dtype).
    rope = 0 if model.learned_pos_emb else (
        2 * base.seq_len * model.head_dim * dtype_bytes(base.param_dtype))
    assert (estimate_memory(model, scaled).by_category["activations"] - rope
            == factor * (estimate_memory(model, base).by_category["activations"] - rope))
