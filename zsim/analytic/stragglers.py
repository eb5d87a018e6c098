"""The step-time factor of a synchronous data-parallel step at N ranks under the engine's
jitter (zsim.engine.replay.Jitter), in closed form and by sampling. Owns `step_factors`
and `effective_kernels`; the run simulation (zsim.engine.run_replay) takes the samples as
its step slowdowns.

Model. Rank r is a straggler for the whole step with probability p (Bernoulli B_r), slower
by s on every kernel; each of its K compute kernels takes a lognormal factor X_rk of mean 1
and coefficient of variation c. With kernels of equal time, the rank's compute time over
nominal is (1 + s B_r) * mean_k X_rk. That mean has mean 1 and variance c^2 / K (the X_rk
are independent), so cv c / sqrt(K); by the central limit theorem it is near normal, and
for c / sqrt(K) << 1 a lognormal of the same mean and cv is the same distribution to the
order that matters: we draw it as lognormal(mu = -sigma^2/2, sigma^2 = ln(1 + c^2/K)).
Kernels of unequal times t_k act as K_eff = (sum t_k)^2 / sum t_k^2 equal ones
(`effective_kernels`). The step ends when the slowest rank does: its factor is the max over
the N ranks. Only the compute is jittered: with a fraction f of the step's critical path
in compute, the step's factor is 1 + f * (max - 1).

What the model leaves out: the engine syncs ranks at every collective, so a step is the
sum over its synchronised spans of each span's max over ranks, which exceeds the max of
the ranks' totals when per-kernel noise dominates (c / sqrt(K) against s p); straggler
ranks, slow for the whole step, are captured exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from zsim.engine.replay import Jitter
from zsim.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFactors:
    """Sampled step-time factors (step time over the jitter-free step)."""

    samples: tuple[float, ...]
    """One factor >= ~1 per sampled step."""
    p50: float
    """Median factor."""
    p99: float
    """99th-percentile factor."""


def effective_kernels(kernel_times_s: Sequence[float]) -> float:
    """K_eff = (sum t)^2 / sum t^2: the number of equal kernels whose mean has the same
    variance as the time-weighted mean of these (module docstring).

    Raises:
        ConfigError: no kernel with a positive time.
    """
    t = np.asarray(kernel_times_s, dtype=np.float64)
    sq = float(np.sum(t * t))
    if sq <= 0 or not math.isfinite(sq):
        raise ConfigError("kernel_times_s", kernel_times_s, "needs a positive kernel time")
    return float(np.sum(t)) ** 2 / sq


def step_factors(jitter: Jitter, *, ranks: int, kernels: float, steps: int, seed: int,
                 compute_fraction: float = 1.0) -> StepFactors:
    """`steps` draws of the step factor at `ranks` ranks of `kernels` (effective) compute
    kernels each, a fraction `compute_fraction` of the step in compute (module docstring).
    Seeded numpy: the same arguments give the same samples.

    Raises:
        ConfigError: ranks or steps below 1, kernels not > 0, compute_fraction outside
            [0, 1], or a jitter field out of range.
    """
    for name, value in (("ranks", ranks), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(name, value, "must be an integer >= 1")
    if not (math.isfinite(kernels) and kernels > 0):
        raise ConfigError("kernels", kernels, "must be finite and > 0")
    if not 0.0 <= compute_fraction <= 1.0:
        raise ConfigError("compute_fraction", compute_fraction, "must be in [0, 1]")
    if not (math.isfinite(jitter.cv) and jitter.cv >= 0):
        raise ConfigError("jitter.cv", jitter.cv, "must be finite and >= 0")
    if not 0.0 <= jitter.straggler_prob <= 1.0:
        raise ConfigError("jitter.straggler_prob", jitter.straggler_prob, "must be in [0, 1]")
    if not (math.isfinite(jitter.straggler_slowdown) and jitter.straggler_slowdown >= 0):
        raise ConfigError("jitter.straggler_slowdown", jitter.straggler_slowdown,
                          "must be finite and >= 0")
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(math.log1p(jitter.cv ** 2 / kernels))
    noise = rng.lognormal(-sigma * sigma / 2, sigma, size=(steps, ranks))
    slow = 1.0 + jitter.straggler_slowdown * (rng.random((steps, ranks))
                                              < jitter.straggler_prob)
    worst = np.max(slow * noise, axis=1)
    factors = 1.0 + compute_fraction * (worst - 1.0)
    return StepFactors(samples=tuple(float(f) for f in factors),
                       p50=float(np.quantile(factors, 0.5)),
                       p99=float(np.quantile(factors, 0.99)))
