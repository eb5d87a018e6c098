"""Measured kernel rates (zsim.spec.kernel_rates) and the times they give
(zsim.analytic.compute.compute_time_s): lookups against hand-worked values, the
leave-one-out error of the matmul interpolation on the shipped H200 table, and the schema's
errors."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

import pytest

from zsim.analytic.compute import (
    Flops,
    block_backward_flops,
    block_forward_flops,
    compute_time_s,
    foreach_launches,
)
from zsim.errors import ConfigError
from zsim.spec.kernel_rates import KernelRates
from zsim.spec.registry import resolve_hardware, resolve_model

TOY: dict[str, Any] = {
    "matmul_tflops": {"bf16": [[1024, 1024, 1024, 100.0], [4096, 4096, 4096, 400.0]]},
    "attention": {"bf16": [[1024, 128, 50.0, 20.0], [4096, 128, 200.0, 80.0]]},
    "memory_gb_per_s": {c: {"forward": 1000, "backward": 500}
                        for c in ("norm", "rope", "elementwise", "cross_entropy", "optimizer")},
    "source": "hand-made for the test",
}


def test_matmul_rate_is_exact_at_a_measured_shape_and_between_neighbours() -> None:
    rates = KernelRates.from_dict(TOY)
    assert rates.matmul_flop_per_s(1024, 1024, 1024, "bf16") == 100e12
    # (2048)^3 is log2-equidistant from both points: inverse-distance weights are equal.
    assert rates.matmul_flop_per_s(2048, 2048, 2048, "bf16") == pytest.approx(250e12)
    assert rates.matmul_flop_per_s(2048, 2048, 2048, "fp8") is None


def test_attention_rate_interpolates_in_log_seq_and_holds_beyond_the_ends() -> None:
    rates = KernelRates.from_dict(TOY)
    assert rates.attention_flop_per_s(2048, 128, "forward", "bf16") == pytest.approx(125e12)
    assert rates.attention_flop_per_s(2048, 128, "backward", "bf16") == pytest.approx(50e12)
    assert rates.attention_flop_per_s(512, 128, "forward", "bf16") == 50e12
    # The nearest head_dim; no table for a dtype: None.
    assert rates.attention_flop_per_s(65536, 64, "backward", "bf16") == 80e12
    assert rates.attention_flop_per_s(2048, 128, "forward", "fp32") is None


def test_time_with_rates_by_hand() -> None:
    hw = replace(resolve_hardware("hgx-h200"), kernels=KernelRates.from_dict(TOY),
                 kernel_overhead_s=0.0)
    work = Flops(matmul=2.0 * 1024**3, attention=3e12, memory_bytes=3e9,
                 gemms=((1024, 1024, 1024, 1.0),),
                 attention_calls=((1024, 128, "forward", 1e12), (1024, 128, "backward", 1e12)),
                 traffic=(("norm", "forward", 1e9), ("rope", "backward", 1e9)))
    # matmul 2*1024^3 / 100 TF; attention 1 TF / 50 TF forward + 1 TF / 20 TF backward
    # (backward counts twice in FLOPs: 3 TF in all); norm 1 GB / 1000 GB/s; rope 1 GB /
    # 500 GB/s; the unclassed 1 GB at the flat memory-bound rate.
    flat_memory = hw.hbm_bandwidth_bytes_per_s * hw.memory_bound_efficiency
    expected = (2.0 * 1024**3 / 100e12 + 1 / 50 + 1 / 20 + 1 / 1000 + 1 / 500
                + 1e9 / flat_memory)
    assert compute_time_s(work, hw, "bf16") == pytest.approx(expected, rel=1e-12)


def test_a_matmul_table_alone_leaves_attention_and_memory_at_the_flat_rates() -> None:
    """What `zsim calibrate` writes for a host: matmul rows only. The same work as
    test_time_with_rates_by_hand: the GEMM at its row, the rest at the flat efficiencies."""
    rates = KernelRates.from_dict({k: TOY[k] for k in ("matmul_tflops", "source")})
    hw = replace(resolve_hardware("hgx-h200"), kernels=rates, kernel_overhead_s=0.0)
    work = Flops(matmul=2.0 * 1024**3, attention=3e12, memory_bytes=3e9,
                 gemms=((1024, 1024, 1024, 1.0),),
                 attention_calls=((1024, 128, "forward", 1e12), (1024, 128, "backward", 1e12)),
                 traffic=(("norm", "forward", 1e9), ("rope", "backward", 1e9)))
    flat_attention = hw.peak("bf16") * hw.attention_efficiency
    flat_memory = hw.hbm_bandwidth_bytes_per_s * hw.memory_bound_efficiency
    expected = 2.0 * 1024**3 / 100e12 + 3e12 / flat_attention + 3e9 / flat_memory
    assert compute_time_s(work, hw, "bf16") == pytest.approx(expected, rel=1e-12)


def test_an_optional_class_runs_at_its_rate_and_at_the_flat_rate_when_left_out() -> None:
    """reduce_copy_in (zsim.spec.kernel_rates.OPTIONAL_MEMORY_CLASSES): 1 GB at 250 GB/s
    where the profile gives it; where it does not, the flat memory-bound rate."""
    with_class = KernelRates.from_dict({**TOY, "memory_gb_per_s": {
        **TOY["memory_gb_per_s"], "reduce_copy_in": {"forward": 250, "backward": 250}}})
    hw = replace(resolve_hardware("hgx-h200"), kernel_overhead_s=0.0)
    work = Flops(matmul=0.0, attention=0.0, memory_bytes=1e9,
                 traffic=(("reduce_copy_in", "backward", 1e9),))
    assert compute_time_s(work, replace(hw, kernels=with_class), "bf16") == \
        pytest.approx(1e9 / 250e9, rel=1e-12)
    flat_memory = hw.hbm_bandwidth_bytes_per_s * hw.memory_bound_efficiency
    assert compute_time_s(work, replace(hw, kernels=KernelRates.from_dict(TOY)), "bf16") == \
        pytest.approx(1e9 / flat_memory, rel=1e-12)


def test_gelu_runs_at_its_rate_or_at_the_elementwise_rate() -> None:
    """GELU's traffic (an optional class): at its own rate where the profile gives it, a
    CPU's calibration alone among the memory classes; where it does not, at the
    elementwise rate it was measured within on the GPU profiles; with neither, at the
    flat memory-bound rate. 1 GB forward and 1 GB backward each time."""
    hw = replace(resolve_hardware("hgx-h200"), kernel_overhead_s=0.0)
    work = Flops(matmul=0.0, attention=0.0, memory_bytes=2e9,
                 traffic=(("gelu", "forward", 1e9), ("gelu", "backward", 1e9)))
    alone = KernelRates.from_dict({"matmul_tflops": TOY["matmul_tflops"], "source": "cpu",
                                   "memory_gb_per_s": {"gelu": {"forward": 2, "backward": 4}}})
    assert alone.memory_bytes_per_s.keys() == {"gelu"}
    assert compute_time_s(work, replace(hw, kernels=alone), "bf16") == pytest.approx(
        1 / 2 + 1 / 4, rel=1e-12)
    # TOY's elementwise: 1000 GB/s forward, 500 backward.
    assert compute_time_s(work, replace(hw, kernels=KernelRates.from_dict(TOY)), "bf16") == \
        pytest.approx(1 / 1000 + 1 / 500, rel=1e-12)
    matmul_only = KernelRates.from_dict({k: TOY[k] for k in ("matmul_tflops", "source")})
    flat_memory = hw.hbm_bandwidth_bytes_per_s * hw.memory_bound_efficiency
    assert compute_time_s(work, replace(hw, kernels=matmul_only), "bf16") == pytest.approx(
        2e9 / flat_memory, rel=1e-12)


def test_only_a_gelu_mlp_has_gelu_traffic() -> None:
    """The GELU MLP's activation reads and writes the (tokens, ffn_hidden) tensor once in
    forward (2 x 2 bytes an element in bf16) and twice that in backward; SwiGLU's SiLU
    stays elementwise."""
    kw = dict(micro_batch=2, seq_len=256, act_bytes=2)
    gpt, llama = resolve_model("125m"), resolve_model("7b")
    elems = 2 * 256 * gpt.ffn_hidden
    assert dict((c, b) for c, ph, b in block_forward_flops(gpt, **kw).traffic)["gelu"] == \
        2 * 2 * elems
    assert dict((c, b) for c, ph, b in block_backward_flops(gpt, **kw).traffic)["gelu"] == \
        2 * 2 * 2 * elems
    assert "gelu" not in {c for c, _, _ in block_forward_flops(llama, **kw).traffic}


def test_foreach_launches_by_hand() -> None:
    # 10 tensors of 1M elements: 16 chunks each (+ half a chunk per tensor on average,
    # 165 in all): one launch of up to 320 chunks; one kernel per tensor on a CPU.
    assert foreach_launches(10 * 2**20, 10, 1, "multi_tensor_apply") == 1
    assert foreach_launches(10 * 2**20, 10, 1, "per_tensor") == 10
    # 100M elements: 1526 + 5 chunks, 5 launches of 320; 200 tiny tensors at depth 3
    # (48 a launch): 5 launches although their chunks fit one.
    assert foreach_launches(1e8, 10, 1, "multi_tensor_apply") == 5
    assert foreach_launches(200 * 1024, 200, 3, "multi_tensor_apply") == 5


def test_a_dtype_without_a_table_keeps_the_flat_efficiency() -> None:
    hw = resolve_hardware("hgx-h200")
    spec = resolve_model("7b")
    fwd = block_forward_flops(spec, micro_batch=1, seq_len=4096, act_bytes=2)
    flat = replace(hw, kernels=None)
    matmul_only = Flops(matmul=fwd.matmul, attention=0.0, gemms=fwd.gemms)
    fp16_table = replace(hw.kernels, matmul={"bf16": hw.kernels.matmul["bf16"]})
    # fp16 runs on bf16's table; fp8 has none, so it falls back to the flat rate.
    assert compute_time_s(matmul_only, replace(hw, kernels=fp16_table), "fp16") == \
        pytest.approx(compute_time_s(matmul_only, hw, "bf16"))
    assert compute_time_s(Flops(matmul=fwd.matmul, attention=0.0), hw, "bf16") == \
        pytest.approx(compute_time_s(Flops(matmul=fwd.matmul, attention=0.0), flat, "bf16"))


def test_backward_shapes_carry_the_same_flops_as_twice_forward() -> None:
    spec = resolve_model("13b")
    fwd = block_forward_flops(spec, micro_batch=1, seq_len=8192, act_bytes=2)
    bwd = block_backward_flops(spec, micro_batch=1, seq_len=8192, act_bytes=2)
    assert sum(2.0 * m * k * n * c for m, k, n, c in bwd.gemms) == pytest.approx(bwd.matmul)
    assert sum(2.0 * m * k * n * c for m, k, n, c in fwd.gemms) == pytest.approx(fwd.matmul)
    assert sum(b for _, _, b in bwd.traffic) == pytest.approx(bwd.memory_bytes)
    assert {ph for _, _, ph, _ in bwd.attention_calls} == {"backward"}


def test_h200_matmul_table_predicts_its_own_points_left_out() -> None:
    """Leave-one-out over the bf16 shapes of hardware_profiles/hgx-h200.yaml (the matmuls
    of real FSDP2 steps and of reports/validation/h200/kernels.csv): the interpolation's
    error where nothing was measured. Measured: mean 7.4%, median 5.4%, worst 66% at the
    smallest shape (1024^3), an edge where the rate falls faster than its neighbours say."""
    rates = resolve_hardware("hgx-h200").kernels
    assert rates is not None
    points = rates.matmul["bf16"]
    errors = []
    for i, p in enumerate(points):
        rest = replace(rates, matmul={"bf16": points[:i] + points[i + 1:]})
        errors.append(abs(rest.matmul_flop_per_s(p.m, p.k, p.n, "bf16") / p.flop_per_s - 1))
    assert len(points) == 42
    assert statistics.mean(errors) < 0.08
    assert statistics.median(errors) < 0.06


@pytest.mark.parametrize(("change", "field"), [
    ({"matmul_tflops": {"bf16": [[1024, 1024, 1024]]}}, "kernels.matmul_tflops.bf16[0]"),
    ({"matmul_tflops": {"bf16": [[1024, 1024, 1024, -1]]}}, "kernels.matmul_tflops.bf16[0]"),
    ({"attention": []}, "kernels.attention"),
    ({"attention": {"bf16": [[1, 2, 3]]}}, "kernels.attention.bf16[0]"),
    ({"memory_gb_per_s": {"norm": {"forward": 1}}}, "kernels.memory_gb_per_s.norm.backward"),
    ({"typo": 1}, "kernels.typo"),
    ({"memory_gb_per_s": {"reduce_copy_in": {"forward": 1}}},
     "kernels.memory_gb_per_s.reduce_copy_in.backward"),
    ({"memory_gb_per_s": {"copy": {"forward": 1, "backward": 1}}},
     "kernels.memory_gb_per_s.copy"),
    ({"memory_gb_per_s": {"gelu": {"forward": 0, "backward": 1}}},
     "kernels.memory_gb_per_s.gelu.forward"),
])
def test_bad_rates_name_the_field(change: dict[str, Any], field: str) -> None:
    data = {**TOY, **change}
    if "memory_gb_per_s" in change:
        data["memory_gb_per_s"] = {**TOY["memory_gb_per_s"], **change["memory_gb_per_s"]}
    with pytest.raises(ConfigError) as e:
        KernelRates.from_dict(data)
    assert e.value.field == field


def test_a_required_class_brings_every_required_class() -> None:
    """Optional classes may stand alone; one of MEMORY_CLASSES without the others names
    the first missing."""
    data = {"matmul_tflops": TOY["matmul_tflops"], "source": "cpu",
            "memory_gb_per_s": {"gelu": {"forward": 2, "backward": 4},
                                "norm": {"forward": 1, "backward": 1}}}
    with pytest.raises(ConfigError) as e:
        KernelRates.from_dict(data)
    assert e.value.field == "kernels.memory_gb_per_s.rope"
