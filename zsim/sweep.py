"""Run a scenario's sweep: resumable, on every local core or a Ray cluster, with the same
rows whatever the executor, the number of workers or the interruptions.

Owns the plan id (a digest of what a run simulates: its name, model, hardware and plan),
the resume rule (a run whose id is in the --out folder's journal, zsim.journal, is not
simulated again), and putting rows back in scenario order. Runs are simulated by
zsim.executor; each finished batch goes to the journal before the next is awaited, so an
interrupted sweep (Ctrl-C, a killed process, a full disk) loses at most the batches in
flight. No pandas here (see zsim.report.dataframes for the table built from the rows).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Generator, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError
from zsim.executor import EXECUTORS, RunOutcome, run_local, run_ray
from zsim.journal import JOURNAL_NAME, Entry, Journal, read_journal
from zsim.scenario import Run, Scenario

Progress = Callable[[int, int, str], None]
"""Called with (runs done, runs in total, the last run finished): once before the first
run is simulated (done = the runs read back from the journal, name ""), then after each
finished batch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRows:
    """A finished sweep, in scenario order."""

    rows: tuple[dict[str, Any], ...]
    """One zsim.report.dataframes.sweep_row per run."""
    curves: dict[str, tuple[tuple[float, int], ...]]
    """Memory curve (time_s, allocated_bytes) of each run named in run_sweep's `curves`."""
    simulated: int
    """Runs simulated by this call (the others were read back from the journal)."""


def plan_ids(runs: Sequence[Run]) -> list[str]:
    """A stable id per run: the SHA-256 (hex, first 24 digits) of the simulator's source
    and the run's name, gpus, model, hardware profile, plan and run-days failure model
    (a fleet file's rates and the restart time included), so that a journal row is
    reused only for the very run it was computed for, by the same simulator (an edited
    scenario recomputes the runs it changed; an updated zsim recomputes them all)."""
    specs: dict[int, str] = {}  # runs of a scenario share their model and hardware objects

    def spec(obj: object) -> str:
        if id(obj) not in specs:
            specs[id(obj)] = repr(obj)
        return specs[id(obj)]

    code = simulator_digest()
    return [hashlib.sha256(json.dumps(
        [code, run.name, run.gpus, spec(run.model), spec(run.hardware), repr(run.plan),
         run.run_days, repr(run.failures)]
    ).encode()).hexdigest()[:24] for run in runs]


def simulator_digest() -> str:
    """SHA-256 (hex) of every Python source file of the zsim package, by relative path."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def run_sweep(scenario: Scenario, out: Path | None = None, *,
              curves: Collection[str] = (), executor: str = "local",
              ray_address: str | None = None, progress: Progress | None = None
              ) -> SweepRows:
    """Simulate every run of `scenario` not already in `out`'s journal.

    Args:
        scenario: the loaded scenario.
        out: folder whose journal (zsim.journal.JOURNAL_NAME) records finished runs and is
            read back first; None: keep nothing, simulate every run.
        curves: names of the runs whose memory curve to keep (for a report's plot).
        executor: "local" (every local core) or "ray" (zsim.executor.run_ray).
        ray_address: the Ray cluster's address (executor "ray"; None: RAY_ADDRESS, else a
            local cluster).
        progress: see Progress.

    Returns:
        Every run's row in scenario order; the same whatever the executor, the number of
        workers, or how often the sweep was interrupted and resumed.

    Raises:
        ConfigError: an unknown executor, ray missing, a journal that cannot be written,
            or a run the simulator does not model (the first in scenario order among those
            simulated; the rows finished before it stay in the journal).
    """
    if executor not in EXECUTORS:
        raise ConfigError("executor", executor, f"must be one of {', '.join(EXECUTORS)}")
    runs = scenario.runs
    ids = plan_ids(runs)
    path = None if out is None else Path(out) / JOURNAL_NAME
    keep = frozenset(curves)
    # A journal row is reused for its run only, and with its memory curve where the
    # report plots it (a report edited to plot more runs recomputes those).
    wanted = {k: run.name in keep for k, run in zip(ids, runs, strict=True)}
    done = {} if path is None else {
        k: e for k, e in read_journal(path).items()
        if k in wanted and (e.get("curve") is not None or not wanted[k])}
    pending = [i for i, k in enumerate(ids) if k not in done]
    if progress is not None:
        progress(len(runs) - len(pending), len(runs), "")
    errors: list[RunOutcome] = []
    finished = len(runs) - len(pending)
    if pending:
        outcomes: Generator[list[RunOutcome], None, None] = (
            run_ray(runs, pending, keep, address=ray_address) if executor == "ray"
            else run_local(runs, pending, keep))
        remaining = set(pending)
        # closing: stopping early shuts the executor down now, not when collected.
        with closing(outcomes), \
                Journal(path) if path is not None else nullcontext() as journal:
            for batch in outcomes:
                entries = [_entry(ids[o.index], o) for o in batch if o.error is None]
                if journal is not None and entries:
                    journal.append(entries)
                done.update((e["id"], e) for e in entries)
                finished += len(entries)
                remaining.difference_update(o.index for o in batch)
                errors += [o for o in batch if o.error is not None]
                if errors:
                    # Stop (dropping the batches not finished, zsim.executor) once every
                    # run before the first rejected one is done, so the error is the one
                    # a serial sweep would stop at, whatever the order batches finish in.
                    first = min(o.index for o in errors)
                    if all(i > first for i in remaining):
                        break
                    continue
                if progress is not None:
                    progress(finished, len(runs), runs[batch[-1].index].name)
    if errors:
        rejected = min(errors, key=lambda o: o.index)
        e = rejected.error
        assert e is not None
        raise ConfigError(e.field, e.value, f"{e.reason} (run {runs[rejected.index].name!r})")
    entries = [done[k] for k in ids]
    return SweepRows(
        rows=tuple(e["row"] for e in entries),
        curves={run.name: tuple((t, b) for t, b in e["curve"])
                for run, e in zip(runs, entries, strict=True) if run.name in keep},
        simulated=len(pending))


def _entry(plan_id: str, outcome: RunOutcome) -> Entry:
    """The journal entry of a finished run: only JSON values, so a row read back from the
    journal and one just computed are the same."""
    return json.loads(json.dumps({"id": plan_id, "row": outcome.row,
                                  "curve": outcome.curve}))

