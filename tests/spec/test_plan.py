"""Plan: degrees each strategy implies, single-field checks, and strict dict round-trips
(Plan and ModelSpec)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zsim.errors import ConfigError
from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.model import ModelSpec, synthetic
from zsim.spec.plan import STRATEGIES, Plan, precision_knobs
from zsim.spec.presets import PRESETS


@pytest.mark.parametrize(("strategy", "expected"), [
    ("ddp", ("ddp", 1, 64)),
    ("zero1", ("zero1", 64, 1)),
    ("zero2", ("zero2", 64, 1)),
    ("zero3", ("zero3", 64, 1)),
    ("fsdp", ("fsdp", 64, 1)),
    ("fsdp-no-reshard", ("fsdp-no-reshard", 64, 1)),
])
def test_for_strategy_degrees(strategy: str, expected: tuple[str, int, int]) -> None:
    p = Plan.for_strategy(strategy, gpus=64, seq_len=4096)
    assert (p.strategy, p.dp_shard, p.dp_replicate) == expected
    assert p.world_size == p.dp_degree == 64 and (p.tp, p.pp) == (1, 1)


@pytest.mark.parametrize(("group", "replicas"), [(8, 8), (16, 4), (64, 1), (1, 64)])
def test_hsdp_is_group_by_replicas(group: int, replicas: int) -> None:
    p = Plan.for_strategy("hsdp", gpus=64, shard_group=group, seq_len=2048)
    assert (p.dp_shard, p.dp_replicate, p.world_size) == (group, replicas, 64)
    assert p.hsdp_enabled == (group > 1 and replicas > 1)


def test_sharding_predicates_follow_the_zero_table() -> None:
    # ZeRO paper Sec. 5: stage 1 shards optimizer state, 2 adds gradients, 3 adds params.
    got = {s: (p.shards_optimizer, p.shards_grads, p.shards_params, p.reshard_after_forward)
           for s in STRATEGIES
           for p in [Plan.for_strategy(s, gpus=8, seq_len=8,
                                       **({"shard_group": 4} if s == "hsdp" else {}))]}
    assert got == {"ddp": (False, False, False, False), "zero1": (True, False, False, False),
                   "zero2": (True, True, False, False), "zero3": (True, True, True, True),
                   "fsdp": (True, True, True, True),
                   "fsdp-no-reshard": (True, True, True, False),
                   "hsdp": (True, True, True, True)}


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(STRATEGIES), st.integers(1, 4096), st.data())
def test_for_strategy_world_size_is_gpus(strategy: str, gpus: int, data: st.DataObject) -> None:
    knobs = {}
    if strategy == "hsdp":
        divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
        knobs["shard_group"] = data.draw(st.sampled_from(divisors))
    p = Plan.for_strategy(strategy, gpus=gpus, seq_len=1024, **knobs)
    assert p.world_size == gpus
    assert p.tokens_per_step == gpus * 1024


@pytest.mark.parametrize(("kwargs", "field", "value"), [
    ({"strategy": "zero4", "gpus": 8}, "strategy", "zero4"),
    ({"strategy": "hsdp", "gpus": 64, "shard_group": 3}, "shard_group", 3),
    ({"strategy": "hsdp", "gpus": 64, "shard_group": 0}, "shard_group", 0),
    ({"strategy": "hsdp", "gpus": 64, "shard_group": "8"}, "shard_group", "8"),
    ({"strategy": "hsdp", "gpus": 64}, "shard_group", None),
    ({"strategy": "fsdp", "gpus": 64, "shard_group": 8}, "shard_group", 8),
    ({"strategy": "fsdp", "gpus": 0}, "gpus", 0),
    ({"strategy": "ddp", "gpus": -8}, "gpus", -8),
    ({"strategy": "ddp", "gpus": 8.0}, "gpus", 8.0),
])
def test_for_strategy_bad_input_names_field(kwargs: dict, field: str, value: object) -> None:
    with pytest.raises(ConfigError) as e:
        Plan.for_strategy(**kwargs, seq_len=1024)
    assert (e.value.field, e.value.value) == (field, value)


@pytest.mark.parametrize("field", ["dp_shard", "dp_replicate", "tp", "pp", "cp", "micro_batch",
                                   "grad_accum", "seq_len", "unit_size", "bucket_bytes",
                                   "virtual_stages"])
@pytest.mark.parametrize("value", [0, -1, 2.5])
def test_non_positive_sizes_raise(field: str, value: object) -> None:
    base = {"strategy": "fsdp", "dp_shard": 8, "seq_len": 1024}
    with pytest.raises(ConfigError) as e:
        Plan(**{**base, field: value})
    assert (e.value.field, e.value.value) == (f"plan.{field}", value)


@pytest.mark.parametrize(("field", "value"), [("prefetch", -1), ("param_dtype", "fp8"),
                                              ("recompute", "some"), ("optimizer", "lion"),
                                              ("offload", "disk"), ("strategy", "zero4"),
                                              ("impl", "fsdp3"), ("impl", "deepspeed")])
def test_closed_choices_raise(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as e:
        Plan(**{"strategy": "fsdp", "dp_shard": 8, "seq_len": 1024, field: value})
    assert (e.value.field, e.value.value) == (f"plan.{field}", value)


def test_each_strategy_runs_as_its_programs() -> None:
    # The default program first; zero1 also runs as torch's ZeroRedundancyOptimizer.
    impls = {s: Plan.for_strategy(s, gpus=8, seq_len=8,
                                  **({"shard_group": 4} if s == "hsdp" else {})).impl
             for s in STRATEGIES}
    assert impls == {"ddp": "torch", "zero1": "deepspeed", "zero2": "deepspeed",
                     "zero3": "deepspeed", "fsdp": "fsdp2", "fsdp-no-reshard": "fsdp2",
                     "hsdp": "fsdp2"}
    assert Plan.for_strategy("zero1", gpus=8, seq_len=8, impl="torch").impl == "torch"
    # The plan round-trips with its DeepSpeed knobs.
    plan = Plan.for_strategy("zero3", gpus=8, seq_len=8,
                             options=DeepSpeedZero(prefetch_bucket_size=123, overlap_comm=False))
    assert Plan.from_dict(plan.to_dict()) == plan


def test_ddp_cannot_shard() -> None:
    with pytest.raises(ConfigError) as e:
        Plan(strategy="ddp", dp_shard=8, seq_len=1024)
    assert (e.value.field, e.value.value) == ("plan.dp_shard", 8)


def test_precision_knobs() -> None:
    assert precision_knobs("bf16")["param_dtype"] == "bf16"
    assert set(precision_knobs("fp32").values()) == {"fp32"}
    with pytest.raises(ConfigError) as e:
        precision_knobs("fp4")
    assert (e.value.field, e.value.value) == ("precision", "fp4")
    assert precision_knobs("tf32")["tf32"] is True and precision_knobs("fp8")["fp8"] is True


# ------------------------------------------------------------------ round trips
PLANS = [
    Plan.for_strategy("ddp", gpus=8, seq_len=2048),
    Plan.for_strategy("hsdp", gpus=128, shard_group=8, seq_len=4096, micro_batch=2,
                      grad_accum=4, recompute="selective", unit_size=2, prefetch=2,
                      reduce_dtype="fp32", optimizer="adamw8bit", offload="optimizer"),
    Plan(strategy="zero2", dp_shard=4, dp_replicate=2, tp=2, pp=2, seq_len=512,
         optimizer="sgd", **precision_knobs("fp32")),
]


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.label)
def test_plan_round_trip(plan: Plan) -> None:
    d = plan.to_dict()
    assert Plan.from_dict(d) == plan
    assert Plan.from_dict(d).to_dict() == d


@pytest.mark.parametrize("model", [*PRESETS.values(), synthetic(7 * 10**9)],
                         ids=lambda m: m.name)
def test_model_round_trip(model: ModelSpec) -> None:
    d = model.to_dict()
    assert ModelSpec.from_dict(d) == model
    assert ModelSpec.from_dict(d).num_params == model.num_params


def test_plan_from_dict_strict() -> None:
    d = PLANS[0].to_dict()
    with pytest.raises(ConfigError) as e:
        Plan.from_dict({**d, "zero_stage": 3})
    assert (e.value.field, e.value.value) == ("plan.zero_stage", 3)
    with pytest.raises(ConfigError) as e:
        Plan.from_dict({k: v for k, v in d.items() if k != "seq_len"}, where="scenario.plan")
    assert e.value.field == "scenario.plan.seq_len"
    assert "missing" in e.value.reason
    with pytest.raises(ConfigError) as e:
        Plan.from_dict([("strategy", "ddp")])  # type: ignore[arg-type]
    assert e.value.field == "plan"


def test_model_from_dict_strict() -> None:
    d = PRESETS["llama2-7b"].to_dict()
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_dict({**d, "n_layer": 32})
    assert (e.value.field, e.value.value) == ("model.n_layer", 32)
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_dict({k: v for k, v in d.items() if k != "vocab_size"})
    assert e.value.field == "model.vocab_size"


def test_with_replaces_without_mutating() -> None:
    p = PLANS[0]
    q = p.with_(micro_batch=4)
    assert (p.micro_batch, q.micro_batch) == (1, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.micro_batch = 2  # type: ignore[misc]


# ---------------------------------------------------------------- 2-D and 3-D plans
@pytest.mark.parametrize(("knobs", "field"), [
    ({"sp": True}, "plan.sp"),                                       # SP needs tp > 1
    ({"tp": 2, "async_tp": True}, "plan.async_tp"),                  # async TP needs SP
    ({"pp_schedule": "zero-bubble"}, "plan.pp_schedule"),
    ({"pp_schedule": "interleaved", "virtual_stages": 2}, "plan.pp_schedule"),  # pp = 1
    ({"pp": 2, "pp_schedule": "interleaved"}, "plan.virtual_stages"),           # 1 stage
    ({"pp": 2, "virtual_stages": 2}, "plan.virtual_stages"),          # 1f1b with 2 stages
    ({"tp_across_nodes": "yes"}, "plan.tp_across_nodes"),
])
def test_model_parallel_fields_that_disagree_raise(knobs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        Plan(**{"strategy": "fsdp", "dp_shard": 8, "seq_len": 1024, **knobs})
    assert e.value.field == field


def test_world_and_label_count_every_axis() -> None:
    p = Plan(strategy="hsdp", dp_shard=4, dp_replicate=2, tp=8, pp=4, cp=2, sp=True,
             pp_schedule="interleaved", virtual_stages=2, grad_accum=8, seq_len=8192)
    assert p.world_size == 4 * 2 * 8 * 4 * 2
    assert p.model_parallel == 64 and p.dp_degree == 8
    assert p.label == "hsdp(4x2) tp=8+sp pp=4(interleaved x2) cp=2 ac=none mb=1"
    assert Plan.from_dict(p.to_dict()) == p


def test_for_strategy_leaves_the_model_parallel_ranks_out_of_dp() -> None:
    p = Plan.for_strategy("hsdp", gpus=256, shard_group=8, tp=8, pp=2, grad_accum=2,
                          seq_len=8192)
    assert (p.dp_shard, p.dp_replicate, p.world_size) == (8, 2, 256)
    assert Plan.for_strategy("ddp", gpus=64, tp=4, cp=2, seq_len=4096).dp_replicate == 8
    with pytest.raises(ConfigError) as e:
        Plan.for_strategy("fsdp", gpus=100, tp=8, seq_len=4096)
    assert (e.value.field, e.value.value) == ("gpus", 100)
    assert "tp*cp*pp = 8*1*1 = 8" in e.value.reason
    with pytest.raises(ConfigError) as e:
        Plan.for_strategy("hsdp", gpus=64, shard_group=16, tp=8, seq_len=4096)
    assert (e.value.field, e.value.value) == ("shard_group", 16)
