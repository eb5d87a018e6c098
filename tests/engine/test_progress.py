"""The engine always makes progress: fluid tasks end at the right time at any clock value
and any size (a task whose remaining time once fell below the clock's resolution was
re-timed at the same instant forever), and a run that goes past its event budget is an
error naming the op in flight, never a hang."""

from __future__ import annotations

import math

import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from zsim.engine.replay import EVENTS_PER_OP, EngineStalled, run
from zsim.engine.resources import Fabric
from zsim.schedule.ops import Op, Schedule

LINK_BYTES_PER_S = 450e9
"""NVLink-like rate, bytes/s: a 1-byte transfer takes 2.2e-12 s, below the clock's step
at t = 1e4 s and above (1.8e-12 s)."""

offsets_s = st.floats(1e-9, 1e7)
sizes_bytes = st.floats(1.0, 1e15)


def _finish_times(offset_s: float, tasks: list[tuple[str, float]], *,
                  slowdown: float = 0.0) -> dict[int, float]:
    """Start `tasks` ((kind, size) with kind "link" in bytes or "compute" in seconds) at
    `offset_s` on one link and one rank; return when each ends."""
    env = simpy.Environment()
    fabric = Fabric(env, {"link": LINK_BYTES_PER_S}, comm_compute_slowdown=slowdown)
    ends: dict[int, float] = {}

    def start() -> simpy.events.ProcessGenerator:
        yield env.timeout(offset_s)
        for i, (kind, size) in enumerate(tasks):
            ev = (fabric.transfer((("link", 1.0),), size, label=f"t{i}") if kind == "link"
                  else fabric.compute(0, size, label=f"t{i}"))
            ev.callbacks.append(lambda _e, i=i: ends.__setitem__(i, env.now))
        yield env.timeout(0)

    env.process(start())
    env.run()
    return ends


def _close(got: float, want: float, offset_s: float) -> bool:
    """Equal up to float rounding: a few steps of the clock at `want`, or 1e-12 relative
    to the task's own duration."""
    return abs(got - want) <= 4 * math.ulp(want) + 1e-12 * (want - offset_s)


@given(offset=offsets_s, size=sizes_bytes)
def test_a_transfer_ends_at_offset_plus_size_over_bandwidth(offset: float, size: float) -> None:
    ends = _finish_times(offset, [("link", size)])
    assert _close(ends[0], offset + size / LINK_BYTES_PER_S, offset)


@given(offset=offsets_s, small=sizes_bytes, large=sizes_bytes)
def test_two_transfers_share_the_link_and_end_when_processor_sharing_says(
        offset: float, small: float, large: float) -> None:
    small, large = min(small, large), max(small, large)
    ends = _finish_times(offset, [("link", large), ("link", small)])
    # Each gets half the link until the small one ends, then the large one runs alone.
    assert _close(ends[1], offset + 2 * small / LINK_BYTES_PER_S, offset)
    assert _close(ends[0], offset + (small + large) / LINK_BYTES_PER_S, offset)


@given(offset=offsets_s, kernel_s=st.floats(1e-15, 1e3), size=sizes_bytes)
def test_compute_beside_a_transfer_ends_on_time(offset: float, kernel_s: float,
                                                size: float) -> None:
    """A kernel and a transfer start together; the kernel runs at full rate (no
    collective is registered on its rank), the transfer alone on its link."""
    ends = _finish_times(offset, [("compute", kernel_s), ("link", size)], slowdown=0.5)
    assert _close(ends[0], offset + kernel_s, offset)
    assert _close(ends[1], offset + size / LINK_BYTES_PER_S, offset)


def test_a_residue_below_the_clock_resolution_ends_the_task() -> None:
    """The state the issue-9 hang was stuck in: at t = 911.09 s a kernel had 4.3e-14 s of
    work left while the clock's step there is 1.1e-13 s, so `now + left == now` and the
    old fabric re-timed it at the same instant forever."""
    offset = 911.0855364476283
    left = 4.3128220721284916e-14
    assert offset + left == offset
    ends = _finish_times(offset, [("compute", left), ("compute", 41.7)])
    assert ends == {0: offset, 1: offset + 41.7}


def _one_kernel_schedule() -> Schedule:
    op = Op(index=0, name="unit 0 forward (mb 0)", kind="forward", stream="compute",
            compute_s=1.0)
    return Schedule(ops=(op,), baseline=(), link_bytes_per_s={}, comm_compute_slowdown=0.0,
                    hbm_bytes=1e12, model_flops=1.0, hardware_flops=1.0, tokens_per_rank=1,
                    world_size=1, peak_flop_per_s=1e12, dp_shard=1)


def test_a_livelock_is_an_error_naming_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inject a fault (the fabric never moves a task forward, so its timer fires again and
    again): the run stops at its event budget and names the op whose task never ends."""
    monkeypatch.setattr(Fabric, "_advance", lambda self: None)
    with pytest.raises(EngineStalled, match=r"unit 0 forward \(mb 0\)") as info:
        run(_one_kernel_schedule())
    assert info.value.in_flight == ["unit 0 forward (mb 0)"]
    assert f"budget {EVENTS_PER_OP} per op" in str(info.value)


def test_events_per_op_stay_far_below_the_budget() -> None:
    """Real schedules take a handful of events per op: the budget is a bug detector."""
    from zsim.schedule.lower import lower
    from zsim.spec.plan import Plan
    from zsim.spec.registry import resolve_hardware, resolve_model

    schedule = lower(resolve_model("13b"), resolve_hardware("dgx-h100"),
                     Plan.for_strategy("fsdp", gpus=128, seq_len=4096, micro_batch=4096))
    events = run(schedule).trace.events
    assert events < EVENTS_PER_OP / 4 * len(schedule.ops)
