"""zsim.calibration.kernel_bench.kernel_rates on a CPU host with more ranks than cores: the
share of a core each rank gets, the kernels timed on rank 0 alone and every rank's rates
divided by that share, and the profile saying so."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from zsim.backend.runner import RankContext, run_ranks
from zsim.calibration.bench_figures import BenchConfig, RankBench
from zsim.calibration.kernel_bench import KERNEL_RATES, core_share, kernel_rates

SMALL = BenchConfig(matmul_shapes=((64, 64, 64),), gemm_linears=((64, 32, 48),),
                    attention_shape=(1, 2, 64, 16), elementwise_numels=(4096,),
                    copy_bytes=1 << 20, cache_flush_bytes=1 << 20)
"""Kernels small enough to time in a second."""


@pytest.mark.parametrize(("ranks", "cores", "share"),
                         [(4, 2, 2.0), (3, 2, 1.5), (2, 2, 1.0), (1, 2, 1.0), (8, 16, 1.0)])
def test_ranks_share_a_core_only_beyond_the_cores(ranks: int, cores: int,
                                                  share: float) -> None:
    assert core_share(ranks, cores) == share


def _rates(ctx: RankContext, cores: int) -> tuple[float, dict[str, Any]]:
    out = RankBench()
    kernel_rates(ctx, BenchConfig(**{**asdict(SMALL), "cores": cores}), out)
    return out.core_share, {name: getattr(out, name) for name in KERNEL_RATES}


def test_more_ranks_than_cores_take_rank_0s_rates_alone_shared() -> None:
    """Two ranks on one core (cores=1): every rank holds the same rates, rank 0's timed
    alone, each divided by 2; on two cores each rank times its own, undivided."""
    shared = run_ranks(_rates, 1, nproc=2)
    (share0, rates0), (share1, rates1) = shared
    assert share0 == share1 == 2.0
    assert rates1 == rates0
    own = run_ranks(_rates, 2, nproc=2)
    assert [share for share, _ in own] == [1.0, 1.0]
    for _, rates in (*shared, *own):
        assert set(rates) == set(KERNEL_RATES)
        flat = [rates[n] for n in ("attention_flop_per_s", "copy_bytes_per_s",
                                   "elementwise_bytes_per_s")]
        flat += [v for n in ("matmul_flop_per_s", "linear_flop_per_s", "gemm_flop_per_s")
                 for d in rates[n].values() for v in d]
        flat += [*rates["attention_pass_flop_per_s"].values(),
                 *rates["gelu_bytes_per_s"].values()]
        assert flat and min(flat) > 0


def test_the_profile_says_its_kernels_are_shared() -> None:
    """A profile of ranks whose kernels were shared names the share in the sources of
    the rates it divided (gpu, efficiency, kernels), and not in the links'."""
    from test_profile_writer import _bench, _profile

    ranks = [_bench(0.0) for _ in range(4)]
    for r in ranks:
        r.core_share = 2.0
        r.gemm_flop_per_s = {"bf16": [1e11] * 3, "fp32": [5e10] * 3}
    data = _profile(ranks, config=BenchConfig(gemm_linears=((512, 256, 1024),)))
    said = "divided by 2, the ranks that share each core"
    for section in ("gpu", "efficiency", "kernels"):
        assert said in data[section]["source"], section
    assert said not in data["intra_node"]["source"]
    alone = _profile([_bench(0.0) for _ in range(2)])
    assert "share each core" not in alone["gpu"]["source"]


def test_every_kind_of_rate_is_divided() -> None:
    from zsim.calibration.kernel_bench import _divided

    assert _divided({"bf16": [4.0, 6.0], "x": {"forward": 8.0}}, 2.0) == {
        "bf16": [2.0, 3.0], "x": {"forward": 4.0}}
    assert _divided(3.0, 1.5) == 2.0


def test_the_deadline_grows_with_the_rounds_and_the_ranks_sharing_a_core(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_ranks' default deadline: ROUND_DEADLINE_S per round, times the ranks that
    share a core on gloo (4 ranks on 2 cores: twice 2 ranks'); a deadline given is kept."""
    from zsim.calibration import profile_writer as profile

    asked: list[float] = []
    monkeypatch.setattr(profile, "run_ranks",
                        lambda *a, timeout_s, **k: asked.append(timeout_s) or [])
    for nproc, rounds in ((2, 3), (4, 3), (4, 1)):
        profile.bench_ranks("gloo", nproc, config=BenchConfig(cores=2, rounds=rounds))
    profile.bench_ranks("gloo", 4, config=BenchConfig(cores=2), timeout_s=60.0)
    one = profile.ROUND_DEADLINE_S
    assert asked == [3 * one, 6 * one, 2 * one, 60.0]
