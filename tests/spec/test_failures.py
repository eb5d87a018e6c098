"""The fleets' failure models: their sources' counts, the split, a job's rate."""

from __future__ import annotations

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
