"""Pipeline schedules replayed on hand-worked toy stages: every stage's forward takes f and
backward b, so the step and the bubble have closed forms (Narayanan et al. 2021, Sec.
2.2: bubble (pp - 1) / (m + pp - 1) for GPipe and 1F1B, divided by v for interleaved
1F1B), and the orders are torch.distributed.pipelining's."""

from __future__ import annotations

import pytest

from zsim.engine.pipeline_replay import run_pipeline
from zsim.errors import ConfigError
from zsim.schedule.pipeline_order import Action, num_stages, peak_in_flight, rank_actions
from zsim.spec.plan import Plan


def _plan(schedule: str, pp: int, m: int, v: int = 1) -> Plan:
    return Plan(strategy="fsdp", dp_shard=1, pp=pp, grad_accum=m, seq_len=128,
                pp_schedule=schedule, virtual_stages=v)  # type: ignore[arg-type]


def _replay(plan: Plan, f: float, b: float, send_s: float = 0.0):  # type: ignore[no-untyped-def]
    actions = [rank_actions(plan, r) for r in range(plan.pp)]
    n = num_stages(plan)
    return actions, run_pipeline(actions, forward_s=[f] * n, backward_s=[b] * n,
                                 send_s=send_s)


@pytest.mark.parametrize(("schedule", "pp", "m", "v"), [
    ("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 4, 1), ("1f1b", 8, 32, 1),
    ("interleaved", 4, 8, 2), ("interleaved", 4, 16, 4), ("interleaved", 4, 4, 2),
    ("interleaved", 16, 128, 2)])
def test_bubble_closed_form(schedule: str, pp: int, m: int, v: int) -> None:
    # A rank's v stages together take the whole f = 1 and b = 2 of its layers.
    plan = _plan(schedule, pp, m, v)
    actions, t = _replay(plan, 1.0 / v, 2.0 / v)
    assert t.step_time_s == pytest.approx(3.0 * m + 3.0 * (pp - 1) / v, rel=1e-12)
    for r in range(pp):
        assert t.bubble_fraction(r) == pytest.approx(((pp - 1) / v) / (m + (pp - 1) / v))
        # Every stage of the rank runs every micro-batch forward and backward once.
        assert sorted((a.stage, a.phase, a.microbatch) for a in actions[r]) == sorted(
            (s, ph, i) for s in range(r, pp * v, pp) for ph in "BF" for i in range(m))


def test_gpipe_with_sends_by_hand() -> None:
    # The last micro-batch's forward reaches the last stage after pp - 1 sends, and its
    # backward reaches the first after pp - 1 more: (m + pp - 1)(f + b) + 2 (pp - 1) d.
    pp, m, f, b, d = 4, 6, 1.0, 2.0, 0.25
    _, t = _replay(_plan("gpipe", pp, m), f, b, send_s=d)
    assert t.step_time_s == pytest.approx((m + pp - 1) * (f + b) + 2 * (pp - 1) * d)


def test_activations_in_flight() -> None:
    pp, m = 4, 8
    # GPipe holds every micro-batch; 1F1B's stage s at most pp - s (torch's warmup).
    assert [peak_in_flight(rank_actions(_plan("gpipe", pp, m), r)) for r in range(pp)] == [m] * 4
    assert [peak_in_flight(rank_actions(_plan("1f1b", pp, m), r)) for r in range(pp)] == [
        4, 3, 2, 1]
    # Interleaved: each of the v stages holds 1/v of the rank's layers; rank 0 holds
    # (v - 1) rounds + 2 (pp - 1) warmup forwards = 4 + 6 = 10 chunks, then one more in
    # its first 1F1B step before the first backward frees one: 11 chunks = 5.5 stages' worth.
    plan = _plan("interleaved", pp, m, 2)
    assert peak_in_flight(rank_actions(plan, 0)) == 11
    assert peak_in_flight(rank_actions(plan, 0), weight=lambda s: 0.5) == 5.5


def test_deadlock_is_an_error() -> None:
    # A rank whose order puts a backward before the forward it needs never starts it.
    bad = [[Action(0, "B", 0), Action(0, "F", 0)]]
    with pytest.raises(ConfigError) as e:
        run_pipeline(bad, forward_s=[1.0], backward_s=[2.0], send_s=0.0)
    assert e.value.field == "plan.pp_schedule"


def test_orders_are_torchs_for_a_small_case() -> None:
    # Schedule1F1B, pp = 2, m = 3: stage 0 warms up with 2 forwards, stage 1 with 1.
    plan = _plan("1f1b", 2, 3)
    got = [[(a.phase, a.microbatch) for a in rank_actions(plan, r)] for r in range(2)]
    assert got == [[("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)],
                   [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]]
    # Interleaved, pp = 2, v = 2, m = 2 (one round of 2): rank 1 holds stages 1 and 3.
    plan = _plan("interleaved", 2, 2, 2)
    r1 = [(a.stage, a.phase, a.microbatch) for a in rank_actions(plan, 1)]
    assert r1 == [(1, "F", 0), (1, "F", 1), (3, "F", 0), (3, "B", 0), (3, "F", 1),
                  (3, "B", 1), (1, "B", 0), (1, "B", 1)]


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 2, 2), (4, 8, 2), (4, 6, 2), (8, 12, 3),
                                            (16, 128, 2)])
def test_interleaved_order_is_torchs(pp: int, m: int, v: int) -> None:
    """The same order as torch's own _get_1f1b_rank_ops (its no-ops dropped)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    rounds = max(1, m // pp)
    per_round = m // rounds
    for r in range(pp):
        warmup = schedules._get_warmup_ops(r, v, per_round, pp, m, multiply_factor=2)
        fwd_bwd = v * m - warmup

        def fwd_stage(step: int, r: int = r) -> int:
            return ((step // per_round) % v) * pp + r

        def bwd_stage(step: int, r: int = r, warmup: int = warmup) -> int:
            return (v - 1 - ((step - warmup) // per_round) % v) * pp + r

        ops = schedules._get_1f1b_rank_ops(v, pp, warmup, fwd_bwd, v * m - fwd_bwd, r,
                                           fwd_stage, bwd_stage)
        theirs = [(a.stage_index, "F" if a.computation_type.name == "FORWARD" else "B",
                   a.microbatch_index) for a in ops if a is not None]
        mine = [(a.stage, a.phase, a.microbatch)
                for a in rank_actions(_plan("interleaved", pp, m, v), r)]
        assert mine == theirs
