"""ZeRO-3's coordinator replayed on small hand-made traces (the expected actions worked
out by hand from partitioned_param_coordinator.py's rules)."""

from __future__ import annotations

from zsim.schedule.programs.deepspeed_fetch import FetchStep, Param, replay

PARAMS = {n: Param(name=n, numel=v, persistent=v <= 1)
          for n, v in [("a", 10), ("b", 10), ("c", 10), ("d", 10), ("n", 1)]}
FORWARD = [("n", "a"), ("b",), ("c",), ("d",)]
TRACE = FORWARD + list(reversed(FORWARD))
"""Four submodules of 10 elements (the first also holds a persistent 1-element norm),
forward then backward."""


def _step(on_demand: tuple[str, ...] = (), prefetch: tuple[str, ...] = (),
          release: tuple[str, ...] = ()) -> FetchStep:
    return FetchStep(on_demand=on_demand, prefetch=prefetch, release=release)


def test_no_prefetch_no_reuse_gathers_every_use() -> None:
    # Released after every use and gathered again at the next: 8 fetches of 10 elements;
    # the persistent norm is never fetched.
    steps = replay(TRACE, PARAMS, prefetch_bucket=0, max_live=100, max_reuse=0)
    assert steps == [_step(on_demand=(n,), release=(n,))
                     for n in ["a", "b", "c", "d", "d", "c", "b", "a"]]


def test_reuse_distance_keeps_what_comes_back_soon() -> None:
    # c's next use (backward, t=5) is 20 elements away (d twice): < 25, kept; b's is 40
    # away: released. d is reused by the very next call: kept.
    steps = replay(TRACE, PARAMS, prefetch_bucket=0, max_live=100, max_reuse=25)
    assert steps == [
        _step(("a",), release=("a",)), _step(("b",), release=("b",)), _step(("c",)),
        _step(("d",)), _step(release=("d",)), _step(release=("c",)),
        _step(("b",), release=("b",)), _step(("a",), release=("a",))]


def test_prefetch_fills_its_bucket_and_holds_skipped_uses() -> None:
    # At t=0 the queue after a's own use is b, c, d, d, c, b, a: 15 elements of budget take
    # b (10) then c (20 >= 15, stop). At t=1 the walk passes c (available) and reaches d
    # and then, still under budget, the backward's a: prefetched from t=1 for t=7. b's
    # backward use (t=6) was walked past, so b is not released after its forward.
    steps = replay(TRACE, PARAMS, prefetch_bucket=15, max_live=100, max_reuse=0)
    assert steps[0] == _step(("a",), prefetch=("b", "c"), release=("a",))
    assert steps[1] == _step(prefetch=("d", "a"))
    assert steps[3] == _step(release=("d",))
    assert steps[4] == _step(("d",), release=("d",))
    assert [s.release for s in steps[5:]] == [("c",), ("b",), ("a",)]
    assert all(not s.on_demand for s in steps[5:])


def test_max_live_caps_the_prefetch() -> None:
    # 10 elements live after a's on-demand fetch and max_live 20: a budget of 10 elements,
    # one submodule.
    steps = replay(TRACE, PARAMS, prefetch_bucket=1000, max_live=20, max_reuse=0)
    assert steps[0].prefetch == ("b",)
