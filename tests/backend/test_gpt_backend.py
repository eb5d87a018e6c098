"""The GPT block (LayerNorm with biases, biased projections, GELU MLP, learned positions,
tied embeddings) run by the real libraries on 2 gloo ranks against the simulator: FSDP2
and DeepSpeed ZeRO-3 (FSDP1 and ZeRO-2 with the optimizer offloaded are rows of the
committed validation report, gpt-tiny, checked by test_validation_report). Model state,
peak memory and saved activations within the validation bounds (state 1%, peak 5%,
activations 3%)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from zsim.backend.measured_step import measure_plan
from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware
from zsim.validation.comparison import BOUNDS_PCT, compare

pytestmark = pytest.mark.slow

GPT = ModelSpec(name="gpt", num_layers=2, d_model=256, num_heads=4, num_kv_heads=4,
                ffn_hidden=1024, mlp="gelu", norm="layernorm", bias=True, vocab_size=1024,
                tied_embeddings=True, learned_pos_emb=True, max_seq_len=256,
                norm_kernel="composite")
SMALL_DS = DeepSpeedZero(reduce_bucket_size=200_000, allgather_bucket_size=200_000,
                         prefetch_bucket_size=200_000, param_persistence_threshold=1_000)
"""Buckets of a fraction of a block, so the 1 GB default buckets do not swamp the peak."""


@pytest.mark.parametrize(("strategy", "knobs"), [
    ("fsdp", {}),
    ("zero3", {"options": SMALL_DS}),
])
def test_memory_of_the_real_program(strategy: str, knobs: dict[str, Any]) -> None:
    if "options" in knobs:
        pytest.importorskip("deepspeed")
    plan = Plan.for_strategy(strategy, gpus=2, seq_len=256, micro_batch=2, **knobs)
    # Memory only: the two memory steps, no timed ones (their path is the Llama runs').
    measured = measure_plan(GPT, plan, nproc=2, steps=0, warmup_steps=0)
    rows = {r["metric"]: r for r in compare(GPT, plan, resolve_hardware("local-cpu"),
                                            measured, times=False)}
    for metric in ("state_memory_bytes", "peak_memory_bytes", "activation_bytes_blocks",
                   "activation_bytes_root"):
        assert abs(rows[metric]["error_pct"]) <= BOUNDS_PCT[metric], (metric, rows[metric])
