"""A HuggingFace `config.json` read as a ModelSpec, for the model types zsim models exactly.

Owns the reading of a config.json: which `model_type`s zsim models (MODEL_TYPES), the keys
it reads for each, the training sequence length it takes from them, and what it refuses or
reports. Nothing is guessed: a model type outside MODEL_TYPES, and a key that changes the
architecture in a way ModelSpec does not represent (mixture of experts, quantised weights,
custom modelling code, biases on only some projections), raise ConfigError naming the key,
its value and the model_type. A key zsim reads but does not model, whose effect on memory
and time is small (dropout, GPT-NeoX's parallel residual and partial rotary embedding, an
activation other than the family's own), and a key no reader here uses, become the spec's
`warnings`. A key absent from the file takes the default of the transformers config class
of its model_type (what `AutoModelForCausalLM.from_config` would build); the shape keys
(layers, widths, heads, vocabulary) are required.

Each family as transformers builds it (src/transformers/models/<type>/modeling_<type>.py
and configuration_<type>.py):
- llama: q/k/v/o projections with bias=attention_bias, gate/up/down with bias=mlp_bias
  (both default false), RMSNorm, head_dim = config.head_dim or hidden/heads (the family
  alike: ModelSpec.head_width), untied output by default (tie_word_embeddings false).
- mistral: llama's block with no biases at all; `sliding_window` (default 4096, null for
  none) on every layer.
- qwen2: q/k/v with biases, o and the MLP without; a sliding window only with
  use_sliding_window, on the layers from max_window_layers on (default 28).
- gpt2: Conv1D c_attn (q, k, v), attention c_proj, mlp c_fc (n_inner, default 4 x n_embd)
  and c_proj, all with biases; LayerNorm with bias; learned positions (wpe, n_positions
  rows); lm_head tied to wte (PretrainedConfig's tie_word_embeddings default true).
- mixtral: mistral's block with a MixtralSparseMoeBlock MLP on every layer: a router
  (gate, hidden -> num_local_experts, no bias) and num_local_experts SwiGLU experts of
  intermediate_size, num_experts_per_tok of them per token.
- qwen2_moe: qwen2's attention; on every layer (decoder_sparse_step 1, no mlp_only_layers)
  a router (num_experts), experts of moe_intermediate_size, num_experts_per_tok per token,
  a shared expert of shared_expert_intermediate_size and its sigmoid gate (hidden -> 1).
- qwen3_moe: q/k/v/o with bias=attention_bias (default false), an RMSNorm over each
  head's query and key (q_norm, k_norm), head_dim given; every layer an MoE (router of
  num_experts, experts of moe_intermediate_size, num_experts_per_tok per token), no
  shared expert.
- deepseek_v3: multi-head latent attention (q_lora_rank, kv_lora_rank, qk_nope_head_dim,
  qk_rope_head_dim, v_head_dim); the first first_k_dense_replace layers dense (MLP of
  intermediate_size), the others a router of n_routed_experts with its
  e_score_correction_bias, experts of moe_intermediate_size, num_experts_per_tok per
  token, and n_shared_experts shared experts; the multi-token-prediction module
  (num_nextn_predict_layers) is not built by transformers and not modelled; the
  checkpoint's fp8 quantization_config describes the released weights, not training.
- gpt_neox: query_key_value and dense with bias=attention_bias (default true), MLP
  dense_h_to_4h / dense_4h_to_h with biases, LayerNorm with bias, embed_out untied
  (default); RoPE over rotary_pct of each head (default 0.25); parallel residual
  (default true) adds attention and MLP to the same input, with the same parameters.

Sequence length (ModelSpec.max_seq_len, with `seq_len_source`): the length the model was
trained at where the config says it (gpt2's n_positions, the size of its learned table;
rope_scaling's original_max_position_embeddings, the length before the context was
extended), else DEFAULT_SEQ_LEN capped at max_position_embeddings, which for long-context
configs is what inference may reach, not what a training run uses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError
from zsim.spec.json_file import read_json
from zsim.spec.model import ModelSpec
from zsim.spec.moe import MlaSpec, MoeSpec

DEFAULT_SEQ_LEN = 4096
"""Sequence length of a config that does not give its training length (capped at its
max_position_embeddings)."""

EXPERT_KEYS: tuple[str, ...] = (
    "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
    "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size",
    "shared_expert_intermediate_size", "moe_layer_freq", "first_k_dense_replace",
    "decoder_sparse_step")
"""Mixture-of-experts keys (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3, DBRX's
spelling): a config holding one with a value is refused unless its model_type is one of
MOE_TYPES, whose reader reads them."""

REFUSED_KEYS: dict[str, str] = {
    "quantization_config": "quantised weights (GPTQ, AWQ, bitsandbytes) are not modelled",
    "auto_map": "the config loads custom modelling code, whose architecture zsim cannot read",
}
"""Keys that change what is trained beyond what ModelSpec represents, with why."""

READ_INSTEAD: dict[str, tuple[str, ...]] = {"deepseek_v3": ("auto_map", "quantization_config")}
"""REFUSED_KEYS a model_type's reader reads itself: DeepSeek-V3's released config.json
loads its own modelling code (auto_map), which transformers now has as deepseek_v3, and
describes its fp8 release weights."""

HARMLESS_KEYS: frozenset[str] = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype",
    "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "initializer_range", "rms_norm_eps", "layer_norm_eps",
    "layer_norm_epsilon", "rope_theta", "rotary_emb_base", "tokenizer_class",
    "task_specific_params", "output_attentions", "output_hidden_states", "return_dict",
    "id2label", "label2id", "finetuning_task", "prefix", "problem_type", "max_length",
    "min_length", "do_sample", "num_beams", "temperature", "top_k", "top_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "early_stopping", "use_bfloat16", "torchscript",
    "classifier_dropout", "summary_activation", "summary_first_dropout",
    "summary_proj_to_labels", "summary_type", "summary_use_proj", "scale_attn_weights",
    "n_ctx",
})
"""Keys that do not change a training step's memory or time: token ids, initialisation,
norm epsilons, the RoPE base, generation and head-for-other-tasks settings. gpt2's n_ctx
is a legacy copy of n_positions that GPT2Model no longer reads."""

GELU_ACTS = frozenset({"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python",
                       "quick_gelu"})
"""transformers ACT2FN names of GELU variants (the reference MLP's activation)."""

CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
"""`architectures` entries of a causal language model (LlamaForCausalLM, GPT2LMHeadModel);
others (ForSequenceClassification, GPT2DoubleHeadsModel) have other heads."""


class HfConfigReader:
    """One config.json being read: its path (for messages), the keys read, and what zsim
    reads but does not model."""

    def __init__(self, path: Path, cfg: dict[str, Any], model_type: str) -> None:
        self.path = path
        self.cfg = cfg
        self.model_type = model_type
        self.read: set[str] = {"model_type"}
        self.unmodelled: list[str] = []

    def error(self, key: str, value: object, reason: str) -> ConfigError:
        return ConfigError(f"{self.path}:{key}", value, reason)

    def refuse(self, key: str, value: object, what: str) -> ConfigError:
        """A key whose value zsim does not model, named with the config's model_type."""
        return self.error(key, value, f"{what} (model_type {self.model_type!r}) is not "
                          "modelled; zsim refuses rather than guess")

    # ------------------------------------------------------------------ values
    def count(self, key: str, default: int | None = None) -> int:
        """A positive integer; absent or null takes `default` (required when None)."""
        self.read.add(key)
        value = self.cfg.get(key)
        if value is None:
            if default is None:
                raise self.error(key, None, "missing required key")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.error(key, value, "must be a positive integer")
        return value

    def optional_count(self, key: str) -> int | None:
        """A positive integer, or None where absent or null."""
        return self.count(key, 0) or None

    def flag(self, key: str, default: bool) -> bool:
        self.read.add(key)
        value = self.cfg.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, value, "must be true or false")
        return value

    def fraction(self, key: str, default: float) -> float:
        """A number in [0, 1] (a dropout probability, rotary_pct)."""
        self.read.add(key)
        value = self.cfg.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value <= 1:
            raise self.error(key, value, "must be a number in [0, 1]")
        return float(value)

    def text(self, key: str, default: str) -> str:
        self.read.add(key)
        value = self.cfg.get(key, default)
        if not isinstance(value, str):
            raise self.error(key, value, "must be a string")
        return value

    # ------------------------------------------------------------------ notes
    def not_modelled(self, key: str, value: object, how: str) -> None:
        """Record a key read but not modelled, and how zsim simulates it instead."""
        self.unmodelled.append(f"{key}={_json(value)} ({how})")

    def dropout(self, *keys: str, default: float) -> None:
        """Dropout probabilities: zsim's reference model has no dropout (its masks would
        add activation memory and a little time)."""
        probabilities = {k: self.fraction(k, default) for k in keys}
        active = [f"{k}={p:g}" for k, p in probabilities.items() if p > 0]
        if active:
            self.unmodelled.append(f"{', '.join(active)} (simulated without dropout: no "
                                   "masks saved)")

    def activation(self, key: str, default: str, *, gated: bool) -> None:
        """The MLP's activation: SiLU in a gated MLP (SwiGLU), a GELU variant in a plain
        one; another keeps the shapes, so only its elementwise cost differs."""
        act = self.text(key, default)
        if (act != "silu") if gated else (act not in GELU_ACTS):
            self.not_modelled(key, act, "simulated as " + ("SiLU" if gated else "GELU"))

    def warnings(self, name: str) -> tuple[str, ...]:
        out = []
        if self.unmodelled:
            out.append(f"{name}: read but not modelled: {'; '.join(self.unmodelled)}")
        unread = sorted(set(self.cfg) - self.read - HARMLESS_KEYS)
        if unread:
            out.append(f"{name}: not read (model_type {self.model_type!r} does not use them "
                       f"in zsim): {', '.join(unread)}")
        return tuple(out)


