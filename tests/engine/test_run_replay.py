"""The run simulation (zsim.engine.run_replay): closed forms it must meet, the Llama 3
fleet's count, determinism, the wall-time budget, bad inputs.

Tolerances, and why:
- no failures, no checkpoints: exact (every step nominal, the day a whole number of steps);
- mean goodput over 8 seeds vs the first-order closed form 1 - δ/τ - (τ/2 + R)/M: 2 %
  relative, with δ/τ, τ/M and R/M each under 0.1 (the neglected terms are their
  products, ~0.5 %; seed noise on 8 x ~240 failures is ~0.2 %);
- lost work per failure at one-step intervals: half a step within 10 % (~800 failures:
  the mean of a uniform over a step has a standard error of ~1 %);
- the simulated best interval vs Young's: within 20 %: the goodput is flat near its
  optimum (at 1.2x the optimum the first-order loss grows by ~1.7 % of itself, ~0.1 %
  of goodput, the order of the seed noise left by common random numbers), so a finer
  grid is not testable with a few seeds;
- the Llama 3 count over 54 days at 16,384 GPUs: 419 within 3 sigma of the simulated
  Poisson count (one seed), and of the mean of 10 seeds.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from zsim.analytic.young_daly import daly_interval_s, first_order_goodput, young_interval_s
from zsim.engine.run_replay import RunInputs, RunOutcome, best_interval, simulate_run
from zsim.errors import ConfigError
from zsim.spec.failures import FailureModel, failure_model, job_failures_per_day

MTBF_S = 3 * 3600.0
NEVER = FailureModel(gpu_failures_per_gpu_day=0.0, node_failures_per_node_day=0.0,
                     restart_s=0.0, source="no failures")


def _fleet(mtbf_s: float, restart_s: float) -> FailureModel:
    """A job of 1,000 GPUs failing every `mtbf_s` on average (GPU causes only)."""
    return FailureModel(gpu_failures_per_gpu_day=86_400.0 / mtbf_s / 1000,
                        node_failures_per_node_day=0.0, restart_s=restart_s, source="test")


BASE = RunInputs(step_time_s=10.0, tokens_per_step=1000, gpus=1000, gpus_per_node=8,
                 failures=_fleet(MTBF_S, 300.0), checkpoint_interval_steps=80,
                 checkpoint_stall_s=30.0, load_s=60.0, days=30.0)
"""δ = 30 s, R = 360 s, M = 3 h; Young's interval 805 s ~ 80 steps."""


def _parts_s(o: RunOutcome) -> float:
    return (o.useful_s + o.straggler_s + o.checkpoint_stall_s + o.checkpoint_wait_s
            + o.lost_work_s + o.restart_s)


def test_no_failures_no_checkpoints_is_closed_form() -> None:
    inputs = RunInputs(step_time_s=15.0, tokens_per_step=16 * 2**20, gpus=16_384,
                       gpus_per_node=8, failures=NEVER, checkpoint_interval_steps=0,
                       days=2.0)
    out = simulate_run(inputs)
    steps = 2 * 86_400 // 15
    assert out.steps_done == steps
    assert out.tokens == steps * 16 * 2**20
    assert out.goodput == 1.0
    assert out.failures == out.checkpoints == 0
    assert out.tokens_per_day == out.tokens / 2


def test_stragglers_stretch_steps_and_are_booked() -> None:
    out = simulate_run(replace(BASE, failures=NEVER, checkpoint_interval_steps=0,
                               step_slowdown_samples=(1.0, 1.5), days=1.0))
    # Half the steps take 1.5x: a step takes 1.25x nominal on average.
    assert out.straggler_s / out.useful_s == pytest.approx(0.25, rel=0.02)
    assert _parts_s(out) == pytest.approx(out.wall_s, rel=1e-12)


def test_failures_only_lose_half_a_step_each() -> None:
    inputs = RunInputs(step_time_s=1.0, tokens_per_step=1, gpus=1000, gpus_per_node=8,
                       failures=_fleet(100.0, 0.0), checkpoint_interval_steps=1, days=1.0)
    out = simulate_run(inputs)
    assert out.failures > 700
    assert out.lost_work_s / out.failures == pytest.approx(0.5, rel=0.1)
    assert out.goodput == pytest.approx(first_order_goodput(1.0, 0.0, 100.0, 0.0), rel=0.01)


@pytest.mark.parametrize("interval_steps", [40, 80, 160])
def test_mean_goodput_matches_first_order_closed_form(interval_steps: int) -> None:
    outs = [simulate_run(replace(BASE, checkpoint_interval_steps=interval_steps, seed=s))
            for s in range(8)]
    mean = math.fsum(o.goodput for o in outs) / len(outs)
    closed = first_order_goodput(interval_steps * BASE.step_time_s, BASE.checkpoint_stall_s,
                                 MTBF_S, BASE.failures.restart_s + BASE.load_s)
    assert mean == pytest.approx(closed, rel=0.02)


