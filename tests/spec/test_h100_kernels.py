"""dgx-h100's GPU and host rates are hgx-h200's measurements carried by the rule its
profile states: the H100 SXM5 and the H200 SXM are the same GH100 die (132 SMs, the same
clocks and 700 W, the same dense peaks in both datasheets) on the same DGX host (2x Xeon
Platinum 8480C), with different HBM. Derived here from hgx-h200.yaml and the two
datasheet bandwidths its and dgx-h100's gpu sections give:

- compute-bound kernels (matmul, attention) keep the H200's rate unless moving their
  operands once through HBM at the H100's achievable rate would take longer than the
  H200's kernel (a roofline bound);
- memory-bound classes keep their fraction of HBM bandwidth;
- flat efficiencies (fractions of peak or of bandwidth), host costs and the kernel
  overhead are the H200's as measured."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from zsim.spec.registry import PROFILES_DIR, resolve_hardware

BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}
"""Bytes per element a kernel of each compute dtype reads and writes (tf32: fp32 storage)."""


def _profile(name: str) -> dict[str, Any]:
    return yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())


H100, H200 = _profile("dgx-h100"), _profile("hgx-h200")


def _achievable_h100_bytes_per_s() -> float:
    """The H100's datasheet HBM bandwidth at the fraction the H200's d2d copy reached."""
    return (H100["gpu"]["hbm_bandwidth_gb_per_s"] * 1e9
            * H200["efficiency"]["memory_bound"])


def _matmul_bound(m: int, k: int, n: int, dtype: str) -> float:
    """FLOP/s at which an (m x k) @ (k x n) matmul would take as long as reading both
    operands and writing the result once at the H100's achievable HBM rate."""
    flops = 2.0 * m * k * n
    traffic = BYTES[dtype] * (m * k + k * n + m * n)
    return flops / traffic * _achievable_h100_bytes_per_s()


def _attention_bound(seq: int, head_dim: int, dtype: str, tensors: int) -> float:
    """The same for causal attention per (batch, head) in forward FLOPs (2 seq^2 d):
    forward reads q, k, v and writes o (4 tensors of seq x d); backward reads q, k, v, o,
    dO and writes dq, dk, dv (8)."""
    flops = 2.0 * seq * seq * head_dim
    traffic = BYTES[dtype] * tensors * seq * head_dim
    return flops / traffic * _achievable_h100_bytes_per_s()


def test_the_two_parts_differ_in_memory_only() -> None:
    """The premise of the carry: the same dense peaks in every dtype, the same host."""
    assert H100["gpu"]["peak_tflops"] == H200["gpu"]["peak_tflops"]
    assert H100["gpu"]["blas_workspace_mib"] == H200["gpu"]["blas_workspace_mib"]
    assert (H100["gpu"]["hbm_bandwidth_gb_per_s"],
            H200["gpu"]["hbm_bandwidth_gb_per_s"]) == (3350, 4800)
    for key in ("gpus_per_node", "host_memory_gib", "pcie_gb_per_s", "cpu_cores",
                "pageable_pcie_gb_per_s"):
        assert H100["node"][key] == H200["node"][key], key


@pytest.mark.parametrize("dtype", sorted(H200["kernels"]["matmul_tflops"]))
def test_matmuls_are_the_h200s_by_the_roofline_rule(dtype: str) -> None:
    """Every measured shape keeps its rate: none is bound by the H100's HBM (the largest
    traffic share is under half of its kernel's time), so the table is the H200's."""
    derived = [[m, k, n, min(t, _matmul_bound(m, k, n, dtype) / 1e12)]
               for m, k, n, t in H200["kernels"]["matmul_tflops"][dtype]]
    assert H100["kernels"]["matmul_tflops"][dtype] == derived
    share = max(t * 1e12 / _matmul_bound(m, k, n, dtype)
                for m, k, n, t in H200["kernels"]["matmul_tflops"][dtype])
    assert share < 0.5


@pytest.mark.parametrize("dtype", sorted(H200["kernels"]["attention"]))
def test_attention_is_the_h200s_by_the_roofline_rule(dtype: str) -> None:
    derived = [[s, d, min(f, _attention_bound(s, d, dtype, 4) / 1e12),
                min(b, _attention_bound(s, d, dtype, 8) / 1e12)]
               for s, d, f, b in H200["kernels"]["attention"][dtype]]
    assert H100["kernels"]["attention"][dtype] == derived


def test_memory_bound_classes_keep_their_fraction_of_bandwidth() -> None:
    ratio = H100["gpu"]["hbm_bandwidth_gb_per_s"] / H200["gpu"]["hbm_bandwidth_gb_per_s"]
    h100, h200 = H100["kernels"]["memory_gb_per_s"], H200["kernels"]["memory_gb_per_s"]
    assert set(h100) == set(h200)
    for cls, rates in h200.items():
        for phase, rate in rates.items():
            assert h100[cls][phase] == pytest.approx(rate * ratio, abs=0.05), (cls, phase)


def test_flat_rates_and_host_costs_are_the_h200s() -> None:
    """Fractions of peak or of bandwidth, the host's AdamW and issue costs and the
    per-kernel gap carry as measured; what differs is the HBM and the links' own
    figures."""
    h100, h200 = resolve_hardware("dgx-h100"), resolve_hardware("hgx-h200")
    for field in ("matmul_efficiency", "attention_efficiency", "memory_bound_efficiency",
                  "pcie_efficiency", "host_adam_params_per_s", "host_adam_threads",
                  "host_adam_serial_fraction", "kernel_overhead_s", "foreach_kernels",
                  "optimizer_tensor_s", "fsdp2_block_host", "pageable_pcie_bytes_per_s",
                  "cpu_cores", "rank_host_adam_params_per_s"):
        a, b = getattr(h100, field), getattr(h200, field)
        if callable(a):
            a, b = a(), b()
        assert a == b, field
    assert h100.kernel_overhead_s == pytest.approx(3.1e-6)
