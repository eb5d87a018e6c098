"""Golden: two derivations of training FLOPs agree.

Derivation 1 (ModelSpec.flops_per_token): 6N + attention, N the parameters that take part
in a matmul per token (Kaplan et al. 2020 Sec. 2.1), attention 12*L*s*d halved for a causal
mask (PaLM App. B).
Derivation 2 (zsim.analytic.compute): per-op counts, 2*m*k*n per matmul forward, backward
twice forward. Written out here by hand from the architecture:

  per token, per block: matmul weights 2d^2 + 2*d*kv (q, o; k, v) + (ups + 1)*d*f
  output projection: V*d;  causal attention forward: 2 * (2*s*d) / 2 = 2*s*d per token
  training = 3 x forward.

The two differ only by parameters that are not matmul weights (norm weights and biases),
which 6N counts and per-op counting does not: by hand 2d per Llama block plus d for the
final norm; for a GPT block with biases and LayerNorm 4d (norms) + 2d + 2*kv + f + d
(biases), plus 2d for the final LayerNorm.
"""

from __future__ import annotations

import math

import pytest

from zsim.analytic.compute import step_flops
from zsim.spec.presets import PRESETS


def hand_forward_flops_per_token(name: str, seq_len: int) -> float:
    m = PRESETS[name]
    d, f, kv, v, layers = m.d_model, m.ffn_hidden, m.num_kv_heads * (m.d_model // m.num_heads), \
        m.vocab_size, m.num_layers
    ups = 2 if m.mlp == "swiglu" else 1
    block = 2 * d * d + 2 * d * kv + (ups + 1) * d * f
    return 2.0 * (layers * block + v * d) + layers * 2.0 * seq_len * d


def hand_non_matmul_params(name: str) -> int:
    m = PRESETS[name]
    d, f, kv = m.d_model, m.ffn_hidden, m.num_kv_heads * (m.d_model // m.num_heads)
    if m.bias:  # GPT-3: LayerNorm weight + bias twice, biases of q, k, v, o, w1, w2
        return m.num_layers * (4 * d + 2 * d + 2 * kv + f + d) + 2 * d
    return m.num_layers * 2 * d + d  # Llama: two RMSNorm weights per block, final norm


@pytest.mark.parametrize("name", ["llama2-7b", "llama3-70b", "gpt3-1.3b", "gpt3-175b"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_per_op_model_flops_match_hand_count(name: str, recompute: str) -> None:
    b, s = 2, 2048
    model_flops, _ = step_flops(PRESETS[name], micro_batch=b, seq_len=s, grad_accum=3,
                                recompute=recompute)
    expected = 3 * hand_forward_flops_per_token(name, s) * b * s * 3
    assert math.isclose(model_flops, expected, rel_tol=1e-12)


@pytest.mark.parametrize("name", ["llama2-7b", "llama3-8b", "gpt3-1.3b", "gpt3-13b"])
def test_six_n_plus_attention_matches_per_op_count(name: str) -> None:
    m, s = PRESETS[name], 2048
    model_flops, _ = step_flops(m, micro_batch=1, seq_len=s, grad_accum=1, recompute="none")
    per_op = model_flops / s
    assert math.isclose(m.flops_per_token(s) - per_op, 6.0 * hand_non_matmul_params(name),
                        rel_tol=1e-9)
    # and the gap is small: norms and biases are < 0.1% of a model's parameters.
    assert abs(m.flops_per_token(s) / per_op - 1) < 1e-3


def test_llama2_7b_flops_per_token_by_hand() -> None:
    # L=32, d=4096, f=11008, V=32000, MHA, s=4096:
    # matmul params 32*(4*4096^2 + 3*4096*11008) + 32000*4096 = 6,607,077,376
    # 6 * that = 39,642,464,256; causal attention 6*32*4096*4096 = 3,221,225,472
    model_flops, _ = step_flops(PRESETS["llama2-7b"], micro_batch=1, seq_len=4096,
                                grad_accum=1, recompute="none")
    assert model_flops / 4096 == 39_642_464_256 + 3_221_225_472


@pytest.mark.parametrize("name", ["llama2-7b", "gpt3-1.3b"])
def test_recomputation_adds_forward_flops(name: str) -> None:
    m, b, s = PRESETS[name], 1, 2048
    d, f, kv = m.d_model, m.ffn_hidden, m.num_kv_heads * (m.d_model // m.num_heads)
    model_flops, hw_none = step_flops(m, micro_batch=b, seq_len=s, grad_accum=1,
                                      recompute="none")
    _, hw_full = step_flops(m, micro_batch=b, seq_len=s, grad_accum=1, recompute="full")
    _, hw_sel = step_flops(m, micro_batch=b, seq_len=s, grad_accum=1, recompute="selective")
    ups = 2 if m.mlp == "swiglu" else 1
    block_fwd = 2.0 * b * s * (2 * d * d + 2 * d * kv + (ups + 1) * d * f) + 2.0 * b * s * s * d
    assert hw_none == model_flops
    # full: every block's forward runs again in backward
    assert math.isclose(hw_full - model_flops, m.num_layers * block_fwd, rel_tol=1e-12)
    # selective (torchtitan op SAC, activation_checkpoint.py: the 2nd, 4th, 6th mm of a
    # block re-run): wk, wo, then w3 (SwiGLU: wq wk wv wo w1 w3 w2) or w2 (GELU: ... w1 w2)
    rerun = d * kv + d * d + d * f
    assert math.isclose(hw_sel - model_flops, m.num_layers * 2.0 * b * s * rerun,
                        rel_tol=1e-12)