def read_hf_config(path: Path) -> ModelSpec:
    """The ModelSpec of a HuggingFace `config.json` on disk (no hub access), named after
    its folder; see the module docstring for what is read and what is refused.

    Raises:
        ConfigError: the file is missing, unreadable or not a JSON object; its model_type is
            missing or not one of MODEL_TYPES; it has a mixture-of-experts, quantisation or
            custom-code key; a required key is missing or a value has the wrong type; or
            it describes a shape ModelSpec cannot represent. The message names the file
            and key (FILE:key), the value, and the model_type where it matters.
    """
    cfg = read_json(path, field="model")
    if not isinstance(cfg, dict):
        raise ConfigError("model", str(path), "config.json must hold a JSON object")
    model_type = cfg.get("model_type")
    known = ", ".join(MODEL_TYPES)
    if not isinstance(model_type, str):
        raise ConfigError(f"{path}:model_type", model_type,
                          f"must name the architecture; zsim models {known}")
    r = HfConfigReader(path, cfg, model_type)
    for key in EXPERT_KEYS:
        if cfg.get(key) not in (None, 0) and model_type not in MOE_TYPES:
            raise r.refuse(key, cfg[key], "a mixture of experts")
    for key, why in REFUSED_KEYS.items():
        if cfg.get(key) is not None and key not in READ_INSTEAD.get(model_type, ()):
            raise r.error(key, cfg[key], f"{why} (model_type {model_type!r})")
    if model_type not in MODEL_TYPES:
        raise r.error("model_type", model_type, f"not modelled; zsim models {known} "
                      "(refused rather than read as another architecture)")
    architectures = cfg.get("architectures")
    r.read.add("architectures")
    if architectures is not None and (not isinstance(architectures, list) or not all(
            isinstance(a, str) and a.endswith(CAUSAL_LM_SUFFIXES) for a in architectures)):
        raise r.refuse("architectures", architectures,
                       "a model other than a causal language model")
    shape = MODEL_TYPES[model_type](r)
    name = Path(path).parent.name or Path(path).stem
    try:
        return ModelSpec(name=name, warnings=r.warnings(name), **shape)
    except ConfigError as e:  # a cross-field rule: name the config's own key
        key = _CONFIG_KEYS[model_type].get(e.field.removeprefix("model."), e.field)
        raise r.error(key, e.value, e.reason) from None


