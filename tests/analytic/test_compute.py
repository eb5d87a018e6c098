"""zsim.analytic.compute: time of FLOPs, memory traffic and kernels on the two-tier toy
cluster (1 TFLOP/s bf16 peak, 0.5 fp32; matmul efficiency 0.5, attention 0.25; 1000 GB/s
memory at efficiency 1), and the traffic counts of the reference block worked out by hand
from the ops of zsim.backend.reference_model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from zsim.analytic.compute import (
    Flops,
    block_backward_flops,
    block_forward_flops,
    compute_time_s,
    head_backward_flops,
    head_forward_flops,
    optimizer_flops,
    recompute_forward_flops,
)
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec


def test_roofline_time_by_hand(two_tier_hw: HardwareProfile) -> None:
    flops = Flops(matmul=1e12, attention=1e12)
    # 1e12 / (1e12 x 0.5) + 1e12 / (1e12 x 0.25) = 2 s + 4 s
    assert math.isclose(compute_time_s(flops, two_tier_hw, "bf16"), 6.0)
    assert math.isclose(compute_time_s(flops, two_tier_hw, "fp32"), 12.0)


def test_memory_bound_and_kernel_terms_add_by_hand(two_tier_hw: HardwareProfile) -> None:
    hw = replace(two_tier_hw, kernel_overhead_s=2e-6)
    # 5e11 B at 1000 GB/s x 1.0 = 0.5 s; 1e5 kernels x 2 us = 0.2 s; matmul 2 s.
    flops = Flops(matmul=1e12, attention=0.0, memory_bytes=5e11, kernels=1e5)
    assert math.isclose(compute_time_s(flops, hw, "bf16"), 2.0 + 0.5 + 0.2)
    # The memory term does not depend on the compute dtype's peak.
    assert math.isclose(compute_time_s(replace(flops, matmul=0.0), hw, "fp32"), 0.7)


def test_flops_arithmetic_carries_bytes_and_kernels() -> None:
    a = Flops(matmul=3.0, attention=1.0, memory_bytes=10.0, kernels=2.0)
    assert (a + a.scaled(2.0)) == Flops(matmul=9.0, attention=3.0, memory_bytes=30.0,
                                        kernels=6.0)
    assert a.total == 4.0  # FLOPs only: traffic is not work in the MFU sense


@pytest.fixture
def small() -> ModelSpec:
    """d=64, 4 heads of 16, 2 kv heads (kv width 32), SwiGLU 96, vocab 100."""
    return ModelSpec(name="small", num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                     ffn_hidden=96, vocab_size=100, max_seq_len=32)


def test_block_forward_traffic_by_hand(small: ModelSpec) -> None:
    b, s, a = 2, 16, 2
    t, d, kv, f = b * s, 64, 32, 96
    # Per token, in elements of the activation dtype (read + written), from the ops of
    # zsim.backend.reference_model.TransformerBlock:
    norm = 2 * d                      # fused RMSNorm: read x, write y (twice per block)
    rope = 10                         # neg 1/2+1/2, cat 1+1, *cos 1+1, *sin 1+1, add 2+1
    elems = (2 * norm + rope * d + rope * kv   # q at width d, k at width kv
             + 2 * d                  # attention output transpose+reshape copy
             + 2 * 3 * d              # two residual adds: read 2, write 1
             + 2 * f + 3 * f)         # SiLU read 1 write 1; gate product read 2 write 1
    fwd = block_forward_flops(small, micro_batch=b, seq_len=s, act_bytes=a)
    assert fwd.memory_bytes == t * elems * a
    # 2 norms + 2 x 5 RoPE + copy + 2 adds + SiLU + product = 17; 7 matmuls; 1 attention.
    assert fwd.kernels == 17 + 7 + 1
    bwd = block_backward_flops(small, micro_batch=b, seq_len=s, act_bytes=a)
    assert (bwd.memory_bytes, bwd.kernels) == (2 * fwd.memory_bytes, 2 * fwd.kernels)
    # fp32 activations move twice the bytes.
    assert block_forward_flops(small, micro_batch=b, seq_len=s, act_bytes=4).memory_bytes == \
        2 * fwd.memory_bytes


def test_composite_norm_adds_its_fp32_passes(small: ModelSpec) -> None:
    t, d, a = 32, 64, 2
    fused = block_forward_flops(small, micro_batch=2, seq_len=16, act_bytes=a)
    comp = block_forward_flops(replace(small, norm_kernel="composite"), micro_batch=2,
                               seq_len=16, act_bytes=a)
    # Per norm: x.float() (a + 4), pow (4 + 4), mean (read 4, write one fp32 per token),
    # rsqrt (4 + 4 per token), x * rstd (4 + 4), type_as (4 + a), * weight (a + a).
    per_norm = t * d * (a + 4 + 8 + 4 + 8 + 4 + a + 2 * a) + t * (4 + 8)
    assert comp.memory_bytes - fused.memory_bytes == 2 * (per_norm - t * d * 2 * a)
    assert comp.kernels - fused.kernels == 2 * (7 - 1)


def test_root_forward_traffic_by_hand(small: ModelSpec) -> None:
    t, d, v, a = 32, 64, 100, 2
    head = head_forward_flops(small, micro_batch=2, seq_len=16, act_bytes=a)
    # embedding gather (read a row, write it), final norm, logits.float() (a + 4),
    # log_softmax in fp32 (4 + 4), nll_loss (one fp32 per token read, the loss written).
    expect = t * d * 2 * a + t * d * 2 * a + t * v * (a + 4) + t * v * 8 + t * 4 + 4
    assert head.memory_bytes == expect
    assert head.kernels == 5 + 1  # 5 memory-bound kernels + the output matmul
    assert head.matmul == 2.0 * t * d * v


def test_root_backward_splits_at_the_logits_gradient_by_hand(small: ModelSpec) -> None:
    # Autograd runs the loss's backward (NLL, log-softmax, the upcast) before the output
    # projection's: the first part is memory-bound only, twice its forward traffic; the
    # second holds both matmul gradients and the embedding and final norm kernels; the
    # two add up to twice the root's forward.
    t, d, v, a = 32, 64, 100, 2
    loss, output = head_backward_flops(small, micro_batch=2, seq_len=16, act_bytes=a)
    assert loss.matmul == 0.0 and loss.gemms == ()
    assert loss.memory_bytes == 2 * (t * v * (a + 4) + t * v * 8 + t * 4 + 4)
    assert loss.kernels == 2 * 3
    assert output.matmul == 2 * 2.0 * t * d * v
    assert sorted(output.gemms) == sorted([(t, v, d, 1.0), (d, t, v, 1.0)])
    assert output.memory_bytes == 2 * (t * d * 2 * a + t * d * 2 * a)
    head = head_forward_flops(small, micro_batch=2, seq_len=16, act_bytes=a)
    assert loss.memory_bytes + output.memory_bytes == 2 * head.memory_bytes
    assert loss.kernels + output.kernels == 2 * head.kernels


def test_selective_recompute_reruns_every_memory_bound_kernel(small: ModelSpec) -> None:
    kw = dict(micro_batch=2, seq_len=16, act_bytes=2)
    fwd = block_forward_flops(small, **kw)
    sel = recompute_forward_flops(small, recompute="selective", **kw)
    full = recompute_forward_flops(small, recompute="full", **kw)
    assert full == fwd
    assert sel.memory_bytes == fwd.memory_bytes and sel.attention == 0.0
    # wk, wo, w3 are recomputed: 3 matmul kernels + the 17 memory-bound ones.
    assert sel.kernels == 17 + 3
    assert recompute_forward_flops(small, recompute="none", **kw) == Flops(matmul=0.0,
                                                                             attention=0.0)


def test_adamw_moves_80_bytes_per_fp32_parameter() -> None:
    # _multi_tensor_adam: wd mul (r p, w p) 8, lerp (r m, r g, w m) 12, mul (r v, w v) 8,
    # addcmul (r v, r g, w v) 12, sqrt (r v, w denom) 8, div 8, add 8,
    # addcdiv (r p, r m, r denom, w p) 16 = 80 B.
    opt = optimizer_flops(1000, optimizer="adamw", tensors=10, master_bytes=4,
                          state_bytes_per_param=8, grad_bytes=4, param_copy_bytes=0)
    assert opt.memory_bytes == 80 * 1000
    assert opt.kernels == 9 * 10
    assert opt.total == 0.0
    # A bf16 compute copy written after the step: one cast kernel per tensor, read 4 write 2.
    mixed = optimizer_flops(1000, optimizer="adamw", tensors=10, master_bytes=4,
                            state_bytes_per_param=8, grad_bytes=2, param_copy_bytes=2)
    assert mixed.memory_bytes == (80 - 2 * 2 + 4 + 2) * 1000
    assert mixed.kernels == 10 * 10


def test_fused_adamw_moves_28_bytes_per_fp32_parameter() -> None:
    # DeepSpeed's FusedAdam: read g, p, m, v; write p, m, v: 7 x 4 B. One kernel per tensor
    # on CPU (ds_adam_step); on CUDA one depth-4 multi_tensor_apply: 10 tensors of 100 Mi
    # elements are 16,000 chunks of 64 Ki elements and half a chunk per tensor,
    # ceil(16,005 / 320) = 51 launches of 320 chunks.
    opt = optimizer_flops(1000, optimizer="adamw", tensors=10, master_bytes=4,
                          state_bytes_per_param=8, grad_bytes=4, param_copy_bytes=0,
                          fused=True)
    assert opt.memory_bytes == 28 * 1000
    assert opt.kernels == 10
    cuda = optimizer_flops(10 * 100 * 2**20, optimizer="adamw", tensors=10, master_bytes=4,
                           state_bytes_per_param=8, grad_bytes=4, param_copy_bytes=2,
                           foreach="multi_tensor_apply", fused=True)
    assert cuda.memory_bytes == (28 + 4 + 2) * 10 * 100 * 2**20
    # The bf16 copy after it: a depth-2 foreach copy, 51 launches too.
    assert cuda.kernels == 51 + 51
