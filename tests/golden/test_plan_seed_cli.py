"""Golden, end to end: `zsim plan --params 7e9 --gpus 64 --format json` reproduces the
ZeRO/FSDP card (docs/card.md): model state 112 / 29.3 / 15.5 / 1.75 GB per GPU
for DDP / ZeRO-1 / ZeRO-2 / ZeRO-3 in the closed-form columns (the ZeRO paper's
accounting; model_state_gb is what each program holds); communication is what each
program sends, where the card's 2S / 2S / 2S / 3S departs from it worked by hand in
tests/golden/test_zero_model_state.py (PROGRAM_COMM_S): DDP's fp32 buckets 4S,
DeepSpeed's bucket all-reduce and gather 3S, FSDP2's root gathered once."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from zsim.cli import app
from zsim.spec.programs import default_program

SEED = {"ddp": ("112", 4), "zero1": ("29.3", 3), "zero2": ("15.5", 3),
        "fsdp": ("1.75", 3 - 523_732_480 / 7e9)}
"""strategy -> (model state GB as printed, communication in units of S: the card's 2 / 2
/ 2 / 3 as each default program departs from it, test_zero_model_state.PROGRAM_COMM_S)."""


@pytest.fixture(scope="module")
def plan_7b_64() -> dict[str, Any]:
    result = CliRunner().invoke(app, ["plan", "--params", "7e9", "--gpus", "64",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_synthetic_model_has_exactly_7e9_params(plan_7b_64: dict[str, Any]) -> None:
    assert plan_7b_64["num_params"] == 7_000_000_000
    assert plan_7b_64["gpus"] == 64


@pytest.mark.parametrize("strategy", sorted(SEED))
def test_seed_numbers(strategy: str, plan_7b_64: dict[str, Any],
                      matches_printed: Callable[[float, str], bool]) -> None:
    printed_gb, volume_s = SEED[strategy]
    rows = [c for c in plan_7b_64["candidates"]
            if c["strategy"] == strategy and c["impl"] == default_program(strategy).name]
    assert {r["recompute"] for r in rows} == {"none", "selective", "full"}
    for row in rows:
        assert matches_printed(row["estimate_model_state_gb"], printed_gb), row
        assert row["comm_volume_model_sizes"] == pytest.approx(volume_s, rel=1e-3)
        # bus bytes by hand: volume x (63/64) x S, S = 7e9 x 2 bytes = 14 GB
        assert row["comm_gib_per_step"] == pytest.approx(volume_s * 63 / 64 * 14e9 / 2**30,
                                                         abs=1e-3)
