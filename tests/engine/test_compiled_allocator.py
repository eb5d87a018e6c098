"""The compiled replay (zsim.engine.compiled_allocator) against the Python one
(zsim.engine.allocator.steady_reserved): the hand-worked cases of test_allocator.py as
steady-state steps, random steps drawn by hypothesis, and the steps of real plans."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zsim.engine import resources
from zsim.engine.allocator import Request, steady_reserved
from zsim.engine.compiled_allocator import steady_reserved as compiled_steady_reserved
from zsim.simulate import simulate
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model

KiB, MiB = 1 << 10, 1 << 20

Replay = Callable[..., "int | None"]
IMPLEMENTATIONS = pytest.mark.parametrize(
    "replay", [steady_reserved, compiled_steady_reserved], ids=["python", "compiled"])


def _req(key: str, nbytes: int, stream: str = "s", pieces: tuple[int, ...] = ()) -> Request:
    return Request(key, nbytes, pieces, stream)


# Each step frees what it allocates, so every step replays the first; the figures are
# test_allocator.py's, worked out there from c10/cuda/CUDACachingAllocator.cpp.
HAND_WORKED: dict[str, tuple[list[Request], list[Request | str], int]] = {
    "small requests share a 2 MiB segment": (
        [_req("a", 600 * KiB), _req("b", 600 * KiB)], [], 2 * MiB),
    "a mid-size request's 20 MiB segment serves the next": (
        [_req("a", 2 * MiB), _req("b", 8 * MiB)], [], 20 * MiB),
    "a large remainder of 1 MiB or less is not split": (
        [], [_req("x", 12 * MiB), "x", _req("y", 5 * MiB), "y",
             _req("z", 11 * MiB + 512 * KiB), "z"], 12 * MiB),
    "small and large pools are separate": (
        [], [_req("x", 12 * MiB), "x", _req("y", 100 * KiB), "y"], 14 * MiB),
    "blocks are not shared across streams": (
        [], [_req("x", 4 * MiB, "a"), "x", _req("y", 4 * MiB, "b"), "y",
             _req("z", 4 * MiB, "a"), "z"], 40 * MiB),
    "best fit takes the smallest block that holds the request": (
        [], [_req("f", 12 * MiB), _req("g", 24 * MiB), "f", "g", _req("h", 11 * MiB),
             _req("i", 23 * MiB), "h", "i"], 36 * MiB),
    "freed neighbours coalesce": (
        [], [_req("x", 6 * MiB), _req("y", 6 * MiB), "x", "y", _req("z", 19 * MiB), "z"],
        20 * MiB),
    # should_split, small pool: a remainder of exactly kMinBlockSize (512 B) is split off
    # and serves the last request: 1 MiB, then 1 MiB - 512 B, of one 2 MiB segment.
    "a small remainder of 512 B is split off": (
        [_req("a", MiB), _req("b", MiB - 512), _req("c", 512)], [], 2 * MiB),
    "pieces free their transients": (
        [], [_req("b", 10 * MiB, pieces=(4 * MiB, 6 * MiB, ~0)), "b"], 20 * MiB),
}


@IMPLEMENTATIONS
@pytest.mark.parametrize("case", list(HAND_WORKED))
def test_hand_worked_steps(replay: Replay, case: str) -> None:
    state, step, expected = HAND_WORKED[case]
    assert replay(state, step, created_in_first_step={}) == expected


@IMPLEMENTATIONS
def test_cached_segments_released_past_the_capacity(replay: Replay) -> None:
    # test_allocator.py's: 60 MiB unlimited, 44 MiB on a 50 MiB device.
    step: list[Request | str] = [_req("a", 16 * MiB), "a", _req("b", 24 * MiB), "b"]
    state = [_req("w", 8 * MiB)]
    assert replay(state, step, created_in_first_step={}) == 60 * MiB
    assert replay(state, step, created_in_first_step={}, capacity_bytes=50 * MiB) == 44 * MiB


@IMPLEMENTATIONS
def test_states_made_by_the_first_step(replay: Replay) -> None:
    # test_allocator.py's lazy and eager optimizer states: 60 and 50 MiB.
    step: list[Request | str] = [_req("act", 30 * MiB), "act", _req("tmp", 4 * MiB), "tmp"]
    assert replay([], step, created_in_first_step={2: [_req("state", 8 * MiB)]}) == 60 * MiB
    assert replay([_req("state", 8 * MiB)], step, created_in_first_step={}) == 50 * MiB


# ------------------------------------------------------------------ random steps
_SIZES = st.one_of(st.integers(1, MiB), st.integers(MiB + 1, 10 * MiB),
                   st.integers(10 * MiB, 64 * MiB),
                   # the rules' edges: kMinBlockSize, kSmallSize, kMinLargeAlloc
                   st.sampled_from([512, MiB - 512, MiB, MiB + 512, 2 * MiB - 512,
                                    10 * MiB - 512, 10 * MiB, 20 * MiB - 512]))


@st.composite
def _pieces(draw: st.DrawFn) -> tuple[int, ...]:
    """A buffer's pieces: tensors, some freed again inside the buffer (~i)."""
    out: list[int] = []
    alive: list[int] = []
    for _ in range(draw(st.integers(0, 5))):
        if alive and draw(st.booleans()):
            out.append(~alive.pop(draw(st.integers(0, len(alive) - 1))))
        else:
            alive.append(len(out))
            out.append(draw(_SIZES))
    return tuple(out)


