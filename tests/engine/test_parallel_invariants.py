"""Invariants of 2-D and 3-D plans (docs/validation.md, the ladder's invariants): on real
profiles, the step is at least the compute and at most compute plus communication,
exposure is at most the communication's busy time, memory is back to the state at rest
after the step, tp = 1 has no TP collectives, and simulating twice gives the same
Result."""

from __future__ import annotations

import pytest

from zsim.simulate import simulate
from zsim.spec.plan import Plan
from zsim.spec.presets import PRESETS
from zsim.spec.registry import resolve_hardware

H100 = resolve_hardware("dgx-h100")
MODEL = PRESETS["llama2-7b"]


@pytest.mark.parametrize("knobs", [
    {"tp": 2}, {"tp": 4, "sp": True}, {"tp": 8, "sp": True, "async_tp": True},
    {"cp": 2}, {"tp": 2, "sp": True, "cp": 2, "recompute": "full"},
    {"tp": 4, "sp": True, "grad_accum": 2, "recompute": "selective"},
])
def test_engine_invariants(knobs: dict[str, object]) -> None:
    plan = Plan.for_strategy("fsdp", gpus=32, seq_len=4096, **knobs)
    r = simulate(MODEL, H100, plan)
    assert r.step_time_s is not None and r.compute_time_s is not None
    comm = r.comm_busy_total_s or 0.0
    assert max(r.compute_time_s, comm) <= r.step_time_s * (1 + 1e-9)
    assert r.step_time_s <= (r.compute_time_s + comm) * (1 + 1e-9)
    assert 0.0 <= (r.exposed_comm_s or 0.0) <= comm * (1 + 1e-9)
    assert r.end_memory_bytes == r.baseline_memory_bytes
    assert ("tp" in r.comm_busy_s) == (plan.tp > 1)
    assert ("cp" in r.comm_busy_s) == (plan.cp > 1)
    assert simulate(MODEL, H100, plan) == r


def test_pipeline_invariants() -> None:
    plan = Plan.for_strategy("fsdp", gpus=32, seq_len=4096, tp=2, sp=True, pp=4, grad_accum=8)
    r = simulate(MODEL, H100, plan)
    assert r.step_time_s is not None
    for st in r.pipeline_stages:
        assert st.busy_s <= st.step_time_s <= r.step_time_s
        assert 0.0 < st.bubble_fraction < 1.0
        assert st.peak_memory_bytes <= r.peak_memory_bytes
    # The first stage holds the most micro-batches in flight (1F1B: pp - rank).
    assert [st.in_flight_microbatches for st in r.pipeline_stages] == [4, 3, 2, 1]
    assert simulate(MODEL, H100, plan) == r
