"""Simulate many plans on every local core, with the results in the order asked.

Owns `simulate_all`: the planner's candidates (and any other batch of plans) shared
between this process and forked workers, which inherit the imported simulator and so
start in milliseconds. Each process takes the next plan nobody has taken (a counter in
shared memory) until none is left, so plans that differ fourfold in cost (a ZeRO-3
candidate's per-submodule schedule against an FSDP one) still keep every core busy; a
worker sends its Results back once, when it runs out of plans. Each plan is simulated
exactly as `zsim.simulate.simulate` does in this process, so the results are the same,
byte for byte, whatever the number of workers; only the wall time changes. Where fork is
unavailable (Windows, macOS's default), or for a batch too small to repay a worker's
start, the plans run here, one after another.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from zsim.cores import usable_cores
from zsim.result import Result
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

if TYPE_CHECKING:  # imports ctypes: left to the first fan-out
    from multiprocessing.sharedctypes import Synchronized

MIN_PLANS_PER_WORKER = 4
"""A process takes part only for at least this many plans (a fork and the return of its
Results cost a few milliseconds; a plan's simulation tens)."""

Outcomes = dict[int, Result | Exception]
"""Plan index -> its Result, or the error `simulate` raised on it."""


def workers_for(count: int) -> int:
    """Processes (this one and forked workers) for `count` plans: the cores this process
    may use (the ZSIM_WORKERS environment variable caps it), one per
    MIN_PLANS_PER_WORKER plans."""
    cores = usable_cores()
    cap = os.environ.get("ZSIM_WORKERS", "")
    if cap.isdigit() and int(cap) > 0:
        cores = min(cores, int(cap))
    return max(1, min(cores, count // MIN_PLANS_PER_WORKER))


def simulate_all(model: ModelSpec, hw: HardwareProfile, plans: list[Plan]) -> list[Result]:
    """`simulate(model, hw, plan)` for every plan, in the order of `plans`, without the
    reserved-memory replay (reserved_memory_bytes None: the planner ranks on allocated
    memory, and the replay costs about as much as the engine).

    Raises:
        ConfigError: the first plan (in order) the simulator rejects, as `simulate`
            would raise it here.
        RuntimeError: a worker died without sending its Results back.
    """
    workers = workers_for(len(plans))
    if workers == 1 or "fork" not in mp.get_all_start_methods():
        return [simulate(model, hw, p, reserved=False) for p in plans]
    ctx = mp.get_context("fork")
    taken = ctx.Value("i", 0)
    started: list[tuple[mp.process.BaseProcess, Connection]] = []
    for _ in range(workers - 1):
        receive, send = ctx.Pipe(duplex=False)
        worker = ctx.Process(target=_work, args=(model, hw, plans, taken, send), daemon=True)
        worker.start()
        send.close()
        started.append((worker, receive))
    outcomes = _take_plans(model, hw, plans, taken)
    for worker, receive in started:
        with receive:
            try:
                share: Outcomes | None = receive.recv()
            except EOFError:
                share = None
        worker.join()
        if share is None:
            raise RuntimeError(f"a simulation worker died (exit code {worker.exitcode}) "
                               "without sending its Results back")
        outcomes.update(share)
    # Plans are taken in order and every plan taken is finished, so the first error in
    # plan order is the one a serial run would have stopped at (and no plan after it
    # need have been taken).
    results = []
    for i in range(len(plans)):
        outcome = outcomes[i]
        if isinstance(outcome, Exception):
            raise outcome
        results.append(outcome)
    return results


def _take_plans(model: ModelSpec, hw: HardwareProfile, plans: list[Plan],
                taken: Synchronized) -> Outcomes:
    """Simulate the next plan nobody has taken until none is left, or until one fails."""
    out: Outcomes = {}
    while True:
        with taken.get_lock():
            i = taken.value
            taken.value = i + 1
        if i >= len(plans):
            return out
        try:
            out[i] = simulate(model, hw, plans[i], reserved=False)
        except Exception as e:  # raised in plan order by simulate_all
            out[i] = e
            return out


def _work(model: ModelSpec, hw: HardwareProfile, plans: list[Plan], taken: Synchronized,
          send: Connection) -> None:
    """A forked worker: its share of the plans, sent back in one message."""
    send.send(_take_plans(model, hw, plans, taken))
    send.close()
