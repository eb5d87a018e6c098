"""Fit an alpha-beta model to collective timings, and report bus bandwidth the way
nccl-tests does (bus bytes as zsim.analytic.collectives counts them). Pure arithmetic
(numpy); no torch, so it is testable on its own.

Model (ring algorithms, Thakur et al. 2005; docs/modelling.md "Communication"): an all-gather or
reduce-scatter of S bytes (the full, unsharded buffer) over n ranks takes
(n-1)·alpha + (n-1)/n · S / B; an all-reduce takes twice both terms; a broadcast (a
chain) (n-1)·alpha + S / B. B is the achievable bandwidth per rank, alpha the per-step
latency. Bus bandwidth = (S / t) · (n-1)/n for all-gather and reduce-scatter,
· 2(n-1)/n for all-reduce, · 1 for broadcast (nccl-tests doc/PERFORMANCE.md), so busbw of
a bandwidth-bound ring equals B.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from zsim.analytic.collectives import bus_bytes
from zsim.errors import ConfigError

RING_PHASES: dict[str, int] = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2,
                               "broadcast": 1}
"""Ring passes per collective: all-reduce = reduce-scatter + all-gather."""



@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveSample:
    """One measured collective."""

    op: str
    """"all_gather", "reduce_scatter", "all_reduce" or "broadcast" (torch.distributed
    spelling)."""
    size_bytes: int
    """Full buffer size: all-gather output, reduce-scatter input, all-reduce buffer."""
    world_size: int
    time_s: float
    """Wall time of one call, seconds (zsim.calibration.microbench: the trimmed mean of the
    timed calls)."""
    dtype: str = "fp32"
    """Element type of the buffer: a reduction's arithmetic runs in it (gloo sums bf16
    element by element, converting each to fp32 and back)."""

    @property
    def bus_bytes_per_s(self) -> float:
        """nccl-tests bus bandwidth: algorithm bandwidth times the ring's traffic factor."""
        return self.size_bytes / self.time_s * bus_bytes(self.op, 1.0, self.world_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class AlphaBeta:
    """Fitted link parameters."""

    latency_s: float
    """Per ring step (alpha), seconds."""
    bandwidth_bytes_per_s: float
    """Achievable per-rank bandwidth (1/beta) of the reference kind (all_gather when
    measured, else the first kind), bytes/s."""
    max_rel_error: float
    """Largest |predicted - measured| / measured over the fitted samples."""
    kind_factor: dict[str, float] = field(default_factory=dict)
    """Each measured kind's bandwidth relative to the reference kind's (1 for it)."""

    def predict_s(self, op: str, size_bytes: int, world_size: int) -> float:
        """Ring time of one collective, seconds."""
        n, k = world_size, RING_PHASES[op]
        bandwidth = self.bandwidth_bytes_per_s * self.kind_factor.get(op, 1.0)
        return k * (n - 1) * self.latency_s + bus_bytes(op, size_bytes, n) / bandwidth


IRLS_ROUNDS = 50
"""Reweighting rounds of the least-absolute-deviation fit (a 12-sample fit settles in
about 20)."""
IRLS_FLOOR = 1e-4
"""Smallest relative residual a weight is taken from: samples the fit already matches
closer than this count as matched, so exact timings stay exact."""


def fit_alpha_beta(samples: Sequence[CollectiveSample]) -> AlphaBeta:
    """Least absolute relative error, so small and large messages count alike and one
    stalled call does not pull the line: t ≈ k(n-1)·alpha + k(n-1)/n·S·beta_kind, one alpha
    for the link and one beta per collective kind measured (a backend may run one kind with
    more traffic than the ring needs: gloo reduce-scatters by all-reducing the whole buffer).

    Solved by iteratively reweighted least squares (weights 1/|relative residual|), which
    converges to the L1 fit. A squared-error fit lets a single small message that waited
    a scheduler slice on a shared host (10x its time) raise alpha until a kind's beta goes
    negative; the L1 fit leaves that sample as an outlier (max_rel_error still reports it).

    Raises:
        ConfigError: fewer than two samples, or a fit with a non-positive beta
            (timings that do not grow with size).
    """
    if len(samples) < 2:
        raise ConfigError("samples", len(samples), "need at least two collective timings")
    kinds = sorted({s.op for s in samples}, key=lambda k: (k != "all_gather", k))
    rows = []
    for s in samples:
        n, k = s.world_size, RING_PHASES[s.op]
        row = [k * (n - 1) / s.time_s] + [0.0] * len(kinds)
        row[1 + kinds.index(s.op)] = bus_bytes(s.op, s.size_bytes, n) / s.time_s
        rows.append(row)
    a, target = np.array(rows), np.ones(len(rows))
    weights = np.ones(len(rows))
    for _ in range(IRLS_ROUNDS):
        root = np.sqrt(weights)[:, None]
        params, *_ = np.linalg.lstsq(a * root, target * root[:, 0], rcond=None)
        weights = 1.0 / np.maximum(np.abs(a @ params - target), IRLS_FLOOR)
    alpha, *betas = params
    if min(betas) <= 0:
        raise ConfigError("samples", "timings", "time does not grow with size: no bandwidth")
    fit = AlphaBeta(latency_s=max(float(alpha), 0.0), bandwidth_bytes_per_s=1.0 / float(betas[0]),
                    max_rel_error=0.0,
                    kind_factor={k: float(betas[0] / b) for k, b in zip(kinds, betas, strict=True)})
    worst = max(abs(fit.predict_s(s.op, s.size_bytes, s.world_size) - s.time_s) / s.time_s
                for s in samples)
    return replace(fit, max_rel_error=worst)