@st.composite
def _trace(draw: st.DrawFn) -> tuple[list[Request], list[Request | str],
                                     dict[int, Sequence[Request]]]:
    """Model state, a step that any number of replays can run (it frees only what it
    allocated before, or a state buffer it allocates again later), and states the first
    step creates."""

    def request(key: str) -> Request:
        return Request(key, draw(_SIZES), draw(_pieces()), draw(st.sampled_from("abc")))

    state = [request(f"state{i}") for i in range(draw(st.integers(0, 3)))]
    step: list[Request | str] = []
    reborn = [r.key for r in state if draw(st.booleans())]
    step += reborn  # freed first, allocated again below
    live: list[str] = []
    for i in range(draw(st.integers(1, 30))):
        if live and draw(st.booleans()):
            step.append(live.pop(draw(st.integers(0, len(live) - 1))))
        elif reborn and draw(st.booleans()):
            step.append(request(reborn.pop()))
        else:
            key = f"b{i}" if draw(st.integers(0, 3)) else "kept"  # "kept": outlives steps
            if key in live:
                continue
            live.append(key)
            step.append(request(key))
    step += [request(key) for key in reborn]
    created: dict[int, Sequence[Request]] = {}
    if draw(st.booleans()):
        at = draw(st.integers(0, len(step) - 1))
        created[at] = [request(f"opt{j}") for j in range(draw(st.integers(1, 3)))]
    return state, step, created


@settings(max_examples=300, deadline=None)
@given(_trace(), st.one_of(st.just(float("inf")), st.integers(20 * MiB, 400 * MiB)))
def test_random_steps_replay_alike(trace: tuple[list[Request], list[Request | str],
                                                dict[int, Sequence[Request]]],
                                   capacity: float) -> None:
    """On a device without a limit and on small ones, where cached segments are released
    and cudaMalloc retried."""
    state, step, created = trace
    assert (compiled_steady_reserved(state, step, created_in_first_step=created,
                                     capacity_bytes=capacity)
            == steady_reserved(state, step, created_in_first_step=created,
                               capacity_bytes=capacity))


# ------------------------------------------------------------------ real plans
PLANS = [("13b", "dgx-h100", Plan.for_strategy(s, gpus=64, seq_len=4096, micro_batch=2,
                                                 grad_accum=2, recompute=r, **extra))
         for s, r, extra in [("fsdp", "selective", {}), ("fsdp-no-reshard", "full", {}),
                             ("hsdp", "selective", {"shard_group": 8}), ("zero3", "full", {}),
                             ("zero2", "selective", {}), ("fsdp", "full", {"impl": "fsdp1"})]]
PLANS += [("7b", "hgx-h200", Plan.for_strategy("fsdp", gpus=8, seq_len=2048, micro_batch=4,
                                               recompute="none", prefetch=2, unit_size=2))]


def test_real_plans_replay_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step the simulator replays for these plans (FSDP2 and FSDP1, HSDP, ZeRO-2/3,
    recomputation policies, unit sizes) gives the same reserved bytes compiled."""
    traces: list[tuple[Sequence[Request], Sequence[Request | str],
                       dict[int, Sequence[Request]]]] = []

    def record(state: Sequence[Request], step: Sequence[Request | str], *,
               created_in_first_step: dict[int, Sequence[Request]],
               capacity_bytes: float) -> int:
        traces.append((list(state), list(step), dict(created_in_first_step)))
        return steady_reserved(state, step, created_in_first_step=created_in_first_step,
                               capacity_bytes=capacity_bytes)

    monkeypatch.setattr(resources, "replay_reserved", record)
    for model, hw, plan in PLANS:
        simulate(resolve_model(model), resolve_hardware(hw), plan)
    assert len(traces) == len(PLANS)
    for state, step, created in traces:
        expected = steady_reserved(state, step, created_in_first_step=created)
        assert compiled_steady_reserved(state, step,
                                        created_in_first_step=created) == expected
