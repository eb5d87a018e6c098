"""Launch N ranks of a torch.distributed job on this machine and collect their results.

Owns process lifetime: a TCPStore bound to port 0 in the parent (so the port is chosen by
the kernel at run time, never hard-coded and never raced), N spawned processes that join
it with gloo (CPU) or NCCL (CUDA), a deadline for the whole job, and clean-up. The first
rank that raises is reported with its traceback; a rank that dies without a word (a
segfault, os._exit) is reported with its exit code; a job that outlives its deadline is
reported with the ranks still running. In every case no process is left behind. A rank
that works to a wall-clock Deadline can append its results to a JSON-lines file as they
complete (append_jsonl), so that what it finished survives its crash (read_jsonl). Ranks
start with glibc's malloc set to cache freed host memory (HOST_MALLOC_ENV), as PyTorch's
CUDA caching allocator caches device memory, unless asked for glibc's defaults. A single
process can also play rank 0 of N on the fake backend
(torch.testing._internal.distributed.fake_pg), which runs collectives as no-ops, for
memory at world sizes this machine cannot host. Imports torch.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zsim.errors import ZsimError

HOST = "127.0.0.1"
_POLL_S = 0.2
"""How often the parent checks for dead ranks while waiting, seconds."""


HOST_MALLOC_ENV: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
}
"""glibc malloc settings of every rank's process: blocks up to 1 GiB come from the heap,
and freed heap is never returned to the kernel. A block freed in one step is then reused
by the next, as the CUDA caching allocator reuses device memory, instead of being mapped
afresh, where the kernel faults in and zeroes every 4 KiB page on first touch. With
glibc's defaults (blocks over a dynamic threshold are mmap'd, the heap top is trimmed)
llama3-8b@d256 fsdp at world 2 took about 17,000 page faults per step here, and its steps
ran 10-20% slower: a host cost that no GPU run has and the simulator does not model."""


class RankFailed(ZsimError):
    """A rank of a backend run raised, died, or did not finish in time."""

    def __init__(self, rank: int | None, detail: str) -> None:
        self.rank = rank
        self.detail = detail
        who = f"rank {rank}" if rank is not None else "ranks"
        super().__init__(f"{who}: {detail}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankContext:
    """What a rank function gets besides its payload."""

    rank: int
    world_size: int
    device: str
    """"cpu" or "cuda:<local rank>"."""
    backend: str
    """"gloo", "nccl" or "fake"."""


RankFn = Callable[[RankContext, Any], Any]


def sync_device(device: str) -> None:
    """Wait for the device's queued kernels (CUDA); a no-op on CPU, where they ran
    on the calling thread."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@dataclass(frozen=True, slots=True)
class Deadline:
    """A wall-clock limit (time.time() seconds, comparable across processes)."""

    at: float

    def left_s(self) -> float:
        """Seconds until the limit."""
        return self.at - time.time()

    def allows(self, need_s: float) -> bool:
        """Whether `need_s` more seconds fit before the limit."""
        return self.left_s() >= need_s


