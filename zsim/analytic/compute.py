"""Compute: FLOPs of each part of the step and their roofline time on a profile.

Owns per-block and per-root FLOP counts by op (matmul vs attention) and their time at the
profile's achievable rates. Per-op counts are an independent derivation of
ModelSpec.flops_per_token (6N + attention); a test checks they agree.

References:
- A matmul (m x k) @ (k x n) costs 2mkn FLOPs; backward costs twice forward (grad of
  input and grad of weight), Kaplan et al. 2020 Sec. 2.1.
- Causal attention: QK^T and AV each 2*b*s^2*d FLOPs forward, halved by the causal mask
  (flash attention skips masked tiles); backward counted as 2x forward like every op,
  the model-FLOPs convention of MFU (PaLM App. B). Flash attention's backward really
  runs 2.5x (it recomputes the scores); the profile's attention efficiency absorbs that.
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Flops:
    """FLOPs of one pass over some ops, split by the rate they run at."""

    matmul: float
    attention: float

    @property
    def total(self) -> float:
        return self.matmul + self.attention

    def __add__(self, other: Flops) -> Flops:
        return Flops(matmul=self.matmul + other.matmul, attention=self.attention + other.attention)

    def scaled(self, factor: float) -> Flops:
        return Flops(matmul=self.matmul * factor, attention=self.attention * factor)


def block_forward_flops(model: ModelSpec, *, micro_batch: int, seq_len: int) -> Flops:
    """Forward FLOPs of one block for a micro-batch: its weight matmuls plus causal
    attention scores and values."""
    tokens = micro_batch * seq_len
    matmul = 2.0 * tokens * sum(k * n for _, k, n in model.block_matmuls())
    # QK^T and AV: 2 * b * s^2 * d each, half of the scores masked.
    attention = 2 * (2.0 * micro_batch * seq_len * seq_len * model.d_model) / 2
    return Flops(matmul=matmul, attention=attention)


def block_backward_flops(model: ModelSpec, *, micro_batch: int, seq_len: int) -> Flops:
    """Backward FLOPs of one block (without recomputation)."""
    return block_forward_flops(model, micro_batch=micro_batch, seq_len=seq_len).scaled(2.0)


def head_forward_flops(model: ModelSpec, *, micro_batch: int, seq_len: int) -> Flops:
    """Forward FLOPs of the output projection (embedding lookups do no matmul)."""
    return Flops(matmul=2.0 * micro_batch * seq_len * model.d_model * model.vocab_size,
                 attention=0.0)


def compute_time_s(flops: Flops, hw: HardwareProfile, dtype: str) -> float:
    """Roofline time of `flops` at the profile's achievable matmul and attention rates."""
    peak = hw.peak(dtype)
    return (flops.matmul / (peak * hw.matmul_efficiency)
            + flops.attention / (peak * hw.attention_efficiency))


def step_flops(model: ModelSpec, *, micro_batch: int, seq_len: int, grad_accum: int,
               recompute: str) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) per rank per optimizer step. Hardware FLOPs add the
    recomputed forward (see recompute_forward_flops)."""
    fwd = block_forward_flops(model, micro_batch=micro_batch, seq_len=seq_len)
    bwd = block_backward_flops(model, micro_batch=micro_batch, seq_len=seq_len)
    head = head_forward_flops(model, micro_batch=micro_batch, seq_len=seq_len)
    model_flops = model.num_layers * (fwd + bwd).total + 3 * head.total
    extra = recompute_forward_flops(model, micro_batch=micro_batch, seq_len=seq_len,
                                    recompute=recompute).total
    hw_flops = model_flops + model.num_layers * extra
    return model_flops * grad_accum, hw_flops * grad_accum


def recompute_forward_flops(model: ModelSpec, *, micro_batch: int, seq_len: int,
                            recompute: str) -> Flops:
    """FLOPs re-run inside one block's backward: the whole forward for "full"; for
    "selective" (torchtitan op SAC) the matmuls whose outputs are not saved, every second
    one in call order (wk, wo, w3 for SwiGLU); attention outputs are saved."""
    if recompute == "none":
        return Flops(matmul=0.0, attention=0.0)
    fwd = block_forward_flops(model, micro_batch=micro_batch, seq_len=seq_len)
    if recompute == "full":
        return fwd
    recomputed = sum(k * n for _, k, n in model.block_matmuls()[1::2])
    return Flops(matmul=2.0 * micro_batch * seq_len * recomputed, attention=0.0)
