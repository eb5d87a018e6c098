"""zsim.analytic.compute: roofline time of FLOPs on the two-tier toy cluster (1 TFLOP/s
bf16 peak, 0.5 fp32; matmul efficiency 0.5, attention 0.25)."""

from __future__ import annotations

import math

from zsim.analytic.compute import Flops, compute_time_s
from zsim.spec.hardware import HardwareProfile


def test_roofline_time_by_hand(two_tier_hw: HardwareProfile) -> None:
    flops = Flops(matmul=1e12, attention=1e12)
    # 1e12 / (1e12 x 0.5) + 1e12 / (1e12 x 0.25) = 2 s + 4 s
    assert math.isclose(compute_time_s(flops, two_tier_hw, "bf16"), 6.0)
    assert math.isclose(compute_time_s(flops, two_tier_hw, "fp32"), 12.0)


def test_flops_arithmetic() -> None:
    a = Flops(matmul=3.0, attention=1.0)
    assert (a + a.scaled(2.0)) == Flops(matmul=9.0, attention=3.0)
    assert a.total == 4.0
