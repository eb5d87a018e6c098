"""compare() for plans the simulator does not model yet (tp, pp > 1 with a program other
than FSDP2 and DDP): the measured figures with no prediction and the simulator's reason
as a note, written to the evidence table and read back as empty cells; a data-parallel
plan and the report's parallel plans keep their predictions. No processes are started."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from zsim.backend.instruments import SavedTensor
from zsim.backend.measured_step import PhaseMemory, PlanMeasurement, RankMeasurement
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware
from zsim.validation import evidence
from zsim.validation.comparison import compare
from zsim.validation.grid import KNOBS, LLAMA_TINY, case_key, grid, parallel_plans


def _measurement(plan: Plan) -> PlanMeasurement:
    """A made-up run of `plan`: rank k peaks at 100 + k bytes, holds 50 + k at rest."""
    ranks = [RankMeasurement(
        rank=k, step_times_s=[0.5, 0.7, 0.6], forward_s={"root": 0.1 * (k + 1)},
        backward_s={},
        memory=PhaseMemory(after_init_bytes=10, after_first_step_bytes=50 + k,
                           peak_forward_bytes=90, peak_backward_bytes=100 + k,
                           peak_optimizer_bytes=60, after_forward_bytes=80,
                           peak_bytes=100 + k, reserved_bytes=100 + k),
        collective_busy_s={"all_reduce": 0.2 + k}, loss=1.0,
        saved=[SavedTensor(scope="layers.0", producer="aten.mm.default", shape=(2,),
                           dtype="bfloat16", bytes=7),
               SavedTensor(scope="root", producer="input", shape=(3,), dtype="int64",
                           bytes=24)])
        for k in range(plan.world_size)]
    return PlanMeasurement(spec=LLAMA_TINY, plan=plan, backend="gloo", ranks=ranks)


REFUSED = [Plan(strategy="zero3", dp_shard=1, tp=2, **KNOBS),
           Plan(strategy="zero3", dp_shard=1, pp=2, grad_accum=4, **KNOBS)]
"""Plans the simulator does not model: TP and PP under DeepSpeed (zsim.schedule.lower
refuses them on plan.tp / plan.pp)."""


@pytest.mark.parametrize("plan", REFUSED, ids=lambda p: p.label)
def test_unsimulated_plans_get_measured_only_rows(plan: Plan, tmp_path: Path) -> None:
    rows = compare(LLAMA_TINY, plan, resolve_hardware("local-cpu"), _measurement(plan))
    last = plan.world_size - 1
    assert {r["metric"]: r["measured"] for r in rows} == pytest.approx({
        "step_time_s": 0.6, "peak_memory_bytes": 100 + last,
        "state_memory_bytes": 50 + last, "activation_bytes_blocks": 7,
        "activation_bytes_root": 24,
        "comm_busy_s": 0.2 + last / 2,  # the median over ranks
        "forward_time_s": 0.1 * (last + 1)})
    field = "plan.pp" if plan.pp > 1 else "plan.tp"
    for r in rows:
        assert r["predicted"] is None and r["error_pct"] is None
        assert r["note"].startswith(f"not simulated: {field}=")
    evidence.write(tmp_path, [evidence.Batch(name="b", report="b", bounds="not held", cases=1)],
                   {"b": [{"batch": "b", "time_utc": "t", **r} for r in rows]}, {})
    back = evidence.read_table(tmp_path)
    assert [(r["predicted"], r["error_pct"], r["measured"], r["note"]) for r in back] == \
        [(None, None, r["measured"], r["note"]) for r in rows]


@pytest.mark.parametrize("plan", [
    Plan.for_strategy("fsdp", gpus=2, seq_len=256, micro_batch=2),
    *parallel_plans()], ids=lambda p: p.label)
def test_simulated_plans_keep_predictions_and_no_note(plan: Plan) -> None:
    rows = compare(LLAMA_TINY, plan, resolve_hardware("local-cpu"), _measurement(plan))
    # A pipeline's replay gives no collective or forward phase times: those two rows are
    # measured only, and say why.
    unpredicted = {"comm_busy_s", "forward_time_s"} if plan.pp > 1 else set()
    assert {r["metric"] for r in rows if r["predicted"] is None} == unpredicted
    for r in rows:
        if r["metric"] in unpredicted:
            assert r["error_pct"] is None and r["note"].startswith("not predicted: a pipeline")
            continue
        assert r["predicted"] > 0 and r["note"] == ""
        assert math.isclose(r["error_pct"],
                            100 * (r["predicted"] - r["measured"]) / r["measured"],
                            abs_tol=0.01)


def test_the_grid_has_the_parallel_cases() -> None:
    keys = {case_key(spec, plan) for spec, plan in grid()}
    assert {"llama-tiny ddp tp=2 ac=none mb=2 n2", "llama-tiny fsdp tp=2 ac=none mb=2 n4",
            "llama-tiny ddp pp=2(1f1b) ac=none mb=2 n2"} <= keys
