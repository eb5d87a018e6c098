"""Runs measured one world size per process within a wall-clock budget: the one runner of
the GPU validation report's runs (zsim.validation.gpu_report) and of the per-phase profile
(zsim.validation.gpu_phases).

Owns the budget's split and the loop in the process. The runs of one Group share a process
(rank 0 of N on the fake process group, or one real rank: NCCL, gloo without CUDA); the
groups run in turn, each with a share of the time left before `until` weighted by its
runs' estimated seconds plus a process's start-up (so a slow group cannot starve the
ones after it). A group whose share cannot fit its start-up and its cheapest run, or
whose library is not installed, is skipped. In the process a run starts only if its
estimate, scaled by how much longer than estimated the group's finished runs took (never
below 1), fits before the share's end; a run that fails is recorded with its error and
the next one goes on. Each run's record (status ok, skipped, error or missing, the
measure's figures, seconds) is appended to a JSON-lines file as it ends, so that a
process that dies keeps what came before it; a process still running at `stop_at` is
stopped, and the runs it never reported on are recorded as missing. Imports torch.
"""

from __future__ import annotations

import gc
import importlib.util
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zsim.backend.runner import (
    Deadline,
    RankContext,
    RankFailed,
    append_jsonl,
    read_jsonl,
    run_fake_rank,
    run_ranks,
)
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One measured run: a model and plan, and how it runs."""

    name: str
    spec: ModelSpec
    plan: Plan
    tf32: bool = False
    """fp32 storage with TF32 matmuls (the simulator has no such precision yet)."""
    published: str = ""
    """The run of tests/data/cases/h200-fsdp2-runs.yaml with the same model and plan."""
    estimate_s: float = 15.0
    """Expected seconds on an H200, its build, steps and analysis included (the report's
    runs of these models took 6-9 s for about ten steps)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """Runs that share one process: one world size and backend."""

    key: str
    backend: str
    """"real" (world 1 on NCCL, gloo without CUDA) or "fake" (rank 0 of world_size)."""
    world_size: int
    runs: tuple[Run, ...]
    needs: str = ""
    """A module that must be importable (else the runs are skipped)."""


Measure = Callable[[RankContext, Run], dict[str, Any]]
"""Measures one run in the group's process and returns its figures; a module-level
function or a functools.partial of one (it is pickled into the process)."""

STARTUP_S = 8.0
"""A process's start-up (torch import, CUDA and process group initialisation), seconds
(18 runs in 4 processes of the GPU report on the H200 took 33 s beyond their runs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _GroupJob:
    runs: tuple[Run, ...]
    measure: Measure
    deadline: Deadline
    """When the group's share ends: no run starts that would not fit before it."""
    log_path: str


def run_groups(groups: list[Group], measure: Measure, *, until: float, stop_at: float,
               log_path: Path, log: Callable[[str], None]
               ) -> list[tuple[Run, Group, dict[str, Any]]]:
    """Every group's runs, each group in its own process (see the module docstring), their
    records appended to `log_path` (emptied first).

    Args:
        groups: the groups, in the order they run.
        measure: what measures a run in its process.
        until: when the last group's share ends (time.time() seconds).
        stop_at: when a process still running is stopped (time.time() seconds).
        log_path: the JSON-lines file of the runs' records.
        log: progress lines.

    Returns:
        (run, its group, its record) for every run of every group, in order.
    """
    log_path.unlink(missing_ok=True)
    out: list[tuple[Run, Group, dict[str, Any]]] = []
    for i, group in enumerate(groups):
        cost = [STARTUP_S + sum(r.estimate_s for r in g.runs) for g in groups[i:]]
        share = Deadline(time.time() + max(until - time.time(), 0.0) * cost[0] / sum(cost))
        failure = ""
        if group.needs and importlib.util.find_spec(group.needs) is None:
            failure = f"skipped: {group.needs} is not installed"
        elif not share.allows(STARTUP_S + min(r.estimate_s for r in group.runs)):
            failure = "skipped: time budget spent"
        else:
            log(f"group {group.key}: {', '.join(r.name for r in group.runs)} "
                f"({share.left_s():.0f} s share)")
            job = _GroupJob(runs=group.runs, measure=measure, deadline=share,
                            log_path=str(log_path))
            timeout_s = max(stop_at - time.time(), 1.0)
            try:
                if group.backend == "fake":
                    run_fake_rank(_run_group, job, world_size=group.world_size,
                                  timeout_s=timeout_s)
                else:
                    run_ranks(_run_group, job, nproc=1, timeout_s=timeout_s,
                              backend="nccl" if torch.cuda.is_available() else "gloo")
            except RankFailed as e:
                failure = f"error: the group's process failed: {str(e)[-1500:]}"
                log(f"group {group.key} failed: {str(e)[-300:]}")
        done = {r["run"]: r for r in read_jsonl(log_path)}
        for run in group.runs:
            if run.name not in done:
                done[run.name] = {"run": run.name, "world_size": group.world_size,
                                  "status": "skipped" if failure.startswith("skipped")
                                  else "missing", "note": failure or "no result"}
                append_jsonl(str(log_path), done[run.name])
            out.append((run, group, done[run.name]))
    return out


def _run_group(ctx: RankContext, job: _GroupJob) -> int:
    """Rank function: the job's runs in turn, each one's record appended to job.log_path
    as it ends. Returns the number of runs measured."""
    slowdown = 1.0
    measured = 0
    for run in job.runs:
        start = time.time()
        need_s = run.estimate_s * slowdown
        record: dict[str, Any] = {"run": run.name, "world_size": ctx.world_size}
        if not job.deadline.allows(need_s):
            record |= {"status": "skipped",
                       "note": f"skipped: time budget spent ({need_s:.0f} s needed, "
                               f"{max(job.deadline.left_s(), 0):.0f} s left in its share)"}
        else:
            try:
                record |= {"status": "ok", **job.measure(ctx, run)}
                slowdown = max(slowdown, (time.time() - start) / run.estimate_s)
                measured += 1
            except Exception as e:  # one failed run must not end the group
                record |= {"status": "error",
                           "note": f"error: {type(e).__name__}: {e} | "
                                   + traceback.format_exc(limit=-4).replace("\n", " ")}
        record["seconds"] = round(time.time() - start, 2)
        append_jsonl(job.log_path, record)
        print(f"  [{ctx.backend} n={ctx.world_size}] {run.name}: {record['status']} "
              f"({record['seconds']} s)", flush=True)
        gc.collect()
        if ctx.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return measured
