"""The entry points of `zsim validate`: how far the simulator is from real runs. cli.py
calls these as it calls zsim.api (resolve names, run, return plain data; no printing).

Commands and what they call: `plan` (zsim.validation.comparison: one plan for real and in
the simulator), `grid` (zsim.validation.report: a batch of the CPU report over the grid of
cases into the evidence folder, zsim.validation.evidence, or every batch's re-prediction),
`figures` (zsim.validation.figures: every figure of the evidence), `gpu-report`
(zsim.validation.gpu_report: the rows one GPU can host, with the GPU fit's measurements),
`published-runs` (zsim.validation.published_runs: the published H200 runs replayed),
`error-budget` (zsim.validation.error_budget: where the CPU batches' step-time error comes
from), `checkpoint` (zsim.validation.checkpoints: real checkpoint saves and loads against
the checkpoint model), `moe-ep` (zsim.validation.moe_ep: the expert-parallel MoE
backend measured).
Imports no torch (an optional extra of zsim): the modules it calls, inside its
functions, do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zsim.api import build_plan
from zsim.errors import ConfigError
from zsim.spec.registry import resolve_hardware, resolve_model


def plan(*, model: str, nproc: int, strategy: str, shard_group: int | None = None,
         profile: str = "local-cpu", seq: int | None = None, micro_batch: int = 1,
         grad_accum: int = 1, ac: str = "none", precision: str = "bf16",
         offload: str = "none", impl: str | None = None, steps: int | None = None,
         out: Path | None = None) -> dict[str, Any]:
    """Run one plan for real on `nproc` processes and in the simulator with a calibrated
    profile; compare; with `out`, also write the rows there as a CSV. The model is the
    one this machine can run (zsim.validation.comparison.for_this_machine: on a machine
    without CUDA, a large preset scaled to d_model 256 with every layer kept, and a
    default sequence of 256 tokens). The real run times `steps` steps, or by default as
    many as fill zsim.validation.comparison.MIN_TIMED_S (3 at least).

    Returns:
        {"model", "profile", "plan", "rows": [{metric, predicted, measured, error_pct,
        bound_pct, note}], "written": the CSV path or None}; predicted and error_pct
        are None, and the note says why, for a plan the simulator does not model yet.

    Raises:
        ConfigError: invalid names, sizes or combinations.
        RankFailed: the real run crashed or hung (the message carries the rank's error).
    """
    from zsim.validation.comparison import BOUNDS_PCT, csv_name, for_this_machine, validate_plan

    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or steps < 1):
        raise ConfigError("steps", steps, "must be a positive integer")
    spec = resolve_model(model)
    hw = resolve_hardware(profile)
    spec, seq = for_this_machine(spec, seq)
    if strategy == "hsdp" and shard_group is None:
        shard_group = max(1, nproc // 2)
    run_plan = build_plan(spec, gpus=nproc, strategy=strategy, shard_group=shard_group,
                          seq=seq, micro_batch=micro_batch, grad_accum=grad_accum, ac=ac,
                          precision=precision, offload=offload, impl=impl)
    timing = {} if steps is None else {"steps": steps, "min_timed_s": 0.0}
    rows = validate_plan(spec, run_plan, nproc=nproc, profile=hw, out_dir=out, **timing)
    written = None if out is None else str(Path(out) / csv_name(spec, run_plan))
    return {"model": spec.name, "profile": hw.name, "plan": run_plan.label, "written": written,
            "rows": [{"metric": r["metric"], "predicted": r["predicted"],
                      "measured": r["measured"], "error_pct": r["error_pct"],
                      "bound_pct": BOUNDS_PCT.get(r["metric"]), "note": r["note"]}
                     for r in rows]}


def grid(*, out: Path, profile: str | None = None, calibrate_here: bool = False,
         only: Sequence[str] = (), no_time: bool = False, runs: int | None = None,
         steps: int = 8, calibration_rounds: int | None = None,
         min_timed_s: float | None = None, repredict: bool = False,
         batch: str | None = None, report: str | None = None) -> dict[str, Any]:
    """Measure a batch of the CPU validation report into the evidence folder `out`
    (zsim.validation.report, zsim.validation.evidence): every case of the grid, or those
    `only` names; or, with `repredict`, predict its batches again with the measured
    figures kept. Then draw every figure of the folder again (zsim.validation.figures).

    Args:
        out: the evidence folder (the repository's is reports/validation).
        profile: calibrated hardware profile (name or YAML path) of its own world size;
            the batch's other world sizes are calibrated here (None: local-cpu).
        calibrate_here: calibrate every world size of the batch on this host instead of
            using a profile (for a host other than the committed profiles').
        only: fnmatch patterns of '<model> <plan label> n<N>': measure only those cases,
            their rows replacing theirs in the batch.
        no_time: keep only host-independent metrics (memory, state, activations).
        runs: runs of each case (None: zsim.validation.report.REPORT_RUNS).
        steps: timed steps per run, at least.
        calibration_rounds: rounds of the benchmarks of each profile calibrated here
            (None: 1 before each pass over the cases when timed, else
            zsim.calibration.bench_figures.BenchConfig's, once before the runs).
        min_timed_s: time more steps until each run's timed steps fill this many seconds
            (None: zsim.validation.comparison.MIN_TIMED_S).
        repredict: measure nothing: predict the batches' rows again with the simulator as
            it is now, each batch with its own profiles, keeping their measured figures.
        batch: the batch measured into (None: zsim.validation.report.GRID_BATCH, the
            grid report's own), or with `repredict` the one predicted again (None: every
            batch).
        report: the report a new batch joins (None: a report of its own name).

    Returns:
        {"written": the table's path, "figures": the figure paths}.

    Raises:
        ConfigError: a profile with --calibrate-here, a profile or report with
            --repredict, a bad count or duration, an unknown profile or batch, or `only`
            matching no case.
    """
    if calibrate_here and profile is not None:
        raise ConfigError("profile", profile, "give --profile or --calibrate-here, not both")
    if repredict and calibrate_here:
        raise ConfigError("calibrate_here", True,
                          "--repredict predicts with each batch's profiles, not --calibrate-here")
    if repredict and profile is not None:
        raise ConfigError("profile", profile, "--repredict predicts with each batch's profiles")
    if repredict and report is not None:
        raise ConfigError("report", report, "--repredict takes --batch, not --report")
    for name, value in (("runs", runs), ("steps", steps),
                        ("calibration_rounds", calibration_rounds)):
        if value is not None and value < 1:
            raise ConfigError(name, value, "must be >= 1")
    if min_timed_s is not None and min_timed_s < 0:
        raise ConfigError("min_timed_s", min_timed_s, "must be >= 0")
    if not calibrate_here and not repredict:
        resolve_hardware(profile or "local-cpu")  # an unknown profile fails before any run
    from zsim.validation import figures as validation_figures
    from zsim.validation import report as validation_report

    if repredict:
        path = validation_report.repredict_report(
            out_dir=Path(out), batches=() if batch is None else (batch,))
    else:
        path = validation_report.regenerate_report(
            None if calibrate_here else profile or "local-cpu", out_dir=Path(out),
            batch=batch or validation_report.GRID_BATCH, report=report, steps=steps,
            runs=validation_report.REPORT_RUNS if runs is None else runs, only=tuple(only),
            keep_time=not no_time,
            min_timed_s=validation_report.MIN_TIMED_S if min_timed_s is None else min_timed_s,
            calibration_rounds=calibration_rounds)
    drawn = validation_figures.write_figures(Path(out))
    return {"written": str(path), "figures": [str(p) for p in drawn]}


def figures(*, out: Path) -> dict[str, Any]:
    """Draw every figure of the evidence folder `out` from its tables
    (zsim.validation.figures), and the error budget's tables.

    Returns:
        {"written": the paths written}.

    Raises:
        ConfigError: a folder that is not an evidence folder.
    """
    from zsim.validation.figures import write_figures

    return {"written": [str(p) for p in write_figures(Path(out))]}


def gpu_report(*, out: Path, quick: bool = False, budget_s: float = 360.0,
               only: Sequence[str] = (), hardware: str | None = None) -> dict[str, Any]:
    """Run the GPU validation report within `budget_s` seconds (zsim.validation.gpu_report;
    `quick`: tiny models and shapes, a smoke test that runs on CPU).

    Args:
        out: the report folder.
        quick: tiny models and shapes.
        budget_s: wall-clock budget, seconds.
        only: validation run names: run only these (and no other section).
        hardware: profile of the predictions (None: zsim.validation.gpu_report's default,
            hgx-h200 with CUDA, local-cpu without).

    Returns:
        {"written": the validation.csv path}.

    Raises:
        ConfigError: a negative budget, or a run name no run has.
    """
    if budget_s < 0:
        raise ConfigError("budget_s", budget_s, "must be >= 0")
    from zsim.validation.gpu_report import run_report

    command = (f"zsim validate gpu-report --out {out} --budget-s {budget_s:g}"
               + (" --quick" if quick else "")
               + (f" --hardware {hardware}" if hardware else "")
               + "".join(f" --only {name}" for name in only))
    path = run_report(Path(out), quick=quick, budget_s=budget_s, hardware=hardware,
                      command=command, only=frozenset(only))
    return {"written": str(path)}


def published_runs(*, cases: Path, hardware: str = "hgx-h200") -> dict[str, Any]:
    """The published H200 runs replayed on `hardware` (zsim.validation.published_runs):
    each run's residuals, predicted / measured - 1, per metric.

    Returns:
        {"rows": one dict per run (run, kind, program, world size, micro-batch and a
        residual per metric), "text": the table in percent}.

    Raises:
        ConfigError: an unreadable runs file or an unknown profile.
    """
    from zsim.validation.published_runs import load_runs, residual_table, residuals

    rows = residuals(load_runs(Path(cases)), resolve_hardware(hardware))
    return {"rows": rows, "text": residual_table(rows)}


def error_budget(*, folder: Path, report: str | None = None, out: Path | None = None,
                 bound_pct: float | None = None) -> dict[str, Any]:
    """Split the step-time error of a report's batches into case biases, calibration
    shifts and the rest (zsim.validation.error_budget), and write its two CSVs and figure.

    Args:
        folder: the evidence folder (zsim.validation.evidence).
        report: the report whose batches to take (None: error_budget.BUDGET_REPORT).
        out: where to write (None: `folder`).
        bound_pct: the step-time bound, percent (None: the report's, 15).

    Returns:
        {"summary": the figures a reader wants first, one per line, "written": paths}.

    Raises:
        ConfigError: not an evidence folder, a report without batches or predicted rows,
            or a batch without its profile.
    """
    from zsim.validation import error_budget as eb

    bound = eb.BOUND_PCT if bound_pct is None else bound_pct
    rows, groups = eb.read_report(Path(folder), report or eb.BUDGET_REPORT)
    budget = eb.fit(rows)
    written = eb.write(Path(out) if out is not None else Path(folder), rows, groups,
                       budget, bound)
    return {"summary": eb.summary(rows, groups, budget, bound),
            "written": [str(p) for p in written]}


def checkpoint(*, out: Path, profile: str = "local-cpu", nproc: int = 2,
               directory: Path | None = None) -> dict[str, Any]:
    """Real checkpoint saves and loads on `nproc` gloo ranks against the checkpoint model,
    with the storage of `directory` (None: the system's temporary folder) measured before
    each plan (zsim.validation.checkpoints); writes checkpoints.csv and storage.yaml into
    `out`.

    Raises:
        ConfigError: an unknown profile, a bad nproc, or a directory that is not a folder.
        RankFailed: a real run crashed or hung.
    """
    from zsim.validation.checkpoints import validate_checkpoints

    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 2:
        raise ConfigError("nproc", nproc, "must be an integer >= 2")
    if directory is not None and not Path(directory).is_dir():
        raise ConfigError("dir", str(directory), "no such folder")
    return validate_checkpoints(resolve_hardware(profile), out, nproc=nproc,
                                directory=directory)


def moe_ep(*, out: Path, steps: int = 5, command: str = "") -> dict[str, Any]:
    """The expert-parallel MoE backend measured on gloo (zsim.validation.moe_ep): its
    cases at world 2 and 4, each rank's all-to-all bytes and calls, routing imbalance,
    state, peak memory and step time into `out`/ep.csv, with provenance.yaml.

    Raises:
        ConfigError: steps is not a positive integer.
        RankFailed: a run crashed or hung.
    """
    from zsim.validation.moe_ep import measure_batch

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError("steps", steps, "must be a positive integer")
    return measure_batch(Path(out), steps=steps, command=command)
