"""The planner behind `zsim plan`: which candidates it enumerates, and the CLI's contract
with zsim.api (flags passed through unchanged, rendering of what api returns)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from zsim import api, cli
from zsim.planner import candidate_plans, plan_candidates
from zsim.spec.presets import PRESETS
from zsim.spec.registry import resolve_hardware

H100 = resolve_hardware("dgx-h100")  # 8 GPUs per node


@pytest.mark.parametrize(("gpus", "has_hsdp"), [(16, True), (128, True), (8, False),
                                                (12, False), (4, False)])
def test_hsdp_shards_within_a_node_when_nodes_are_whole(gpus: int, has_hsdp: bool) -> None:
    plans = candidate_plans(H100, gpus=gpus, seq_len=1024)
    hsdp = [p for p in plans if p.strategy == "hsdp"]
    assert bool(hsdp) == has_hsdp
    for p in hsdp:
        assert (p.dp_shard, p.dp_replicate) == (8, gpus // 8)
    programs = {("ddp", "torch"), ("zero1", "deepspeed"), ("zero2", "deepspeed"),
                ("zero3", "deepspeed"), ("fsdp", "fsdp2"), ("fsdp", "fsdp1"),
                ("fsdp-no-reshard", "fsdp2"), ("fsdp-no-reshard", "fsdp1")} | (
        {("hsdp", "fsdp2"), ("hsdp", "fsdp1")} if has_hsdp else set())
    assert sorted((p.strategy, p.impl, p.recompute) for p in plans) == sorted(
        (s, i, r) for s, i in programs for r in ("none", "selective", "full"))
    assert all(p.world_size == gpus for p in plans)
    assert len({p.label for p in plans}) == len(plans)  # every row named apart


def test_one_gpu_has_no_communication() -> None:
    for c in plan_candidates(PRESETS["gpt3-125m"], H100, gpus=1, seq_len=1024):
        assert c.comm_bus_bytes == 0 and c.comm_time_s == 0


def test_small_model_fits_everywhere_without_recomputation() -> None:
    ranked = plan_candidates(PRESETS["gpt3-125m"], H100, gpus=8, seq_len=1024)
    assert all(c.fits for c in ranked)
    # no recomputation is never slower than recomputing
    assert ranked[0].plan.recompute == "none"


def test_cli_passes_flags_to_api_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    canned = {"model": "m", "num_params": 1, "hardware": "h", "gpus": 16, "seq_len": 512,
              "micro_batch": 3, "recommended": "fsdp ac=none mb=3", "yours": None,
              "warnings": [], "candidates": [{"plan": "fsdp ac=none mb=3", "fits": True}]}

    def fake_plan(**kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return canned

    monkeypatch.setattr(api, "plan", fake_plan)
    result = CliRunner().invoke(cli.app, [
        "plan", "--model", "7b", "--gpus", "16", "--hardware", "dgx-a100", "--seq", "512",
        "--micro-batch", "3", "--grad-accum", "2", "--precision", "fp32", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert seen == {"model": "7b", "params": None, "gpus": 16, "hardware": "dgx-a100",
                    "seq": 512, "micro_batch": 3, "grad_accum": 2, "precision": "fp32",
                    "ds_config": None, "fsdp_config": None, "global_batch": None,
                    "parallel": {}, "run_days": None, "fleet": "llama3", "restart_s": None}
    assert json.loads(result.stdout) == canned
