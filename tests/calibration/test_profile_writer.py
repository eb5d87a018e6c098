"""`calibrate()`: bad arguments refused; rounds of the benchmark merge figure by figure;
host costs floored. Its run end to end on 2 gloo ranks with a short benchmark (the profile
loads with the strict schema of zsim.spec.hardware and carries its provenance) is checked
on the profile tests/cli/test_output_locations.py has the installed package write: the
same function with the same benchmark, run once in the suite."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from zsim.calibration import profile_writer as profile_module
from zsim.calibration.bench_figures import BLOCK_STEPS, RankBench
from zsim.calibration.collective_fit import AlphaBeta, CollectiveSample
from zsim.calibration.host_costs import host_costs
from zsim.calibration.microbench import median_of_rounds
from zsim.calibration.profile_writer import _measured_us, calibrate, profile_dict
from zsim.errors import ConfigError


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
    costs = host_costs([RankBench(block_step_s=noisy)], link, nproc=2, foreach="per_tensor")
    assert costs.kernel_s == costs.fsdp_unit_s == costs.collective_s() == 0.0
    assert all(v == 0.0 for phases in costs.checkpoint_s.values() for v in phases.values())


def test_measured_calls_are_the_median_over_ranks_by_kind_and_size() -> None:
    """collectives.measured_us: each kind's sizes ascending, each time the median of the
    ranks' (in us, four significant digits)."""
    def rank(times_us: list[float]) -> RankBench:
        ops = [("all_reduce", 65536), ("all_reduce", 4096), ("all_gather", 4096)]
        return RankBench(collectives=[
            CollectiveSample(op=op, size_bytes=size, world_size=3, time_s=t * 1e-6)
            for (op, size), t in zip(ops, times_us, strict=True)])

    ranks = [rank([300, 100, 50]), rank([310, 130, 40]), rank([900, 120, 45])]
    assert _measured_us(ranks, 3) == {"ranks": 3, "all_reduce": [[4096, 120], [65536, 310]],
                                      "all_gather": [[4096, 45]]}


def _bench(ds_adam: float) -> RankBench:
    """One rank's figures, made up but of the right kinds (a host of round numbers)."""
    sizes = (4096, 65536, 1 << 20, 4 << 20)
    return RankBench(
        collectives=[CollectiveSample(op=op, size_bytes=s, world_size=2,
                                      time_s=2e-5 + s / 1e9)
                     for op in ("all_gather", "reduce_scatter", "all_reduce") for s in sizes],
        p2p_bytes_per_s=1e9, matmul_flop_per_s={"fp32": [1e11, 1.2e11], "bf16": [4e11, 5e11]},
        linear_flop_per_s={"fp32": [0.9e11, 1e11], "bf16": [3.5e11, 4e11]},
        attention_flop_per_s=1e11, copy_bytes_per_s=2e10, elementwise_bytes_per_s=1.5e10,
        adam_params_per_s=1e9, deepspeed_adam_params_per_s=ds_adam,
        comm_compute_slowdown=0.05, compute_comm_slowdown=0.05, rank_skew=0.05,
        block_step_s={k: 1e-3 * (i + 1) for i, k in enumerate(BLOCK_STEPS)})


def _profile(ranks: list[RankBench], **kw: Any) -> dict[str, Any]:
    """profile_dict of these ranks' figures: a gloo host of len(ranks) ranks, a fixed date."""
    return profile_dict(ranks, name="t", backend="gloo", nproc=len(ranks),
                        started=datetime(2026, 12, 1, tzinfo=timezone.utc),
                        disk_bytes_per_s=(1e9, 1e9), **kw)


@pytest.mark.parametrize("ds_adam", [4e9, 0.0])
def test_profile_writes_the_host_optimizer_rates(ds_adam: float) -> None:
    """DeepSpeedCPUAdam's rate is the node's (the ranks' median x ranks), written only
    where it was timed; torch's AdamW rate always; a gloo host runs foreach ops tensor by
    tensor. The profile loads."""
    from zsim.spec.hardware import HardwareProfile

    data = _profile([_bench(ds_adam), _bench(ds_adam)])
    eff = data["efficiency"]
    assert eff["host_adam_params_per_s"] == pytest.approx(2e9)
    assert eff["foreach_kernels"] == "per_tensor"
    if ds_adam:
        assert eff["deepspeed_adam_params_per_s"] == pytest.approx(8e9)
    else:
        assert "deepspeed_adam_params_per_s" not in eff
    hw = HardwareProfile.from_dict(data, name="t")
    assert hw.deepspeed_adam_params_per_s == pytest.approx(ds_adam * 2)


