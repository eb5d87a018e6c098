"""The CPU validation report: cases of the grid (zsim.validation.grid) run for real and in
the simulator, compared as zsim.validation.comparison compares one plan, into a batch of
the committed evidence (zsim.validation.evidence: the long table, the runs behind each
step time, the batch's passes and profiles); a batch of some cases (`--only`), of
host-independent metrics only (`--no-time`); and every batch predicted again without
measuring (`repredict_report`).

Owns the report's protocol: the runs of a case in separate passes over the cases, minutes
apart (REPORT_RUNS), their steps pooled; the profiles it predicts with, one per world size
(a given profile at its own world size, the others calibrated here, or every one
calibrated here between the passes); the merge of a pass's rows into its batch; the
record of each pass. Imports torch.
"""

from __future__ import annotations

import shutil
import statistics
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from zsim.backend.measured_step import PlanMeasurement, measure_plan
from zsim.calibration.bench_figures import BenchConfig
from zsim.calibration.machine import git_commit, machine_description
from zsim.calibration.profile_writer import bench_ranks, calibrate, write_profile
from zsim.errors import ConfigError
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import PROFILES_DIR, resolve_hardware
from zsim.validation import evidence
from zsim.validation.comparison import (
    BOUNDS_PCT,
    MIN_TIMED_S,
    backend_knobs,
    compare,
    metric_row,
    predictions,
)
from zsim.validation.evidence import Batch, Row
from zsim.validation.grid import case_key, grid

REPORT_RUNS = 3
"""Runs of each plan in the report, in separate passes over the grid (minutes apart): the
shared host has slow spells lasting minutes, in which one run of a plan measured up to 20%
slower than another; the report's step time is the median over every run's steps."""

GRID_BATCH = "validation"
"""The batch `zsim validate grid` measures into by default: the grid report's own."""

