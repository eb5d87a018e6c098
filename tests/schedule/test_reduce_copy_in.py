"""FSDP2's reduce-scatter copy-in (torch.ops.fsdp.chunk_cat on the compute stream) timed
at the profile's measured rate for a copy that casts (hgx-h200's
kernels.memory_gb_per_s.reduce_copy_in), at the flat memory-bound rate for one that does
not: durations worked out from the unit's bytes."""

from __future__ import annotations

import pytest

from zsim.schedule.lower import lower
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model
from zsim.units import GB


def _copy_in_s(spec: ModelSpec, plan: Plan) -> float:
    ops = lower(spec, resolve_hardware("hgx-h200"), plan).ops
    return next(op.compute_s for op in ops if op.name == "unit 0 reduce-scatter copy-in")


@pytest.mark.parametrize("reduce_dtype", ["fp32", "bf16"])
def test_copy_in_by_hand(reduce_dtype: str) -> None:
    spec = resolve_model("7b")
    hw = resolve_hardware("hgx-h200")
    assert hw.kernels is not None and hw.rank_skew == 0
    plan = Plan.for_strategy("fsdp", gpus=8, seq_len=4096, reduce_dtype=reduce_dtype)
    # 7B's blocks split evenly over 8 ranks (no padding): the copy reads each bf16
    # gradient and writes it in the reduce dtype.
    params = spec.params_per_block
    assert params % 8 == 0
    if reduce_dtype == "fp32":
        nbytes, rate = params * (2 + 4), hw.kernels.memory_bytes_per_s["reduce_copy_in"]["backward"]
        assert rate == 2053 * GB
    else:
        nbytes, rate = params * (2 + 2), hw.hbm_bandwidth_bytes_per_s * hw.memory_bound_efficiency
    assert _copy_in_s(spec, plan) == pytest.approx(nbytes / rate + hw.kernel_overhead_s,
                                                   rel=1e-12)