def test_the_cost_of_a_call_is_net_of_the_synchronisations_it_made() -> None:
    """With a measured synchronisation cost S (each rank's figure; the profile takes
    their mean), the FSDP2 nano runs' calls paid S where the simulator charges it: per
    block, resharding after forward, the forward all-gather and the reduce-scatter,
    each after the block's compute (the backward all-gather follows the previous
    reduce-scatter), 2 of its 3 calls; not resharding, both of its 2. The cost of a call
    is the mean over the two runs of what their calls took less those S, over their
    calls: S x (2/3 + 2/2) / 2 below the figure without S (here not floored)."""
    from zsim.spec.hardware import HardwareProfile

    plain = [_bench(0.0), _bench(0.0)]
    s_us = (400.0, 600.0)
    timed = [replace(r, sync_overhead_s=s * 1e-6) for r, s in zip(plain, s_us, strict=True)]
    # Calls dearer than the synchronisations, so that no figure is floored at 0.
    for r in (*plain, *timed):
        r.block_step_s = {**r.block_step_s, "fsdp": 0.02, "fsdp_no_reshard": 0.015}
    a, b = _profile(plain), _profile(timed)
    assert a["host"]["sync_overhead_us"] == 0.0
    assert b["host"]["sync_overhead_us"] == pytest.approx(500.0)
    assert (a["host"]["collective_overhead_us"] - b["host"]["collective_overhead_us"]
            == pytest.approx(500.0 * (2 / 3 + 1) / 2, abs=1.0))  # 4 significant digits
    assert HardwareProfile.from_dict(b, name="t").sync_overhead_s == pytest.approx(5e-4)


def test_the_alpha_beta_fit_sees_the_fp32_calls_only() -> None:
    """The link's latency and bandwidth are fitted on the fp32 calls; bf16 reductions
    that take twice as long as fp32 (gloo adds bf16 through fp32) change the bf16 table
    and nothing of the link."""
    plain = [_bench(0.0), _bench(0.0)]
    with_bf16 = [_bench(0.0), _bench(0.0)]
    for r in with_bf16:
        r.collectives = r.collectives + [
            CollectiveSample(op=s.op, size_bytes=s.size_bytes, world_size=2, dtype="bf16",
                             time_s=2 * s.time_s)
            for s in r.collectives if s.op != "all_gather"]
    a, b = _profile(plain), _profile(with_bf16)
    for link in ("intra_node", "inter_node"):
        assert a[link] == b[link]
    assert "bf16" not in a["collectives"]["measured_us"]
    # 4 KiB: 2 x (20 us + 4,096 B at 1 GB/s) = 48.19 us
    assert b["collectives"]["measured_us"]["bf16"]["all_reduce"][0] == [4096, 48.19]


def test_profile_writes_the_cold_gemms_as_a_kernel_table() -> None:
    """Each GEMM shape of the bench config at the median of its rate over ranks, in
    TFLOP/s; a model's GEMM of a measured shape then takes exactly that rate, and a
    profile whose ranks timed none has no kernels section."""
    from zsim.calibration.bench_figures import BenchConfig
    from zsim.calibration.kernel_bench import gemm_shapes
    from zsim.spec.hardware import HardwareProfile

    cfg = BenchConfig(gemm_linears=((512, 256, 1024),))
    shapes = gemm_shapes(cfg)
    assert shapes == ((256, 512, 1024), (512, 256, 1024), (512, 1024, 256))
    ranks = [_bench(0.0) for _ in range(3)]
    for scale, r in zip((1.0, 1.5, 4.0), ranks, strict=True):
        r.gemm_flop_per_s = {"bf16": [scale * 1e11 * (i + 1) for i in range(3)],
                             "fp32": [scale * 2e10] * 3}
    data = _profile(ranks, config=cfg)
    table = data["kernels"]["matmul_tflops"]
    assert table["bf16"] == [[256, 512, 1024, 0.15], [512, 256, 1024, 0.3],
                             [512, 1024, 256, 0.45]]
    assert table["fp32"] == [[*s, 0.03] for s in shapes]
    hw = HardwareProfile.from_dict(data, name="t")
    assert hw.kernels is not None
    assert hw.kernels.matmul_flop_per_s(512, 1024, 256, "bf16") == pytest.approx(0.45e12)
    without = _profile([_bench(0.0)] * 2)
    assert "kernels" not in without


