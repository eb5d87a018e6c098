"""Fixtures for the analytic unit tests: a two-tier toy cluster whose numbers make
hand-worked times exact."""

from __future__ import annotations

from typing import Any

import pytest

from zsim.spec.hardware import HardwareProfile


@pytest.fixture
def two_tier_hw(two_tier_data: dict[str, Any]) -> HardwareProfile:
    """4 GPUs per node; NVLink-like 100 GB/s with 1 us per hop inside a node, NIC-like
    10 GB/s with 10 us per hop across nodes; efficiency 1; 1 TFLOP/s peaks, matmul at
    half of peak and attention at a quarter."""
    return HardwareProfile.from_dict(two_tier_data, name="two-tier")


@pytest.fixture
def two_tier_data() -> dict[str, Any]:
    """two_tier_hw's YAML structure (a new copy each time, for tests that change it)."""

    def link(name: str, gb_per_s: float, us: float) -> dict[str, object]:
        return {"name": name, "bandwidth_gb_per_s": gb_per_s, "latency_us": us,
                "efficiency": 1.0, "source": "test",
                "collective_efficiency": {"all_gather": 1.0, "reduce_scatter": 1.0,
                                          "all_reduce": 1.0}}

    return {
        "name": "two-tier", "description": "toy",
        "gpu": {"name": "toy", "hbm_gib": 80, "hbm_bandwidth_gb_per_s": 1000,
                "peak_tflops": {"bf16": 1, "fp32": 0.5}, "source": "test"},
        "node": {"gpus_per_node": 4, "host_memory_gib": 512, "pcie_gb_per_s": 10,
                 "nvme_read_gb_per_s": 1, "nvme_write_gb_per_s": 1, "source": "test"},
        "intra_node": link("intra", 100, 1), "inter_node": link("inter", 10, 10),
        "collectives": {"model": "ring", "nvls_busbw_gb_per_s": 0, "source": "test"},
        "efficiency": {"matmul": 0.5, "attention": 0.25, "memory_bound": 1.0, "pcie": 1.0,
                       "host_adam_params_per_s": 1e9, "comm_compute_slowdown": 0.0,
                       "compute_comm_slowdown": 0.0,
                       "kernel_overhead_us": 0,
                       "source": "test"},
        "host": {"launch": "async", "collective_overhead_us": 0, "rank_skew": 0,
                 "fsdp_unit_overhead_us": 0,
                 "checkpoint_overhead_us": {m: {"forward": 0, "backward": 0}
                                            for m in ("full", "selective")},
                 "source": "test"},
    }
