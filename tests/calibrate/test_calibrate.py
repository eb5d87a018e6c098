"""`calibrate()` end to end on 2 gloo ranks with a short benchmark: the profile loads with
the strict schema of zsim.spec.hardware and carries its provenance; rounds of the
benchmark merge figure by figure."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from zsim.calibrate.fit import AlphaBeta, CollectiveSample  # noqa: E402
from zsim.calibrate.microbench import (  # noqa: E402
    BLOCK_STEPS,
    BenchConfig,
    RankBench,
    median_of_rounds,
)
from zsim.calibrate.profile import _host_costs, calibrate  # noqa: E402
from zsim.errors import ConfigError  # noqa: E402
from zsim.spec.hardware import HardwareProfile  # noqa: E402

pytestmark = pytest.mark.slow

QUICK = BenchConfig(sizes_bytes=(4096, 65536, 1 << 20, 4 << 20), iters_small=3, iters_large=2,
                    matmul_shapes=((256, 256, 256), (512, 256, 512)), copy_bytes=8 << 20,
                    adam_params=1 << 18, attention_shape=(1, 2, 128, 64),
                    elementwise_numels=(1 << 16,), sync_segments=(1, 4, 8),
                    host_layers=(1, 3), rounds=1)


def test_calibrate_writes_a_loadable_profile_with_provenance(tmp_path: Path) -> None:
    out = calibrate("gloo", 2, tmp_path / "cpu-test.yaml", config=QUICK, timeout_s=300)
    hw = HardwareProfile.from_yaml(out)
    assert hw.name == "cpu-test"
    assert hw.gpus_per_node == 2
    assert set(hw.peak_flop_per_s) == {"fp32", "bf16"}
    assert hw.intra_node.latency_s >= 0
    assert 0 < hw.intra_node.efficiency <= 1
    text = out.read_text()
    assert f"torch {torch.__version__}" in text
    assert "--backend gloo --nproc 2" in text
    # The compute model's memory-bound and per-kernel terms are measured, not defaulted:
    # a bf16 elementwise mix below the copy rate, and a per-kernel cost of a CPU dispatch
    # (microseconds: more than 100 ns, far less than a millisecond).
    assert 0 < hw.memory_bound_efficiency <= 1
    assert 1e-7 < hw.kernel_overhead_s < 1e-3
    assert "kernel_overhead" in text and "log_softmax" in text
    # CPU ranks run their kernels on the calling thread; the host costs are measured:
    # FSDP2's hooks take host time per unit (tens of microseconds at least, under a
    # second), and reduce_scatter (an all-reduce of the whole buffer in gloo) has its
    # own fitted rate.
    assert hw.launch == "synchronous"
    assert 1e-5 < hw.fsdp_unit_overhead_s < 1.0
    assert hw.rank_skew >= 0 and hw.collective_overhead_s >= 0
    assert set(hw.intra_node.kind_efficiency) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert hw.intra_node.kind_efficiency["all_gather"] == 1.0
    # Selective recomputation runs every op of a block through SAC's Python dispatch
    # mode in forward: microseconds per kernel, far above nothing, far below a millisecond.
    assert 1e-6 < hw.checkpoint_overhead_s["selective"]["forward"] < 1e-3
    assert all(v >= 0 for phases in hw.checkpoint_overhead_s.values() for v in phases.values())


def test_calibrate_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nproc"):
        calibrate("gloo", 1, tmp_path / "x.yaml")
    with pytest.raises(ConfigError, match="backend"):
        calibrate("mpi", 2, tmp_path / "x.yaml")


def _round(scale: float) -> RankBench:
    return RankBench(
        collectives=[CollectiveSample(op="all_gather", size_bytes=4096, world_size=2,
                                      time_s=1e-4 * scale),
                     CollectiveSample(op="all_reduce", size_bytes=4096, world_size=2,
                                      time_s=2e-4 / scale)],
        matmul_flop_per_s={"bf16": [1e9 * scale, 2e9 / scale]},
        attention_flop_per_s=5e8 * scale,
        rank_skew=0.1 / scale,
        block_step_s={"plain": 1e-3 * scale, "fsdp": 2e-3},
    )


def test_rounds_merge_to_the_median_of_each_figure() -> None:
    # Scales 1, 3, 2: the median of each figure is its value at scale 2, whether the
    # figure grows or shrinks with the scale, so figures are merged independently.
    merged = median_of_rounds([_round(1.0), _round(3.0), _round(2.0)])
    assert merged == _round(2.0)


def test_host_costs_of_a_noisy_host_are_floored_at_zero() -> None:
    """A per-block figure is a difference of step times (3 blocks - 1 block): on a busy
    host it can come out negative, and the profile's host costs would then be refused
    (efficiency.kernel_overhead_us must be >= 0); each is floored at 0 instead."""
    noisy = {k: -1e-4 for k in BLOCK_STEPS}
    link = AlphaBeta(latency_s=1e-5, bandwidth_bytes_per_s=1e9, max_rel_error=0.0)
    costs = _host_costs([RankBench(block_step_s=noisy)], link, nproc=2)
    assert costs.kernel_s == costs.fsdp_unit_s == costs.collective_s == 0.0
    assert all(v == 0.0 for phases in costs.checkpoint_s.values() for v in phases.values())