def append_jsonl(path: str, row: dict[str, Any]) -> None:
    """Append one JSON line (a crash later in the process keeps the rows before it)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows a process appended (none if it wrote none)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def run_ranks(fn: RankFn, payload: Any, *, nproc: int, backend: str = "gloo",
              timeout_s: float = 300.0, malloc_env: dict[str, str] | None = None) -> list[Any]:
    """Run `fn(ctx, payload)` on ranks 0..nproc-1, each in its own process.

    Args:
        fn: a module-level function (it is pickled into spawned processes).
        payload: picklable argument passed to every rank.
        nproc: number of processes (world size).
        backend: "gloo" (CPU) or "nccl" (one CUDA device per rank).
        timeout_s: deadline for the whole job, seconds; collectives time out after it too.
        malloc_env: glibc malloc settings of the ranks' processes; None: HOST_MALLOC_ENV,
            {} glibc's defaults.

    Returns:
        The ranks' return values, in rank order.

    Raises:
        RankFailed: a rank raised (its traceback is in the message), exited without a
            result, or the job ran past timeout_s.
    """
    if nproc < 1:
        raise RankFailed(None, f"nproc={nproc} must be >= 1")
    store = dist.TCPStore(HOST, 0, nproc + 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    ctx = mp.get_context("spawn")
    results: queue.Queue[tuple[int, str, Any]] = ctx.Queue()  # type: ignore[assignment]
    procs = [ctx.Process(target=_rank_main,
                         args=(fn, payload, rank, nproc, backend, store.port, timeout_s,
                               results),
                         daemon=True)
             for rank in range(nproc)]
    try:
        _start(procs, HOST_MALLOC_ENV if malloc_env is None else malloc_env)
        return _collect(procs, results, timeout_s)
    finally:
        _stop(procs)
        del store


def run_fake_rank(fn: RankFn, payload: Any, *, world_size: int,
                  timeout_s: float = 300.0) -> Any:
    """Run `fn` once, in a fresh process, as rank 0 of `world_size` on the fake backend:
    collectives return immediately and move no data, so shards have their true size.

    Raises:
        RankFailed: as for run_ranks.
    """
    ctx = mp.get_context("spawn")
    results: queue.Queue[tuple[int, str, Any]] = ctx.Queue()  # type: ignore[assignment]
    p = ctx.Process(target=_rank_main,
                    args=(fn, payload, 0, world_size, "fake", 0, timeout_s, results),
                    daemon=True)
    try:
        _start([p], HOST_MALLOC_ENV)
        return _collect([p], results, timeout_s)[0]
    finally:
        _stop([p])


def _start(procs: list[Any], malloc_env: dict[str, str]) -> None:
    """Start spawned processes with `malloc_env` in their environment (glibc reads it
    when the process starts, so it cannot be set from inside a rank)."""
    with _environment(malloc_env):
        for p in procs:
            p.start()


@contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    """os.environ with `extra` added, restored on exit."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def _collect(procs: list[Any], results: queue.Queue[tuple[int, str, Any]],
             timeout_s: float) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    out: dict[int, Any] = {}
    while len(out) < len(procs):
        try:
            rank, status, value = results.get(timeout=_POLL_S)
        except queue.Empty:
            for rank, p in enumerate(procs):
                # A rank that exited before reporting; give its message a moment to land.
                if rank not in out and p.exitcode is not None and results.empty():
                    time.sleep(_POLL_S)
                    if results.empty():
                        raise RankFailed(rank, f"exited with code {p.exitcode} "
                                               "without a result") from None
            if time.monotonic() > deadline:
                running = [r for r in range(len(procs)) if r not in out]
                raise RankFailed(None, f"timed out after {timeout_s:g} s; still running: "
                                       f"{running}") from None
            continue
        if status == "error":
            rank, value = _root_cause(rank, value, results)
            raise RankFailed(rank, value)
        out[rank] = value
    return [out[r] for r in range(len(procs))]


_COLLATERAL = ("DistBackendError", "Connection closed by peer", "Connection reset by peer",
               "Broken pipe", "DistNetworkError")
"""Errors a rank gets because another rank died: reported only if nothing else is."""
_GRACE_S = 2.0
"""How long to wait for other ranks' errors once one has reported, seconds."""


def _root_cause(rank: int, detail: str,
                results: queue.Queue[tuple[int, str, Any]]) -> tuple[int, str]:
    """When one rank dies, its peers fail too, often first (their sockets close): collect
    the errors that arrive within a grace period and pick one that is not collateral."""
    errors = [(rank, detail)]
    deadline = time.monotonic() + _GRACE_S
    while time.monotonic() < deadline:
        try:
            r, status, value = results.get(timeout=_POLL_S)
        except queue.Empty:
            continue
        if status == "error":
            errors.append((r, value))
    for r, value in errors:
        if not any(marker in value for marker in _COLLATERAL):
            return r, value
    return errors[0]


def _stop(procs: list[Any]) -> None:
    """Terminate what still runs, then kill what ignores SIGTERM; reap everything."""
    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.terminate()
    for p in started:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


def _rank_main(fn: RankFn, payload: Any, rank: int, world_size: int, backend: str,
               port: int, timeout_s: float, results: Any) -> None:
    # What the libraries print in a rank (DeepSpeed: "... built successfully") goes to
    # stderr: the parent's stdout is a command's output (zsim validate plan --format json).
    sys.stdout = sys.stderr
    try:
        if backend == "fake":
            from torch.testing._internal.distributed.fake_pg import FakeStore

            store: Any = FakeStore()
        else:
            store = dist.TCPStore(HOST, port, world_size + 1, is_master=False,
                                  timeout=timedelta(seconds=timeout_s))
        device = "cpu"
        if backend == "fake" and torch.cuda.is_available():
            # Rank 0 of N on the one GPU: the allocator's figures are the real ones.
            device = "cuda:0"
            torch.cuda.set_device(device)
        elif backend == "nccl":
            device = f"cuda:{rank % torch.cuda.device_count()}"
            torch.cuda.set_device(device)
        else:
            # Share the cores: oversubscribed ranks would time each other's threads.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size)
                                  if backend != "fake" else torch.get_num_threads())
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        try:
            value = fn(RankContext(rank=rank, world_size=world_size, device=device,
                                   backend=backend), payload)
        finally:
            dist.destroy_process_group()
        results.put((rank, "ok", value))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