# ---------------------------------------------------------------------- families
def _llama_family(r: HfConfigReader) -> dict[str, Any]:
    """llama, mistral and qwen2: RMSNorm, a gated MLP, GQA, RoPE."""
    heads, hidden = r.count("num_attention_heads"), r.count("hidden_size")
    head_dim = r.optional_count("head_dim")
    width = head_dim if head_dim is not None and head_dim * heads != hidden else 0
    bias = qkv_bias = False
    window = 0
    if r.model_type == "llama":
        bias = r.flag("attention_bias", False)
        if bias != r.flag("mlp_bias", False):
            raise r.refuse("attention_bias", bias,
                           f"biases on only some linears (mlp_bias={not bias!r})")
        slices = r.count("pretraining_tp", 1)
        if slices > 1:
            r.not_modelled("pretraining_tp", slices, "each matmul simulated whole, not "
                           "in slices")
    elif r.model_type == "qwen3_moe":
        bias = r.flag("attention_bias", False)
        if r.flag("use_sliding_window", False):
            raise r.refuse("use_sliding_window", True, "sliding-window attention")
        r.read |= {"sliding_window", "max_window_layers", "layer_types"}
    elif r.model_type in ("mistral", "mixtral"):
        # MistralConfig's sliding_window defaults to 4096, MixtralConfig's to none.
        window = _sliding_window(r, default=4096 if r.model_type == "mistral" else 0)
    else:  # qwen2, qwen2_moe: q/k/v biased, o and MLP not
        qkv_bias = True
        if r.flag("use_sliding_window", False):
            layers = r.count("num_hidden_layers")
            types = r.cfg.get("layer_types")
            r.read.add("layer_types")
            if types is None:
                sliding = r.count("max_window_layers", 28) < layers
            elif isinstance(types, list):
                sliding = "sliding_attention" in types
            else:
                raise r.error("layer_types", types, "must be a list of layer types")
            window = _sliding_window(r, default=4096) if sliding else 0
        else:
            r.read |= {"sliding_window", "max_window_layers", "layer_types"}
    r.activation("hidden_act", "silu", gated=True)
    r.dropout("attention_dropout", default=0.0)
    seq, source = _rope_seq_len(r)
    return {"num_layers": r.count("num_hidden_layers"), "d_model": hidden,
            "num_heads": heads, "num_kv_heads": r.count("num_key_value_heads", heads),
            "ffn_hidden": r.count("intermediate_size"), "mlp": "swiglu", "norm": "rmsnorm",
            "bias": bias, "qkv_bias": qkv_bias, "vocab_size": r.count("vocab_size"),
            "tied_embeddings": r.flag("tie_word_embeddings", False), "max_seq_len": seq,
            "seq_len_source": source, "sliding_window": window, "head_width": width}


