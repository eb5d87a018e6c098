"""`zsim plan` answers at one global batch: both tables train the same tokens per step,
each plan at the largest micro-batch that fits (the rest accumulated), with one
recommendation over both; its text fits a 120-column terminal on every shipped profile,
and its saved-activation column is what a micro-batch saves (a closed form by hand)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from zsim import api
from zsim.cli import app
from zsim.planner import batch_splits
from zsim.simulate import simulate
from zsim.spec.plan import Plan
from zsim.spec.presets import PRESETS
from zsim.spec.registry import hardware_names, resolve_hardware
from zsim.units import GiB


@pytest.fixture(scope="module")
def four_m_tokens() -> dict[str, Any]:
    """13B on 128 H200s at 4M tokens: 1,024 sequences, 8 per GPU in the 1-D table."""
    return api.plan(model="13b", params=None, gpus=128, hardware="hgx-h200", seq=None,
                    global_batch="4Mt")


def test_both_tables_train_the_global_batch(four_m_tokens: dict[str, Any]) -> None:
    r = four_m_tokens
    assert r["global_batch_sequences"] == 1024
    assert r["global_batch_tokens"] == 4 * 2**20
    for row in r["candidates"]:
        assert row["micro_batch"] * row["grad_accum"] * 128 == 1024, row["plan"]
    for row in r["parallel"]["candidates"]:
        dp = row["dp_shard"] * row["dp_replicate"]
        assert row["micro_batch"] * row["grad_accum"] * dp == 1024, row["plan"]
    # One recommendation, at the head of its own table.
    table = r if r["recommended_table"] == "1-D" else r["parallel"]
    assert table["candidates"][0]["plan"] == r["recommended"]
    tiers = [c["tier"] for c in (*r["candidates"], *r["parallel"]["candidates"])]
    assert tiers.count("recommended") == 1


def test_each_plan_takes_the_largest_micro_batch_that_fits(
        four_m_tokens: dict[str, Any]) -> None:
    spec, hw = PRESETS["llama2-13b"], resolve_hardware("hgx-h200")
    rows = [c for c in four_m_tokens["candidates"] if c["fits"]]
    assert max(c["micro_batch"] for c in rows) > 1  # micro-batches above 1 are searched
    checked = 0
    for row in rows:
        mb = row["micro_batch"]
        if mb == 8:
            continue
        # The next larger micro-batch that splits the GPU's 8 sequences does not fit.
        bigger = next(m for m, _ in batch_splits(8) if m > mb and m == 2 * mb)
        every = "sync=every" in row["plan"]
        if every and bigger == 8:
            continue  # without accumulation there is nothing to reduce every micro-batch
        shape = Plan.for_strategy(row["strategy"], gpus=128, impl=row["impl"],
                                  shard_group=row["dp_shard"] if row["strategy"] == "hsdp"
                                  else None, seq_len=4096, recompute=row["recompute"],
                                  micro_batch=bigger, grad_accum=8 // bigger,
                                  grad_sync="every" if every else "last")
        assert not simulate(spec, hw, shape, reserved=False).fits, shape.label
        checked += 1
    assert checked


def test_batch_splits_are_every_divisor_largest_first() -> None:
    assert batch_splits(8) == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert batch_splits(12, micro_batch=3) == [(3, 4)]
    assert batch_splits(12, grad_accum=3) == [(4, 3)]
    assert batch_splits(1) == [(1, 1)]


def test_saved_activations_are_what_a_micro_batch_saves() -> None:
    r = api.plan(model="13b", params=None, gpus=128, hardware="dgx-h100", seq=None)
    row = next(c for c in r["candidates"] if c["plan"] == "fsdp ac=full mb=1")
    # By hand, Llama-2-13B (40 blocks, d 5,120, vocabulary 32,000, head dim 128), one
    # sequence of 4,096 tokens, bf16 (FSDP2), full recomputation: each block saves its
    # bf16 input; the root saves the token ids and labels (int64), RoPE's cos and sin
    # (bf16), the final RMSNorm's input and fp32 rstd (fused kernel), the output
    # projection's input and the loss's fp32 log-softmax.
    s, d, v = 4096, 5120, 32000
    blocks = 40 * s * d * 2
    root = s * 8 + 2 * s * 128 * 2 + (s * d * 2 + s * 4) + s * d * 2 + s * v * 4 + s * 8
    assert row["saved_activations_gib_per_microbatch"] == round((blocks + root) / GiB, 3)
    # Without recomputation every block saves far more; what is live at the peak is
    # another figure, kept in the JSON.
    none = next(c for c in r["candidates"] if c["plan"] == "fsdp ac=none mb=1")
    assert none["saved_activations_gib_per_microbatch"] > 10 * row[
        "saved_activations_gib_per_microbatch"]
    assert "at_peak_activations_gib" in row


@pytest.mark.parametrize("hardware", hardware_names())
def test_the_answer_fits_120_columns(hardware: str) -> None:
    result = CliRunner().invoke(app, ["plan", "--model", "13b", "--gpus", "128",
                                      "--hardware", hardware])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= 120
    assert "GB" not in result.stdout.replace("GiB", "")


def test_a_2d_answer_fits_120_columns() -> None:
    result = CliRunner().invoke(app, ["plan", "--model", "70b-3", "--gpus", "256", "--seq",
                                      "8192", "--global-batch", "512"])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= 120
    assert "2-D and 3-D plans" in result.stdout


def test_nothing_fits_says_what_comes_closest_and_what_would_make_room() -> None:
    r = api.plan(model="405b", params=None, gpus=8, hardware="dgx-h100", seq=8192)
    assert r["recommended"] is None
    leanest = min(r["candidates"], key=lambda c: c["peak_gib"])
    assert r["recommendation"].startswith(
        f"no plan fits in 79.1 GiB of HBM: the leanest, {leanest['plan']}, needs "
        f"{leanest['peak_gib']:.1f} GiB; try a shorter sequence (--seq below 8,192)")
    assert "--tp, --pp" in r["recommendation"]  # one node: no 2-D search was run
    text = CliRunner().invoke(app, ["plan", "--model", "405b", "--gpus", "8", "--seq", "8192"])
    assert text.exit_code == 0 and "no plan fits in 79.1 GiB of HBM" in text.stdout
