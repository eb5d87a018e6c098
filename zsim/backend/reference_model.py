"""The reference decoders of docs/modelling.md ("The reference training step"), Llama- and
GPT-style, built from a ModelSpec as a torch.nn.Module, plus the scaling that shrinks a
spec to fit this machine.

Owns the torch program whose memory and time the simulator predicts. The Llama block:
token embedding; per block RMSNorm (torch.nn.RMSNorm) -> bias-free q/k/v/o attention with
GQA, rotary embeddings (rotate-half form, cos/sin tables cast once per step to the
activation dtype and shared by all blocks, or spec.rope_table_dtype's fp32 buffers) and
scaled_dot_product_attention(is_causal=True) -> residual -> RMSNorm -> SwiGLU MLP (w1,
w3 up; w2 down) -> residual; final RMSNorm; untied output. The GPT block (GPT-2/3):
token plus learned position embeddings (a table of max_seq_len rows, looked up by
position ids) and no rotation; LayerNorm (with a bias when
spec.bias); q/k/v/o and MLP projections with biases when spec.bias (q/k/v alone with
spec.qkv_bias, as Qwen2); GELU MLP (w1 up, w2
down) with the tanh approximation GPT-2 and GPT-3 train with; final LayerNorm; the output
projection tied to the token embedding when spec.tied_embeddings (one Parameter held by
both modules, as HF's GPT-2 ties lm_head, so every wrapper sees it in the root and
DeepSpeed's ZeRO-3 fetches it for the output module's forward). Each field selects its
part independently (norm, mlp, bias, qkv_bias, learned_pos_emb, tied_embeddings). Loss =
cross_entropy(logits.float(), labels), in the model's forward or, with
spec.loss_in_forward False, outside it (LossOutside, as torchtitan's step). The spec's
kernel knobs select the SDPA backend (attention_kernel="math" forces the math kernel),
GQA (enable_gqa or repeated k/v) and the logits upcast. Module and parameter names
follow ModelSpec.parameter_tensors (torchtitan's Llama names, for GPT too), so the two
counts can be compared one to one.
Imports torch.
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
"""RMSNorm and LayerNorm epsilon (Llama 2 config.json rms_norm_eps; GPT-2's
layer_norm_epsilon)."""
GELU_APPROXIMATE = "tanh"
"""GPT-2/3's GELU ("gelu_new" in HF's GPT-2, Megatron's bias_gelu): the tanh
approximation. Memory does not depend on it: either form saves only its input."""


def _sdpa_context(spec: ModelSpec) -> contextlib.AbstractContextManager[None]:
    """The SDPA backend the spec's attention_kernel knob asks for ("flash" lets torch
    choose, which is the flash kernel on CUDA and on CPU when the inputs allow it)."""
    if spec.attention_kernel == "math":
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


def _norm(spec: ModelSpec) -> nn.Module:
    """The spec's normalisation: RMSNorm (weight), or LayerNorm (weight, bias if spec.bias)."""
    if spec.norm == "layernorm":
        return nn.LayerNorm(spec.d_model, eps=NORM_EPS, bias=spec.bias)
    return nn.RMSNorm(spec.d_model, eps=NORM_EPS)


class Attention(nn.Module):
    """GQA attention with causal SDPA: rotary embeddings unless the model has learned
    positions, projection biases when spec.bias (q, k and v only: spec.qkv_bias)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        d, kv = spec.d_model, spec.kv_dim
        qkv_bias = spec.bias or spec.qkv_bias
        self.wq = nn.Linear(d, d, bias=qkv_bias)
        self.wk = nn.Linear(d, kv, bias=qkv_bias)
        self.wv = nn.Linear(d, kv, bias=qkv_bias)
        self.wo = nn.Linear(d, d, bias=spec.bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        spec = self.spec
        b, s, _ = x.shape
        # Heads as -1: under tensor parallelism a rank holds 1/tp of them (torchtitan).
        q = self.wq(x).view(b, s, -1, spec.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, spec.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, spec.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        groups = spec.num_heads // spec.num_kv_heads
        gqa = groups > 1 and spec.gqa_impl == "enable_gqa"
        if groups > 1 and spec.gqa_impl == "repeat_kv":
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        with _sdpa_context(spec):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in rotate-half form (GPT-NeoX / HF Llama): x*cos + rot(x)*sin.
    cos and sin do not require grad, so autograd saves only them, not x."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class FeedForward(nn.Module):
    """The MLP: SwiGLU w2(silu(w1 x) * w3 x) (Shazeer 2020), or GELU w2(gelu(w1 x))
    (GPT); biases when spec.bias."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.swiglu = spec.mlp == "swiglu"
        self.w1 = nn.Linear(spec.d_model, spec.ffn_hidden, bias=spec.bias)
        if self.swiglu:
            self.w3 = nn.Linear(spec.d_model, spec.ffn_hidden, bias=spec.bias)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.d_model, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate=GELU_APPROXIMATE))


