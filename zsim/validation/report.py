"""The CPU validation report: every case of the grid (zsim.validation.grid) run for real
and in the simulator, compared as zsim.validation.comparison compares one plan, into
validation.csv, step_time_runs.csv, predicted_vs_measured.png and provenance.yaml; a batch
of it (`--only`), a batch of host-independent metrics only (`--no-time`), and the report
predicted again without measuring (`repredict_report`).

Owns the report's protocol: the runs of a case in separate passes over the cases, minutes
apart (REPORT_RUNS), their steps pooled; the profiles it predicts with, one per world size
(a given profile at its own world size, the others calibrated here, or every one
calibrated here between the passes); the merge of a batch's rows into the report; the
provenance of every batch. Imports torch and matplotlib (the plot only).
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from zsim.backend.measured_step import PlanMeasurement, measure_plan
from zsim.calibration.bench_figures import BenchConfig
from zsim.calibration.machine import machine_description
from zsim.calibration.profile_writer import bench_ranks, calibrate, write_profile
from zsim.errors import ConfigError
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.validation.comparison import (
    BOUNDS_PCT,
    MIN_TIMED_S,
    backend_knobs,
    compare,
    metric_row,
    predictions,
    write_csv,
)
from zsim.validation.grid import case_key, grid

REPORT_RUNS = 3
"""Runs of each plan in the report, in separate passes over the grid (minutes apart): the
shared host has slow spells lasting minutes, in which one run of a plan measured up to 20%
slower than another; the report's step time is the median over every run's steps."""

def regenerate_report(profile: HardwareProfile | None, *, out_dir: Path, steps: int = 8,
                      runs: int = REPORT_RUNS, only: tuple[str, ...] = (),
                      keep_time: bool = True, min_timed_s: float = MIN_TIMED_S,
                      calibration_rounds: int | None = None) -> Path:
    """Run (model, plan) cases of the grid for real `runs` times (one pass over the cases
    per run) and in the simulator; write `validation.csv` (step time: the median over all
    runs' timed steps; the other measurements from the first run), `step_time_runs.csv`
    (each run's median step time, the host's run-to-run spread), one
    predicted-vs-measured plot per metric and `provenance.yaml`. Plans at a world size
    other than `profile`'s gpus_per_node are predicted with a profile calibrated at that
    world size (see _profiles_per_world); with `profile` None, every world size is (the
    command's --calibrate-here: a host other than the committed profiles' measures a
    batch consistent with itself). Calibrating here for timed runs, each world size gets
    `calibration_rounds` rounds of the benchmarks (None: 1) before each pass over the
    cases, and its profile is the median over those sessions: the shared host drifts by
    tens of percent over a batch's half hour, and a profile benchmarked before the runs
    would describe its first minutes only. Otherwise each world size is calibrated once,
    before the runs, with `calibration_rounds` rounds (None: BenchConfig's default). Each
    timed run fills at least `min_timed_s` seconds.

    With `only`, a batch: just the cases whose case_key matches one of the fnmatch
    patterns are measured; their rows replace theirs in the existing report, the other
    rows stay, rows of cases no longer in the grid go, and the batch is appended to the
    provenance's batches. Without `keep_time` the batch runs the two memory steps only
    (no timed step), keeps the host-independent metrics (memory, state, activations) and
    predicts with the profiles already in out_dir (with `profile` None, with ones
    calibrated anew): for a host other than the one the profiles were calibrated on,
    whose step times say nothing about the simulator.

    Returns:
        The CSV path.

    Raises:
        ConfigError: no case matches `only`.
    """
    import fnmatch

    out_dir.mkdir(parents=True, exist_ok=True)
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
    spread = _SpreadCalibration(worlds, out_dir, backend=backend,
                                rounds=calibration_rounds or 1) if (
        profile is None and keep_time) else None
    profiles = {} if spread is not None else _profiles_per_world(
        profile, worlds, out_dir, backend=backend,
        reuse=not keep_time and profile is not None, rounds=calibration_rounds)
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
    rows: list[dict[str, Any]] = []
    for (spec, plan), done in zip(cases, measured, strict=True):
        rows += compare(spec, plan, profiles[plan.world_size], done[0].pooled(*done[1:]),
                        times=keep_time)
    runs_rows = _runs_rows(cases, measured) if keep_time else []
    csv_path, runs_path = out_dir / "validation.csv", out_dir / "step_time_runs.csv"
    if only:
        order = [case_key(spec, plan) for spec, plan in every]
        batch_keys = {case_key(spec, plan) for spec, plan in cases}
        rows = _merge(_read_csv(csv_path), rows, order, batch_keys)
        # A batch without step times drops its cases' old runs (they timed what its rows
        # no longer describe) and adds none.
        runs_rows = _merge(_read_csv(runs_path), runs_rows, order, batch_keys)
    path = write_csv(rows, csv_path)
    write_csv(runs_rows, runs_path, RUN_FIELDS)
    _plot(rows, out_dir)
    batch = {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"zsim validate grid --out {out_dir} --runs {runs}"
                   + (" --calibrate-here" if profile is None else "")
                   + (f" --calibration-rounds {calibration_rounds}"
                      if calibration_rounds is not None else "")
                   + (f" --steps {steps}" if keep_time else " --no-time")
                   + (f" --min-timed-s {min_timed_s:g}"
                      if keep_time and min_timed_s != MIN_TIMED_S else "")
                   + "".join(f" --only '{pat}'" for pat in only),
        "torch": str(torch.__version__),
        "machine": machine_description(),
        "profiles": {n: p.name for n, p in profiles.items()},
        "calibration": (f"{spread.config.rounds} round(s) of the benchmarks per world size "
                        f"before each of the {runs} passes over the cases, each profile the "
                        f"median over them" if spread is not None else "before the runs"),
        "runs_per_plan": runs,
        "min_timed_s_per_run": min_timed_s if keep_time else 0.0,
        "metrics": "all" if keep_time else "host-independent only (memory, state, "
                                            "activations; no step, forward or comm time)",
        "cases": [case_key(spec, plan) for spec, plan in cases] if only else len(cases),
    }
    _write_provenance(out_dir / "provenance.yaml", batch, knobs, append=bool(only))
    return path


def repredict_report(profile: HardwareProfile, *, out_dir: Path) -> Path:
    """The report in `out_dir` predicted again by the simulator as it is now, its
    measured figures kept (the real runs are not repeated): for a change of the model
    that moves predictions. Each case is predicted as regenerate_report predicts it
    (`profile` at its world size, the profiles already in out_dir at the others); rows of
    cases no longer in the grid stay as they are. The re-prediction is appended to the
    provenance's batches.

    Returns:
        The CSV path.
    """
    csv_path = out_dir / "validation.csv"
    rows = _read_csv(csv_path)
    knobs = backend_knobs("cpu")
    cases = {case_key(s, p): (s, p) for s, p in ((replace(m, **knobs), p) for m, p in grid())}
    keys = [f"{r['model']} {r['plan']} n{r['nproc']}" for r in rows]
    worlds = sorted({cases[k][1].world_size for k in keys if k in cases})
    profiles = _profiles_per_world(profile, worlds, out_dir, backend="gloo", reuse=True)
    made: dict[str, tuple[dict[str, float | None] | None, str]] = {}
    out = []
    for key, row in zip(keys, rows, strict=True):
        if key not in cases:
            out.append(row)
            continue
        spec, plan = cases[key]
        if key not in made:
            made[key] = predictions(spec, plan, profiles[plan.world_size],
                                    backend=row["backend"])
        predicted, note = made[key]
        common = {k: row[k] for k in ("model", "plan", "nproc", "backend")}
        out.append(metric_row(common, row["metric"], predicted, row["measured"], note))
    path = write_csv(out, csv_path)
    _plot(out, out_dir)
    batch = {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"zsim validate grid --out {out_dir} --repredict",
        "profiles": {n: p.name for n, p in profiles.items()},
        "metrics": "predictions made again; measured figures kept from the batches above",
        "cases": sorted(made),
    }
    _write_provenance(out_dir / "provenance.yaml", batch, knobs, append=True)
    return path


def _write_provenance(path: Path, batch: dict[str, Any], knobs: dict[str, Any], *,
                      append: bool) -> None:
    """provenance.yaml: the kernel knobs, the bounds, and every batch that measured rows
    of the report (a full regeneration starts the list again)."""
    import yaml

    batches = []
    if append and path.is_file():
        old = yaml.safe_load(path.read_text())
        # A report from before batches was one full pass, described at the top level.
        batches = old.get("batches") or [{k: v for k, v in old.items()
                                          if k not in ("kernel_knobs", "bounds_pct")}]
    path.write_text(yaml.safe_dump({"kernel_knobs": knobs, "bounds_pct": BOUNDS_PCT,
                                    "batches": [*batches, batch]}, sort_keys=False))


RUN_FIELDS = ("model", "plan", "nproc", "run", "steps", "step_time_s", "vs_median_run_pct")
"""Columns of step_time_runs.csv."""


def _runs_rows(cases: list[tuple[ModelSpec, Plan]],
               measured: list[list[PlanMeasurement]]) -> list[dict[str, Any]]:
    """Each run's median step time per plan, and its deviation from the median run."""
    rows = []
    for (spec, plan), done in zip(cases, measured, strict=True):
        mid = statistics.median(m.step_time_s for m in done)
        rows += [{"model": spec.name, "plan": plan.label, "nproc": plan.world_size,
                  "run": run, "steps": len(m.ranks[0].step_times_s),
                  "step_time_s": f"{m.step_time_s:.6g}",
                  "vs_median_run_pct": f"{100 * (m.step_time_s - mid) / mid:+.1f}"}
                 for run, m in enumerate(done, start=1)]
    return rows


def _row_key(row: dict[str, Any]) -> str:
    """case_key of a CSV row."""
    return f"{row['model']} {row['plan']} n{row['nproc']}"


def _read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a report CSV, numbers parsed back, an empty cell as None (none if the file
    does not exist)."""
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        rows: list[dict[str, Any]] = list(csv.DictReader(f))
    for row in rows:
        row["nproc"] = int(row["nproc"])
        for k in ("predicted", "measured", "error_pct"):
            if k in row:
                row[k] = float(row[k]) if row[k] != "" else None
    return rows


def _merge(old: list[dict[str, Any]], new: list[dict[str, Any]], order: list[str],
           batch: set[str]) -> list[dict[str, Any]]:
    """The report's rows after a batch: the old rows of the batch's cases give way to
    `new`, old rows of cases no longer in the grid (`order`) go; sorted by the grid's
    order, each case's rows in their own order."""
    rank = {key: i for i, key in enumerate(order)}
    kept = [r for r in old if _row_key(r) in rank and _row_key(r) not in batch]
    return sorted(kept + new, key=lambda r: rank[_row_key(r)])


class _SpreadCalibration:
    """Benchmark sessions at each world size, run between the passes over the cases
    (session()), and the profiles they give (profiles(): each rank's figures the median
    over the sessions, zsim.calibration.profile_writer.write_profile)."""

    def __init__(self, worlds: list[int], out_dir: Path, *, backend: str,
                 rounds: int) -> None:
        self.worlds, self.out_dir, self.backend = worlds, out_dir, backend
        self.config = BenchConfig(rounds=rounds)
        self.sessions: dict[int, list[Any]] = {n: [] for n in worlds}
        self.started = datetime.now(timezone.utc)

    def session(self) -> None:
        for n in self.worlds:
            self.sessions[n].append(bench_ranks(self.backend, n, config=self.config))

    def profiles(self) -> dict[int, HardwareProfile]:
        out = {}
        for n, sessions in self.sessions.items():
            path = write_profile(sessions, backend=self.backend, nproc=n,
                                 out=self.out_dir / f"calibrated-{self.backend}-n{n}.yaml",
                                 started=self.started, config=self.config)
            out[n] = HardwareProfile.from_yaml(path)
        return out


def _profiles_per_world(profile: HardwareProfile | None, world_sizes: list[int],
                        out_dir: Path, *, backend: str, reuse: bool = False,
                        rounds: int | None = None) -> dict[int, HardwareProfile]:
    """`profile` for the world size it was measured at (its gpus_per_node); for other
    world sizes, or every one when `profile` is None, a profile calibrated here at that
    many ranks (written to out_dir), since on one host the ranks share its cores and
    links, so per-rank rates depend on N; `rounds` of the benchmarks (None: BenchConfig's
    default). With `reuse`, one already in out_dir is read instead of calibrated again."""
    out: dict[int, HardwareProfile] = {}
    for n in world_sizes:
        path = out_dir / f"calibrated-{backend}-n{n}.yaml"
        if profile is not None and n == profile.gpus_per_node:
            out[n] = profile
            continue
        if not (reuse and path.is_file()):
            path = calibrate(backend, n, path,
                             config=None if rounds is None else BenchConfig(rounds=rounds))
        out[n] = HardwareProfile.from_yaml(path)
    return out


def _plot(rows: list[dict[str, Any]], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    rows = [r for r in rows if r["predicted"] is not None]  # measured-only rows: no point
    metrics = sorted({r["metric"] for r in rows})
    cols = 4
    nrows = -(-len(metrics) // cols)
    fig = Figure(figsize=(4.5 * cols, 4.2 * nrows))
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    for ax, metric in zip(axes, metrics, strict=False):
        sel = [r for r in rows if r["metric"] == metric]
        for nproc, marker in ((2, "o"), (4, "s")):
            pts = [r for r in sel if r["nproc"] == nproc]
            ax.scatter([r["measured"] for r in pts], [r["predicted"] for r in pts],
                       marker=marker, label=f"world {nproc}")
        lo = min(min(r["measured"], r["predicted"]) for r in sel)
        hi = max(max(r["measured"], r["predicted"]) for r in sel)
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, label="predicted = measured")
        bound = BOUNDS_PCT.get(metric)
        if bound:
            for sign in (1, -1):
                f = 1 + sign * bound / 100
                ax.plot([lo, hi], [lo * f, hi * f], color="grey", linewidth=0.8,
                        linestyle="--", label=f"+-{bound:g}%" if sign > 0 else None)
        if hi > 10 * lo:  # log axes across decades, labelled at decades only
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"measured {metric}")
        ax.set_ylabel(f"predicted {metric}")
        ax.set_title(metric + (f" (bound {bound:g}%)" if bound else ""))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "predicted_vs_measured.png", dpi=100)