def test_the_first_checkpoint_of_a_process_pays_its_planning_once() -> None:
    """Without failures only the job's first checkpoint pays the extra: in its stall
    (sync), or in its write, which the next checkpoint then waits for (async)."""
    # 100 whole cycles of 830 s (80 steps and the stall), then 500 s: both runs end
    # training, after 100 stalls.
    quiet = replace(BASE, failures=NEVER, days=(100 * 830 + 500) / 86_400)
    plain, extra = simulate_run(quiet), simulate_run(replace(quiet,
                                                             first_checkpoint_extra_s=100.0))
    assert extra.checkpoint_stall_s - plain.checkpoint_stall_s == pytest.approx(100.0)
    assert plain.checkpoint_wait_s == extra.checkpoint_wait_s == 0.0
    # Async: 80 steps of 10 s train while a 10 s write runs; the first write runs 1,000 s
    # more, so the second checkpoint waits 10 + 1,000 - 800 = 210 s, and no later one.
    async_ = replace(quiet, checkpoint_stall_s=1.0, checkpoint_background_s=10.0)
    first = simulate_run(replace(async_, first_checkpoint_extra_s=1000.0))
    assert simulate_run(async_).checkpoint_wait_s == 0.0
    assert first.checkpoint_wait_s == pytest.approx(210.0)
    for out in (plain, extra, first):
        assert _parts_s(out) == pytest.approx(out.wall_s, rel=1e-12)


def test_every_restart_pays_the_first_checkpoints_planning_again() -> None:
    """The failure times of a seed do not depend on the extra (common random numbers).
    A restart pays it again at its first stall, unless the next failure comes first:
    within the restart, the load, 80 steps and the stall (1,190 s), with probability
    1 - exp(-1190 / MTBF) = 10%. Four seeds of ~240 failures: 10% relative."""
    reach = math.exp(-(BASE.failures.restart_s + BASE.load_s + 80 * BASE.step_time_s
                       + BASE.checkpoint_stall_s) / MTBF_S)
    plain = [simulate_run(replace(BASE, seed=s)) for s in range(4)]
    extra = [simulate_run(replace(BASE, seed=s, first_checkpoint_extra_s=1.0))
             for s in range(4)]
    assert [o.failures for o in extra] == [o.failures for o in plain]
    paid = math.fsum(e.checkpoint_stall_s - p.checkpoint_stall_s
                     for p, e in zip(plain, extra, strict=True))
    expected = math.fsum(1.0 + reach * o.failures for o in extra)
    assert paid == pytest.approx(expected, rel=0.1)


def test_best_simulated_interval_is_near_young_and_daly() -> None:
    young = young_interval_s(BASE.checkpoint_stall_s, MTBF_S)
    candidates = [round(young / BASE.step_time_s * f)
                  for f in (0.5, 0.7, 0.85, 1.0, 1.18, 1.4, 2.0)]
    best, outcomes = best_interval(BASE, candidates, seeds=8)
    assert set(outcomes) == set(candidates)
    assert all(len(o) == 8 for o in outcomes.values())
    assert best * BASE.step_time_s / young == pytest.approx(1.0, abs=0.2)
    daly = daly_interval_s(BASE.checkpoint_stall_s, MTBF_S)
    assert best * BASE.step_time_s / daly == pytest.approx(1.0, abs=0.2)


def test_llama3_fleet_reproduces_its_interruption_count() -> None:
    llama3 = failure_model("llama3")
    inputs = RunInputs(step_time_s=15.0, tokens_per_step=16 * 2**20, gpus=16_384,
                       gpus_per_node=8, failures=llama3, checkpoint_interval_steps=50,
                       checkpoint_stall_s=30.0, days=54.0)
    counts = [simulate_run(replace(inputs, seed=s)).failures for s in range(10)]
    assert abs(counts[0] - 419) <= 3 * math.sqrt(counts[0])
    mean = sum(counts) / len(counts)
    assert abs(mean - 419) <= 3 * math.sqrt(419 / len(counts))
    assert job_failures_per_day(llama3, 16_384, 8) * 54 == pytest.approx(419)


def test_async_write_waits_and_stalls_per_cycle() -> None:
    # Without failures: 10 s of steps, then a wait for the previous write (25 s from the
    # last stall's end: 15 s left), then a 1 s stall: a 26 s cycle.
    inputs = RunInputs(step_time_s=1.0, tokens_per_step=1, gpus=8, gpus_per_node=8,
                       failures=NEVER, checkpoint_interval_steps=10, checkpoint_stall_s=1.0,
                       checkpoint_background_s=25.0, days=1.0)
    out = simulate_run(inputs)
    assert out.goodput == pytest.approx(10 / 26, rel=1e-3)
    assert out.checkpoint_wait_s / out.wall_s == pytest.approx(15 / 26, rel=1e-3)
    assert out.checkpoint_stall_s / out.wall_s == pytest.approx(1 / 26, rel=1e-3)
    assert _parts_s(out) == pytest.approx(out.wall_s, rel=1e-12)


