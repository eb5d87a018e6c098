"""The fleets' failure models: their sources' counts, the split, a job's rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from zsim.errors import ConfigError
from zsim.spec.failures import (
    FLEETS,
    LLAMA3_DAYS,
    LLAMA3_GPU_CAUSES,
    LLAMA3_GPUS,
    LLAMA3_NODE_CAUSES,
    LLAMA3_UNEXPECTED,
    FailureModel,
    failure_model,
    job_failures_per_day,
)


def test_llama3_causes_add_up_to_the_unexpected_interruptions() -> None:
    assert sum(LLAMA3_GPU_CAUSES.values()) == 268
    assert sum(LLAMA3_NODE_CAUSES.values()) == 151
    assert sum(LLAMA3_GPU_CAUSES.values()) + sum(LLAMA3_NODE_CAUSES.values()) \
        == LLAMA3_UNEXPECTED == 419
    assert not set(LLAMA3_GPU_CAUSES) & set(LLAMA3_NODE_CAUSES)


def test_llama3_rate_gives_back_its_count() -> None:
    per_day = job_failures_per_day(failure_model("llama3"), LLAMA3_GPUS, 8)
    assert per_day * LLAMA3_DAYS == pytest.approx(419, rel=1e-12)


def test_job_rate_scales_with_gpus_and_nodes() -> None:
    model = FailureModel(gpu_failures_per_gpu_day=0.001, node_failures_per_node_day=0.01,
                         restart_s=60.0, source="test")
    assert job_failures_per_day(model, 16, 8) == pytest.approx(16 * 0.001 + 2 * 0.01)
    # A partly filled last node is a node.
    assert job_failures_per_day(model, 12, 8) == pytest.approx(12 * 0.001 + 2 * 0.01)


def test_every_fleet_names_its_source() -> None:
    for model in FLEETS.values():
        assert model.source and model.restart_s > 0


@pytest.mark.parametrize(("call", "field"), [
    (lambda: failure_model("nope"), "failures"),
    (lambda: job_failures_per_day(failure_model("llama3"), 0, 8), "gpus"),
    (lambda: job_failures_per_day(failure_model("llama3"), 8, True), "gpus_per_node"),
    (lambda: FailureModel(gpu_failures_per_gpu_day=-1.0, node_failures_per_node_day=0.0,
                          restart_s=0.0, source=""), "failures.gpu_failures_per_gpu_day"),
    (lambda: FailureModel(gpu_failures_per_gpu_day=0.0, node_failures_per_node_day=0.0,
                          restart_s=float("nan"), source=""), "failures.restart_s"),
])
def test_bad_input_names_the_field(call, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field


def test_unknown_fleet_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="llama3"):
        failure_model("rsc1")


def test_a_restart_time_of_ones_own_replaces_the_assumed_one() -> None:
    fleet = failure_model("llama3")
    assert fleet.restart_assumed
    own = failure_model("llama3", restart_s=120)
    assert own.restart_s == 120.0 and not own.restart_assumed
    assert (own.gpu_failures_per_gpu_day, own.node_failures_per_node_day, own.source) == (
        fleet.gpu_failures_per_gpu_day, fleet.node_failures_per_node_day, fleet.source)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "5m"])
def test_a_bad_restart_time_names_the_field(bad: object) -> None:
    with pytest.raises(ConfigError) as err:
        failure_model("llama3", restart_s=bad)  # type: ignore[arg-type]
    assert err.value.field == "restart_s"


def _fleet_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "ours.yaml"
    path.write_text(text)
    return str(path)


def test_a_fleet_file_gives_its_own_rates_and_marks_a_missing_restart_assumed(
        tmp_path: Path) -> None:
    ours = failure_model(_fleet_file(tmp_path, (
        "gpu_failures_per_gpu_day: 0.0002\nnode_failures_per_node_day: 0.001\n"
        "source: our scheduler's 2026 logs\n")))
    assert (ours.gpu_failures_per_gpu_day, ours.node_failures_per_node_day) == (0.0002, 0.001)
    assert ours.restart_assumed and ours.source == "our scheduler's 2026 logs"
    # 1,024 GPUs on 128 nodes: 1024 x 0.0002 + 128 x 0.001 per day.
    assert job_failures_per_day(ours, 1024, 8) == pytest.approx(0.3328, rel=1e-12)
    timed = failure_model(_fleet_file(tmp_path, (
        "gpu_failures_per_gpu_day: 0\nnode_failures_per_node_day: 0.001\n"
        "source: ours\nrestart_s: 240\n")))
    assert timed.restart_s == 240.0 and not timed.restart_assumed


@pytest.mark.parametrize(("text", "field"), [
    ("gpu_failure_per_gpu_day: 1\nnode_failures_per_node_day: 0\nsource: x\n",
     "fleet.gpu_failure_per_gpu_day"),
    ("gpu_failures_per_gpu_day: 1\nsource: x\n", "fleet.node_failures_per_node_day"),
    ("gpu_failures_per_gpu_day: 1\nnode_failures_per_node_day: 0\n", "fleet.source"),
    ("gpu_failures_per_gpu_day: -1\nnode_failures_per_node_day: 0\nsource: x\n",
     "fleet.gpu_failures_per_gpu_day"),
    ("gpu_failures_per_gpu_day: 1\nnode_failures_per_node_day: 0\nsource: x\n"
     "restart_s: soon\n", "fleet.restart_s"),
    ("- 1\n", "fleet"),
    ("gpu_failures_per_gpu_day: [1\n", "fleet"),
])
def test_a_bad_fleet_file_names_the_key(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        failure_model(_fleet_file(tmp_path, text))
    assert err.value.field == field
