"""Precisions beyond bf16: TF32 matmuls on fp32 storage, fp8 linears as
torchao's Float8Linear runs them (with FSDP2's fp8 all-gather), checked by hand and
against each other."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from zsim.analytic.compute import Flops, block_forward_flops, with_float8_linears
from zsim.errors import ConfigError
from zsim.simulate import simulate
from zsim.spec.plan import Plan, precision_knobs
from zsim.spec.registry import resolve_hardware, resolve_model


def test_float8_casts_by_hand() -> None:
    """One (m x k) @ (k x n) = (8 x 4) @ (4 x 2): forward casts 5 (mk + kn) = 200 bytes in
    4 kernels; backward 7 mn + 7 mk + 5 kn = 112 + 224 + 40 = 376 bytes in 8 kernels."""
    fwd = Flops(matmul=2.0 * 8 * 4 * 2, attention=0.0, gemms=((8, 4, 2, 1.0),))
    f8 = with_float8_linears(fwd, fwd, phase="forward")
    assert (f8.memory_bytes, f8.kernels, f8.matmul_dtype) == (200.0, 4.0, "fp8")
    assert f8.traffic == (("elementwise", "forward", 200.0),)
    b8 = with_float8_linears(Flops(matmul=0.0, attention=0.0), fwd, phase="backward")
    assert (b8.memory_bytes, b8.kernels) == (376.0, 8.0)
    with pytest.raises(ValueError):
        _ = f8 + fwd  # matmuls of two dtypes do not add up to one op


def test_fp8_runs_the_block_matmuls_at_the_fp8_peak_and_halves_the_gathers() -> None:
    # Flat efficiencies (no measured bf16 table beside the fp8 peak): the ratio is the peaks'.
    hw = replace(resolve_hardware("dgx-h100"), kernels=None)
    spec = resolve_model("13b")
    bf16 = Plan.for_strategy("fsdp", gpus=64, seq_len=4096)
    fp8 = Plan.for_strategy("fsdp", gpus=64, seq_len=4096, **precision_knobs("fp8"))
    a, b = simulate(spec, hw, bf16), simulate(spec, hw, fp8)
    assert b.step_time_s < a.step_time_s
    # Block matmul FLOPs are most of the step; at twice the peak they take half the time,
    # and the casts and the bf16 output projection keep the step above half.
    assert 0.5 * a.compute_time_s < b.compute_time_s < 0.8 * a.compute_time_s
    linear = sum(k * n for _, k, n in spec.block_matmuls()) / spec.params_per_block
    block_ratio = (linear + (1 - linear) * 2) / 2
    # Blocks are gathered twice (forward, and again for backward after resharding), the
    # root once.
    blocks, root = 2 * (spec.num_params - spec.root_params), spec.root_params
    expected = (blocks * block_ratio + root) / (blocks + root)
    assert b.comm_bus_bytes["all_gather"] / a.comm_bus_bytes["all_gather"] == \
        pytest.approx(expected, rel=0.01)
    assert b.mfu is not None and a.mfu is not None and b.mfu > a.mfu  # same model FLOPs


def test_fp8_needs_bf16_parameters_and_a_peak() -> None:
    with pytest.raises(ConfigError) as e:
        Plan.for_strategy("fsdp", gpus=8, seq_len=2048, param_dtype="fp32", fp8=True)
    assert e.value.field == "plan.fp8"
    done = subprocess.run([sys.executable, "-m", "zsim", "simulate", "--model", "1.3b",
                           "--gpus", "8", "--strategy", "fsdp", "--hardware", "dgx-a100",
                           "--precision", "fp8"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("error: hardware.gpu.peak_tflops.fp8=None: profile "
                                   "dgx-a100 has no peak for fp8")


def test_tf32_is_fp32_memory_at_a_tensor_core_rate() -> None:
    hw = resolve_hardware("dgx-h100")
    spec = resolve_model("1.3b")
    fp32 = Plan.for_strategy("fsdp", gpus=8, seq_len=2048, **precision_knobs("fp32"))
    tf32 = Plan.for_strategy("fsdp", gpus=8, seq_len=2048, **precision_knobs("tf32"))
    a, b = simulate(spec, hw, fp32), simulate(spec, hw, tf32)
    assert a.peak_memory_bytes == b.peak_memory_bytes
    # Flat profile: matmuls and attention at 494.7 instead of 66.9 TFLOP/s.
    fwd = block_forward_flops(spec, micro_batch=1, seq_len=2048, act_bytes=4)
    assert b.compute_time_s < a.compute_time_s * (fwd.memory_bytes > 0) * 0.5
    assert tf32.compute_dtype == "tf32" and fp32.compute_dtype == "fp32"
