"""validate_plan(): one real 2-rank run against the simulator, rows and CSV; runs of a plan
pool their timed steps. The real runs are those test_backend's FSDP2 test and
test_tensor_parallel_backend's TP test check (shared through the real_runs fixture)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from _runs import RealRuns

from zsim.backend.measured_step import PhaseMemory, PlanMeasurement, RankMeasurement
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware
from zsim.validation import comparison
from zsim.validation.comparison import BOUNDS_PCT, validate_plan

pytestmark = pytest.mark.slow

TINY = ModelSpec(name="tiny", num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                 ffn_hidden=344, vocab_size=500, max_seq_len=64)


@pytest.fixture
def shared_runs(monkeypatch: pytest.MonkeyPatch, real_runs: RealRuns) -> None:
    """validate_plan() measures through the session's real runs."""
    monkeypatch.setattr(comparison, "measure_plan", real_runs.measure)


@pytest.mark.usefixtures("shared_runs")
def test_validate_rows_and_csv(tmp_path: Path) -> None:
    plan = Plan.for_strategy("fsdp", gpus=2, seq_len=48, micro_batch=2)
    rows = validate_plan(TINY, plan, nproc=2, profile=resolve_hardware("local-cpu"), steps=2,
                         min_timed_s=0.0, out_dir=tmp_path)
    metrics = {r["metric"] for r in rows}
    assert {"step_time_s", "peak_memory_bytes", "activation_bytes_blocks",
            "activation_bytes_root", "comm_busy_s"} <= metrics
    for r in rows:
        assert r["predicted"] > 0 and r["measured"] > 0
        assert math.isclose(r["error_pct"],
                            100 * (r["predicted"] - r["measured"]) / r["measured"],
                            abs_tol=0.01)
    with (tmp_path / "tiny-fsdp-n2.csv").open() as f:
        written = list(csv.DictReader(f))
    assert [w["metric"] for w in written] == [r["metric"] for r in rows]


def _run(spec: ModelSpec, plan: Plan, per_rank_steps: list[list[float]],
         loss: float) -> PlanMeasurement:
    memory = PhaseMemory(after_init_bytes=1, after_first_step_bytes=2, peak_forward_bytes=3,
                         peak_backward_bytes=4, peak_optimizer_bytes=3, after_forward_bytes=3,
                         peak_bytes=4, reserved_bytes=4)
    ranks = [RankMeasurement(rank=i, step_times_s=steps, forward_s={}, backward_s={},
                             memory=memory, collective_busy_s={}, saved=[], loss=loss)
             for i, steps in enumerate(per_rank_steps)]
    return PlanMeasurement(spec=spec, plan=plan, backend="gloo", ranks=ranks)


def test_runs_pool_their_steps_rank_by_rank() -> None:
    plan = Plan.for_strategy("fsdp", gpus=2, seq_len=48, micro_batch=2)
    first = _run(TINY, plan, [[1.0, 3.0], [2.0, 2.0]], loss=7.0)
    second = _run(TINY, plan, [[5.0], [4.0]], loss=8.0)
    pooled = first.pooled(second)
    # Slowest rank per step: 2, 3 (first run), 5 (second run); median 3.
    assert [r.step_times_s for r in pooled.ranks] == [[1.0, 3.0, 5.0], [2.0, 2.0, 4.0]]
    assert pooled.step_time_s == 3.0
    assert first.step_time_s == 2.5 and second.step_time_s == 5.0
    assert {r.loss for r in pooled.ranks} == {7.0}  # the rest is the first run's


@pytest.mark.usefixtures("shared_runs")
def test_validate_a_tp_plan_is_predicted_within_bounds(tmp_path: Path) -> None:
    """TP without data parallelism (ddp, one data-parallel rank): the simulator predicts
    the real run's memory figures per rank within the report's bounds (in a file of its
    own beside the ddp plan's)."""
    plan = Plan(strategy="ddp", dp_shard=1, tp=2, seq_len=48, micro_batch=2)
    rows = validate_plan(TINY, plan, nproc=2, profile=resolve_hardware("local-cpu"), steps=1,
                         min_timed_s=0.0, out_dir=tmp_path)
    by_metric = {r["metric"]: r for r in rows}
    for metric in ("peak_memory_bytes", "state_memory_bytes", "activation_bytes_blocks",
                   "activation_bytes_root"):
        assert abs(by_metric[metric]["error_pct"]) <= BOUNDS_PCT[metric], by_metric[metric]
    for r in rows:
        assert r["predicted"] > 0 and r["note"] == ""
    with (tmp_path / "tiny-ddp-tp2-n2.csv").open() as f:
        assert [w["note"] for w in csv.DictReader(f)] == [""] * len(rows)
