"""zsim.analytic.activations: saved bytes per token of a Llama block, counted by hand from
what each op's backward needs (PyTorch tools/autograd/derivatives.yaml; flash attention,
Dao et al. 2022 Alg. 2; torchtitan's op-level SAC policy)."""

from __future__ import annotations

import dataclasses

import pytest

from zsim.analytic.activations import (
    STATE_ALIASES,
    block_activation_bytes,
    block_input_casts,
    block_recompute_bytes,
    loss_working_bytes,
    root_saved_tensors,
)
from zsim.spec.model import ModelSpec
from zsim.spec.presets import PRESETS

LLAMA3_8B = PRESETS["llama3-8b"]  # d 4096, 32 heads, 8 kv heads (kv width 1024), f 14336


def per_token(recompute: str, **changes: object) -> float:
    model = dataclasses.replace(LLAMA3_8B, **changes)
    b, s = 2, 256
    return block_activation_bytes(model, micro_batch=b, seq_len=s, recompute=recompute) / (b * s)


def test_no_recompute_flash_by_hand() -> None:
    d, kv, f, h = 4096, 1024, 14336, 32
    # bf16: norm inputs (2), the q/k/v input, q, sdpa out (also wo's input: the flash
    # output is laid out (b, s, h, d), so the transpose back is free), w1 input: 6 x 2d;
    # k and v at kv width (enable_gqa): 2 x 2kv; w1 out, silu out, w3 out, w2 input: 4 x 2f;
    # fp32: two RMSNorm rstd (2 x 4) and the flash log-sum-exp per head (4h).
    assert per_token("none") == 12 * d + 4 * kv + 8 * f + 8 + 4 * h


def test_composite_norm_saves_fp32_copies() -> None:
    # CPU's RMSNorm decomposition saves x.float() instead of x and the fp32 normalised x:
    # per norm 4d + 4d instead of 2d, two norms per block.
    d = 4096
    assert per_token("none", norm_kernel="composite") - per_token("none") == 2 * (8 * d - 2 * d)


def test_repeat_kv_saves_k_and_v_at_full_width() -> None:
    d, kv = 4096, 1024
    assert per_token("none", gqa_impl="repeat_kv") - per_token("none") == 4 * (d - kv)


def test_selective_by_hand() -> None:
    d, kv, f, h = 4096, 1024, 14336, 32
    # block input; outputs of the 1st, 3rd, 5th, 7th matmul (wq d, wv kv, w1 f, w2 d);
    # sdpa output and log-sum-exp
    assert per_token("selective") == 2 * d + 2 * d + 2 * kv + 2 * f + 2 * d + 2 * d + 4 * h


def test_full_keeps_only_the_block_input() -> None:
    assert per_token("full") == 2 * 4096


def test_math_attention_saves_the_score_matrix() -> None:
    b, s, h = 1, 512, 32
    model = dataclasses.replace(LLAMA3_8B, attention_kernel="math")
    flash = block_activation_bytes(LLAMA3_8B, micro_batch=b, seq_len=s, recompute="none")
    math_ = block_activation_bytes(model, micro_batch=b, seq_len=s, recompute="none")
    # math: q, k expanded to every head (2d, 2d), softmax b*h*s^2 in bf16, v expanded (2d),
    # and a (b, h, s, d) output that .contiguous() copies for wo (2d);
    # flash: q (2d), k and v at kv width (2 x 2kv), out (2d, shared with wo), lse (4h)
    d, kv = 4096, 1024
    assert math_ - flash == b * s * (2 * d + 2 * d + 2 * d + 2 * d - 2 * d - 4 * kv - 2 * d
                                     - 4 * h) + 2 * b * h * s * s


def test_recompute_bytes_are_what_the_policy_dropped() -> None:
    kw = {"micro_batch": 1, "seq_len": 1024}
    none = block_activation_bytes(LLAMA3_8B, recompute="none", **kw)
    for policy in ("selective", "full"):
        kept = block_activation_bytes(LLAMA3_8B, recompute=policy, **kw)
        assert block_recompute_bytes(LLAMA3_8B, recompute=policy, **kw) == none - kept
    assert block_recompute_bytes(LLAMA3_8B, recompute="none", **kw) == 0


@pytest.mark.parametrize("upcast", [True, False])
def test_loss_and_root_by_hand(upcast: bool) -> None:
    model = dataclasses.replace(LLAMA3_8B, logits_upcast=upcast)
    b, s, d, v = 1, 1024, 4096, 128256
    logit = 4 if upcast else 2
    saved = sum(t.bytes for t in root_saved_tensors(model, micro_batch=b, seq_len=s))
    # token ids and labels int64, final-norm input and rstd, output input, log-softmax,
    # and once per step the RoPE cos and sin tables (s x head_dim 128 each, bf16)
    assert saved == b * s * (8 + 8 + 2 * d + 4 + 2 * d + v * logit) + 2 * s * 128 * 2
    # backward of the loss: grad of the log-softmax and of its input, both in logit dtype;
    # forward: bf16 logits plus their fp32 copy when upcast
    forward = b * s * v * (2 + (4 if upcast else 0))
    assert loss_working_bytes(model, micro_batch=b, seq_len=s) == max(
        forward, 2 * b * s * v * logit)


