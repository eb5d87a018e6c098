"""ModelSpec: parameter counts against published totals and independent closed forms, FLOPs
per token against a per-matmul count (config.json loading: test_hf_config.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec, synthetic
from zsim.spec.presets import ALIASES, PRESETS

PUBLISHED_PARAMS = {
    # nanoGPT transformer_sizing.ipynb (GPT-2 small, no biases, tied).
    "gpt2-124m": 124_337_664,
    # Hugging Face model cards / safetensors totals of meta-llama/*.
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
}


def closed_form_params(m: ModelSpec) -> int:
    """Parameter count written out from the architecture, independently of ModelSpec's own
    closed form: per block q and o (d x d), k and v (kv x d), ups and down (f x d), two norms;
    then embeddings, optional learned positions, final norm, untied output, extras."""
    d, kv, f = m.d_model, m.num_kv_heads * (m.d_model // m.num_heads), m.ffn_hidden
    ups = 2 if m.mlp == "swiglu" else 1
    norm = d * (2 if (m.norm == "layernorm" and m.bias) else 1)
    block = (2 * d * d + 2 * kv * d) + (ups + 1) * f * d + 2 * norm
    if m.bias:
        block += (d + 2 * kv + d) + (ups * f + d)
    elif m.qkv_bias:  # q, k and v alone (Qwen2)
        block += d + 2 * kv
    root = m.vocab_size * d + (m.max_seq_len * d if m.learned_pos_emb else 0) + norm
    if not m.tied_embeddings:
        root += m.vocab_size * d
    return m.num_layers * block + root + m.extra_params


def enumerated_params(m: ModelSpec) -> int:
    return sum(math.prod(shape) for _, shape in m.parameter_tensors())


DENSE = sorted(name for name, m in PRESETS.items() if m.moe is None)
"""The dense presets: this file's closed form and per-matmul count are of dense blocks;
the MoE presets are counted by hand in tests/spec/test_hf_config.py (and equal their
released configs there)."""


@pytest.mark.parametrize("name", DENSE)
def test_every_preset_counts_agree_three_ways(name: str) -> None:
    m = PRESETS[name]
    assert enumerated_params(m) == m.num_params == closed_form_params(m)


@pytest.mark.parametrize(("name", "published"), sorted(PUBLISHED_PARAMS.items()))
def test_preset_matches_published_count(name: str, published: int) -> None:
    assert PRESETS[name].num_params == published


def test_gpt2_small_matches_nanogpt_closed_form() -> None:
    # nanoGPT transformer_sizing: 12 L d^2 + 2 L d (weights and LayerNorm gains, no biases)
    # + V d + T d (tied wte, wpe) + d (final LayerNorm).
    L, d, V, T = 12, 768, 50257, 1024
    assert PRESETS["gpt2-124m"].num_params == 12 * L * d * d + 2 * L * d + V * d + T * d + d


def test_mpt7b_is_gpt3_6_7b_shape_with_vocab_50368(published_cases: dict) -> None:
    case = published_cases["MOS-MPT7B-FSDP-8xA100-80-noAC"]
    mpt = dataclasses.replace(PRESETS["gpt3-6.7b"], vocab_size=case["model"]["vocab"])
    published = int(case["model"]["params"].split()[0].replace(",", ""))
    assert published == 6_658_859_008
    assert mpt.num_params == published
    # The case's own derivation: 12 L d^2 + V d + s d + 13 d L + 2 d.
    L, d, V, s = 32, 4096, 50368, 2048
    assert mpt.num_params == 12 * L * d * d + V * d + s * d + 13 * d * L + 2 * d


def test_mpt7b_mfu_reproduces_published_figure(published_cases: dict) -> None:
    # MFU = tok/s/GPU * (6N + 12 L d s) / 312 TFLOP/s (the case's formula, non-causal).
    case = published_cases["MOS-MPT7B-FSDP-8xA100-80-noAC"]
    mpt = dataclasses.replace(PRESETS["gpt3-6.7b"], vocab_size=50368)
    mfu = case["measured"]["tokens_per_s_per_gpu"] * mpt.flops_per_token(
        2048, causal=False) / 312e12
    assert mfu == pytest.approx(case["measured"]["mfu_pct"] / 100, rel=5e-3)


def test_aliases_point_at_presets() -> None:
    assert set(ALIASES.values()) <= set(PRESETS)
    assert PRESETS[ALIASES["13b"]].num_params == PUBLISHED_PARAMS["llama2-13b"]


@st.composite
def model_specs(draw: st.DrawFn) -> ModelSpec:
    head_dim = draw(st.sampled_from([8, 16, 32, 64, 128]))
    kv = draw(st.integers(1, 8))
    heads = kv * draw(st.integers(1, 4))
    return ModelSpec(
        name="random", num_layers=draw(st.integers(1, 48)), d_model=heads * head_dim,
        num_heads=heads, num_kv_heads=kv, ffn_hidden=draw(st.integers(1, 20_000)),
        mlp=draw(st.sampled_from(["swiglu", "gelu"])),
        norm=draw(st.sampled_from(["rmsnorm", "layernorm"])), bias=draw(st.booleans()),
        qkv_bias=draw(st.booleans()), vocab_size=draw(st.integers(1, 200_000)),
        tied_embeddings=draw(st.booleans()),
        learned_pos_emb=draw(st.booleans()), max_seq_len=draw(st.integers(1, 8192)),
        extra_params=draw(st.integers(0, 10**6)))


@settings(max_examples=200, deadline=None)
@given(model_specs())
def test_random_specs_count_equal_both_ways(m: ModelSpec) -> None:
    assert enumerated_params(m) == m.num_params == closed_form_params(m)


@settings(max_examples=100, deadline=None)
@given(st.integers(10**8, 10**12))
def test_synthetic_has_exactly_n_params(n: int) -> None:
    m = synthetic(n)
    assert m.num_params == n
    assert enumerated_params(m) == n
    # The transformer, not the filler, holds the bulk of the budget.
    assert m.extra_params < m.num_params / 2


def test_synthetic_rejects_tiny_budget() -> None:
    with pytest.raises(ConfigError) as e:
        synthetic(1000)
    assert e.value.field == "params" and e.value.value == 1000


# ------------------------------------------------------------------------- FLOPs
def per_matmul_flops(m: ModelSpec, seq_len: int, *, causal: bool) -> tuple[float, float]:
    """(linear, attention) FLOPs per token for forward + backward, counted per matmul:
    a (tokens x k) @ (k x n) product costs 2 k n per token forward and twice that backward.
    Attention: q @ k^T and p @ v each cost 2 * head_dim per (query, key) pair per head; a
    causal mask keeps s (s + 1) / 2 of the s^2 pairs."""
    d, f, V = m.d_model, m.ffn_hidden, m.vocab_size
    kv = m.num_kv_heads * (m.d_model // m.num_heads)
    ups = 2 if m.mlp == "swiglu" else 1
    per_block = 2 * d * d + 2 * d * kv + 2 * d * kv + 2 * d * d + ups * 2 * d * f + 2 * f * d
    linear_fwd = m.num_layers * per_block + 2 * d * V  # output projection (tied or not)
    pairs_per_token = (seq_len + 1) / 2 if causal else seq_len
    attn_fwd = m.num_layers * 2 * (2 * d * pairs_per_token)
    return 3 * linear_fwd, 3 * attn_fwd


def non_matmul_params(m: ModelSpec) -> int:
    """Norm gains/biases and linear biases: counted by 6N but doing no matmul."""
    return sum(math.prod(s) for n, s in m.parameter_tensors()
               if len(s) == 1 and n != "extra")


@pytest.mark.parametrize("name", DENSE)
def test_flops_per_token_matches_per_matmul_count(name: str) -> None:
    m = PRESETS[name]
    s = m.max_seq_len
    linear, attn = per_matmul_flops(m, s, causal=False)
    # Non-causal: exact, once 6N's norm and bias terms (no matmul) are added back.
    assert m.flops_per_token(s, causal=False) == linear + attn + 6 * non_matmul_params(m)
    assert m.attention_flops_per_token(s, causal=False) == attn
    # Causal: the closed form halves s^2, the exact mask keeps s(s+1)/2: within 1/s.
    linear_c, attn_c = per_matmul_flops(m, s, causal=True)
    assert m.attention_flops_per_token(s) == pytest.approx(attn_c, rel=1.0 / s)
    assert m.flops_per_token(s) == pytest.approx(linear_c + attn_c, rel=2e-3)


@settings(max_examples=100, deadline=None)
@given(model_specs(), st.integers(1, 8192))
def test_random_specs_flops_match_per_matmul_count(m: ModelSpec, seq_len: int) -> None:
    linear, attn = per_matmul_flops(m, seq_len, causal=False)
    assert m.flops_per_token(seq_len, causal=False) == pytest.approx(
        linear + attn + 6 * non_matmul_params(m), rel=1e-12)


def test_flops_is_6n_plus_attention_for_llama2_7b() -> None:
    # Kaplan et al. 2020: 6 N per token with N = non-embedding parameters; PaLM App. B adds
    # 12 L s d (halved causal). Llama-2-7b: N = 6,738,415,616 - 32000 * 4096.
    m = PRESETS["llama2-7b"]
    n = 6_738_415_616 - 32000 * 4096
    assert m.flops_per_token(4096) == 6 * n + 12 * 32 * 4096 * 4096 / 2


# ------------------------------------------------------------- single-field checks
@pytest.mark.parametrize(("field", "value"), [("num_layers", 0), ("d_model", -8),
                                              ("vocab_size", 1.5), ("max_seq_len", True),
                                              ("extra_params", -1), ("mlp", "relu"),
                                              ("rope_table_dtype", "bf16"),
                                              ("qkv_bias", 1), ("sliding_window", -1),
                                              ("warnings", ["a list"]),
                                              ("seq_len_source", None)])
def test_bad_field_raises_naming_it(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(PRESETS["llama2-7b"], **{field: value})
    assert e.value.field == f"model.{field}" and e.value.value == value


def test_heads_must_divide() -> None:
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(PRESETS["llama2-7b"], num_heads=24)
    assert e.value.field == "model.num_heads"
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(PRESETS["llama2-7b"], num_kv_heads=5)
    assert e.value.field == "model.num_kv_heads"


# ------------------------------------------------------------ mixture of experts, MLA
def _moe_spec(**moe: object) -> ModelSpec:
    from zsim.spec.moe import MoeSpec

    return ModelSpec(name="m", num_layers=4, d_model=256, num_heads=4, num_kv_heads=4,
                     ffn_hidden=512, vocab_size=1000, max_seq_len=128,
                     moe=MoeSpec(**{"experts": 8, "top_k": 2, "expert_ffn_hidden": 128, **moe}))


def test_an_moe_spec_round_trips_through_its_dict_and_names_a_bad_key() -> None:
    spec = _moe_spec(shared_ffn_hidden=256, dense_layers=1)
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    data = spec.to_dict()
    data["moe"]["topk"] = 2
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_dict(data)
    assert e.value.field == "model.moe.topk"


@pytest.mark.parametrize(("moe", "field"), [
    ({"top_k": 9}, "model.moe.top_k"),            # more than the experts
    ({"ep": 3}, "model.moe.ep"),                  # does not divide 8 experts
    ({"dense_layers": 4}, "model.moe.dense_layers"),  # every layer dense
])
def test_impossible_moe_sections_name_the_field(moe: dict, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        _moe_spec(**moe)
    assert e.value.field == field


def test_dense_layers_count_as_dense_blocks_and_active_params_are_top_k() -> None:
    """One dense layer (MLP 3 x 256 x 512) and three MoE layers (router 8 x 256, 8
    experts of 3 x 256 x 128): totals and the per-token share worked by hand."""
    spec = _moe_spec(dense_layers=1)
    attention, norms = 4 * 256 * 256, 2 * 256
    dense = attention + norms + 3 * 256 * 512
    moe = attention + norms + 8 * 256 + 8 * 3 * 256 * 128
    root = 2 * 1000 * 256 + 256
    assert spec.num_params == dense + 3 * moe + root
    assert spec.active_params == spec.num_params - 3 * 6 * 3 * 256 * 128
    assert spec.mlp_width == 2 * 128
