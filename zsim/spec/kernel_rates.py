"""KernelRates: measured kernel rates of one GPU by shape, the optional `kernels:` section
of a hardware profile.

Owns the schema of that section and the rate lookups: a matmul's rate by its shape
(m, k, n) and dtype, causal attention's forward and backward rates by sequence length,
head dimension and dtype, and the bandwidth of each class of memory-bound kernel (norms, RoPE,
elementwise, the loss, the optimizer) by pass. A profile without the section
keeps its flat efficiencies (zsim.spec.hardware); one with it gets times that follow the
shape of each kernel, as measured (for the H200: kernels inside real FSDP2 steps and
micro-benchmarks, reports/validation/h200/; for a host `zsim calibrate` measured: its
matmuls, with attention and memory-bound kernels left to the flat efficiencies).
Only the matmul table is required: without attention rows or memory-bound classes those
kernels keep the flat efficiencies.

Interpolation between measured shapes: inverse-distance weighting in log2(m, k, n) over
the nearest INTERP_NEIGHBOURS points of the dtype's table (exact at a measured shape);
for attention, linear in log2(seq) between the measured sequence lengths of the closest
head dimension in the step's dtype, constant beyond the ends.
tests/spec/test_kernel_rates.py holds the leave-one-out error of the matmul interpolation
on the H200 table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, TypeVar

from zsim.errors import ConfigError
from zsim.units import GB

MEMORY_CLASSES: tuple[str, ...] = ("norm", "rope", "elementwise", "cross_entropy",
                                   "optimizer")
"""Classes of memory-bound kernels: RMSNorm/LayerNorm, rotary embedding, elementwise
(activations, residual adds, embedding gathers), the loss (logit upcast, log-softmax,
NLL), the foreach optimizer step."""

OPTIONAL_MEMORY_CLASSES: tuple[str, ...] = ("reduce_copy_in", "gelu")
"""Classes a profile may leave out: FSDP2's reduce-scatter copy-in when it casts
(torch.ops.fsdp.chunk_cat writing the unsharded gradients, cast to the reduce dtype, into
the flat reduce-scatter input: bf16 gradients reduced in fp32); GELU, the activation of a
GELU MLP (a tanh or erf per element: on a CPU a few times slower per byte than SiLU).
A profile may give these alone (a CPU's calibration times GELU and no other class).
Traffic of a class the profile lacks runs at its CLASS_FALLBACK class's rate where it has
that, else, as other copies and casts (FSDP copy-in/out, gradient casts), at the
profile's flat memory-bound rate (efficiency.memory_bound)."""

CLASS_FALLBACK: dict[str, str] = {"gelu": "elementwise"}
"""The class whose rate an optional class's traffic takes where the profile lacks it:
GELU was measured within the elementwise class on the GPU profiles."""

PASSES: tuple[str, ...] = ("forward", "backward")

INTERP_NEIGHBOURS = 4
"""Measured shapes weighted in a matmul rate lookup."""


@dataclass(frozen=True, slots=True)
class MatmulPoint:
    """One measured matmul: (m x k) @ (k x n) at `flop_per_s` (2mkn / time)."""

    m: int
    k: int
    n: int
    flop_per_s: float

    def distance2(self, m: int, k: int, n: int) -> float:
        return ((math.log2(m) - math.log2(self.m)) ** 2
                + (math.log2(k) - math.log2(self.k)) ** 2
                + (math.log2(n) - math.log2(self.n)) ** 2)


@dataclass(frozen=True, slots=True)
class AttentionPoint:
    """One measured causal attention call: forward and backward rates in forward FLOPs
    (4 * batch * heads * seq^2 * head_dim / 2) per second."""

    seq: int
    head_dim: int
    forward_flop_per_s: float
    backward_flop_per_s: float


Point = TypeVar("Point", MatmulPoint, AttentionPoint)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelRates:
    """Measured rates of one GPU's kernels by shape."""

    matmul: dict[str, tuple[MatmulPoint, ...]]
    """Measured matmuls per compute dtype ("bf16", "tf32", ...)."""
    attention: dict[str, tuple[AttentionPoint, ...]]
    """Measured causal attention per compute dtype, by sequence length and head
    dimension (none: the flat attention efficiency)."""
    memory_bytes_per_s: dict[str, dict[str, float]]
    """Bytes read + written per second by memory-bound kernel class (MEMORY_CLASSES, and
    those of OPTIONAL_MEMORY_CLASSES the profile gives) and pass (PASSES); empty: the
    flat memory-bound efficiency for every class."""
    source: str
    _looked_up: dict[tuple[int, int, int, str], float | None] = field(
        default_factory=dict, init=False, compare=False, repr=False)
    """Matmul rates already interpolated: a model's few shapes are asked for by every op
    of every plan (the lowering's hot path)."""

    def memory_rates(self, kernel_class: str) -> dict[str, float] | None:
        """Bytes per second of a memory-bound class by pass: its own, or its
        CLASS_FALLBACK's; None: neither measured (the flat memory-bound rate applies)."""
        rates = self.memory_bytes_per_s.get(kernel_class)
        if rates is None and kernel_class in CLASS_FALLBACK:
            rates = self.memory_bytes_per_s.get(CLASS_FALLBACK[kernel_class])
        return rates

    def matmul_flop_per_s(self, m: int, k: int, n: int, dtype: str) -> float | None:
        """Rate of an (m x k) @ (k x n) matmul in `dtype`; None: no table for the dtype."""
        key = (m, k, n, dtype)
        if key not in self._looked_up:
            self._looked_up[key] = self._interpolate(m, k, n, dtype)
        return self._looked_up[key]

    def _interpolate(self, m: int, k: int, n: int, dtype: str) -> float | None:
        table = self.matmul.get(dtype)
        if not table:
            return None
        nearest = sorted((p.distance2(m, k, n), p.flop_per_s) for p in table)
        if nearest[0][0] == 0.0:
            return nearest[0][1]
        weights = [(1.0 / d2, rate) for d2, rate in nearest[:INTERP_NEIGHBOURS]]
        return sum(w * r for w, r in weights) / sum(w for w, _ in weights)

    def attention_flop_per_s(self, seq: int, head_dim: int, phase: str,
                             dtype: str) -> float | None:
        """Forward FLOPs per second of causal attention's `phase` ("forward" or
        "backward") at this sequence length and head dimension in `dtype`; None: no
        measurement in that dtype."""
        table = self.attention.get(dtype)
        if not table:
            return None
        hd = min({p.head_dim for p in table}, key=lambda h: (abs(h - head_dim), h))
        pts = sorted((p.seq, p.forward_flop_per_s if phase == "forward"
                      else p.backward_flop_per_s) for p in table if p.head_dim == hd)
        by_seq: dict[int, list[float]] = {}
        for s, rate in pts:
            by_seq.setdefault(s, []).append(rate)
        xs = sorted(by_seq)
        ys = [sum(by_seq[s]) / len(by_seq[s]) for s in xs]
        if seq <= xs[0]:
            return ys[0]
        for (s0, r0), (s1, r1) in pairwise(zip(xs, ys, strict=True)):
            if seq <= s1:
                f = (math.log2(seq) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
                return r0 + f * (r1 - r0)
        return ys[-1]

    @classmethod
    def from_dict(cls, data: Any) -> KernelRates:
        """Build from the profile's `kernels:` mapping.

        Raises:
            ConfigError: a key is unknown or missing, or a value is not a positive number.
        """
        where = "kernels"
        _keys(data, where, ("matmul_tflops", "source"),
              optional=("attention", "memory_gb_per_s"))
        if not isinstance(data["source"], str) or not data["source"].strip():
            raise ConfigError("kernels.source", data["source"], "must be a non-empty string")
        matmul = _tables(data["matmul_tflops"], "kernels.matmul_tflops", _matmul_point,
                         "[m, k, n, tflops]")
        attention = (_tables(data["attention"], "kernels.attention", _attention_point,
                             "[seq, head_dim, fwd, bwd]") if "attention" in data else {})
        if "memory_gb_per_s" not in data:
            return cls(matmul=matmul, attention=attention, memory_bytes_per_s={},
                       source=data["source"])
        mem = data["memory_gb_per_s"]
        # Every class (the GPU phase rates), or optional ones alone (a CPU's calibration).
        alone = isinstance(mem, dict) and bool(mem) and not any(c in mem for c in MEMORY_CLASSES)
        required = () if alone else MEMORY_CLASSES
        _keys(mem, "kernels.memory_gb_per_s", required, optional=OPTIONAL_MEMORY_CLASSES)
        rates = {}
        for c in (*required, *(c for c in OPTIONAL_MEMORY_CLASSES if c in mem)):
            _keys(mem[c], f"kernels.memory_gb_per_s.{c}", PASSES)
            rates[c] = {p: _positive(mem[c][p], f"kernels.memory_gb_per_s.{c}.{p}") * GB
                        for p in PASSES}
        return cls(matmul=matmul, attention=attention, memory_bytes_per_s=rates,
                   source=data["source"])


def _tables(data: Any, where: str, point: Callable[[Any, str], Point],
            row: str) -> dict[str, tuple[Point, ...]]:
    """A mapping of dtype -> non-empty list of rows, each read by `point`."""
    if not isinstance(data, dict) or not data:
        raise ConfigError(where, data, f"must map dtype names to lists of {row}")
    return {dtype: tuple(point(r, f"{where}.{dtype}[{i}]")
                         for i, r in enumerate(_rows(rows, f"{where}.{dtype}")))
            for dtype, rows in data.items()}


def _keys(data: Any, where: str, expected: tuple[str, ...],
          optional: tuple[str, ...] = ()) -> None:
    """`data` is a mapping with every key of `expected`, and no key outside it and
    `optional`."""
    if not isinstance(data, dict):
        raise ConfigError(where, data, "must be a mapping")
    for key in data:
        if key not in expected and key not in optional:
            raise ConfigError(f"{where}.{key}", data[key],
                              f"unknown key; expected one of {', '.join(expected + optional)}")
    for key in expected:
        if key not in data:
            raise ConfigError(f"{where}.{key}", None, "missing required key")


def _rows(rows: Any, where: str) -> list[Any]:
    if not isinstance(rows, list) or not rows:
        raise ConfigError(where, rows, "must be a non-empty list")
    return rows


def _positive(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        raise ConfigError(where, v, "must be a positive number")
    return float(v)


def _dim(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(where, v, "must be a positive integer")
    return v


def _matmul_point(row: Any, where: str) -> MatmulPoint:
    """[m, k, n, tflops]."""
    if not isinstance(row, list) or len(row) != 4:
        raise ConfigError(where, row, "must be [m, k, n, tflops]")
    return MatmulPoint(_dim(row[0], where), _dim(row[1], where), _dim(row[2], where),
                       _positive(row[3], where) * 1e12)


def _attention_point(row: Any, where: str) -> AttentionPoint:
    """[seq, head_dim, forward tflops, backward tflops] (forward FLOPs per second)."""
    if not isinstance(row, list) or len(row) != 4:
        raise ConfigError(where, row,
                          "must be [seq, head_dim, forward_tflops, backward_tflops]")
    return AttentionPoint(_dim(row[0], where), _dim(row[1], where),
                          _positive(row[2], where) * 1e12, _positive(row[3], where) * 1e12)
