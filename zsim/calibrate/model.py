"""The reference Llama-style decoder of DESIGN.md ("Reference training step"), built from a
ModelSpec as a torch.nn.Module, plus the scaling that shrinks a spec to fit this machine.

Owns the torch program whose memory and time the simulator predicts: token embedding;
per block RMSNorm (torch.nn.RMSNorm) -> bias-free q/k/v/o attention with GQA, rotary
embeddings (rotate-half form, cos/sin tables cast once per step to the activation dtype
and shared by all blocks) and scaled_dot_product_attention(is_causal=True) -> residual ->
RMSNorm -> SwiGLU MLP (w1, w3 up; w2 down) -> residual; final RMSNorm; untied output;
loss = cross_entropy(logits.float(), labels). The spec's kernel knobs select the SDPA
backend (attention_kernel="math" forces the math kernel), GQA (enable_gqa or repeated
k/v) and the logits upcast. Module and parameter names follow ModelSpec.parameter_tensors
(torchtitan's Llama names), so the two counts can be compared one to one. Imports torch;
only zsim.calibrate may import this module.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec

ROPE_THETA = 10_000.0
"""RoPE base frequency (Su et al. 2021; Llama 2 uses 1e4)."""
NORM_EPS = 1e-5
"""RMSNorm epsilon (Llama 2 config.json rms_norm_eps)."""


def _sdpa_context(spec: ModelSpec) -> contextlib.AbstractContextManager[None]:
    """The SDPA backend the spec's attention_kernel knob asks for ("flash" lets torch
    choose, which is the flash kernel on CUDA and on CPU when the inputs allow it)."""
    if spec.attention_kernel == "math":
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


class Attention(nn.Module):
    """Bias-free GQA attention with rotary embeddings and causal SDPA."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        d, kv = spec.d_model, spec.kv_dim
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, kv, bias=False)
        self.wv = nn.Linear(d, kv, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, spec.num_heads, spec.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        groups = spec.num_heads // spec.num_kv_heads
        gqa = groups > 1 and spec.gqa_impl == "enable_gqa"
        if groups > 1 and spec.gqa_impl == "repeat_kv":
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        with _sdpa_context(spec):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).reshape(b, s, spec.d_model))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in rotate-half form (GPT-NeoX / HF Llama): x*cos + rot(x)*sin.
    cos and sin do not require grad, so autograd saves only them, not x."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x), bias-free (Shazeer 2020)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.w1 = nn.Linear(spec.d_model, spec.ffn_hidden, bias=False)
        self.w3 = nn.Linear(spec.d_model, spec.ffn_hidden, bias=False)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then h + ffn(norm(h))."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(spec.d_model, eps=NORM_EPS)
        self.attention = Attention(spec)
        self.ffn_norm = nn.RMSNorm(spec.d_model, eps=NORM_EPS)
        self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The whole reference model; `forward(tokens, labels)` returns the scalar loss."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        _check_supported(spec)
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.d_model)
        self.layers = nn.ModuleList(TransformerBlock(spec) for _ in range(spec.num_layers))
        self.norm = nn.RMSNorm(spec.d_model, eps=NORM_EPS)
        self.output = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        cos, sin = _rope_tables(spec)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self) -> None:
        """Initialise in place (after `to_empty` from the meta device, also on DTensors):
        weights N(0, 0.02) as GPT-2 and torchtitan's Llama, norms to one, RoPE tables."""
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, mean=0.0, std=0.02)
                elif isinstance(m, nn.RMSNorm):
                    m.reset_parameters()
            cos, sin = _rope_tables(self.spec)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        # Cast once per step, shared by every block: one (s, head_dim) table each.
        cos = self.rope_cos[:s].to(h.dtype)
        sin = self.rope_sin[:s].to(h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin)
        logits = self.output(self.norm(h))
        if self.spec.logits_upcast:
            logits = logits.float()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))


def _rope_tables(spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (max_seq_len, head_dim), fp32 (Su et al. 2021)."""
    inv_freq = 1.0 / ROPE_THETA ** (
        torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim)
    angles = torch.outer(torch.arange(spec.max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def _check_supported(spec: ModelSpec) -> None:
    """The backend builds the Llama family only (DESIGN.md's reference step).

    Raises:
        ConfigError: a GPT-style field (GELU MLP, LayerNorm, biases, tied or learned
            position embeddings, extra parameters) is set.
    """
    llama = {"mlp": "swiglu", "norm": "rmsnorm", "bias": False, "tied_embeddings": False,
             "learned_pos_emb": False, "extra_params": 0}
    for field, want in llama.items():
        if getattr(spec, field) != want:
            raise ConfigError(f"model.{field}", getattr(spec, field),
                              f"the torch backend builds Llama-style models only ({want!r})")


def scale_model(spec: ModelSpec, *, d_model: int, vocab_size: int | None = None,
                head_dim: int = 64, max_seq_len: int | None = None) -> ModelSpec:
    """Shrink a spec to fit this machine while keeping its structure: the same number of
    layers (so a plan's units stay the same), the same ratios ffn/d and heads/kv_heads.

    Args:
        spec: the full-size model.
        d_model: new hidden size; must be a multiple of head_dim.
        vocab_size: new vocabulary (default: unchanged).
        head_dim: head width of the scaled model.
        max_seq_len: new maximum sequence length (default: unchanged).

    Raises:
        ConfigError: d_model is not a multiple of head_dim, or the GQA ratio does not
            divide the scaled head count.
    """
    if d_model <= 0 or d_model % head_dim:
        raise ConfigError("d_model", d_model, f"must be a positive multiple of head_dim={head_dim}")
    heads = d_model // head_dim
    ratio = spec.num_heads // spec.num_kv_heads
    if heads % ratio:
        raise ConfigError("d_model", d_model,
                          f"gives {heads} heads, not divisible by the GQA ratio {ratio}")
    ffn = max(1, round(spec.ffn_hidden * d_model / spec.d_model))
    return replace(spec, name=f"{spec.name}@d{d_model}", d_model=d_model, num_heads=heads,
                   num_kv_heads=heads // ratio, ffn_hidden=ffn,
                   vocab_size=vocab_size or spec.vocab_size,
                   max_seq_len=max_seq_len or spec.max_seq_len)

