"""ModelSpec: the shape of a decoder-only transformer, with exact parameter and FLOP counts.

Owns the architecture description and the closed forms derived from it; imports nothing
beyond the standard library and zsim.errors. Two independent parameter counts live here:
`parameter_tensors()` enumerates every weight tensor (what `torch.nn.Module.parameters()`
would list for the reference model of docs/modelling.md), and `num_params` sums closed-form
expressions per component; a test checks they agree.

References:
- GPT-3 shapes: Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1.
- Llama-2 shapes: Touvron et al. 2023, Table 1 and the released config.json files.
- Llama-3.1 shapes: Llama Team 2024, "The Llama 3 Herd of Models", Table 3.
- FLOPs: Kaplan et al. 2020 Sec. 2.1 (6N per token for forward + backward) plus the
  attention term 12 * L * s * d per token (PaLM, Chowdhery et al. 2022, App. B), halved
  for causal masking as flash attention skips the masked half.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any, Literal

from zsim.errors import ConfigError
from zsim.spec.moe import MlaSpec, MoeSpec

Mlp = Literal["swiglu", "gelu"]
Norm = Literal["rmsnorm", "layernorm"]
AttentionKernel = Literal["flash", "math"]
NormKernel = Literal["fused", "composite"]
GqaImpl = Literal["enable_gqa", "repeat_kv"]
RopeTableDtype = Literal["activation", "fp32"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer (GPT or Llama family)."""

    name: str
    """Preset or file name, for reports."""
    num_layers: int
    """Transformer blocks."""
    d_model: int
    """Hidden size."""
    num_heads: int
    """Attention (query) heads."""
    num_kv_heads: int
    """Key/value heads; equal to num_heads for multi-head attention, fewer for GQA."""
    ffn_hidden: int
    """MLP inner size (per up-projection for SwiGLU)."""
    mlp: Mlp = "swiglu"
    """"swiglu": w1, w3 up and w2 down (Llama); "gelu": one up, one down (GPT)."""
    norm: Norm = "rmsnorm"
    """Normalisation layer; RMSNorm has a weight, LayerNorm a weight and (with bias) a bias."""
    bias: bool = False
    """Linear and norm layers carry biases (GPT-3 does, Llama does not)."""
    qkv_bias: bool = False
    """The query, key and value projections carry biases even where `bias` is False
    (Qwen2: q/k/v biased, o and the MLP not); with `bias` they have them anyway."""
    vocab_size: int
    """Embedding rows."""
    tied_embeddings: bool = False
    """The output projection reuses the token embedding matrix."""
    learned_pos_emb: bool = False
    """A learned position-embedding table of max_seq_len rows (GPT); False means RoPE."""
    max_seq_len: int
    """Default training sequence length, tokens (the model's training length where its
    source gives one); with learned position embeddings also the table's rows, the most
    a plan may use."""
    seq_len_source: str = ""
    """Where max_seq_len came from, for headers ("config n_positions", "default 4,096
    (the config allows up to 131,072)"); empty for a spec built in code."""
    head_width: int = 0
    """Per-head query/key/value width where it is not d_model / num_heads (Qwen3: 128
    with d_model 2048 and 32 heads, Mistral-Nemo: 128 with 5120 and 32); 0 means
    d_model / num_heads."""
    qk_norm: bool = False
    """An RMSNorm of head_dim weights on each head's query and key (Qwen3's q_norm and
    k_norm): two head_dim parameters per block; their activations are not modelled."""
    sliding_window: int = 0
    """Tokens each query attends back over (Mistral-7B-v0.1's sliding-window attention).
    zsim simulates full causal attention, so `check_plan` (zsim.spec.consistency) refuses
    a longer sequence; 0 means no window."""
    warnings: tuple[str, ...] = ()
    """What the spec's source says that zsim reads but does not model (dropout, GPT-NeoX's
    parallel residual), one line each, for the caller to print."""
    attention_kernel: AttentionKernel = "flash"
    """Which SDPA kernel autograd records: "flash" saves q, k, v, out and the log-sum-exp;
    "math" also saves the s x s softmax (what CPU and fake-CUDA runs use)."""
    norm_kernel: NormKernel = "fused"
    """"fused" RMSNorm saves its input and an fp32 rstd (CUDA); "composite" saves fp32
    intermediates too (the CPU decomposition of torch.nn.RMSNorm)."""
    gqa_impl: GqaImpl = "enable_gqa"
    """GQA through SDPA's enable_gqa (k, v saved at kv width) or by repeating k and v to
    all heads before attention (saved at full width)."""
    logits_upcast: bool = True
    """Loss computed as cross_entropy(logits.float()): the log-softmax saved in fp32."""
    loss_in_forward: bool = True
    """The model's forward returns the loss (Hugging Face models given labels,
    zsim.backend.reference_model): FSDP's root pre-backward hook, on the root's output, runs as
    the backward starts. False: it returns the logits and the step computes the loss
    outside (torchtitan's loss_fn(model(inputs), labels)), so that hook, and the
    all-gather it prefetches, runs once the loss's backward has made the logits'
    gradient."""
    rope_table_dtype: RopeTableDtype = "activation"
    """The dtype the model hands its blocks RoPE's cos and sin tables in: "activation":
    cast once per step from its fp32 buffers and shared by every block; "fp32": the
    buffers themselves, which FSDP2's MixedPrecisionPolicy (cast_forward_inputs) casts
    to the compute dtype in each block's pre-forward, a copy per block that its
    checkpoint or its rotation keeps until the block's backward. No effect with learned
    position embeddings."""
    extra_params: int = 0
    """Parameters outside the transformer structure, held by the root unit. Synthetic
    models (`synthetic()`) use it to reach an exact parameter count; 0 for real models."""
    tp: int = 1
    """Tensor-parallel degree this spec is one rank's shard of (`tp_shard`): num_heads,
    num_kv_heads, ffn_hidden and vocab_size are then that rank's; 1 means the whole
    model."""
    sequence_parallel: bool = False
    """With tp > 1: the norms and the residual stream are sharded on the sequence over
    the TP group (Korthikanti et al. 2022, Sec. 4.2.2)."""
    loss_vocab_size: int = 0
    """Vocabulary the loss's logits span on this rank (`loss_vocab`): under tensor
    parallelism (`tp_shard`) the whole vocabulary, since torchtitan's Llama plan without
    loss parallelism gives the ColwiseParallel output projection Replicate outputs (its
    vocab_size / tp columns all-gathered) and every rank computes the loss on them; 0
    means vocab_size."""
    context_parallel: int = 1
    """Context-parallel degree this spec computes one rank's share of: its sequence is
    1/cp of the whole, and each of its queries attends to cp times as many keys (ring
    attention); 1 means none."""
    moe: MoeSpec | None = None
    """Mixture-of-experts feed-forward (zsim.spec.moe.MoeSpec): the MoE layers' MLP is a
    router, routed experts and optional shared experts; None for a dense model. zsim
    simulates every block as an MoE block (the `moe.dense_layers` leading dense layers
    are counted exactly in num_params and flops_per_token, simulated as MoE blocks)."""
    mla: MlaSpec | None = None
    """Multi-head latent attention (zsim.spec.moe.MlaSpec) in place of the q/k/v/o
    projections; None for (grouped-query) multi-head attention."""

    def __post_init__(self) -> None:
        for f in ("num_layers", "d_model", "num_heads", "num_kv_heads", "ffn_hidden",
                  "vocab_size", "max_seq_len", "tp", "context_parallel"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{f}", value, "must be a positive integer")
        for f in ("extra_params", "loss_vocab_size"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"model.{f}", value, "must be an integer >= 0")
        for f in ("bias", "qkv_bias", "tied_embeddings", "learned_pos_emb", "logits_upcast",
                  "sequence_parallel"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"model.{f}", getattr(self, f), "must be true or false")
        if not isinstance(self.sliding_window, int) or isinstance(self.sliding_window, bool) \
                or self.sliding_window < 0:
            raise ConfigError("model.sliding_window", self.sliding_window,
                              "must be an integer >= 0")
        if not isinstance(self.seq_len_source, str):
            raise ConfigError("model.seq_len_source", self.seq_len_source, "must be a string")
        if not isinstance(self.warnings, tuple) or not all(
                isinstance(w, str) for w in self.warnings):
            raise ConfigError("model.warnings", self.warnings, "must be a tuple of strings")
        self._check_variants()
        if not isinstance(self.head_width, int) or isinstance(self.head_width, bool) \
                or self.head_width < 0:
            raise ConfigError("model.head_width", self.head_width, "must be an integer >= 0")
        if not isinstance(self.qk_norm, bool):
            raise ConfigError("model.qk_norm", self.qk_norm, "must be true or false")
        if self.mla is None and not self.head_width and self.d_model % self.num_heads:
            raise ConfigError("model.num_heads", self.num_heads,
                              f"must divide d_model={self.d_model}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("model.num_kv_heads", self.num_kv_heads,
                              f"must divide num_heads={self.num_heads}")
        for f, choices in (("mlp", ("swiglu", "gelu")),
                           ("norm", ("rmsnorm", "layernorm")),
                           ("attention_kernel", ("flash", "math")),
                           ("norm_kernel", ("fused", "composite")),
                           ("gqa_impl", ("enable_gqa", "repeat_kv")),
                           ("rope_table_dtype", ("activation", "fp32"))):
            if getattr(self, f) not in choices:
                raise ConfigError(f"model.{f}", getattr(self, f),
                                  f"must be one of {', '.join(choices)}")

    def _check_variants(self) -> None:
        """The MoE and MLA sections: of their types, and consistent with the rest."""
        if self.moe is not None:
            if not isinstance(self.moe, MoeSpec):
                raise ConfigError("model.moe", self.moe, "must be an MoE section")
            if self.moe.dense_layers >= self.num_layers:
                raise ConfigError("model.moe.dense_layers", self.moe.dense_layers,
                                  f"must be < num_layers={self.num_layers}")
            if self.mlp != "swiglu" or self.bias:
                raise ConfigError("model.mlp", self.mlp,
                                  "MoE experts are modelled as SwiGLU without biases")
        if self.mla is not None:
            if not isinstance(self.mla, MlaSpec):
                raise ConfigError("model.mla", self.mla, "must be an MLA section")
            if self.num_kv_heads != self.num_heads or self.bias or self.qkv_bias:
                raise ConfigError("model.num_kv_heads", self.num_kv_heads,
                                  "MLA gives every head its own key and value: must equal "
                                  f"num_heads={self.num_heads}, without biases")

    # ---------------------------------------------------------------- shapes
    def ep_share(self, ep: int) -> ModelSpec:
        """This spec as one rank of an expert-parallel group of `ep` holds it: experts / ep
        of each MoE layer's routed experts (`ep` 1 or a dense model: itself)."""
        if ep == 1 or self.moe is None:
            return self
        return replace(self, moe=replace(self.moe, ep=ep))

    def cp_share(self, cp: int) -> ModelSpec:
        """This spec as one rank of a context-parallel group of `cp` computes it: the
        sequence it is given is its 1/cp share, attending to the whole (`cp` 1: itself)."""
        return self if cp == 1 else replace(self, context_parallel=cp)

    def tp_shard(self, tp: int, *, sequence_parallel: bool = False,
                 expert_parallel: bool = False) -> ModelSpec:
        """One rank's shard of the model under tensor parallelism of degree `tp`, as
        torchtitan's Llama plan divides it (parallelize_module with ColwiseParallel on
        wq, wk, wv, w1, w3 and the output, RowwiseParallel on wo, w2 and the token
        embedding; norms replicated; Megatron-LM divides a block alike): heads and kv
        heads, the MLP's inner size and the vocabulary divided by tp (the last two
        rounded up: DTensor shards unevenly); d_model and the norms whole; the loss over
        the whole vocabulary (loss_vocab_size: the logits are replicated). An MoE's
        shared experts are divided alike; its routed experts too without EP, while with
        `expert_parallel` (torchtitan's moe_sharding: experts Shard(0) over the EP group,
        the MoE's input left sequence-sharded) they stay whole and route the rank's
        1/tp of the tokens (MoeSpec.token_shard). `tp` 1 is the model itself."""
        if tp == 1:
            return self
        moe = self.moe and replace(
            self.moe, shared_ffn_hidden=-(-self.moe.shared_ffn_hidden // tp),
            **({"token_shard": tp} if expert_parallel
               else {"expert_ffn_hidden": -(-self.moe.expert_ffn_hidden // tp)}))
        return replace(self, moe=moe, num_heads=self.num_heads // tp,
                       num_kv_heads=self.num_kv_heads // tp,
                       ffn_hidden=-(-self.ffn_hidden // tp), vocab_size=-(-self.vocab_size // tp),
                       loss_vocab_size=self.loss_vocab, tp=tp,
                       sequence_parallel=sequence_parallel)

    @property
    def loss_vocab(self) -> int:
        """Columns of the logits the loss reads (see loss_vocab_size)."""
        return self.loss_vocab_size or self.vocab_size

    @property
    def head_dim(self) -> int:
        """Per-head query and key width (with MLA its no-position and RoPE parts)."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.head_width or self.d_model // (self.num_heads * self.tp)

    @property
    def v_dim(self) -> int:
        """Width of the value projection's heads and of attention's output (the output
        projection's input): q_dim, or with MLA the heads' v_head_dim."""
        return self.q_dim if self.mla is None else self.num_heads * self.mla.v_head_dim

    @property
    def mlp_width(self) -> int:
        """Inner width one token's MLP computes and saves: ffn_hidden, or in an MoE
        block its top_k routed experts' and the shared experts' widths."""
        if self.moe is None:
            return self.ffn_hidden
        return self.moe.routed_width + self.moe.shared_ffn_hidden

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is an MoE (0 for a dense model)."""
        return 0 if self.moe is None else self.num_layers - self.moe.dense_layers

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (SwiGLU: three d x expert_ffn_hidden)."""
        return 0 if self.moe is None else 3 * self.d_model * self.moe.expert_ffn_hidden

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (and of attention's output): d_model,
        or this rank's heads of it under tensor parallelism."""
        return self.num_heads * self.head_dim

    @property
    def norm_tokens_divisor(self) -> int:
        """What the tokens of the norms and the residual stream are divided by: tp with
        sequence parallelism, else 1."""
        return self.tp if self.sequence_parallel else 1

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection output."""
        return self.num_kv_heads * self.head_dim

    def block_tensors(self, *, dense: bool = False) -> list[tuple[str, tuple[int, ...]]]:
        """Every parameter tensor of one transformer block, (name, shape), in module order:
        the simulated block (an MoE block in an MoE model), or with `dense` a dense layer
        of an MoE model (its moe.dense_layers)."""
        d = self.d_model
        t: list[tuple[str, tuple[int, ...]]] = [("attention_norm.weight", (d,))]
        if self.norm == "layernorm" and self.bias:
            t.append(("attention_norm.bias", (d,)))
        t += self._attention_tensors()
        t.append(("ffn_norm.weight", (d,)))
        if self.norm == "layernorm" and self.bias:
            t.append(("ffn_norm.bias", (d,)))
        if self.moe is not None and not dense:
            return t + self._moe_tensors(self.moe)
        f = self.ffn_hidden
        ups = ("w1", "w3") if self.mlp == "swiglu" else ("w1",)
        for proj in ups:
            t.append((f"feed_forward.{proj}.weight", (f, d)))
            if self.bias:
                t.append((f"feed_forward.{proj}.bias", (f,)))
        t.append(("feed_forward.w2.weight", (d, f)))
        if self.bias:
            t.append(("feed_forward.w2.bias", (d,)))
        return t

    def _attention_tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """The attention's projections (as torchtitan's Llama and DeepSeek-V3 name them)."""
        d, q, kv = self.d_model, self.q_dim, self.kv_dim
        t: list[tuple[str, tuple[int, ...]]] = []
        if self.mla is not None:
            m, h = self.mla, self.num_heads
            if m.q_lora_rank:
                t += [("attention.wq_a.weight", (m.q_lora_rank, d)),
                      ("attention.q_norm.weight", (m.q_lora_rank,)),
                      ("attention.wq_b.weight", (q, m.q_lora_rank))]
            else:
                t.append(("attention.wq.weight", (q, d)))
            t += [
                ("attention.wkv_a.weight", (m.kv_lora_rank + m.qk_rope_head_dim, d)),
                ("attention.kv_norm.weight", (m.kv_lora_rank,)),
                ("attention.wkv_b.weight", (h * (m.qk_nope_head_dim + m.v_head_dim),
                                            m.kv_lora_rank)),
                ("attention.wo.weight", (d, self.v_dim))]
            return t
        for proj, out in (("wq", q), ("wk", kv), ("wv", kv)):
            t.append((f"attention.{proj}.weight", (out, d)))
            if self.bias or self.qkv_bias:
                t.append((f"attention.{proj}.bias", (out,)))
        if self.qk_norm:
            t += [("attention.q_norm.weight", (self.head_dim,)),
                  ("attention.k_norm.weight", (self.head_dim,))]
        t.append(("attention.wo.weight", (d, q)))
        if self.bias:
            t.append(("attention.wo.bias", (d,)))
        return t

    def _moe_tensors(self, moe: MoeSpec) -> list[tuple[str, tuple[int, ...]]]:
        """The router, this rank's routed experts (torchtitan's GroupedExperts: one
        [experts, ...] tensor per projection) and the shared experts (one MLP)."""
        d, fe, fs, e = self.d_model, moe.expert_ffn_hidden, moe.shared_ffn_hidden, \
            moe.local_experts
        t: list[tuple[str, tuple[int, ...]]] = [("moe.router.gate.weight", (moe.experts, d))]
        if moe.router_bias:
            t.append(("moe.router.expert_bias", (moe.experts,)))
        # GroupedExperts' [experts, fe, d] tensors, written with their first two dims
        # flattened: FSDP2 shards them on dim 0, or, as torchtitan's apply_fsdp places
        # them when the shard group outnumbers the experts, on dim 1 (Shard(1)): either
        # way about experts x fe / n rows of d per rank, not a whole expert each.
        t += [("moe.experts.w1", (e * fe, d)), ("moe.experts.w2", (e * d, fe)),
              ("moe.experts.w3", (e * fe, d))]
        if fs:
            t += [("moe.shared_experts.w1.weight", (fs, d)),
                  ("moe.shared_experts.w2.weight", (d, fs)),
                  ("moe.shared_experts.w3.weight", (fs, d))]
        if moe.shared_expert_gate:
            t.append(("moe.shared_expert_gate.weight", (1, d)))
        return t

    def block_matmuls(self) -> list[tuple[str, int, int]]:
        """The weight matmuls of one block in call order: (module, in_features,
        out_features), each over every token of the micro-batch. An MoE block's routed
        experts appear as the top_k experts a token passes through, side by side (in
        x top_k * expert_ffn_hidden): the FLOPs of the grouped GEMMs, whose rows are the
        routed tokens."""
        d, q, kv, v = self.d_model, self.q_dim, self.kv_dim, self.v_dim
        if self.mla is not None:
            m = self.mla
            mms = ([("attention.wq_a", d, m.q_lora_rank), ("attention.wq_b", m.q_lora_rank, q)]
                   if m.q_lora_rank else [("attention.wq", d, q)])
            mms += [("attention.wkv_a", d, m.kv_lora_rank + m.qk_rope_head_dim),
                    ("attention.wkv_b", m.kv_lora_rank,
                     self.num_heads * (m.qk_nope_head_dim + m.v_head_dim)),
                    ("attention.wo", v, d)]
        else:
            mms = [("attention.wq", d, q), ("attention.wk", d, kv), ("attention.wv", d, kv),
                   ("attention.wo", q, d)]
        if self.moe is not None:
            moe = self.moe
            # The router and routed experts on 1/token_shard of the tokens: charged as
            # that share of their width (MoeSpec.routed_width; equal FLOPs).
            routed = moe.routed_width
            mms += [("moe.router.gate", d, -(-moe.experts // moe.token_shard)),
                    ("moe.experts.w1", d, routed),
                    ("moe.experts.w3", d, routed), ("moe.experts.w2", routed, d)]
            if moe.shared_ffn_hidden:
                fs = moe.shared_ffn_hidden
                mms += [("moe.shared_experts.w1", d, fs), ("moe.shared_experts.w3", d, fs),
                        ("moe.shared_experts.w2", fs, d)]
            if moe.shared_expert_gate:
                mms.append(("moe.shared_expert_gate", d, 1))
            return mms
        f = self.ffn_hidden
        mms.append(("feed_forward.w1", d, f))
        if self.mlp == "swiglu":
            mms.append(("feed_forward.w3", d, f))
        mms.append(("feed_forward.w2", f, d))
        return mms

    def root_tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """Parameter tensors outside the blocks (embeddings, final norm, output), in order."""
        d = self.d_model
        t: list[tuple[str, tuple[int, ...]]] = [("tok_embeddings.weight", (self.vocab_size, d))]
        if self.learned_pos_emb:
            t.append(("pos_embeddings.weight", (self.max_seq_len, d)))
        t.append(("norm.weight", (d,)))
        if self.norm == "layernorm" and self.bias:
            t.append(("norm.bias", (d,)))
        if not self.tied_embeddings:
            t.append(("output.weight", (self.vocab_size, d)))
        if self.extra_params:
            t.append(("extra", (self.extra_params,)))
        return t

    def parameter_tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """All parameter tensors: root tensors first, then each block's, prefixed (an MoE
        model's leading dense layers with their dense MLP)."""
        out = self.root_tensors()
        dense = self.moe.dense_layers if self.moe is not None else 0
        for i in range(self.num_layers):
            out += [(f"layers.{i}.{n}", s) for n, s in self.block_tensors(dense=i < dense)]
        return out

    # ---------------------------------------------------------------- closed forms
    @property
    def params_per_block(self) -> int:
        """Closed form of the simulated block: attention, MLP and norms 2d. Attention
        2d*q + 2d*kv (q, o; k, v); with MLA the latent projections (q: d*rq + rq +
        rq*q, or d*q full-rank; kv: d*(rkv + rope) + rkv + rkv*h*(nope + v); o: v*d).
        MLP (3 if SwiGLU else 2)*d*f, or an MoE's router d*E (+ E with its bias), its
        experts/ep local experts of 3*d*fe, shared experts 3*d*fs and their gate d.
        With biases add d + 2kv + d for attention, f-per-up + d for the MLP and 2d for
        LayerNorm biases (Narayanan et al. 2021, Sec. 5.1 for the GPT case); with q/k/v
        biases only, d + 2kv. A TP shard (`tp_shard`) has q = d/tp query width in place
        of d in q and o."""
        return self._attention_params + self._mlp_params(dense=False) + self._norm_params

    @property
    def dense_block_params(self) -> int:
        """Closed form of an MoE model's dense layer (its MLP of ffn_hidden); the block
        itself in a dense model."""
        return self._attention_params + self._mlp_params(dense=True) + self._norm_params

    @property
    def _norm_params(self) -> int:
        d = self.d_model
        return 2 * d + (2 * d if self.bias and self.norm == "layernorm" else 0)

    @property
    def _attention_params(self) -> int:
        d, q, kv = self.d_model, self.q_dim, self.kv_dim
        if self.mla is not None:
            m = self.mla
            wq = m.q_lora_rank * (d + 1 + q) if m.q_lora_rank else d * q
            wkv = (d * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
                   + m.kv_lora_rank * self.num_heads * (m.qk_nope_head_dim + m.v_head_dim))
            return wq + wkv + self.v_dim * d
        n = 2 * d * q + 2 * d * kv + (2 * self.head_dim if self.qk_norm else 0)
        if self.bias:
            n += q + d + 2 * kv
        elif self.qkv_bias:
            n += q + 2 * kv
        return n

    def _mlp_params(self, *, dense: bool) -> int:
        d = self.d_model
        if self.moe is None or dense:
            n_up, f = (2 if self.mlp == "swiglu" else 1), self.ffn_hidden
            return (n_up + 1) * d * f + ((n_up * f + d) if self.bias else 0)
        moe = self.moe
        return (moe.experts * d + (moe.experts if moe.router_bias else 0)
                + moe.local_experts * self.expert_params + 3 * d * moe.shared_ffn_hidden
                + (d if moe.shared_expert_gate else 0))

    @property
    def embedding_params(self) -> int:
        """Token embeddings (plus learned positions)."""
        return self.vocab_size * self.d_model + (
            self.max_seq_len * self.d_model if self.learned_pos_emb else 0)

    @property
    def head_params(self) -> int:
        """Final norm and (untied) output projection."""
        norm = self.d_model * (2 if self.norm == "layernorm" and self.bias else 1)
        return norm + (0 if self.tied_embeddings else self.vocab_size * self.d_model)

    @property
    def root_params(self) -> int:
        """Everything the root FSDP unit owns: embeddings, final norm, output, extra."""
        return self.embedding_params + self.head_params + self.extra_params

    @property
    def buffer_bytes(self) -> int:
        """Non-parameter module state of the reference model (docs/modelling.md): the fp32 RoPE
        cos and sin tables, max_seq_len x head_dim each (zsim.backend.reference_model); none
        with learned position embeddings."""
        return 0 if self.learned_pos_emb else 2 * self.max_seq_len * self.head_dim * 4

    @property
    def num_params(self) -> int:
        """Total parameter count (of the rank's share under tp_shard or ep_share)."""
        dense = self.num_layers - self.moe_layers
        return (self.moe_layers * self.params_per_block + dense * self.dense_block_params
                if self.moe is not None else self.num_layers * self.params_per_block
                ) + self.root_params

    @property
    def inactive_params(self) -> int:
        """Parameters a token does not pass through: in every MoE layer, the routed
        experts beyond its top_k (counted over the whole model, whatever ep_share);
        0 for a dense model."""
        if self.moe is None:
            return 0
        return self.moe_layers * (self.moe.experts - self.moe.top_k) * self.expert_params

    @property
    def total_params(self) -> int:
        """Parameters of the whole model: num_params with every EP rank's experts."""
        if self.moe is None:
            return self.num_params
        return self.num_params + self.moe_layers * (
            self.moe.experts - self.moe.local_experts) * self.expert_params

    @property
    def active_params(self) -> int:
        """Parameters each token passes through (all of a dense model's; an MoE model's
        "activated" parameters, embeddings included, as its papers count them)."""
        return self.total_params - self.inactive_params

    @property
    def non_embedding_params(self) -> int:
        """Parameters that take part in matmuls per token (Kaplan's N): all but the
        embedding lookup tables; the output projection counts (it is a matmul)."""
        lookups = self.embedding_params if not self.tied_embeddings else self.max_seq_len * \
            self.d_model * self.learned_pos_emb
        return self.num_params - lookups - self.extra_params

    @property
    def active_non_embedding_params(self) -> int:
        """Of the matmul parameters (non_embedding_params, the whole model's experts), those
        one token passes through: what its FLOPs are six times."""
        return self.non_embedding_params + self.total_params - self.num_params \
            - self.inactive_params

    def attention_flops_per_token(self, seq_len: int, *, causal: bool = True) -> float:
        """Forward + backward attention score/value FLOPs per token: 12 * L * s * d
        (PaLM App. B; 6 * L * s * (q + v) with MLA's wider query/key heads), halved when
        the causal mask lets the kernel skip half the scores."""
        flops = 6.0 * self.num_layers * seq_len * self.context_parallel * (
            self.q_dim + self.v_dim)
        return flops / 2 if causal else flops

    def flops_per_token(self, seq_len: int, *, causal: bool = True) -> float:
        """Model FLOPs per trained token (forward + backward, no recomputation):
        6 * N_matmul + attention. N_matmul excludes lookup tables, as they do no matmul,
        and an MoE's experts a token is not routed to (active_non_embedding_params)."""
        return 6.0 * self.active_non_embedding_params + self.attention_flops_per_token(
            seq_len, causal=causal)

    # ---------------------------------------------------------------- conversions
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "model") -> ModelSpec:
        """Strict: unknown keys and missing required keys raise ConfigError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}", data[unknown[0]],
                              f"unknown key; known keys: {', '.join(sorted(known))}")
        required = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [k for k in required if k not in data]
        if missing:
            raise ConfigError(f"{where}.{missing[0]}", None, "missing required key")
        sections = {"moe": MoeSpec, "mla": MlaSpec}
        data = {k: (sections[k].from_dict(v, where=f"{where}.{k}")
                    if k in sections and v is not None else v) for k, v in data.items()}
        return cls(**data)


def synthetic(num_params: int, *, seq_len: int = 4096) -> ModelSpec:
    """A Llama-style model of exactly `num_params` parameters.

    Shape follows Kaplan et al. 2020's aspect ratio (d_model ~ 128 * layers for
    mid-size models, Fig. 5 shows loss is flat over a wide range of it): layers are chosen
    so the blocks hold most of the budget, d_model is a multiple of 128, SwiGLU with
    ffn = 8/3 d rounded to 256, vocab 32000, untied; the remainder goes to `extra_params`.

    Raises:
        ConfigError: num_params is too small to hold one block and the embeddings.
    """
    if num_params < 10_000_000:
        raise ConfigError("params", num_params, "synthetic models need at least 1e7 parameters")
    vocab = 32000
    best: ModelSpec | None = None
    for layers in range(2, 200):
        d = max(128, round(128 * layers / 128) * 128)
        ffn = (8 * d // 3 + 255) // 256 * 256
        spec = ModelSpec(name="", num_layers=layers, d_model=d, num_heads=d // 128,
                         num_kv_heads=d // 128, ffn_hidden=ffn, vocab_size=vocab,
                         max_seq_len=seq_len)
        if spec.num_params > num_params:
            break
        best = spec
    if best is None:
        raise ConfigError("params", num_params, "too few parameters for a transformer")
    name = f"synthetic-{num_params:.3g}".replace("+", "")
    return ModelSpec(**{**best.to_dict(), "name": name,
                        "extra_params": num_params - best.num_params,
                        "seq_len_source": f"zsim's default for a synthetic model, {seq_len:,}"})
