"""zsim.analytic.memory: bytes per parameter for each optimizer and precision, shard
padding, and the parts of the first peak estimate, worked by hand."""

from __future__ import annotations

import pytest

from zsim.analytic.memory import estimate_memory, model_state_bytes, unit_param_count
from zsim.spec.plan import Plan
from zsim.spec.presets import PRESETS

PSI = 1_000_000


@pytest.mark.parametrize(("knobs", "bytes_per_param"), [
    # bf16 param + bf16 grad + fp32 master + two fp32 Adam states (ZeRO paper, K = 12)
    ({}, 2 + 2 + 4 + 8),
    # SGD with momentum: one fp32 buffer
    ({"optimizer": "sgd"}, 2 + 2 + 4 + 4),
    # 8-bit Adam (Dettmers et al. 2022): two uint8 states + an fp32 absmax per 2048 each
    ({"optimizer": "adamw8bit"}, 2 + 2 + 4 + 2 + 2 * 4 / 2048),
    # pure fp32: the parameters are the master copy
    ({"param_dtype": "fp32", "grad_dtype": "fp32", "reduce_dtype": "fp32"}, 4 + 4 + 8),
    # optimizer offload keeps only the 16-bit params and grads on the GPU
    ({"offload": "optimizer"}, 2 + 2),
])
def test_ddp_bytes_per_param(knobs: dict[str, object], bytes_per_param: float) -> None:
    plan = Plan.for_strategy("ddp", gpus=8, seq_len=1024, **knobs)
    assert model_state_bytes(PSI, plan).total == pytest.approx(PSI * bytes_per_param)


def test_categories_of_zero2() -> None:
    state = model_state_bytes(PSI, Plan.for_strategy("zero2", gpus=4, seq_len=1024))
    assert state.as_dict() == {"params": 2 * PSI, "grads": 2 * PSI / 4,
                               "master_params": 4 * PSI / 4, "optimizer_states": 8 * PSI / 4}


def test_shards_are_padded_to_whole_elements() -> None:
    # 10 parameters over 4 ranks: a flat buffer padded to 12, 3 elements per rank
    state = model_state_bytes(10, Plan.for_strategy("fsdp", gpus=4, seq_len=1024))
    assert state.as_dict() == {"params": 6, "grads": 6, "master_params": 12,
                               "optimizer_states": 24}


def test_fsdp_holds_the_computing_and_prefetched_units() -> None:
    model = PRESETS["llama2-7b"]
    plan = Plan.for_strategy("fsdp", gpus=8, seq_len=4096, prefetch=1, unit_size=2)
    # a unit of 2 blocks: 2 x (4 d^2 + 3 d f + 2 d) parameters, in bf16, current + next
    d, f = 4096, 11008
    unit = 2 * (4 * d * d + 3 * d * f + 2 * d)
    assert unit_param_count(model, plan) == unit
    assert estimate_memory(model, plan).by_category["gathered_params"] == 2 * unit * 2


def test_the_root_unit_can_be_the_largest() -> None:
    model = PRESETS["llama3-8b"]  # 2 x 128256 x 4096 embedding + output > one block
    plan = Plan.for_strategy("fsdp", gpus=8, seq_len=4096)
    assert unit_param_count(model, plan) == 2 * 128256 * 4096 + 4096


def test_no_reshard_keeps_every_unit_gathered() -> None:
    model = PRESETS["llama2-7b"]
    plan = Plan.for_strategy("fsdp-no-reshard", gpus=8, seq_len=4096)
    assert estimate_memory(model, plan).by_category["gathered_params"] == 2 * model.num_params


def test_replicated_strategies_keep_two_buckets_in_flight() -> None:
    model = PRESETS["llama2-7b"]
    for strategy in ("ddp", "zero1", "zero2"):
        plan = Plan.for_strategy(strategy, gpus=8, seq_len=4096)
        by_category = estimate_memory(model, plan).by_category
        assert by_category["gathered_params"] == 0
        assert by_category["gathered_grads"] == 2 * 25 * 2**20


def test_peak_is_at_least_the_model_state() -> None:
    model = PRESETS["llama2-13b"]
    for strategy in ("ddp", "zero1", "zero2", "fsdp", "fsdp-no-reshard"):
        estimate = estimate_memory(model, Plan.for_strategy(strategy, gpus=8, seq_len=4096))
        assert estimate.steady_state_bytes == model_state_bytes(
            model.num_params, Plan.for_strategy(strategy, gpus=8, seq_len=4096)).total
        assert estimate.peak_bytes > estimate.steady_state_bytes
