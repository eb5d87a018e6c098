"""Golden cross-check: zsim's saved-tensor count against Korthikanti et al. 2022.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
Sec. 4.1, Eq. 1: a GPT layer (16-bit activations, no recomputation, no parallelism) saves
34*s*b*h + 5*a*s^2*b bytes. Their itemisation:

  attention 11sbh + 5as^2b: QKV input 2sbh; Q and K 4sbh; softmax output 2as^2b;
            softmax-dropout mask as^2b; dropout output 2as^2b and V 2sbh (for A @ V);
            output-projection input 2sbh; output-dropout mask sbh
  MLP       19sbh: input of the first linear 2sbh, GELU input 8sbh, input of the second
            linear 8sbh (ffn = 4h), dropout mask sbh
  norms     4sbh: each LayerNorm's input 2sbh

zsim's reference step has no dropout, so relative to Eq. 1 it drops:
  - the two sbh dropout masks (attention output, MLP output):      -2sbh
  - the softmax-dropout mask (as^2b) and the dropout output (2as^2b), since A @ V then
    reads the softmax output that is already saved:                 -3as^2b
Bias does not change what a linear saves (addmm keeps its input and weight, not its
output), and GELU saves its input, the 8sbh Korthikanti count. zsim additionally counts
the per-token fp32 statistics of each LayerNorm (mean and rstd, 2 x 4 bytes x sb per
norm, two norms: +16sb), which Eq. 1 neglects. Hence, exactly:

  zsim = 34sbh + 5as^2b - 2sbh - 3as^2b + 16sb = 32sbh + 2as^2b + 16sb.

For GPT-3 1.3B (h = 2048, a = 16) at s = 2048, b = 1:
  Korthikanti = 34*2048*2048 + 5*16*2048^2 = 142,606,336 + 335,544,320 = 478,150,656
  zsim        = 478,150,656 - 8,388,608 - 201,326,592 + 32,768 = 268,468,224
"""

from __future__ import annotations

import dataclasses

import pytest

from zsim.analytic.activations import block_activation_bytes, korthikanti_bytes_per_layer
from zsim.spec.model import ModelSpec


def gpt_layer(*, d_model: int, heads: int) -> ModelSpec:
    """A GPT-style model as Korthikanti assume: LayerNorm, biases, GELU MLP of 4h, MHA,
    16-bit activations, the math (non-flash) attention kernel."""
    return ModelSpec(name="gpt", num_layers=1, d_model=d_model, num_heads=heads,
                     num_kv_heads=heads, ffn_hidden=4 * d_model, mlp="gelu",
                     norm="layernorm", bias=True, vocab_size=50257, tied_embeddings=True,
                     learned_pos_emb=True, max_seq_len=8192, attention_kernel="math")


def test_worked_example_gpt3_1_3b() -> None:
    model = gpt_layer(d_model=2048, heads=16)
    got = block_activation_bytes(model, micro_batch=1, seq_len=2048, recompute="none")
    assert got == 268_468_224
    assert korthikanti_bytes_per_layer(seq_len=2048, micro_batch=1, d_model=2048,
                                       num_heads=16) == 478_150_656


@pytest.mark.parametrize(("d_model", "heads", "seq_len", "micro_batch"), [
    (768, 12, 1024, 1), (2048, 16, 2048, 4), (4096, 32, 2048, 2), (12288, 96, 2048, 1),
])
def test_korthikanti_minus_dropout_plus_norm_stats(d_model: int, heads: int, seq_len: int,
                                                   micro_batch: int) -> None:
    s, b, h, a = seq_len, micro_batch, d_model, heads
    korthikanti = 34 * s * b * h + 5 * a * s * s * b  # Eq. 1, written out independently
    expected = korthikanti - 2 * s * b * h - 3 * a * s * s * b + 16 * s * b
    model = gpt_layer(d_model=d_model, heads=heads)
    got = block_activation_bytes(model, micro_batch=b, seq_len=s, recompute="none")
    assert got == expected
    assert korthikanti_bytes_per_layer(seq_len=s, micro_batch=b, d_model=h,
                                       num_heads=a) == korthikanti


def test_bias_does_not_change_saved_bytes() -> None:
    with_bias = gpt_layer(d_model=1024, heads=16)
    without = dataclasses.replace(with_bias, bias=False)
    kw = {"micro_batch": 2, "seq_len": 512, "recompute": "none"}
    assert block_activation_bytes(with_bias, **kw) == block_activation_bytes(without, **kw)
