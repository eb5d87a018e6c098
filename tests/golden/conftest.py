"""Fixtures for the golden closed-form tests: a toy cluster with round numbers, so that
expected times can be worked out by hand, and the printed-precision rule for published
tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from zsim.spec.hardware import HardwareProfile


def toy_profile_dict(*, bandwidth_gb_per_s: float = 100.0, latency_us: float = 0.0,
                     gpus_per_node: int = 8, hbm_gib: float = 80.0) -> dict[str, Any]:
    """A profile in the YAML schema: every link `bandwidth_gb_per_s` at efficiency 1,
    `latency_us` per hop, 1 TFLOP/s peaks at efficiency 1."""

    def link(name: str) -> dict[str, Any]:
        return {"name": name, "bandwidth_gb_per_s": bandwidth_gb_per_s,
                "latency_us": latency_us, "efficiency": 1.0, "source": "test",
                "collective_efficiency": {"all_gather": 1.0, "reduce_scatter": 1.0,
                                          "all_reduce": 1.0}}

    return {
        "name": "toy",
        "description": "round numbers for hand-worked expectations",
        "gpu": {"name": "toy", "hbm_gib": hbm_gib, "hbm_bandwidth_gb_per_s": 1000,
                "peak_tflops": {"bf16": 1, "fp16": 1, "fp32": 1}, "source": "test"},
        "node": {"gpus_per_node": gpus_per_node, "host_memory_gib": 1024, "pcie_gb_per_s": 10,
                 "nvme_read_gb_per_s": 1, "nvme_write_gb_per_s": 1, "source": "test"},
        "intra_node": link("toy-intra"),
        "inter_node": link("toy-inter"),
        "collectives": {"model": "ring", "nvls_busbw_gb_per_s": 0, "source": "test"},
        "efficiency": {"matmul": 1.0, "attention": 1.0, "memory_bound": 1.0, "pcie": 1.0,
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


@pytest.fixture
def toy_hw() -> HardwareProfile:
    """100 GB/s on every link, zero latency, efficiency 1, 8 GPUs per node."""
    return HardwareProfile.from_dict(toy_profile_dict(), name="toy")


@pytest.fixture
def matches_printed() -> Callable[[float, str], bool]:
    """`check(value, printed)`: value rounds to the printed figure, i.e. lies within half a
    unit of its last printed digit ("29.3" allows 0.05, "112" allows 0.5)."""

    def check(value: float, printed: str) -> bool:
        decimals = len(printed.split(".")[1]) if "." in printed else 0
        return abs(value - float(printed)) <= 0.5 * 10.0**-decimals + 1e-9

    return check
