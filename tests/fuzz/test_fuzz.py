"""The fuzz campaign's small profile: every target of fuzz_inputs.TARGETS over a
few dozen generated inputs, each within its time bound. bench/fuzz.py runs the same
oracles over 10,000 inputs and reports the counts."""

from __future__ import annotations

from typing import Any

import pytest
from fuzz_inputs import TARGETS, time_bound
from hypothesis import HealthCheck, given, settings

EXAMPLES = {"model": 100, "hardware": 100, "plan": 100, "simulate": 30, "scenario": 30,
            "hf_config": 100, "cli": 40, "ds_config": 60, "fsdp_config": 60, "cli_config": 20}
"""Inputs per target in the suite (the simulating targets are the slow ones)."""


@pytest.mark.parametrize("target", list(TARGETS))
def test_target_never_crashes_or_hangs(target: str) -> None:
    strategy, oracle = TARGETS[target]

    @settings(max_examples=EXAMPLES[target], database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(value=strategy)
    def run(value: Any) -> None:
        with time_bound():
            assert oracle(value) in ("valid", "rejected")

    run()


@pytest.mark.parametrize("target", list(TARGETS))
def test_the_inputs_reach_both_outcomes(target: str) -> None:
    """A target's inputs are neither all rejected nor all accepted (a strategy that only
    ever produces errors tests nothing beyond the first check)."""
    strategy, oracle = TARGETS[target]
    seen: set[str] = set()

    @settings(max_examples=60, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(value=strategy)
    def run(value: Any) -> None:
        with time_bound():
            seen.add(oracle(value))

    run()
    assert seen == {"valid", "rejected"}