def test_profile_writes_gelus_rate_beside_the_gemms() -> None:
    """GELU's rate by pass, the median over ranks in GB/s, in the kernels section: the
    one memory-bound class a CPU's calibration measures (the profile loads with it and a
    GELU MLP's traffic takes it); ranks that timed no GELU leave it out."""
    from zsim.calibration.bench_figures import BenchConfig
    from zsim.spec.hardware import HardwareProfile

    cfg = BenchConfig(gemm_linears=((512, 256, 1024),))  # 3 GEMM shapes
    ranks = [_bench(0.0) for _ in range(3)]
    for scale, r in zip((1.0, 3.0, 2.0), ranks, strict=True):
        r.gemm_flop_per_s = {"bf16": [1e11] * 3, "fp32": [2e10] * 3}
        r.gelu_bytes_per_s = {"forward": scale * 1e9, "backward": scale * 3e9}
    data = _profile(ranks, config=cfg)
    assert data["kernels"]["memory_gb_per_s"] == {"gelu": {"forward": 2.0, "backward": 6.0}}
    assert "GELU" in data["kernels"]["source"]
    hw = HardwareProfile.from_dict(data, name="t")
    assert hw.kernels is not None
    assert hw.kernels.memory_rates("gelu") == {"forward": 2e9, "backward": 6e9}
    for r in ranks:
        r.gelu_bytes_per_s = {}
    assert "memory_gb_per_s" not in _profile(ranks, config=cfg)["kernels"]


def test_profile_writes_attentions_passes_apart_and_the_step_takes_them() -> None:
    """Attention's forward and backward timed apart become one kernels.attention row at
    the bench shape (the median over ranks, forward FLOPs per second of each pass, in
    TFLOP/s); a block then pays its attention at those rates instead of the flat
    efficiency's 1:2 split. By hand, at gpt-tiny's shape (micro-batch 2, 4 heads of 64,
    sequence 256): forward FLOPs 4 x 2 x 4 x 256^2 x 64 / 2 = 67.1 M, so 1 and 0.1 TFLOP/s
    take 67.1 us forward and 671 us backward, where the flat 1e11 FLOP/s took 671 us and
    1,342 us."""
    from zsim.analytic.compute import block_backward_flops, block_forward_flops, compute_time_s
    from zsim.calibration.bench_figures import BenchConfig
    from zsim.spec.hardware import HardwareProfile
    from zsim.validation.grid import grid

    cfg = BenchConfig(gemm_linears=((512, 256, 1024),), attention_shape=(2, 4, 256, 64))
    ranks = [_bench(0.0) for _ in range(3)]
    for scale, r in zip((1.0, 3.0, 2.0), ranks, strict=True):
        r.gemm_flop_per_s = {"bf16": [1e11] * 3, "fp32": [2e10] * 3}
        r.attention_pass_flop_per_s = {"forward": scale * 0.5e12, "backward": scale * 0.05e12}
    data = _profile(ranks, config=cfg)
    assert data["kernels"]["attention"] == {"bf16": [[256, 64, 1.0, 0.1]]}
    assert "forward and backward apart" in data["kernels"]["source"]
    with_rows = HardwareProfile.from_dict(data, name="t")
    data["kernels"].pop("attention")
    flat = HardwareProfile.from_dict(data, name="t")
    assert flat.peak("bf16") * flat.attention_efficiency == pytest.approx(1e11)
    gpt = next(m for m, _ in grid() if m.name == "gpt-tiny")
    forward_flops = 4 * 2 * 4 * 256**2 * 64 / 2
    for pass_flops, measured_s, flat_s in (
            (block_forward_flops, forward_flops / 1e12, forward_flops / 1e11),
            (block_backward_flops, forward_flops / 0.1e12, 2 * forward_flops / 1e11)):
        work = pass_flops(gpt, micro_batch=2, seq_len=256, act_bytes=2)
        assert (compute_time_s(work, with_rows, "bf16") - compute_time_s(work, flat, "bf16")
                == pytest.approx(measured_s - flat_s))
    for r in ranks:
        r.attention_pass_flop_per_s = {}
    assert "attention" not in _profile(ranks, config=cfg)["kernels"]


