"""Where a sweep's runs are simulated: here, on forked local workers, or on a Ray cluster.

Owns `evaluate` (a batch of runs -> their rows, as `zsim.simulate.simulate` and
zsim.report.dataframes.sweep_row give them, the same in any process) and the two executors,
which take the runs still to do and yield each batch's outcomes as soon as it finishes, in
whatever order batches finish (zsim.sweep puts rows back in scenario order). `local` uses
every core this process may use (`ZSIM_WORKERS=N` caps them, as for `zsim plan`): forked
workers that inherit the loaded scenario, so only run indices and rows cross processes.
`ray` sends batches of runs to a Ray cluster (`ray.init(address)`: the address given, else
`RAY_ADDRESS`, else a local cluster on this machine); ray is imported only there (the
optional extra `ray`, RAY_INSTALL), and every node must be able to import zsim. A
cluster's address is first reached with a plain TCP connection, CONNECT_TIMEOUT_S at
most (an unknown host, a refused or unanswered connection is a ConfigError at once:
Ray's own client retries for minutes), and Ray's client then gets the same bound on its
connection to the cluster (its GCS) and one attempt.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
from collections.abc import Generator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from zsim import simulate as simulate_module
from zsim.engine.allocator import use_compiled_replay
from zsim.errors import ConfigError
from zsim.multicore import workers_for
from zsim.scenario import Run

EXECUTORS: tuple[str, ...] = ("local", "ray")

RAY_INSTALL = "pip install 'ray>=2.40'"
"""How to install what `--executor ray` needs: the `ray` extra of pyproject.toml (a test
keeps them equal, and the same words in the CLI's help and the README)."""

CONNECT_TIMEOUT_S = 5
"""Seconds a Ray cluster's address may take to accept a TCP connection, and Ray's client
to connect to the cluster's GCS (Ray's own default for the latter is 30 s, retried 20
times)."""

RAY_CONNECT_ENV: dict[str, str] = {
    "RAY_gcs_rpc_server_connect_timeout_s": str(CONNECT_TIMEOUT_S),
    "RAY_py_gcs_connect_timeout_s": str(CONNECT_TIMEOUT_S),
    "RAY_gcs_server_port_wait_time_s": "1",
}
"""Ray 2.x's settings of its client's connection to a cluster (read from the environment:
the first two when ray is imported, the last, its count of attempts, at ray.init),
applied where the user has not set them."""

MAX_BATCH = 32
"""Runs per batch at most: a batch's rows reach the journal (and the progress bar)
together, so batches stay small enough to lose little to an interruption and to keep
every worker busy to the end."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """What simulating one run gave."""

    index: int
    """The run's position in the scenario."""
    row: dict[str, Any] | None
    """Its zsim.report.dataframes.sweep_row, or None when it failed."""
    curve: list[tuple[float, int]] | None
    """Its memory curve (time_s, allocated_bytes) when asked for, else None."""
    error: ConfigError | None = None
    """The error the simulator raised on it (a plan it does not model), else None."""


def evaluate(runs: Sequence[Run], indices: Sequence[int], curves: frozenset[str]
             ) -> list[RunOutcome]:
    """Simulate `runs[i]` for each i of `indices` (symmetric mode, one step, with the
    reserved-memory replay, compiled: zsim.engine.allocator.use_compiled_replay), as
    `zsim sweep` always has, each distinct lowered schedule once
    (zsim.simulate.SimulationCache); keep the memory curve of the runs named in
    `curves`. A run the simulator rejects gives an outcome with its error; the
    batch goes on."""
    from zsim.report.dataframes import sweep_row

    use_compiled_replay()  # loaded once per process (inherited by forked workers)
    out = []
    cache = simulate_module.SimulationCache()  # plans of a batch that simulate alike
    for i in indices:
        run = runs[i]
        try:
            result = simulate_module.simulate(run.model, run.hardware, run.plan, cache=cache)
        except ConfigError as e:
            out.append(RunOutcome(index=i, row=None, curve=None, error=e))
            continue
        curve = list(result.memory_curve) if run.name in curves else None
        out.append(RunOutcome(index=i, row=sweep_row(run, result), curve=curve))
    return out


def batches(indices: Sequence[int], workers: int) -> list[list[int]]:
    """`indices` cut into consecutive batches: about 16 per worker, MAX_BATCH at most."""
    size = max(1, min(MAX_BATCH, len(indices) // (16 * workers)))
    return [list(indices[i:i + size]) for i in range(0, len(indices), size)]


def run_local(runs: Sequence[Run], pending: Sequence[int], curves: frozenset[str]
              ) -> Generator[list[RunOutcome], None, None]:
    """The outcomes of `runs[i]` for i in `pending`, a batch at a time, on every local
    core (here alone for few runs, or where fork is unavailable)."""
    workers = workers_for(len(pending))
    if workers == 1 or "fork" not in mp.get_all_start_methods():
        for batch in batches(pending, 1):
            yield evaluate(runs, batch, curves)
        return
    global _RUNS
    _RUNS = runs  # inherited by the forked workers, so only indices are sent
    use_compiled_replay()  # loaded here, once, for every worker
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork"),
                               initializer=_ignore_interrupts)
    try:
        futures: set[Future[list[RunOutcome]]] = {
            pool.submit(_evaluate_inherited, batch, curves)
            for batch in batches(pending, workers)}
        while futures:
            done, futures = wait(futures, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: f.result()[0].index):
                yield future.result()
    finally:
        # On an error, Ctrl-C or the caller stopping early: drop the batches not started
        # (workers finish the one they hold, whose rows are then lost, not half-kept).
        pool.shutdown(wait=False, cancel_futures=True)
        if _RUNS is runs:  # not a later sweep's, should this generator be closed late
            _RUNS = ()


_RUNS: Sequence[Run] = ()
"""The runs of the sweep in progress, for forked workers (set only by run_local)."""


def _evaluate_inherited(indices: list[int], curves: frozenset[str]) -> list[RunOutcome]:
    return evaluate(_RUNS, indices, curves)


def _ignore_interrupts() -> None:
    """Workers leave Ctrl-C to the parent, which stops the sweep (no traceback per
    worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_ray(runs: Sequence[Run], pending: Sequence[int], curves: frozenset[str], *,
            address: str | None) -> Generator[list[RunOutcome], None, None]:
    """The outcomes of `runs[i]` for i in `pending`, a batch at a time, on a Ray cluster.

    Args:
        address: the cluster's address (`ray.init(address)`); None: `RAY_ADDRESS` if set,
            else a local cluster. A Ray session already started in this process is used
            as it is (and left running).

    Raises:
        ConfigError: ray is not installed, or no Ray cluster answers at the address.
    """
    field, address = (("ray_address", address) if address is not None
                      else ("RAY_ADDRESS", os.environ.get("RAY_ADDRESS")))
    remote = address is not None and address not in ("", "auto", "local")
    set_here = {k: v for k, v in RAY_CONNECT_ENV.items() if remote and k not in os.environ}
    os.environ.update(set_here)  # before ray is imported, which reads some of them
    try:
        try:
            import ray
        except ImportError:
            raise ConfigError("executor", "ray", f"needs Ray: {RAY_INSTALL}") from None
        started = not ray.is_initialized()
        if started:
            if remote:
                check_ray_address(field, str(address))
            try:
                ray.init(address=address or None, include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
            except ConnectionError as e:  # e.g. something else listens there, or "auto"
                reason = (str(e).strip().splitlines() or ["no Ray cluster answered"])[0]
                raise ConfigError(field, address, reason) from None
    finally:
        for key in set_here:
            del os.environ[key]
    try:
        remote = ray.remote(evaluate)
        workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        # Each batch carries its runs (shared model and hardware pickled once per batch),
        # numbered from 0 there; `owned` maps them back to scenario indices.
        owned = {remote.remote([runs[i] for i in batch], range(len(batch)), curves): batch
                 for batch in batches(pending, workers)}
        refs = list(owned)
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            batch = owned.pop(ready[0])
            yield [RunOutcome(index=batch[o.index], row=o.row, curve=o.curve, error=o.error)
                   for o in ray.get(ready[0])]
    finally:
        if started:
            ray.shutdown()


def check_ray_address(field: str, address: str) -> None:
    """Reach a Ray cluster's address (HOST:PORT or ray://HOST:PORT) with a TCP connection,
    CONNECT_TIMEOUT_S at most.

    Raises:
        ConfigError: `field`=`address` is not HOST:PORT, its host is unknown, or the
            connection is refused or not answered in time.
    """
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [IPv6]:PORT
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(field, address, "must be HOST:PORT (or ray://HOST:PORT, auto, "
                          "local)")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except socket.gaierror as e:
        raise ConfigError(field, address, f"unknown host {host!r} ({e.strerror})") from None
    except TimeoutError:
        raise ConfigError(field, address, f"no answer within {CONNECT_TIMEOUT_S} s (connection "
                          "timeout): no Ray cluster reachable there") from None
    except ConnectionRefusedError:
        raise ConfigError(field, address, "connection refused: no Ray cluster listens there "
                          "(`ray start --head` starts one)") from None
    except OSError as e:
        raise ConfigError(field, address, f"cannot connect ({e.strerror or e})") from None
