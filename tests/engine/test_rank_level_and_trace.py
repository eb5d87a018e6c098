"""Rank-level mode (every rank simulated, collectives wait for their whole group) and the
Chrome trace export."""

from __future__ import annotations

import json

import pytest
from toy_cluster import make_toy_hw

from zsim.engine.replay import Jitter, run
from zsim.errors import ConfigError
from zsim.schedule.lower import lower, memory_floor_bytes
from zsim.simulate import chrome_trace, simulate
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

PLANS = [Plan.for_strategy("fsdp", gpus=4, seq_len=256, grad_accum=2),
         Plan.for_strategy("hsdp", gpus=4, shard_group=2, seq_len=256),
         Plan.for_strategy("ddp", gpus=4, seq_len=256, bucket_bytes=200_000)]


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.strategy)
def test_rank_level_without_jitter_equals_symmetric(tiny_model: ModelSpec, plan: Plan) -> None:
    hw = make_toy_hw(latency_s=5e-6, slowdown=0.1)
    sym = simulate(tiny_model, hw, plan)
    ranks = simulate(tiny_model, hw, plan, rank_level=True, rank_level_steps=1,
                     jitter=Jitter(cv=0.0, straggler_prob=0.0))
    assert ranks.step_time_s == pytest.approx(sym.step_time_s, rel=1e-12)
    assert ranks.step_time_p50_s == ranks.step_time_p99_s == ranks.step_time_s
    assert ranks.peak_memory_bytes == sym.peak_memory_bytes


def test_jitter_and_stragglers_spread_the_step_time(tiny_model: ModelSpec) -> None:
    hw = make_toy_hw()
    plan = PLANS[0]
    sym = simulate(tiny_model, hw, plan)
    noisy = simulate(tiny_model, hw, plan, rank_level=True, seed=7, rank_level_steps=12,
                     jitter=Jitter(cv=0.05, straggler_prob=0.2, straggler_slowdown=0.5))
    assert noisy.step_time_p50_s is not None and noisy.step_time_p99_s is not None
    assert noisy.step_time_p50_s < noisy.step_time_p99_s
    # Collectives make every rank wait for the slowest: the median step is slower than
    # the noiseless one, and a straggler step is up to 1.5x slower.
    assert noisy.step_time_p50_s > sym.step_time_s
    assert noisy.step_time_p99_s < 1.6 * sym.step_time_s
    again = simulate(tiny_model, hw, plan, rank_level=True, seed=7, rank_level_steps=12,
                     jitter=Jitter(cv=0.05, straggler_prob=0.2, straggler_slowdown=0.5))
    assert again.to_dict() == noisy.to_dict()


def test_waits_on_late_ranks_are_attributed_to_stragglers(tiny_model: ModelSpec) -> None:
    schedule = lower(tiny_model, make_toy_hw(), PLANS[0])
    even = run(schedule, num_ranks=2, seed=1, jitter=Jitter(cv=0.0, straggler_prob=0.0))
    assert not any(w.reason == "straggler" for w in even.trace.waits)
    # With this seed one of the two ranks is a straggler (2x every kernel): the other one
    # waits for it at collectives, and the step is slower.
    slow = run(schedule, num_ranks=2, seed=2,
               jitter=Jitter(cv=0.0, straggler_prob=0.5, straggler_slowdown=1.0))
    waiting = {w.rank for w in slow.trace.waits if w.reason == "straggler"}
    assert len(waiting) == 1
    assert slow.trace.step_time_s > even.trace.step_time_s


def test_chrome_trace_has_a_track_per_stream_and_a_memory_counter(
        tiny_model: ModelSpec) -> None:
    plan = Plan.for_strategy("hsdp", gpus=4, shard_group=2, seq_len=256)
    r = simulate(tiny_model, make_toy_hw(), plan, trace=True)
    doc = json.loads(json.dumps(chrome_trace(r)))
    ev = doc["traceEvents"]
    threads = {e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert {"rank 0 compute", "rank 0 all_gather", "rank 0 reduce_scatter",
            "rank 0 all_reduce"} <= threads
    spans = [e for e in ev if e["ph"] == "X"]
    assert len(spans) == r.num_ops
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(r.step_time_s * 1e6)
    counters = [e for e in ev if e["ph"] == "C"]
    assert len(counters) == len(r.memory_curve)
    assert max(c["args"]["allocated"] for c in counters) == pytest.approx(
        r.peak_memory_bytes / 2**30)


def test_chrome_trace_needs_a_traced_run(tiny_model: ModelSpec) -> None:
    r = simulate(tiny_model, make_toy_hw(), PLANS[0])
    with pytest.raises(ConfigError):
        chrome_trace(r)


def test_to_dict_is_json_with_the_keys_the_cli_prints(tiny_model: ModelSpec) -> None:
    # `zsim simulate --format json` prints at least these keys.
    # HBM between the plan's floor and its simulated peak: simulated, and out of memory.
    floor = sum(memory_floor_bytes(tiny_model, PLANS[0], make_toy_hw()).values())
    peak = simulate(tiny_model, make_toy_hw(), PLANS[0]).peak_memory_bytes
    r = simulate(tiny_model, make_toy_hw(hbm_bytes=(floor + peak) / 2), PLANS[0])
    d = json.loads(json.dumps(r.to_dict(curve=True)))
    assert {"fits", "step_time_s", "exposed_comm_s", "compute_time_s", "peak_memory_bytes",
            "reserved_memory_bytes", "memory_at_peak", "tokens_per_s", "mfu",
            "oom"} <= set(d)
    assert d["fits"] is False and d["oom"].startswith("OOM at ")
    assert d["memory_curve"][-1] == [r.step_time_s, r.baseline_memory_bytes]
