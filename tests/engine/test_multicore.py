"""zsim.multicore: plans simulated on forked workers give the Results one process gives, in
the order asked, and a plan the simulator rejects raises the same ConfigError."""

from __future__ import annotations

import json
import os

import pytest

from zsim import multicore
from zsim.errors import ConfigError
from zsim.simulate import simulate
from zsim.spec.plan import Plan
from zsim.spec.presets import PRESETS
from zsim.spec.registry import resolve_hardware

MODEL = PRESETS["gpt3-125m"]
HW = resolve_hardware("dgx-h100")
PLANS = [Plan.for_strategy(s, gpus=16, seq_len=1024, recompute=rc, micro_batch=mb)  # type: ignore[arg-type]
         for s in ("fsdp", "zero3", "zero2", "ddp") for rc in ("none", "full")
         for mb in (1, 4)]


def _dump(results: list[object]) -> str:
    return json.dumps([r.to_dict() for r in results], sort_keys=True)  # type: ignore[attr-defined]


def test_workers_give_the_serial_results_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZSIM_WORKERS", "2")
    assert 1 <= multicore.workers_for(len(PLANS)) <= 2  # the cap holds
    parallel = multicore.simulate_all(MODEL, HW, PLANS)
    serial = [simulate(MODEL, HW, p, reserved=False) for p in PLANS]  # as simulate_all does
    assert _dump(parallel) == _dump(serial)


def test_small_batches_and_a_cap_of_one_stay_in_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert multicore.workers_for(multicore.MIN_PLANS_PER_WORKER - 1) == 1
    monkeypatch.setenv("ZSIM_WORKERS", "1")
    assert multicore.workers_for(1000) == 1


def test_a_rejected_plan_raises_its_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZSIM_WORKERS", "2")
    bad = [*PLANS[:8], PLANS[0].with_(seq_len=MODEL.max_seq_len * 4), *PLANS[8:]]
    with pytest.raises(ConfigError) as info:
        multicore.simulate_all(MODEL, HW, bad)
    assert info.value.field.endswith("seq_len")


def test_a_worker_that_dies_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed mid-batch (out of memory, a signal) fails the batch at once, with
    its exit code."""
    monkeypatch.setenv("ZSIM_WORKERS", "2")
    if multicore.workers_for(len(PLANS)) < 2:
        pytest.skip("one core: nothing is forked")
    parent = os.getpid()

    def dies_in_a_worker(*args: object, **kwargs: object) -> object:
        if os.getpid() != parent:
            os._exit(3)
        return simulate(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(multicore, "simulate", dies_in_a_worker)
    with pytest.raises(RuntimeError, match="exit code 3"):
        multicore.simulate_all(MODEL, HW, PLANS)


def _square_or_fail(n: int) -> int:
    if n in (5, 9):
        raise ValueError(f"item {n}")
    return n * n


def test_a_fan_out_keeps_order_and_raises_the_first_error_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Any function of one item: results in item order from every worker, and of two
    failing items the earlier one's error, as a serial loop gives them."""
    monkeypatch.setenv("ZSIM_WORKERS", "2")
    assert multicore.workers_for(2, per_worker=1) == min(2, multicore.usable_cores())
    assert multicore.fan_out(lambda n: n * n, list(range(40)), per_worker=1) == [
        n * n for n in range(40)]
    with pytest.raises(ValueError, match="item 5"):
        multicore.fan_out(_square_or_fail, list(range(40)), per_worker=1)
