"""A profile's measured collective calls (collectives.measured_us) under the "ring" model:
a call of the measured group takes the time interpolated between the measured sizes;
other kinds, group sizes and groups across nodes keep the alpha-beta link model. The
expected times are worked out by hand on the two-tier toy (intra-node 100 GB/s, 1 us per
ring step)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from zsim.analytic.collectives import CommGroup, choose, collective_time_s
from zsim.errors import ConfigError
from zsim.spec.hardware import HardwareProfile

US = 1e-6
TABLE = {"ranks": 2, "all_reduce": [[1e6, 50], [4e6, 80], [16e6, 200], [64e6, 300]]}
"""us per call. At 64 MB the measured call (300 us) beats the toy link's 640 us."""


def _with_table(data: dict[str, Any], table: Any) -> HardwareProfile:
    data["collectives"]["measured_us"] = table
    return HardwareProfile.from_dict(data, name="two-tier")


PAIR = CommGroup(ranks=2, ranks_per_node=2)


@pytest.mark.parametrize(("size", "expected_us"), [
    (1e6, 50.0),                        # a measured size
    (2.5e6, 50 + 30 * 1.5 / 3),         # halfway-ish between 1 and 4 MB: linear
    (4e5, 50.0),                        # below the smallest: its time
    (16e6, 200.0),
    (64e6, 300.0),                      # faster than the link's 640 us: loads stretched
    (128e6, 300 + 100 / 48e6 * 64e6),   # past the largest: the last segment's line
])
def test_a_measured_group_takes_the_interpolated_time(two_tier_data: dict[str, Any],
                                                      size: float, expected_us: float) -> None:
    hw = _with_table(two_tier_data, TABLE)
    assert collective_time_s("all_reduce", size, PAIR, hw) == pytest.approx(expected_us * US)


def test_where_nothing_was_measured_the_link_model_holds(
        two_tier_data: dict[str, Any], two_tier_hw: HardwareProfile) -> None:
    hw = _with_table(two_tier_data, TABLE)
    # 2-rank all-gather of 8 MB: 1 ring step (1 us) + 4 MB of bus bytes at 100 GB/s.
    assert collective_time_s("all_gather", 8e6, PAIR, hw) == pytest.approx((1 + 40) * US)
    for group in (CommGroup(ranks=4, ranks_per_node=4), CommGroup(ranks=2, ranks_per_node=1)):
        assert collective_time_s("all_reduce", 8e6, group, hw) == pytest.approx(
            collective_time_s("all_reduce", 8e6, group, two_tier_hw))
    assert collective_time_s("all_reduce", 8e6, PAIR, two_tier_hw) == pytest.approx(
        (2 + 80) * US)  # without the table: 2 steps + 8 MB of bus bytes


def test_the_measured_time_splits_into_latency_and_link_bytes(
        two_tier_data: dict[str, Any]) -> None:
    hw = _with_table(two_tier_data, TABLE)
    # 16 MB: 160 us of bus bytes on the link, the other 40 us latency.
    slow = choose("all_reduce", 16e6, PAIR, hw)
    assert slow.latency_s == pytest.approx(40 * US) and slow.link_loads == (("intra_node", 1.0),)
    # 64 MB: 640 us on the link at its load, measured 300: no latency, load 300/640.
    fast = choose("all_reduce", 64e6, PAIR, hw)
    assert fast.latency_s == 0.0
    assert fast.link_loads == (("intra_node", pytest.approx(300 / 640)),)