def _gpt2(r: HfConfigReader) -> dict[str, Any]:
    """GPT-2: LayerNorm and every linear with biases, learned positions, tied output."""
    d = r.count("n_embd")
    if r.flag("add_cross_attention", False):
        raise r.refuse("add_cross_attention", True, "cross-attention to an encoder")
    for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if r.flag(key, False):
            r.not_modelled(key, True, "attention simulated as GPT-2's default")
    r.activation("activation_function", "gelu_new", gated=False)
    # GPT2Config's defaults: 0.1 each.
    r.dropout("resid_pdrop", "embd_pdrop", "attn_pdrop", default=0.1)
    positions = r.count("n_positions")
    return {"num_layers": r.count("n_layer"), "d_model": d, "num_heads": r.count("n_head"),
            "num_kv_heads": r.count("n_head"), "ffn_hidden": r.count("n_inner", 4 * d),
            "mlp": "gelu", "norm": "layernorm", "bias": True,
            "vocab_size": r.count("vocab_size"),
            "tied_embeddings": r.flag("tie_word_embeddings", True),
            "learned_pos_emb": True, "max_seq_len": positions,
            "seq_len_source": "config n_positions, the learned position table's length"}


def _gpt_neox(r: HfConfigReader) -> dict[str, Any]:
    """GPT-NeoX (Pythia): LayerNorm and every linear with biases, RoPE, untied output."""
    if not r.flag("attention_bias", True):
        raise r.refuse("attention_bias", False,
                       "attention without biases beside an MLP and norms with them")
    if r.flag("use_parallel_residual", True):
        r.not_modelled("use_parallel_residual", True, "blocks simulated sequential: the "
                       "same parameters and FLOPs, one d-wide activation per block more "
                       "saved than the parallel form saves")
    # transformers 5 spells rotary_pct partial_rotary_factor.
    key = "partial_rotary_factor" if "partial_rotary_factor" in r.cfg else "rotary_pct"
    pct = r.fraction(key, 0.25)
    if pct < 1:
        r.not_modelled(key, pct, "RoPE simulated over the whole head")
    r.activation("hidden_act", "gelu", gated=False)
    r.dropout("attention_dropout", "hidden_dropout", default=0.0)
    heads = r.count("num_attention_heads")
    seq, source = _rope_seq_len(r)
    return {"num_layers": r.count("num_hidden_layers"), "d_model": r.count("hidden_size"),
            "num_heads": heads, "num_kv_heads": heads,
            "ffn_hidden": r.count("intermediate_size"), "mlp": "gelu", "norm": "layernorm",
            "bias": True, "vocab_size": r.count("vocab_size"),
            "tied_embeddings": r.flag("tie_word_embeddings", False), "max_seq_len": seq,
            "seq_len_source": source}


