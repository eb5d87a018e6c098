"""Hypothesis strategies for the property tests: plans and models.

Plans are drawn field by field and built through the real constructors; draws that the
constructors reject (ConfigError) are discarded with `assume`, so every example is a plan
a user could have written.
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

COMPUTE_DTYPES = ("bf16", "fp16", "fp32")


def plan_knobs() -> st.SearchStrategy[dict[str, Any]]:
    """Every Plan field except the strategy and the degrees."""
    return st.fixed_dictionaries({
        "micro_batch": st.integers(1, 8),
        "grad_accum": st.integers(1, 4),
        "seq_len": st.sampled_from([128, 512, 2048, 4096, 8192]),
        "recompute": st.sampled_from(["none", "selective", "full"]),
        "unit_size": st.integers(1, 2),
        "prefetch": st.integers(0, 2),
        "param_dtype": st.sampled_from(COMPUTE_DTYPES),
        "grad_dtype": st.sampled_from(COMPUTE_DTYPES),
        "reduce_dtype": st.sampled_from(COMPUTE_DTYPES),
        "master_dtype": st.sampled_from(COMPUTE_DTYPES),
        "optimizer": st.sampled_from(["adamw", "sgd", "adamw8bit"]),
        "optimizer_state_dtype": st.sampled_from(COMPUTE_DTYPES),
        "offload": st.sampled_from(["none", "optimizer", "params"]),
    })


def build_plan(**fields: Any) -> Plan:
    """Plan(**fields), discarding the example if the constructor rejects it."""
    try:
        return Plan(**fields)
    except ConfigError:
        assume(False)
        raise  # unreachable: assume(False) raises


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    """Small decoder-only transformers of every supported kind (sizes stay small so the
    arithmetic is fast; the closed forms are scale-free)."""
    heads = draw(st.integers(1, 16))
    kv_heads = draw(st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
    head_dim = draw(st.sampled_from([16, 32, 64, 128]))
    return ModelSpec(
        name="drawn",
        num_layers=draw(st.integers(1, 6)),
        d_model=heads * head_dim,
        num_heads=heads,
        num_kv_heads=kv_heads,
        ffn_hidden=draw(st.integers(1, 64)) * 64,
        mlp=draw(st.sampled_from(["swiglu", "gelu"])),
        norm=draw(st.sampled_from(["rmsnorm", "layernorm"])),
        bias=draw(st.booleans()),
        vocab_size=draw(st.integers(128, 60_000)),
        tied_embeddings=draw(st.booleans()),
        max_seq_len=8192,
        attention_kernel=draw(st.sampled_from(["flash", "math"])),
        norm_kernel=draw(st.sampled_from(["fused", "composite"])),
        gqa_impl=draw(st.sampled_from(["enable_gqa", "repeat_kv"])),
        logits_upcast=draw(st.booleans()),
    )