@pytest.mark.parametrize(("table", "field"), [
    ({"all_reduce": [[1, 1], [2, 2]]}, "collectives.measured_us"),
    ({"ranks": 2, "all_to_all": [[1, 1], [2, 2]]}, "collectives.measured_us"),
    ({"ranks": 1, "all_reduce": [[1, 1], [2, 2]]}, "collectives.measured_us.ranks"),
    ({"ranks": 2, "all_reduce": [[1, 1]]}, "collectives.measured_us.all_reduce"),
    ({"ranks": 2, "all_reduce": [[2, 1], [1, 2]]}, "collectives.measured_us.all_reduce"),
    ({"ranks": 2, "all_reduce": [[1, -1], [2, 2]]}, "collectives.measured_us.all_reduce"),
    ({"ranks": 2, "int8": {"all_reduce": [[1, 1], [2, 2]]}}, "collectives.measured_us"),
    ({"ranks": 2, "bf16": {"all_gather": [[1, 1], [2, 2]]}}, "collectives.measured_us.bf16"),
    ({"ranks": 2, "bf16": [[1, 1], [2, 2]]}, "collectives.measured_us.bf16"),
    ({"ranks": 2, "bf16": {"all_reduce": [[1, 1]]}},
     "collectives.measured_us.bf16.all_reduce"),
])
def test_a_bad_table_names_its_field(two_tier_data: dict[str, Any], table: dict[str, Any],
                                     field: str) -> None:
    with pytest.raises(ConfigError) as e:
        _with_table(two_tier_data, copy.deepcopy(table))
    assert e.value.field == field


DTYPED = {"ranks": 2, "all_reduce": [[1e6, 50], [4e6, 80]],
          "reduce_scatter": [[1e6, 40], [4e6, 70]],
          "bf16": {"all_reduce": [[1e6, 90], [4e6, 150]]}}
"""fp32 calls, and bf16 all-reduces (gloo adds bf16 through fp32, element by element)."""


def test_a_reduction_in_a_dtype_measured_apart_takes_its_table(
        two_tier_data: dict[str, Any]) -> None:
    hw = _with_table(two_tier_data, copy.deepcopy(DTYPED))
    assert collective_time_s("all_reduce", 2.5e6, PAIR, hw, "bf16") == pytest.approx(
        (90 + 60 / 2) * US)
    assert collective_time_s("all_reduce", 2.5e6, PAIR, hw) == pytest.approx((50 + 15) * US)
    # A kind or dtype with no table of its own: fp32's (the arithmetic is the difference).
    assert collective_time_s("reduce_scatter", 1e6, PAIR, hw, "bf16") == pytest.approx(40 * US)
    assert collective_time_s("all_reduce", 1e6, PAIR, hw, "fp16") == pytest.approx(50 * US)


def test_the_simulator_charges_gradient_reductions_at_their_dtype() -> None:
    """DDP's bucket all-reduces on a 2-rank host whose bf16 all-reduces were measured 1 ms
    slower than fp32's at every size: a model cast to bf16 reduces bf16 buckets, each call
    1 ms longer than with the fp32 table alone; under autocast the buckets are fp32 (the
    parameters' dtype) whatever the plan's reduce_dtype, and the bf16 table is not read.
    The simulation counts the same calls either way."""
    from dataclasses import replace

    from zsim.simulate import simulate
    from zsim.spec.plan import Plan
    from zsim.spec.registry import PROFILES_DIR, resolve_model

    data = yaml.safe_load((PROFILES_DIR / "local-cpu.yaml").read_text())
    fp32 = [[4096, 500], [1e9, 5e6]]  # slower than the link: the table sets every call
    data["collectives"]["measured_us"] = {"ranks": 2, "all_reduce": fp32}
    # One call at a time (not gloo's two threads): the stream's busy time is their sum.
    data["host"]["collective_threads"] = 1
    plain = HardwareProfile.from_dict(copy.deepcopy(data), name="t")
    data["collectives"]["measured_us"]["bf16"] = {
        "all_reduce": [[s, us + 1000] for s, us in fp32]}
    slow_bf16 = HardwareProfile.from_dict(data, name="t")
    spec = resolve_model("125m")
    autocast = replace(Plan.for_strategy("ddp", gpus=2, seq_len=512), micro_batch=1)
    assert autocast.reduce_dtype == "bf16" and autocast.master_dtype == "fp32"
    bf16_model = autocast.with_(master_dtype="bf16")
    a, b = simulate(spec, plain, bf16_model), simulate(spec, slow_bf16, bf16_model)
    calls = a.collective_calls["all_reduce"]
    assert calls > 1 and b.collective_calls == a.collective_calls
    assert b.comm_busy_s["all_reduce"] - a.comm_busy_s["all_reduce"] == pytest.approx(
        calls * 1e-3)
    c, d = simulate(spec, plain, autocast), simulate(spec, slow_bf16, autocast)
    assert d.comm_busy_s["all_reduce"] == pytest.approx(c.comm_busy_s["all_reduce"])