def test_failure_during_async_write_loses_that_checkpoint() -> None:
    # A write of B seconds after each snapshot: a failure in it goes back one more
    # interval, so each failure loses ~B more than with a sync save of the same stall.
    sync = [simulate_run(replace(BASE, seed=s)) for s in range(8)]
    slow = [simulate_run(replace(BASE, checkpoint_background_s=400.0, seed=s))
            for s in range(8)]
    extra = (sum(o.lost_work_s for o in slow) / sum(o.failures for o in slow)
             - sum(o.lost_work_s for o in sync) / sum(o.failures for o in sync))
    assert extra == pytest.approx(400.0, rel=0.25)
    assert all(o.checkpoint_wait_s == 0 for o in slow)  # the write ends within a segment


@pytest.mark.parametrize("inputs", [
    BASE,
    replace(BASE, step_slowdown_samples=(1.0, 1.0, 1.1, 1.3), checkpoint_background_s=900.0),
    replace(BASE, checkpoint_interval_steps=0, days=3.5),
    replace(BASE, failures=_fleet(600.0, 900.0), days=2.0),
], ids=["sync", "async-waits-stragglers", "no-checkpoints", "restarts-fail"])
def test_parts_add_up_to_wall_time_and_same_seed_same_outcome(inputs: RunInputs) -> None:
    out = simulate_run(inputs)
    assert _parts_s(out) == pytest.approx(out.wall_s, rel=1e-12)
    assert min(out.useful_s, out.straggler_s, out.checkpoint_stall_s, out.checkpoint_wait_s,
               out.lost_work_s, out.restart_s) >= 0
    assert out.goodput == pytest.approx(out.useful_s / out.wall_s)
    assert simulate_run(inputs) == out
    assert repr(simulate_run(inputs)) == repr(out)


def test_failures_during_restart_restart_it() -> None:
    # Recovery (900 s) longer than the MTBF (600 s): most restarts fail, and the job
    # barely trains.
    out = simulate_run(replace(BASE, failures=_fleet(600.0, 900.0), days=2.0))
    assert out.restart_s / out.wall_s > 0.7
    assert out.failures > 200


@pytest.mark.parametrize(("change", "field"), [
    ({"step_time_s": 0.0}, "step_time_s"),
    ({"step_slowdown_samples": (1.0, 0.9)}, "step_slowdown_samples[1]"),
    ({"tokens_per_step": -1}, "tokens_per_step"),
    ({"gpus": 0}, "gpus"),
    ({"gpus_per_node": 1.5}, "gpus_per_node"),
    ({"failures": "llama3"}, "failures"),
    ({"checkpoint_interval_steps": -1}, "checkpoint_interval_steps"),
    ({"checkpoint_stall_s": float("nan")}, "checkpoint_stall_s"),
    ({"checkpoint_background_s": -1.0}, "checkpoint_background_s"),
    ({"load_s": float("inf")}, "load_s"),
    ({"days": 0}, "days"),
    ({"seed": -1}, "seed"),
])
def test_bad_inputs_name_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        replace(BASE, **change)
    assert err.value.field == field


@pytest.mark.parametrize(("candidates", "seeds", "field"), [
    ([], 1, "candidates"), ([10, 0], 1, "candidates[1]"), ([10], 0, "seeds")])
def test_bad_best_interval_arguments(candidates: list[int], seeds: int, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        best_interval(BASE, candidates, seeds=seeds)
    assert err.value.field == field


@pytest.mark.parametrize("background_s", [0.0, 40.0, 799.0, 900.0])
def test_whole_cycles_in_one_event_book_what_one_cycle_at_a_time_does(
        background_s: float) -> None:
    # Without slowdown samples, uninterrupted checkpoint cycles run as one timeout; a
    # sample of 1.0 (every step nominal) forces the step-by-segment path. Same failure
    # draws (their own seed stream), so every figure must agree. 900 s outlasts the
    # 800 s segment: no batching, both paths wait for the write alike.
    inputs = replace(BASE, checkpoint_background_s=background_s, days=10.0, seed=5)
    batched = simulate_run(inputs)
    one_by_one = simulate_run(replace(inputs, step_slowdown_samples=(1.0,)))
    assert batched.failures == one_by_one.failures > 50
    assert batched.steps_done == one_by_one.steps_done
    assert batched.checkpoints == one_by_one.checkpoints
    for part in ("useful_s", "checkpoint_stall_s", "checkpoint_wait_s", "lost_work_s",
                 "restart_s"):
        assert getattr(batched, part) == pytest.approx(getattr(one_by_one, part), rel=1e-9,
                                                       abs=1e-6)