def test_fp32_rope_tables_are_the_buffers_and_a_cast_per_block() -> None:
    """ModelSpec.rope_table_dtype "fp32": the root saves slices of the fp32 buffers
    (state, no new bytes) instead of a bf16 copy; a program that casts each block's
    inputs (FSDP2's MixedPrecisionPolicy) keeps a bf16 (s, head_dim) cos and sin per
    block."""
    b, s = 1, 1024
    shared = dataclasses.replace(LLAMA3_8B, rope_table_dtype="activation")
    fp32 = dataclasses.replace(LLAMA3_8B, rope_table_dtype="fp32")

    def root(model: ModelSpec) -> int:
        return sum(t.bytes for t in root_saved_tensors(model, micro_batch=b, seq_len=s)
                   if t.name not in STATE_ALIASES)

    assert root(shared) - root(fp32) == 2 * s * 128 * 2
    assert [t.bytes for t in block_input_casts(fp32, seq_len=s, casts_inputs=True)] == \
        [s * 128 * 2, s * 128 * 2]
    assert block_input_casts(fp32, seq_len=s, casts_inputs=False) == []
    assert block_input_casts(shared, seq_len=s, casts_inputs=True) == []
    gpt = dataclasses.replace(PRESETS["gpt3-13b"], rope_table_dtype="fp32")
    assert block_input_casts(gpt, seq_len=s, casts_inputs=True) == []  # no RoPE


# ---------------------------------------------------------------------- autocast (DDP)
CPU_GQA = ModelSpec(
    name="cpu-gqa", num_layers=2, d_model=256, num_heads=4, num_kv_heads=2, ffn_hidden=688,
    vocab_size=2048, max_seq_len=256, norm_kernel="composite")
"""The backend's CPU validation shape: d 256, 4 heads x 64, 2 kv heads (kv width 128),
SwiGLU 688, composite RMSNorm (what torch.nn.RMSNorm runs on CPU)."""


def test_autocast_block_by_hand() -> None:
    b, s, d, kv, f, h = 2, 96, 256, 128, 688, 4
    bs = b * s
    kw = {"micro_batch": b, "seq_len": s, "recompute": "none"}
    # Under autocast (fp32 params, bf16 matmuls), tensor by tensor:
    norms = 2 * (bs * d * 4 + bs * 4 + bs * d * 4)      # fp32 input, rstd, fp32 normalised
    weight_casts = 2 * (d * d + d * kv + d * kv + d * d + 3 * d * f)  # wq wk wv wo w1 w3 w2
    input_casts = 5 * bs * d * 2                         # wq, wk, wv, w1, w3: one cast each
    sdpa = bs * d * 2 + 2 * bs * kv * 2 + bs * d * 2 + b * h * s * 4  # q, k, v, out, lse
    mlp = 4 * bs * f * 2                                 # w1 out, silu out, w3 out, w2 input
    by_hand = norms + weight_casts + input_casts + sdpa + mlp
    assert by_hand == 4_084_224
    assert block_activation_bytes(CPU_GQA, autocast=True, **kw) == by_hand
    # Measured on CPU (zsim.backend.instruments.record_saved_tensors, torch 2.13, bf16
    # autocast, the block after the first, whose input is not the embedding's output):
    # 4,084,224 bytes. FSDP2's bf16 program saves one shared q/k/v input and one w1/w3
    # input and no weight casts: 2,339,328 bytes, unchanged by the autocast knob.
    fsdp2 = block_activation_bytes(CPU_GQA, **kw)
    assert fsdp2 == 2_339_328
    assert by_hand - fsdp2 == weight_casts + (3 - 1) * bs * d * 2 + (2 - 1) * bs * d * 2


def test_autocast_recomputation_by_hand() -> None:
    b, s, d, kv, f, h = 2, 96, 256, 128, 688, 4
    bs = b * s
    kw = {"micro_batch": b, "seq_len": s, "autocast": True}
    # full: the fp32 residual-stream input of the block only (measured: 196,608 bytes)
    assert block_activation_bytes(CPU_GQA, recompute="full", **kw) == bs * d * 4 == 196_608
    # selective: fp32 block input, bf16 outputs of wq, wv, w1, w2 (every second matmul),
    # sdpa output and lse; weight casts are recomputed (measured: 807,936 bytes)
    selective = bs * d * 4 + bs * (d + kv + f + d) * 2 + bs * d * 2 + b * h * s * 4
    assert block_activation_bytes(CPU_GQA, recompute="selective", **kw) == selective == 807_936


