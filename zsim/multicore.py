"""Work on many items (plans, checkpoint methods, GPU counts) on every local core, with the
results in the order asked.

Owns `fan_out`: a function of one item applied to a batch shared between this process and
forked workers, which inherit the imported simulator (and the function, so it need not
pickle) and so start in milliseconds; `simulate_all` is its use for the engine. Each
process takes the next item nobody has taken (a counter in shared memory) until none is
left, so items that differ fourfold in cost (a ZeRO-3 candidate's per-submodule schedule
against an FSDP one) still keep every core busy; a worker sends its results back once,
when it runs out of items. Each item is worked on exactly as in this process, so the
results are the same, byte for byte, whatever the number of workers; only the wall time
changes. Where fork is unavailable (Windows, macOS's default), or for a batch too small
to repay a worker's start, the items are worked on here, one after another.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Generic, TypeVar

from zsim.cores import usable_cores
from zsim.result import Result
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

if TYPE_CHECKING:  # imports ctypes: left to the first fan-out
    from multiprocessing.sharedctypes import Synchronized

MIN_PLANS_PER_WORKER = 4
"""A process takes part in a fan-out (or a sweep's pool, zsim.executor) only for at least
this many items, unless told otherwise (a fork and the return of its results cost a few
milliseconds; an item's work, about one and up)."""

T = TypeVar("T")
R = TypeVar("R")


def workers_for(count: int, per_worker: int = MIN_PLANS_PER_WORKER) -> int:
    """Processes (this one and forked workers) for `count` items: the cores this process
    may use (the ZSIM_WORKERS environment variable caps it), one per `per_worker`
    items."""
    cores = usable_cores()
    cap = os.environ.get("ZSIM_WORKERS", "")
    if cap.isdigit() and int(cap) > 0:
        cores = min(cores, int(cap))
    return max(1, min(cores, count // per_worker))


def simulate_all(model: ModelSpec, hw: HardwareProfile, plans: list[Plan]) -> list[Result]:
    """`simulate(model, hw, plan)` for every plan, in the order of `plans`, without the
    reserved-memory replay (reserved_memory_bytes None: the planner ranks on allocated
    memory, and the replay costs about as much as the engine). A fork and the return of
    its Results cost a few milliseconds, a plan's simulation one (a small model) to two
    hundred (405B's 126 layers): a worker for each plan beyond the first, as cores allow.

    Raises:
        ConfigError: the first plan (in order) the simulator rejects, as `simulate`
            would raise it here.
        RuntimeError: a worker died without sending its Results back.
    """
    return fan_out(lambda p: simulate(model, hw, p, reserved=False), plans, per_worker=1)


def fan_out(work: Callable[[T], R], items: Sequence[T], *,
            per_worker: int = MIN_PLANS_PER_WORKER) -> list[R]:
    """`work(item)` for every item, in the order of `items`, on up to
    workers_for(len(items), per_worker) processes (module docstring). `work` runs in
    forked workers too, so it must not rely on state it changes; its results must pickle.

    Raises:
        Exception: the first (in order) that `work` raises, as a serial loop would.
        RuntimeError: a worker died without sending its results back.
    """
    workers = workers_for(len(items), per_worker)
    if workers == 1 or "fork" not in mp.get_all_start_methods():
        return [work(item) for item in items]
    ctx = mp.get_context("fork")
    taken = ctx.Value("i", 0)
    started: list[tuple[mp.process.BaseProcess, Connection]] = []
    for _ in range(workers - 1):
        receive, send = ctx.Pipe(duplex=False)
        worker = ctx.Process(target=_work, args=(_Share(work, items, taken), send),
                             daemon=True)
        worker.start()
        send.close()
        started.append((worker, receive))
    outcomes = _Share(work, items, taken).take()
    for worker, receive in started:
        with receive:
            try:
                share: dict[int, R | Exception] | None = receive.recv()
            except EOFError:
                share = None
        worker.join()
        if share is None:
            raise RuntimeError(f"a worker died (exit code {worker.exitcode}) without "
                               "sending its results back")
        outcomes.update(share)
    # Items are taken in order and every item taken is finished, so the first error in
    # item order is the one a serial run would have stopped at (and no item after it
    # need have been taken).
    results = []
    for i in range(len(items)):
        outcome = outcomes[i]
        if isinstance(outcome, Exception):
            raise outcome
        results.append(outcome)
    return results


class _Share(Generic[T, R]):
    """What one process of a fan-out works through: the items nobody has taken."""

    def __init__(self, work: Callable[[T], R], items: Sequence[T],
                 taken: Synchronized) -> None:
        self.work, self.items, self.taken = work, items, taken

    def take(self) -> dict[int, R | Exception]:
        """Item index -> its result, or the error `work` raised on it: the next item
        nobody has taken until none is left, or until one fails."""
        out: dict[int, R | Exception] = {}
        while True:
            with self.taken.get_lock():
                i = self.taken.value
                self.taken.value = i + 1
            if i >= len(self.items):
                return out
            try:
                out[i] = self.work(self.items[i])
            except Exception as e:  # raised in item order by fan_out
                out[i] = e
                return out


def _work(share: _Share[T, R], send: Connection) -> None:
    """A forked worker: its share of the items, sent back in one message."""
    send.send(share.take())
    send.close()
