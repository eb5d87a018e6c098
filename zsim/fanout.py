"""Simulate many plans on every local core, with the results in the order asked.

Owns `simulate_all`: the planner's candidates (and any other batch of plans) split over
forked worker processes, which inherit the imported simulator and so start in
milliseconds. Each plan is simulated exactly as `zsim.simulate.simulate` does in this
process, so the results are the same, byte for byte, whatever the number of workers;
only the wall time changes. Where fork is unavailable (Windows, macOS's default), or for
a batch too small to repay a worker's start, the plans run here, one after another.
"""

from __future__ import annotations

import multiprocessing as mp
import os

from zsim.result import Result
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

MIN_PLANS_PER_WORKER = 4
"""A worker is forked only for at least this many plans (a fork and the return of its
Results cost a few milliseconds; a plan's simulation tens)."""

_job: tuple[ModelSpec, HardwareProfile, list[Plan]] | None = None
"""The batch being fanned out, set before the fork so the workers inherit it."""


def workers_for(count: int) -> int:
    """Worker processes for `count` plans: the cores this process may use (the
    ZSIM_WORKERS environment variable caps it), one per MIN_PLANS_PER_WORKER plans."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1
    cap = os.environ.get("ZSIM_WORKERS", "")
    if cap.isdigit() and int(cap) > 0:
        cores = min(cores, int(cap))
    return max(1, min(cores, count // MIN_PLANS_PER_WORKER))


def simulate_all(model: ModelSpec, hw: HardwareProfile, plans: list[Plan]) -> list[Result]:
    """`simulate(model, hw, plan)` for every plan, in the order of `plans`.

    Raises:
        ConfigError: the first plan (in order) the simulator rejects, as `simulate`
            would raise it here.
    """
    global _job
    workers = workers_for(len(plans))
    if workers == 1 or "fork" not in mp.get_all_start_methods():
        return [simulate(model, hw, p) for p in plans]
    _job = (model, hw, plans)
    try:
        with mp.get_context("fork").Pool(workers) as pool:
            # One plan per task: plans differ fourfold in cost (a ZeRO-3 candidate's
            # per-submodule schedule against an FSDP one), so workers take the next as
            # they finish.
            return pool.map(_simulate_index, range(len(plans)), chunksize=1)
    finally:
        _job = None


def _simulate_index(i: int) -> Result:
    assert _job is not None, "fanned-out worker without a job"
    model, hw, plans = _job
    return simulate(model, hw, plans[i])