def _mixtral(r: HfConfigReader) -> dict[str, Any]:
    """Mixtral: mistral's attention, an MoE of intermediate_size experts on every layer."""
    shape = _llama_family(r)
    r.dropout("router_jitter_noise", default=0.0)
    r.read |= {"output_router_logits", "router_aux_loss_coef"}
    experts = r.count("num_local_experts")
    return shape | {"moe": MoeSpec(experts=experts, top_k=r.count("num_experts_per_tok", 2),
                                   expert_ffn_hidden=shape["ffn_hidden"])}


def _qwen2_moe(r: HfConfigReader) -> dict[str, Any]:
    """Qwen2-MoE: qwen2's attention, routed experts and a gated shared expert per layer."""
    shape = _llama_family(r)
    shared = r.count("shared_expert_intermediate_size", 0) if \
        r.cfg.get("shared_expert_intermediate_size") else 0
    return shape | {"moe": _qwen_experts(r, shared_ffn_hidden=shared,
                                         shared_expert_gate=bool(shared))}


def _qwen3_moe(r: HfConfigReader) -> dict[str, Any]:
    """Qwen3-MoE: attention with per-head q/k RMSNorm and an explicit head width, an MoE
    of moe_intermediate_size experts on every layer, no shared expert."""
    return _llama_family(r) | {"qk_norm": True, "moe": _qwen_experts(r)}


def _qwen_experts(r: HfConfigReader, **shared: Any) -> MoeSpec:
    """The Qwen MoE families' experts (num_experts of moe_intermediate_size, top
    num_experts_per_tok) on every layer: dense layers between them (decoder_sparse_step
    other than 1, mlp_only_layers) are refused."""
    step = r.count("decoder_sparse_step", 1)
    r.read.add("mlp_only_layers")
    dense = r.cfg.get("mlp_only_layers") or []
    if step != 1 or dense:
        raise r.refuse("decoder_sparse_step" if step != 1 else "mlp_only_layers",
                       step if step != 1 else dense, "dense layers between MoE layers")
    r.read |= {"output_router_logits", "router_aux_loss_coef", "norm_topk_prob"}
    return MoeSpec(experts=r.count("num_experts"), top_k=r.count("num_experts_per_tok"),
                   expert_ffn_hidden=r.count("moe_intermediate_size"), **shared)


def _deepseek_v3(r: HfConfigReader) -> dict[str, Any]:
    """DeepSeek-V3: MLA attention, leading dense layers, then routed and shared experts."""
    heads = r.count("num_attention_heads")
    if r.count("num_key_value_heads", heads) != heads:
        raise r.refuse("num_key_value_heads", r.cfg["num_key_value_heads"],
                       "MLA with fewer key/value heads than query heads")
    if r.count("moe_layer_freq", 1) != 1:
        raise r.refuse("moe_layer_freq", r.cfg["moe_layer_freq"],
                       "dense layers between MoE layers")
    if r.flag("attention_bias", False):
        raise r.refuse("attention_bias", True, "MLA projections with biases")
    mtp = r.count("num_nextn_predict_layers", 0) if r.cfg.get("num_nextn_predict_layers") \
        else 0
    if mtp:
        r.not_modelled("num_nextn_predict_layers", mtp, "the multi-token-prediction module "
                       "is not simulated (transformers does not build it)")
    r.read.add("auto_map")
    if isinstance(r.cfg.get("auto_map"), dict):
        r.not_modelled("auto_map", r.cfg["auto_map"].get("AutoModelForCausalLM"),
                       "read as transformers' own deepseek_v3 architecture")
    dense = r.count("first_k_dense_replace", 0) if r.cfg.get("first_k_dense_replace") else 0
    if dense:
        r.not_modelled("first_k_dense_replace", dense, "the dense layers are counted "
                       "exactly; the simulator runs every layer as an MoE layer")
    quant = r.cfg.get("quantization_config")
    r.read.add("quantization_config")
    if quant is not None:
        r.not_modelled("quantization_config", quant, "the released weights' format: "
                       "trained in the plan's precision (--fp8 for fp8 linears)")
    r.read |= {"n_group", "topk_group", "topk_method", "scoring_func", "norm_topk_prob",
               "routed_scaling_factor", "ep_size", "aux_loss_alpha", "seq_aux"}
    r.activation("hidden_act", "silu", gated=True)
    r.dropout("attention_dropout", default=0.0)
    seq, source = _rope_seq_len(r)
    fe = r.count("moe_intermediate_size")
    shared = r.count("n_shared_experts", 0) if r.cfg.get("n_shared_experts") else 0
    return {"num_layers": r.count("num_hidden_layers"), "d_model": r.count("hidden_size"),
            "num_heads": heads, "num_kv_heads": heads,
            "ffn_hidden": r.count("intermediate_size"), "mlp": "swiglu", "norm": "rmsnorm",
            "vocab_size": r.count("vocab_size"),
            "tied_embeddings": r.flag("tie_word_embeddings", False), "max_seq_len": seq,
            "seq_len_source": source,
            "mla": MlaSpec(q_lora_rank=r.count("q_lora_rank", 0) if r.cfg.get("q_lora_rank")
                           else 0, kv_lora_rank=r.count("kv_lora_rank"),
                           qk_nope_head_dim=r.count("qk_nope_head_dim"),
                           qk_rope_head_dim=r.count("qk_rope_head_dim"),
                           v_head_dim=r.count("v_head_dim")),
            "moe": MoeSpec(experts=r.count("n_routed_experts"),
                           top_k=r.count("num_experts_per_tok"), expert_ffn_hidden=fe,
                           shared_ffn_hidden=shared * fe, router_bias=True,
                           dense_layers=dense)}


