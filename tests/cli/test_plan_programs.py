"""`zsim plan` ranks the programs users run side by side (torch DDP, DeepSpeed ZeRO 1/2/3,
FSDP1 and FSDP2) and tells one story per program: its model-state column is what that
program holds between steps, the state its simulated peak starts from. Given a user's
DeepSpeed or accelerate config, it ranks that config and its variations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zsim import api, cli
from zsim.simulate import simulate
from zsim.spec.presets import PRESETS
from zsim.spec.registry import resolve_hardware
from zsim.spec.user_config import config_plan
from zsim.units import GiB

CONFIGS = Path(__file__).resolve().parents[2] / "scenarios" / "configs"
MODEL = PRESETS["llama2-13b"]
PSI = MODEL.num_params


@pytest.fixture(scope="module")
def ranking() -> dict[str, object]:
    return api.plan(model="13b", params=None, gpus=128, hardware="dgx-h100", seq=None)


def _by_label(ranking: dict[str, object]) -> dict[str, dict[str, object]]:
    return {r["plan"]: r for r in ranking["candidates"]}  # type: ignore[index,union-attr]


def test_model_state_is_what_each_program_holds(ranking: dict[str, object]) -> None:
    rows, n = _by_label(ranking), 128
    # By hand from each library's source (bf16 params, fp32 master and Adam moments):
    # DeepSpeed stage 1/2 keep the flat 16-bit parameters whole and partition the fp32
    # master and moments; stage 3 partitions everything and keeps its 16-bit gradient
    # partition and one reduce bucket (reduce_bucket_size 5e8 elements, 2 bytes each);
    # FSDP1/FSDP2 keep the fp32 shard and its moments (gradients freed by zero_grad);
    # torch DDP keeps fp32 parameters, gradients and moments whole.
    expected_bytes = {
        "zero1 ac=none mb=1": 2 * PSI + 12 * PSI / n,
        "zero2 ac=none mb=1": 2 * PSI + 12 * PSI / n,
        "zero3 ac=none mb=1": 16 * PSI / n + 2 * 500_000_000,
        "fsdp ac=none mb=1": 12 * PSI / n,
        "fsdp[fsdp1] ac=none mb=1": 12 * PSI / n,
        "fsdp-no-reshard[fsdp1] ac=none mb=1": 12 * PSI / n,
        "ddp ac=none mb=1": 16 * PSI,
    }
    for label, nbytes in expected_bytes.items():
        assert rows[label]["model_state_gib"] == pytest.approx(nbytes / GiB, rel=2e-3), label


def test_the_simulated_peak_starts_from_that_state(ranking: dict[str, object]) -> None:
    for row in _by_label(ranking).values():
        if row["evaluated"] == "simulated":
            assert row["peak_gib"] >= row["model_state_gib"] * (1 - 1e-3), row["plan"]


def test_deepspeed_and_fsdp1_are_ranked_next_to_fsdp2(ranking: dict[str, object]) -> None:
    impls = {(r["strategy"], r["impl"]) for r in _by_label(ranking).values()}
    assert {("zero3", "deepspeed"), ("zero1", "deepspeed"), ("fsdp", "fsdp1"),
            ("fsdp", "fsdp2"), ("hsdp", "fsdp1")} <= impls
    # Two programs of one strategy are two different predictions, not one row twice.
    rows = _by_label(ranking)
    assert rows["fsdp[fsdp1] ac=none mb=1"]["step_time_s"] != \
        rows["fsdp ac=none mb=1"]["step_time_s"]


def test_a_deepspeed_config_is_ranked_with_its_variations() -> None:
    r = api.plan(model="13b", params=None, gpus=64, hardware="dgx-h100", seq=2048,
                 ds_config=CONFIGS / "ds_zero3.json")
    rows = r["candidates"]
    yours = [row for row in rows if row["yours"]]
    assert len(yours) == 1 and yours[0]["plan"] == r["yours"] == "zero3 ac=none mb=1"
    assert {row["impl"] for row in rows} == {"deepspeed"}
    assert {row["strategy"] for row in rows} == {"zero1", "zero2", "zero3"}
    labels = [row["plan"] for row in rows]
    assert len(labels) == len(set(labels))
    # Offload variations: parameters only where stage 3 shards them.
    assert "zero3 ac=none mb=1 offload=params" in labels
    assert not any(lab.startswith(("zero1", "zero2")) and "offload=params" in lab
                   for lab in labels)


def test_an_accelerate_config_keeps_its_program() -> None:
    r = api.plan(model="13b", params=None, gpus=64, hardware="dgx-h100", seq=2048,
                 fsdp_config=CONFIGS / "accelerate_fsdp1.yaml")
    rows = r["candidates"]
    assert {row["impl"] for row in rows} == {"fsdp1"}
    assert {row["strategy"] for row in rows} == {"fsdp", "fsdp-no-reshard", "hsdp"}
    assert sum(row["yours"] for row in rows) == 1


def test_cli_marks_your_config(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.app, [
        "plan", "--model", "13b", "--gpus", "64", "--seq", "2048",
        "--ds-config", str(CONFIGS / "ds_zero3.json")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    marked = [line for line in lines if line.split()[:1] and line.split()[0].endswith("*")]
    assert len(marked) == 1 and marked[0].split()[1:3] in (["zero3", "none"],
                                                          [">", "zero3"], ["=", "zero3"])
    assert "*: your config, zero3 ac=none mb=1" in lines
    bad = tmp_path / "ds.json"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 7}}))
    result = CliRunner().invoke(cli.app, ["plan", "--model", "13b", "--gpus", "64",
                                          "--ds-config", str(bad)])
    assert result.exit_code == 2
    assert "stage" in result.output and "Traceback" not in result.output


def test_the_host_tail_of_an_offloaded_step_is_exposed() -> None:
    """DeepSpeed's CPU Adam runs after the last backward, when nothing is left for the
    GPU to do: the host's whole step (its shard of the parameters at the rank's AdamW
    rate) is exposed, and the step is the compute stream's busy time plus what it waited
    for."""
    hw = resolve_hardware("dgx-h100")
    plan = config_plan(MODEL, hw, ds_config=CONFIGS / "ds_zero3_offload.json",
                           fsdp_config=None, gpus=64, seq=2048)[0]
    r = simulate(MODEL, hw, plan)
    adam_s = MODEL.num_params / 64 / hw.rank_host_adam_params_per_s("deepspeed")
    assert r.host_busy_s == pytest.approx(adam_s, rel=0.01)
    assert r.exposed_host_s == pytest.approx(r.host_busy_s, rel=0.01)
    waited = r.compute_time_s + r.exposed_comm_s + r.exposed_host_s
    assert waited == pytest.approx(r.step_time_s, rel=0.01)
