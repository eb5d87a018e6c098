"""The sampled step-time factor of a synchronous step (zsim.analytic.stragglers) against
its own closed forms; tests/engine/test_stragglers_vs_engine.py holds it to the engine."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zsim.analytic.stragglers import effective_kernels, step_factors
from zsim.engine.replay import Jitter
from zsim.errors import ConfigError


def test_no_jitter_no_slowdown() -> None:
    out = step_factors(Jitter(cv=0.0, straggler_prob=0.0), ranks=8, kernels=10, steps=50,
                       seed=0)
    assert out.samples == (1.0,) * 50
    assert out.p50 == out.p99 == 1.0


def test_stragglers_alone_slow_a_step_when_any_rank_is_one() -> None:
    ranks, p, s = 8, 0.05, 0.3
    out = step_factors(Jitter(cv=0.0, straggler_prob=p, straggler_slowdown=s), ranks=ranks,
                       kernels=1, steps=20_000, seed=1)
    slow = np.asarray(out.samples) > 1.0
    # P(some rank of 8 is a straggler) = 1 - 0.95^8 = 0.337; binomial s.e. 0.0033.
    assert slow.mean() == pytest.approx(1 - (1 - p) ** ranks, abs=0.015)
    assert set(np.round(out.samples, 12)) == {1.0, 1.3}


def test_one_rank_mean_of_k_kernels_has_cv_over_sqrt_k() -> None:
    out = step_factors(Jitter(cv=0.2, straggler_prob=0.0), ranks=1, kernels=16,
                       steps=50_000, seed=2)
    x = np.asarray(out.samples)
    assert x.mean() == pytest.approx(1.0, abs=0.002)
    assert x.std() / x.mean() == pytest.approx(0.2 / math.sqrt(16), rel=0.02)


def test_compute_fraction_dilutes_the_factor_and_seed_repeats() -> None:
    jitter = Jitter(cv=0.05, straggler_prob=0.05, straggler_slowdown=0.3)
    full = step_factors(jitter, ranks=8, kernels=10, steps=100, seed=3)
    half = step_factors(jitter, ranks=8, kernels=10, steps=100, seed=3, compute_fraction=0.5)
    assert np.allclose(np.asarray(half.samples) - 1, (np.asarray(full.samples) - 1) / 2)
    assert step_factors(jitter, ranks=8, kernels=10, steps=100, seed=3) == full


def test_effective_kernels() -> None:
    assert effective_kernels([1.0] * 7) == pytest.approx(7)
    # One kernel of 3 and three of 1: (6)^2 / (9 + 3) = 3.
    assert effective_kernels([3.0, 1.0, 1.0, 1.0]) == pytest.approx(3)


@pytest.mark.parametrize(("call", "field"), [
    (lambda: step_factors(Jitter(), ranks=0, kernels=1, steps=1, seed=0), "ranks"),
    (lambda: step_factors(Jitter(), ranks=1, kernels=0, steps=1, seed=0), "kernels"),
    (lambda: step_factors(Jitter(), ranks=1, kernels=1, steps=1, seed=0,
                          compute_fraction=2.0), "compute_fraction"),
    (lambda: step_factors(Jitter(straggler_prob=1.5), ranks=1, kernels=1, steps=1, seed=0),
     "jitter.straggler_prob"),
    (lambda: effective_kernels([0.0]), "kernel_times_s"),
])
def test_bad_input_names_the_field(call, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field