MODEL_TYPES: dict[str, Callable[[HfConfigReader], dict[str, Any]]] = {
    "llama": _llama_family, "mistral": _llama_family, "qwen2": _llama_family,
    "mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe,
    "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2, "gpt_neox": _gpt_neox,
}
"""The model_types zsim models exactly, each with the reader of its keys."""

_LLAMA_KEYS = {"num_layers": "num_hidden_layers", "d_model": "hidden_size",
               "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
               "ffn_hidden": "intermediate_size", "vocab_size": "vocab_size",
               "max_seq_len": "max_position_embeddings"}
MOE_TYPES: frozenset[str] = frozenset({"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"})
"""The model_types whose readers read the mixture-of-experts keys."""
_CONFIG_KEYS: dict[str, dict[str, str]] = {
    "llama": _LLAMA_KEYS, "mistral": _LLAMA_KEYS, "qwen2": _LLAMA_KEYS,
    "mixtral": _LLAMA_KEYS, "qwen2_moe": _LLAMA_KEYS, "qwen3_moe": _LLAMA_KEYS,
    "deepseek_v3": _LLAMA_KEYS,
    "gpt_neox": _LLAMA_KEYS,
    "gpt2": {"num_layers": "n_layer", "d_model": "n_embd", "num_heads": "n_head",
             "num_kv_heads": "n_head", "ffn_hidden": "n_inner", "vocab_size": "vocab_size",
             "max_seq_len": "n_positions"},
}
"""ModelSpec field -> the config key it is read from, to name a cross-field error."""


# ---------------------------------------------------------------------- helpers
def _sliding_window(r: HfConfigReader, *, default: int) -> int:
    """The attention window (`sliding_window`; null: none, absent: `default`)."""
    r.read.add("sliding_window")
    if "sliding_window" in r.cfg and r.cfg["sliding_window"] is None:
        return 0
    return r.count("sliding_window", default)


def _rope_seq_len(r: HfConfigReader) -> tuple[int, str]:
    """A RoPE model's training length and where it came from: rope_scaling's (or
    transformers 5's rope_parameters') original_max_position_embeddings, else
    DEFAULT_SEQ_LEN capped at max_position_embeddings."""
    limit = r.count("max_position_embeddings")
    for key in ("rope_scaling", "rope_parameters"):
        rope = r.cfg.get(key)
        r.read.add(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise r.error(key, rope, "must be an object or null")
        original = rope.get("original_max_position_embeddings")
        if original is not None:
            if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
                raise r.error(f"{key}.original_max_position_embeddings", original,
                              "must be a positive integer")
            return original, f"config {key}.original_max_position_embeddings"
    if limit <= DEFAULT_SEQ_LEN:
        return limit, "config max_position_embeddings"
    return DEFAULT_SEQ_LEN, (f"default {DEFAULT_SEQ_LEN:,} (the config allows up to "
                             f"{limit:,})")


def _json(value: object) -> str:
    """A config value as config.json spells it (true, not True)."""
    return json.dumps(value)