def regenerate_report(profile: str | None, *, out_dir: Path, batch: str = GRID_BATCH,
                      report: str | None = None, steps: int = 8, runs: int = REPORT_RUNS,
                      only: tuple[str, ...] = (), keep_time: bool = True,
                      min_timed_s: float = MIN_TIMED_S,
                      calibration_rounds: int | None = None) -> Path:
    """Run (model, plan) cases of the grid for real `runs` times (one pass over the cases
    per run) and in the simulator, into batch `batch` of the evidence folder `out_dir`
    (zsim.validation.evidence): its rows of the table (step time: the median over all
    runs' timed steps; the other measurements from the first run), each run's median step
    time (the host's run-to-run spread), the profiles it predicts with and a pass saying
    when, where (commit, host) and how it measured. Plans at a world size other than
    `profile`'s gpus_per_node are predicted with a profile calibrated at that world size
    (see _profiles_per_world); with `profile` None, every world size is (the command's
    --calibrate-here: a host other than the committed profiles' measures a batch
    consistent with itself). Calibrating here for timed runs, each world size gets
    `calibration_rounds` rounds of the benchmarks (None: 1) before each pass over the
    cases, and its profile is the median over those sessions: the shared host drifts by
    tens of percent over a batch's half hour, and a profile benchmarked before the runs
    would describe its first minutes only. Otherwise each world size is calibrated once,
    before the runs, with `calibration_rounds` rounds (None: BenchConfig's default). Each
    timed run fills at least `min_timed_s` seconds.

    A batch not in the folder yet joins `report` (None: a report of its own name), held to
    no bounds until a person says so in batches.yaml. With `only`, just the cases whose
    case_key matches one of the fnmatch patterns are measured: their rows replace theirs
    in the batch, the batch's other rows stay, its rows of cases no longer in the grid go,
    and the pass is added to the batch's (a pass none of whose rows is left is dropped).
    Without, the batch's rows are all replaced. Without `keep_time` the pass runs the two
    memory steps only (no timed step), keeps the host-independent metrics (memory, state,
    activations) and predicts with the batch's profiles where it has them (with `profile`
    None, with ones calibrated anew): for a host other than the one the profiles were
    calibrated on, whose step times say nothing about the simulator.

    Args:
        profile: a shipped profile's name or a profile YAML (None: calibrate here).

    Returns:
        The table's path.

    Raises:
        ConfigError: no case matches `only`, a bad batch name, or `report` naming another
            report than the batch's.
    """
    import fnmatch

    evidence.check_name(batch)
    out_dir = Path(out_dir)
    batches = evidence.read_batches(out_dir) if (out_dir / evidence.BATCHES).is_file() else []
    old = next((b for b in batches if b.name == batch), None)
    if old is not None and report is not None and report != old.report:
        raise ConfigError("report", report, f"batch {batch} belongs to report {old.report}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    knobs = backend_knobs(device)
    every = [(replace(model, **knobs), plan) for model, plan in grid()]
    cases = [(spec, plan) for spec, plan in every
             if not only or any(fnmatch.fnmatchcase(case_key(spec, plan), pat) for pat in only)]
    if not cases:
        raise ConfigError("only", " ".join(only), "matches no case of the grid")
    worlds = sorted({p.world_size for _, p in cases})
    backend = "nccl" if device == "cuda" else "gloo"
    # Calibrating here for timed runs: a round of the benchmarks before each pass, so
    # that each profile samples the host over the minutes its runs take.
    spread = _SpreadCalibration(worlds, out_dir, batch, backend=backend,
                                rounds=calibration_rounds or 1) if (
        profile is None and keep_time) else None
    profiles = {} if spread is not None else _profiles_per_world(
        profile, worlds, out_dir, batch, backend=backend,
        reuse=old if not keep_time and profile is not None else None,
        rounds=calibration_rounds)
    measured: list[list[PlanMeasurement]] = [[] for _ in cases]
    for run in range(runs):
        if spread is not None:
            spread.session()
            print(f"run {run + 1}/{runs}: calibrated {', '.join(f'n{n}' for n in worlds)}",
                  flush=True)
        for (spec, plan), done in zip(cases, measured, strict=True):
            # Without times: the two memory steps only, no warm-up or timed step.
            done.append(measure_plan(spec, plan, nproc=plan.world_size,
                                     steps=steps if keep_time else 0,
                                     warmup_steps=1 if keep_time else 0,
                                     min_timed_s=min_timed_s if keep_time else 0.0))
            print(f"run {run + 1}/{runs}: measured {case_key(spec, plan)}", flush=True)
    if spread is not None:
        profiles = spread.profiles()
    stamp = _now()
    rows: list[Row] = []
    for (spec, plan), done in zip(cases, measured, strict=True):
        rows += [_table_row(r, batch, stamp)
                 for r in compare(spec, plan, profiles[plan.world_size][0],
                                  done[0].pooled(*done[1:]), times=keep_time)]
    runs_rows = _runs_rows(batch, cases, measured) if keep_time else []
    table = evidence.by_batch(evidence.read_table(out_dir))
    runs_table = evidence.by_batch(evidence.read_runs(out_dir))
    order = [case_key(spec, plan) for spec, plan in every]
    measured_keys = {case_key(spec, plan) for spec, plan in cases}
    # A batch without step times drops its cases' old runs (they timed what its rows no
    # longer describe) and adds none.
    table[batch] = _merge(table.get(batch, []) if only else [], rows, order, measured_keys)
    runs_table[batch] = _merge(runs_table.get(batch, []) if only else [], runs_rows, order,
                               measured_keys)
    command = (f"zsim validate grid --out {out_dir} --batch {batch}"
               + (f" --report {report}" if report is not None else "")
               + (f" --profile {profile}" if profile is not None else " --calibrate-here")
               + f" --runs {runs}"
               + (f" --calibration-rounds {calibration_rounds}"
                  if calibration_rounds is not None else "")
               + (f" --steps {steps}" if keep_time else " --no-time")
               + (f" --min-timed-s {min_timed_s:g}"
                  if keep_time and min_timed_s != MIN_TIMED_S else "")
               + "".join(f" --only '{pat}'" for pat in only))
    commit = git_commit()
    this = {
        "time_utc": stamp, "commit": commit[:7] if commit else None,
        "host": machine_description(), "command": command, "torch": str(torch.__version__),
        "runs_per_plan": runs, "min_timed_s_per_run": min_timed_s if keep_time else 0.0,
        "calibration": (f"{spread.config.rounds} round(s) of the benchmarks per world size "
                        f"before each of the {runs} passes over the cases, each profile the "
                        f"median over them" if spread is not None else "before the runs"),
        "metrics": "all" if keep_time else "host-independent only (memory, state, "
                                            "activations; no step, forward or comm time)",
        "cases": len(cases),
    }
    times = {r["time_utc"] for r in table[batch]}
    kept = [p for p in (old.passes if old is not None and only else ())
            if p["time_utc"] in times and p["time_utc"] != stamp]
    passes = (*kept, this)
    new = Batch(name=batch, report=old.report if old is not None else report or batch,
                bounds=old.bounds if old is not None else "not held",
                why=old.why if old is not None else "",
                about=old.about if old is not None else "",
                cases=len({evidence.case_key(r) for r in table[batch]}), kernel_knobs=knobs,
                profiles=dict(sorted({**(old.profiles if old is not None else {}),
                                      **{n: ref for n, (_, ref) in profiles.items()}}.items())),
                passes=passes)
    batches = [new if b.name == batch else b for b in batches] + ([] if old else [new])
    evidence.write(out_dir, batches, table, runs_table)
    return out_dir / evidence.TABLE


def repredict_report(*, out_dir: Path, batches: tuple[str, ...] = ()) -> Path:
    """The batches `batches` (all: every batch) of the evidence folder `out_dir` predicted
    again by the simulator as it is now, each with its own profiles, their measured
    figures kept (the real runs are not repeated): for a change of the model that moves
    predictions. Rows of cases not in the grid (no longer, or never: a GPU report's) stay
    as they are.

    Returns:
        The table's path.

    Raises:
        ConfigError: an unknown batch, or a batch without a profile at a world size it has
            grid rows of.
    """
    out_dir = Path(out_dir)
    every = evidence.read_batches(out_dir)
    chosen = [evidence.batch_of(every, name) for name in batches] if batches else every
    table = evidence.by_batch(evidence.read_table(out_dir))
    knobs = backend_knobs("cpu")
    cases = {case_key(s, p): (s, p) for s, p in ((replace(m, **knobs), p) for m, p in grid())}
    for b in chosen:
        profiles = evidence.batch_profiles(out_dir, b)
        made: dict[str, tuple[dict[str, float | None] | None, str]] = {}
        out = []
        for row in table.get(b.name, []):
            key = evidence.case_key(row)
            if key not in cases:
                out.append(row)
                continue
            spec, plan = cases[key]
            if plan.world_size not in profiles:
                raise ConfigError(f"batches.{b.name}.profiles", sorted(profiles),
                                  f"has no profile for world size {plan.world_size}")
            if key not in made:
                made[key] = predictions(spec, plan, profiles[plan.world_size],
                                        backend=row["backend"])
            predicted, note = made[key]
            common = {k: row[k] for k in ("model", "plan", "nproc", "backend")}
            out.append(_table_row(metric_row(common, row["metric"], predicted,
                                             row["measured"], note),
                                  b.name, row["time_utc"]))
        table[b.name] = out
    evidence.write(out_dir, every, table, evidence.by_batch(evidence.read_runs(out_dir)))
    return out_dir / evidence.TABLE


def _now() -> str:
    """This minute, as a pass's time_utc ('YYYY-MM-DD HH:MM', UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")


def _table_row(row: Row, batch: str, time_utc: str) -> Row:
    """A comparison row (zsim.validation.comparison.metric_row) as a row of the table."""
    return {"batch": batch, "time_utc": time_utc, **row, "run": "",
            "bound_pct": BOUNDS_PCT.get(row["metric"])}


def _runs_rows(batch: str, cases: list[tuple[ModelSpec, Plan]],
               measured: list[list[PlanMeasurement]]) -> list[Row]:
    """Each run's median step time per plan, and its deviation from the median run."""
    rows = []
    for (spec, plan), done in zip(cases, measured, strict=True):
        mid = statistics.median(m.step_time_s for m in done)
        rows += [{"batch": batch, "model": spec.name, "plan": plan.label,
                  "nproc": plan.world_size, "run": run, "steps": len(m.ranks[0].step_times_s),
                  "step_time_s": f"{m.step_time_s:.6g}",
                  "vs_median_run_pct": f"{100 * (m.step_time_s - mid) / mid:+.1f}"}
                 for run, m in enumerate(done, start=1)]
    return rows


def _merge(old: list[Row], new: list[Row], order: list[str], batch: set[str]) -> list[Row]:
    """A batch's rows after a pass: the old rows of the pass's cases give way to `new`,
    old rows of cases no longer in the grid (`order`) go; sorted by the grid's order,
    each case's rows in their own order."""
    rank = {key: i for i, key in enumerate(order)}
    kept = [r for r in old if evidence.case_key(r) in rank
            and evidence.case_key(r) not in batch]
    return sorted(kept + new, key=lambda r: rank[evidence.case_key(r)])


class _SpreadCalibration:
    """Benchmark sessions at each world size, run between the passes over the cases
    (session()), and the profiles they give (profiles(): each rank's figures the median
    over the sessions, zsim.calibration.profile_writer.write_profile), written into the
    evidence folder's profiles/ as <batch>-n<N>.yaml."""

    def __init__(self, worlds: list[int], out_dir: Path, batch: str, *, backend: str,
                 rounds: int) -> None:
        self.worlds, self.out_dir, self.batch, self.backend = worlds, out_dir, batch, backend
        (out_dir / evidence.PROFILES).mkdir(parents=True, exist_ok=True)
        self.config = BenchConfig(rounds=rounds)
        self.sessions: dict[int, list[Any]] = {n: [] for n in worlds}
        self.started = datetime.now(timezone.utc)

    def session(self) -> None:
        for n in self.worlds:
            self.sessions[n].append(bench_ranks(self.backend, n, config=self.config))

    def profiles(self) -> dict[int, tuple[HardwareProfile, str]]:
        out = {}
        for n, sessions in self.sessions.items():
            ref = _calibrated_ref(self.batch, n)
            path = write_profile(sessions, backend=self.backend, nproc=n,
                                 out=self.out_dir / ref, started=self.started,
                                 config=self.config)
            out[n] = (HardwareProfile.from_yaml(path), ref)
        return out


def _calibrated_ref(batch: str, world: int) -> str:
    """Where a batch's profile of one world size lies, relative to the evidence folder."""
    return f"{evidence.PROFILES}/{batch}-n{world}.yaml"


def _profiles_per_world(profile: str | None, world_sizes: list[int], out_dir: Path,
                        batch: str, *, backend: str, reuse: Batch | None = None,
                        rounds: int | None = None
                        ) -> dict[int, tuple[HardwareProfile, str]]:
    """Each world size's profile and its reference in batches.yaml
    (zsim.validation.evidence.Batch.profiles): `profile` for the world size it was
    measured at (its gpus_per_node; a shipped one by name, a file copied into the
    evidence folder); for other world sizes, or every one when `profile` is None, a
    profile calibrated here at that many ranks, since on one host the ranks share its
    cores and links, so per-rank rates depend on N; `rounds` of the benchmarks (None:
    BenchConfig's default). With `reuse`, that batch's own profile of a world size is
    read instead of calibrated again.

    Raises:
        ConfigError: an unknown profile.
    """
    given = None if profile is None else resolve_hardware(profile)
    (out_dir / evidence.PROFILES).mkdir(parents=True, exist_ok=True)
    out: dict[int, tuple[HardwareProfile, str]] = {}
    for n in world_sizes:
        if given is not None and n == given.gpus_per_node:
            ref = profile if (PROFILES_DIR / f"{profile}.yaml").is_file() else None
            if ref is None:
                ref = _calibrated_ref(batch, n)
                if Path(str(profile)).resolve() != (out_dir / ref).resolve():
                    shutil.copyfile(str(profile), out_dir / ref)
            out[n] = (given, str(ref))
            continue
        if reuse is not None and n in reuse.profiles:
            ref = reuse.profiles[n]
            out[n] = (HardwareProfile.from_yaml(evidence.profile_path(out_dir, ref)), ref)
            continue
        ref = _calibrated_ref(batch, n)
        path = calibrate(backend, n, out_dir / ref,
                         config=None if rounds is None else BenchConfig(rounds=rounds))
        out[n] = (HardwareProfile.from_yaml(path), ref)
    return out