class TransformerBlock(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then h + ffn(norm(h))."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = _norm(spec)
        self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The whole reference model; `forward(tokens, labels)` returns the scalar loss, or
    the logits when spec.loss_in_forward is False (LossOutside computes the loss)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        _check_supported(spec)
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.d_model)
        if spec.learned_pos_emb:
            self.pos_embeddings = nn.Embedding(spec.max_seq_len, spec.d_model)
        self.layers = nn.ModuleList(TransformerBlock(spec) for _ in range(spec.num_layers))
        self.norm = _norm(spec)
        self.output = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            # One Parameter in two modules: named_parameters() lists it once, as
            # tok_embeddings.weight (ModelSpec.root_tensors has no output.weight then).
            self.output.weight = self.tok_embeddings.weight
        if not spec.learned_pos_emb:
            cos, sin = rope_tables(spec)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self) -> None:
        """Initialise in place (after `to_empty` from the meta device, also on DTensors):
        weights N(0, 0.02) as GPT-2 and torchtitan's Llama, biases to zero, norms to one,
        RoPE tables."""
        init_parameters(self)
        if not self.spec.learned_pos_emb:
            with torch.no_grad():
                cos, sin = rope_tables(self.spec)
                self.rope_cos.copy_(cos)
                self.rope_sin.copy_(sin)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        rope: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.spec.learned_pos_emb:
            # Through the module (HF GPT-2's wpe(position_ids)), so wrappers that gather
            # parameters per module (DeepSpeed ZeRO-3) see the lookup.
            h = h + self.pos_embeddings(torch.arange(s, device=tokens.device))
        else:
            rope = rope_inputs(self.spec, self.rope_cos, self.rope_sin, s, h.dtype)
        for layer in self.layers:
            h = layer(h, rope)
        logits = self.output(self.norm(h))
        if not self.spec.loss_in_forward:
            return logits  # LossOutside computes the loss
        if self.spec.logits_upcast:
            logits = logits.float()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))


def rope_inputs(spec: ModelSpec, cos: torch.Tensor, sin: torch.Tensor, s: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The RoPE tables a model hands its blocks for a sequence of `s` tokens
    (spec.rope_table_dtype): cast once to the activation `dtype`, shared by every block;
    or the fp32 buffers' rows as they are (FSDP2's MixedPrecisionPolicy then casts them
    in each block's pre-forward)."""
    if spec.rope_table_dtype == "fp32":
        return cos[:s], sin[:s]
    return cos[:s].to(dtype), sin[:s].to(dtype)


class LossOutside(nn.Module):
    """The step's loss around a model whose forward returns its logits
    (spec.loss_in_forward False, torchtitan's loss_fn(model(inputs), labels)): the
    wrapped, sharded model's root module outputs the logits, and the loss is computed
    here, outside it; called as model(tokens, labels) -> loss like the model itself."""

    def __init__(self, model: nn.Module, spec: ModelSpec) -> None:
        super().__init__()
        self.model = model
        self.spec = spec

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.model(tokens, labels)
        upcast = logits.float() if self.spec.logits_upcast else logits
        del logits  # torchtitan frees its prediction before the backward
        return F.cross_entropy(upcast.flatten(0, 1), labels.flatten(0, 1))


def init_parameters(module: nn.Module) -> None:
    """Initialise the parameters of `module` and its children in place: linear and
    embedding weights N(0, 0.02) as GPT-2 and torchtitan's Llama, biases to zero, norms
    to one."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.RMSNorm, nn.LayerNorm)):
                m.reset_parameters()


def rope_tables(spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (max_seq_len, head_dim), fp32 (Su et al. 2021)."""
    inv_freq = 1.0 / ROPE_THETA ** (
        torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim)
    angles = torch.outer(torch.arange(spec.max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def _check_supported(spec: ModelSpec) -> None:
    """The backend builds real architectures only: a synthetic model's extra_params
    (parameters outside the transformer, used by no op) have no torch counterpart.

    Raises:
        ConfigError: extra_params is set.
    """
    if spec.extra_params:
        raise ConfigError("model.extra_params", spec.extra_params,
                          "the torch backend builds transformer parameters only (0)")


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