def test_autocast_root_by_hand() -> None:
    b, s, d, v = 2, 96, 256, 2048
    bs = b * s
    saved = sum(t.bytes for t in root_saved_tensors(CPU_GQA, micro_batch=b, seq_len=s,
                                                     autocast=True))
    # ids and labels (int64); the RoPE slices keep the model's fp32 cos and sin buffers
    # (max_seq_len 256 x head_dim 64 each); composite final norm (fp32 input, rstd, fp32
    # normalised); the output's bf16 weight and input casts; fp32 log-softmax.
    assert saved == (2 * bs * 8 + 2 * 256 * 64 * 4 + bs * d * 4 + bs * 4 + bs * d * 4
                     + v * d * 2 + bs * d * 2 + bs * v * 4)
    # Measured on CPU: 3,116,804 bytes under the root plus the two 65,536-byte tables
    # (recorded under the first block) plus a 4-byte nll_loss scalar not modelled.
    assert saved == 3_116_804 + 2 * 65_536 - 4


# ---------------------------------------------------------------------- GPT block
GPT3_125M = PRESETS["gpt3-125m"]  # d 768, 12 heads, f 3072, LayerNorm with bias, tied


@pytest.mark.parametrize("norm_kernel", ["fused", "composite"])
def test_gpt_block_by_hand(norm_kernel: str) -> None:
    model = dataclasses.replace(GPT3_125M, norm_kernel=norm_kernel)
    b, s = 2, 256
    d, f, h = 768, 3072, 12
    got = block_activation_bytes(model, micro_batch=b, seq_len=s, recompute="none") / (b * s)
    # LayerNorm is one native kernel on every device (the composite knob is RMSNorm's CPU
    # decomposition): per norm its bf16 input, mean and rstd (fp32 on CUDA, the input's
    # bf16 on CPU); the q/k/v input, q, k, v, sdpa out (also wo's input), w1 input: 6 x 2d;
    # the log-sum-exp 4h; GELU's input (w1's output) and w2's input (GELU's output): 2 x 2f.
    # Biases add no saved tensor (addmm saves what mm saves).
    stats = 4 if norm_kernel == "fused" else 2
    assert got == 2 * (2 * d + 2 * stats) + 6 * 2 * d + 4 * h + 2 * 2 * f


def test_gpt_root_by_hand() -> None:
    model = dataclasses.replace(GPT3_125M, norm_kernel="composite")
    b, s, d, v = 2, 256, 768, 50257
    saved = sum(t.bytes for t in root_saved_tensors(model, micro_batch=b, seq_len=s))
    # token ids and labels (int64), the position ids arange(s) once (int64, no RoPE
    # tables), the final LayerNorm's bf16 input, mean and rstd (CPU: bf16), the output
    # projection's input (tied: the embedding weight is a parameter, not an activation),
    # the fp32 log-softmax.
    assert saved == b * s * (8 + 8 + 2 * d + 2 + 2 + 2 * d + 4 * v) + 8 * s


TINY = ModelSpec(name="tiny", num_layers=4, d_model=256, num_heads=4, num_kv_heads=2,
                 ffn_hidden=688, vocab_size=2048, max_seq_len=256, norm_kernel="composite")
"""The validation report's llama-tiny with the CPU norm (head dim 64)."""


def test_tp_rank_block_by_hand() -> None:
    # One rank of tp=2 without SP (torchtitan's plan under DTensor; bf16 activations,
    # no autocast), b=2, s=256 (bs=512): its 2 query heads (q width 128), 1 kv head (64)
    # and 344 of the 688 MLP columns. Whole on every rank: both composite norms (fp32 x,
    # fp32 normalised x, fp32 rstd), the input the q/k/v and w1/w3 ColwiseParallel
    # linears share (replicated, bs x d).
    shard = TINY.tp_shard(2)
    bs = 512
    norms = 2 * (bs * 256 * 4 + bs * 256 * 4 + bs * 4)
    linear_inputs = 2 * bs * 256 * 2
    attention = bs * 128 * 2 * 2 + bs * 64 * 2 * 2 + 2 * 2 * 256 * 4  # q, out; k, v; lse
    mlp = 4 * bs * 344 * 2  # w1 out, silu out, w3 out, w2 input
    assert block_activation_bytes(shard, micro_batch=2, seq_len=256, recompute="none") == (
        norms + linear_inputs + attention + mlp) == 4_431_872


def test_tp_rank_loss_spans_the_whole_vocabulary() -> None:
    # The output projection computes 1024 of the 2048 logits per rank, but its output is
    # Replicate (no loss parallelism): every rank's loss saves the fp32 log-softmax of all
    # 2048, and works on all of them.
    shard = TINY.tp_shard(2)
    saved = {t.name: t.bytes for t in root_saved_tensors(shard, micro_batch=2, seq_len=256)}
    assert saved["loss.log_softmax"] == 512 * 2048 * 4
    assert saved["output.input"] == 512 * 256 * 2  # the final norm's output, whole
    assert (loss_working_bytes(shard, micro_batch=2, seq_len=256)
            == loss_working_bytes(TINY, micro_batch=2, seq_len=256) == 2 * 512 * 2048 * 4)
