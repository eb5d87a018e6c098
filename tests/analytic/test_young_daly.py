"""Young's and Daly's checkpoint intervals and the first-order goodput."""

from __future__ import annotations

import math

import pytest

from zsim.analytic.young_daly import daly_interval_s, first_order_goodput, young_interval_s
from zsim.errors import ConfigError


def test_young_is_sqrt_2_delta_m() -> None:
    assert young_interval_s(30.0, 10_800.0) == pytest.approx(math.sqrt(2 * 30 * 10_800))


def test_daly_matches_its_formula_and_tends_to_young() -> None:
    d, m = 30.0, 10_800.0
    x = d / (2 * m)
    assert daly_interval_s(d, m) == pytest.approx(
        math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d)
    # For δ << M the correction terms vanish relative to the interval.
    assert daly_interval_s(1e-3, 1e6) == pytest.approx(young_interval_s(1e-3, 1e6), rel=1e-3)
    # A stall of 2M or more: checkpoint every M.
    assert daly_interval_s(3.0, 1.0) == 1.0


def test_first_order_goodput_is_maximal_at_young() -> None:
    d, m, r = 30.0, 10_800.0, 600.0
    tau = young_interval_s(d, m)
    best = first_order_goodput(tau, d, m, r)
    assert best == pytest.approx(1 - d / tau - (tau / 2 + r) / m)
    for other in (0.7 * tau, 1.4 * tau):
        assert first_order_goodput(other, d, m, r) < best


@pytest.mark.parametrize(("call", "field"), [
    (lambda: young_interval_s(0.0, 1.0), "stall_s"),
    (lambda: daly_interval_s(1.0, -1.0), "mtbf_s"),
    (lambda: first_order_goodput(0.0, 1.0, 1.0, 0.0), "interval_s"),
    (lambda: first_order_goodput(1.0, 1.0, 1.0, float("inf")), "recovery_s"),
])
def test_bad_input_names_the_field(call, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field
