"""The seed card's production example (scenarios/seed-13b-128.yaml), statement by
statement, from simulation alone. Where the simulation disagrees with the card the test
pins what the simulation says and reports/seed-13b-128.md explains why."""

from __future__ import annotations

from pathlib import Path

import pytest

from zsim.analytic.memory import model_state_bytes
from zsim.result import Result
from zsim.scenario import load_scenario
from zsim.simulate import simulate
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_model
from zsim.units import GB

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "seed-13b-128.yaml"


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[Plan, Result]]:
    scenario = load_scenario(SCENARIO)
    return {run.name: (run.plan, simulate(run.model, run.hardware, run.plan, trace=True))
            for run in scenario.runs}


def _ds_flat(psi: int, n: int) -> int:
    """DeepSpeed ZeRO-1/2's flat 16-bit buffer: padded to a multiple of 2 x N elements."""
    return -(-psi // (2 * n)) * 2 * n


def test_ddp_and_zero1_do_not_fit_8k(runs: dict[str, tuple[Plan, Result]]) -> None:
    ddp, zero1 = runs["ddp"][1], runs["zero1"][1]
    # Their model state and one micro-batch's activations exceed HBM: the closed form
    # says so, nothing is simulated.
    assert not ddp.fits and ddp.oom is not None
    assert ddp.oom.startswith("does not fit (closed form")
    # DeepSpeed's ZeRO-1 keeps the flat bf16 parameters on every rank (2 B) and shards the
    # fp32 master and AdamW moments (12 B / N): 2 Psi + 12 Psi / 128 ~ 27 GB (and the two
    # 32 MiB cuBLAS workspaces), which fits; with the ~62 GiB one 8k sequence saves for
    # backward it does not.
    assert not zero1.fits and zero1.oom is not None
    assert zero1.oom.startswith("does not fit (closed form")
    model = resolve_model("13b")
    flat = _ds_flat(model.num_params, 128)
    assert zero1.baseline_memory_bytes == (2 * flat + 12 * flat // 128 + model.buffer_bytes
                                           + 2 * 32 * 2**20)
    assert zero1.baseline_memory_bytes < zero1.hbm_bytes < zero1.peak_memory_bytes
    assert zero1.baseline_memory_bytes + zero1.memory_at_peak["activations"] > zero1.hbm_bytes
    assert runs["fsdp"][1].fits


def test_fsdp_frees_the_replicated_model_state(runs: dict[str, tuple[Plan, Result]]) -> None:
    model = resolve_model("13b")
    psi, n = model.num_params, 128
    zero1_plan, zero1 = runs["zero1"]
    fsdp_plan, fsdp = runs["fsdp"]
    # Closed form (ZeRO paper): 4 Psi + 12 Psi/N -> 16 Psi/N, about 51.6 GB per GPU.
    closed = (model_state_bytes(model.num_params, zero1_plan).total
              - model_state_bytes(model.num_params, fsdp_plan).total)
    assert closed == pytest.approx(psi * (4 + 12 / n - 16 / n), rel=1e-9)
    assert closed > 50 * GB
    # The simulated programs at rest: DeepSpeed's ZeRO-1 holds 2 Psi + 12 Psi/N (its bf16
    # gradients exist only during backward), FSDP2 12 Psi/N: fully sharding frees the
    # replicated bf16 parameters, 2 Psi ~ 26 GB (the card says ~20 GB).
    freed_at_rest = zero1.baseline_memory_bytes - fsdp.baseline_memory_bytes
    assert freed_at_rest == pytest.approx(psi * 2, rel=1e-3)
    assert 24 * GB < freed_at_rest < 28 * GB


def test_fsdp_all_gathers_cross_nodes_and_stay_hidden_at_8k(
        runs: dict[str, tuple[Plan, Result]]) -> None:
    fsdp, hsdp = runs["fsdp-selective-mb2"][1], runs["hsdp-selective-mb2"][1]
    assert {sp.link for sp in fsdp.spans if sp.kind == "all_gather"} == {"inter_node"}
    assert {sp.link for sp in hsdp.spans if sp.kind == "all_gather"} == {"intra_node"}
    # Cross-node rings pay 15 network steps (9.6 us) and 112 NVLink steps per gather
    # against 7 NVLink steps inside a node, at similar bus bandwidth (8 NICs ~ 376 GB/s vs
    # NVLink ~ 364 GB/s): FSDP's all-gathers are busy longer.
    assert fsdp.comm_busy_s["all_gather"] > 1.2 * hsdp.comm_busy_s["all_gather"]
    # The card reports 8% lower FSDP throughput; on 8 NDR NICs per node at 8k tokens a
    # 13B block computes far longer than its 128-rank all-gather, so both hide their
    # collectives and throughput differs by under 3% (see the report).
    for r in (fsdp, hsdp):
        assert r.exposed_comm_s < 0.02 * r.step_time_s
    assert abs(fsdp.tokens_per_s / hsdp.tokens_per_s - 1) < 0.03


def test_selective_recompute_makes_8k_fit_with_micro_batch_2(
        runs: dict[str, tuple[Plan, Result]]) -> None:
    assert not runs["hsdp"][1].fits
    assert runs["hsdp-selective"][1].fits
    assert runs["hsdp-selective-mb2"][1].fits
    assert runs["fsdp-selective-mb2"][1].fits
    assert not runs["zero1-selective-mb2"][1].fits
    # Micro-batch 2 uses the larger batch: more tokens per second than micro-batch 1.
    assert (runs["hsdp-selective-mb2"][1].tokens_per_s
            > runs["hsdp-selective"][1].tokens_per_s)
