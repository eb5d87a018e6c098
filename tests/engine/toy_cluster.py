"""A toy cluster with round numbers, so expected timelines can be
worked out by hand."""

from __future__ import annotations

from zsim.spec.hardware import HardwareProfile, Link
from zsim.units import GB


def make_toy_hw(*, gpus_per_node: int = 2, intra_gb_per_s: float = 100.0,
                inter_gb_per_s: float = 10.0, latency_s: float = 0.0,
                slowdown: float = 0.0, hbm_bytes: float = 1e12) -> HardwareProfile:
    """Toy profile: 1e12 FLOP/s at efficiency 1, links at efficiency 1, 1 TB/s HBM."""
    return HardwareProfile(
        name="toy", description="toy cluster with round numbers", gpu_name="toy",
        hbm_bytes=hbm_bytes, hbm_bandwidth_bytes_per_s=1e12,
        peak_flop_per_s={"bf16": 1e12, "fp32": 1e12}, gpus_per_node=gpus_per_node,
        host_memory_bytes=1e12, pcie_bytes_per_s=10 * GB, nvme_read_bytes_per_s=1 * GB,
        nvme_write_bytes_per_s=1 * GB,
        intra_node=Link(name="toy-nvlink", bandwidth_bytes_per_s=intra_gb_per_s * GB,
                        latency_s=latency_s, efficiency=1.0),
        inter_node=Link(name="toy-nic", bandwidth_bytes_per_s=inter_gb_per_s * GB,
                        latency_s=latency_s, efficiency=1.0),
        collectives="ring", nvls_bus_bytes_per_s=0.0,
        matmul_efficiency=1.0, attention_efficiency=1.0, memory_bound_efficiency=1.0,
        pcie_efficiency=1.0, host_adam_params_per_s=1e9, comm_compute_slowdown=slowdown)