def test_the_cold_gemms_cover_every_gemm_of_the_validation_grid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every GEMM the simulator times for the report's plans (library, TP, PP; both
    world sizes) is one the calibration measures, so each runs at its own measured rate,
    not one interpolated between neighbours."""

    from zsim.calibration.bench_figures import BenchConfig
    from zsim.calibration.kernel_bench import gemm_shapes
    from zsim.simulate import simulate
    from zsim.spec.kernel_rates import KernelRates
    from zsim.spec.registry import resolve_hardware
    from zsim.validation.comparison import backend_knobs
    from zsim.validation.grid import grid

    shapes = gemm_shapes(BenchConfig())
    asked: set[tuple[int, int, int]] = set()
    lookup = KernelRates.matmul_flop_per_s

    def record(self: KernelRates, m: int, k: int, n: int, dtype: str) -> float | None:
        asked.add((m, k, n))
        return lookup(self, m, k, n, dtype)

    monkeypatch.setattr(KernelRates, "matmul_flop_per_s", record)
    rates = KernelRates.from_dict({"matmul_tflops": {"bf16": [[*s, 1.0] for s in shapes]},
                                   "source": "test"})
    hw = replace(resolve_hardware("local-cpu"), kernels=rates)
    for spec, plan in grid():
        simulate(replace(spec, **backend_knobs("cpu")), hw, plan)
    assert asked and asked <= set(shapes), sorted(asked - set(shapes))


def test_sessions_merge_rank_by_rank_into_one_profile(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """write_profile of sessions benchmarked at different times: each rank's figures the
    median over the sessions (a host 1x, 3x and 2x as slow gives the 2x session's profile),
    the provenance counting every round."""

    import yaml

    from zsim.calibration.bench_figures import BenchConfig
    from zsim.calibration.profile_writer import write_profile

    def slow(rank: RankBench, scale: float) -> RankBench:
        return replace(rank, adam_params_per_s=rank.adam_params_per_s / scale,
                       p2p_bytes_per_s=rank.p2p_bytes_per_s / scale,
                       collectives=[replace(c, time_s=c.time_s * scale)
                                    for c in rank.collectives])

    monkeypatch.setattr(profile_module, "disk_rates", lambda folder: (1e9, 2e9))
    ranks = [_bench(4e9), replace(_bench(4e9), rank_skew=0.07)]
    sessions = [[slow(r, scale) for r in ranks] for scale in (1.0, 3.0, 2.0)]
    when = datetime(2026, 12, 2, tzinfo=timezone.utc)
    path = write_profile(sessions, backend="gloo", nproc=2, out=tmp_path / "p.yaml",
                         started=when, config=BenchConfig(rounds=1))
    expected = profile_dict(sessions[2], name="p", backend="gloo", nproc=2, started=when,
                            disk_bytes_per_s=(1e9, 2e9), config=BenchConfig(rounds=3))
    assert yaml.safe_load(path.read_text()) == expected
    assert "each figure the median of 3 rounds" in expected["host"]["source"]


def test_reductions_are_timed_in_bf16_too_and_tabled_apart() -> None:
    """The reducing kinds are timed in bf16 right after fp32 at each size (up to
    reduction_dtype_max_bytes), all-gathers and broadcasts in fp32 only; the profile's
    table keeps the bf16 calls under bf16."""
    from zsim.calibration.bench_figures import BenchConfig
    from zsim.calibration.comm_bench import collective_cases

    cfg = BenchConfig(sizes_bytes=(4096, 1 << 20, 64 << 20, 256 << 20))
    cases = collective_cases(cfg)
    assert [c for c in cases if c[0] == "all_gather"] == [
        ("all_gather", "fp32", s) for s in cfg.sizes_bytes]
    assert [c for c in cases if c[0] == "all_reduce"] == [
        ("all_reduce", "fp32", 4096), ("all_reduce", "bf16", 4096),
        ("all_reduce", "fp32", 1 << 20), ("all_reduce", "bf16", 1 << 20),
        ("all_reduce", "fp32", 64 << 20), ("all_reduce", "bf16", 64 << 20),
        ("all_reduce", "fp32", 256 << 20)]
    rank = RankBench(collectives=[
        CollectiveSample(op=op, size_bytes=size, world_size=2, dtype=dtype,
                         time_s=(2 if dtype == "bf16" else 1) * size * 1e-9 + 1e-4)
        for op, dtype, size in cases])
    table = _measured_us([rank], 2)
    assert table["bf16"]["all_reduce"] == [[4096, 108.2], [1 << 20, 2197.0],
                                           [64 << 20, 134300.0]]
    assert table["all_reduce"][1] == [1 << 20, 1149.0]
    assert [c for c in cases if c[0] == "broadcast"] == [
        ("broadcast", "fp32", s) for s in cfg.sizes_bytes]
    assert set(table) == {"ranks", "all_gather", "reduce_scatter", "all_reduce", "broadcast",
                          "bf16"}


def test_a_call_time_is_the_mean_with_its_stalls_less_the_slowest_tenth() -> None:
    """gloo's calls are bimodal (fast, or stalled 2-4 ms): the median jumps between the
    modes, the mean (what a step of many calls pays) does not; the slowest tenth, rare
    hiccups, is left out."""
    from zsim.calibration.timing import trimmed_mean

    calls = [1.0] * 11 + [4.0] * 8 + [100.0]  # 20 calls: 8 stalls and one hiccup
    assert trimmed_mean(calls) == pytest.approx((11 * 1.0 + 7 * 4.0) / 18)
    assert trimmed_mean([2.0, 3.0, 7.0]) == pytest.approx(4.0)  # fewer than 10: all kept
