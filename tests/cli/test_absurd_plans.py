"""Absurd plans answer: the four commands that once hung, each with a result and the
reason it cannot fit. The closed form rules out what no schedule can fit (activations of
4,096 or 100,000 sequences, 10 million GPUs gathering padded FSDP2 units); what the
floor lets through is simulated, and the engine's event budget bounds its work. Their
wall time from a fresh install is bench/bench_engine.py's to report, not a test's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from zsim.cli import app
from zsim.engine.replay import EVENTS_PER_OP
from zsim.units import GiB

BASE = ["simulate", "--model", "13b", "--strategy", "fsdp", "--format", "json"]


def _simulate(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, [*BASE, *args])
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.stdout)
    return out


@pytest.mark.parametrize("micro_batch", [4096, 100_000])
def test_huge_micro_batches_are_ruled_out_by_the_closed_form(micro_batch: int) -> None:
    out = _simulate("--gpus", "128", "--micro-batch", str(micro_batch))
    assert out["evaluated"] == "closed form" and not out["fits"]
    assert out["step_time_s"] is None and out["tokens_per_s"] is None
    # Activations grow with the micro-batch: 4,096 sequences of 4,096 tokens need
    # thousands of times the HBM; the floor says how much.
    assert out["memory_at_peak"]["activations"] > 1000 * out["hbm_bytes"]
    assert "activations of one micro-batch" in out["oom"]


def test_a_million_gpus_is_simulated_and_runs_out_gathering_padded_units() -> None:
    # 13B over 1,048,576 ranks: every parameter has fewer rows than ranks, so FSDP2 gives
    # each rank one whole row of each and gathers 2^20 rows: a block unit's all-gather
    # output is 2^20 x (6 x 5,120 + 13,824 + 2) x 2 B = 87.0 GiB, above 79.1 GiB of HBM.
    out = _simulate("--gpus", "1048576")
    assert out["evaluated"] == "simulated" and not out["fits"]
    assert "gathered/forward/flat" in out["oom"]
    block_row_elems = 6 * 5120 + 13824 + 2
    assert out["peak_memory_bytes"] >= 2**20 * block_row_elems * 2 > out["hbm_bytes"]
    assert out["step_time_s"] > 0


def test_ten_million_gpus_are_ruled_out_by_the_gathered_root() -> None:
    # The root (32,000 x 5,120 embedding and output, 5,120 norm) gathered on 1e7 ranks,
    # one row each: 1e7 x (2 x 5,120 + 1) x 2 B = 190.8 GiB, held through the step.
    out = _simulate("--gpus", "10000000")
    assert out["evaluated"] == "closed form" and not out["fits"]
    assert out["memory_at_peak"]["gathered_params"] == 10_000_000 * (2 * 5120 + 1) * 2
    assert out["memory_at_peak"]["gathered_params"] / GiB == pytest.approx(190.75, abs=0.01)


def test_the_engine_work_per_op_is_bounded_at_a_million_gpus() -> None:
    from zsim.engine.replay import run
    from zsim.schedule.lower import lower
    from zsim.spec.plan import Plan
    from zsim.spec.registry import resolve_hardware, resolve_model

    schedule = lower(resolve_model("13b"), resolve_hardware("dgx-h100"),
                     Plan.for_strategy("fsdp", gpus=2**20, seq_len=4096))
    assert run(schedule).trace.events < EVENTS_PER_OP / 4 * len(schedule.ops)


def test_hsdp_on_an_absurd_world_answers_at_once() -> None:
    # 10^20 - 1 GPUs on 8-GPU nodes: a node's shard group does not divide them, and the
    # groups that would are looked for among a few nodes' sizes, not among the world's
    # divisors (a search that never ended: found by the cli fuzz target).
    result = CliRunner().invoke(app, ["simulate", "--model", "7b", "--strategy", "hsdp",
                                      "--gpus", str(10**20 - 1)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.startswith("error: shard_group=None: HSDP shards over a node's 8 ")
