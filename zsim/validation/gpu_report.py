"""The GPU validation report (docs/validation.md, "GPU runs"): one command that, on a machine with
one CUDA GPU, runs the validation rows that one GPU can host, predicts each with the
simulator, and measures what the GPU fit needs (zsim.calibration.gpu_host_sweep,
zsim.calibration.gpu_kernel_bench), all within a wall-clock budget.

    zsim validate gpu-report --out DIR [--quick] [--budget-s 360]

Validation rows (zsim.validation.gpu_runs): world 1 on a real process group (NCCL; gloo
on CPU) and rank 0 of N on the fake process group at N = 8, 64 and 512, and last, after
the measurements, DeepSpeed ZeRO-2 at world 1 when deepspeed is installed. The rows of
one world size run in one process, in turn (the caching allocator emptied between them),
each group with its share of the section's time (zsim.validation.budgeted_runs); each
row is appended to DIR/raw/<section>.jsonl as it completes, so a crash keeps the rows
before it. Metric names are those of the CPU report (reports/validation/validation.csv),
plus forward/backward/optimizer times, peak reserved, after-forward memory and host
issue time; predictions come from zsim.simulate with the given hardware profile
(hgx-h200 on CUDA). The fake process group moves no data, so measured step times have no
communication: they are compared with the simulator's step time minus its exposed
collective waits (offload copies stay in).

Outputs in DIR: validation.csv (model, plan, nproc, backend, metric, predicted, measured,
error_pct, run, note), runs.yaml (every run's raw figures), host.csv and host_fit.csv
(the host sweep and its per-block slopes), kernels.csv, report.md, provenance.yaml (GPU,
versions, date, command, budget, what was skipped). A failed row is recorded with its
error and the run goes on; items that would start after their section's share of the
budget (SHARES) are skipped and listed. Imports torch.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import torch
import yaml

from zsim.backend.runner import Deadline, RankFailed, read_jsonl, run_fake_rank
from zsim.calibration import gpu_host_sweep, gpu_kernel_bench
from zsim.calibration.machine import environment
from zsim.calibration.nano import QUICK_SWEEP_CONFIGS, SWEEP_CONFIGS
from zsim.errors import ConfigError
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.validation.budgeted_runs import Group, Run, run_groups
from zsim.validation.comparison import FIELDS as CPU_FIELDS
from zsim.validation.comparison import predicted_activation_bytes, write_csv
from zsim.validation.gpu_runs import (
    FULL_STEPS,
    QUICK_STEPS,
    Steps,
    deepspeed_groups,
    groups,
    measure_run,
)

FIELDS = (*(f for f in CPU_FIELDS if f != "note"), "run", "note")
"""Columns of validation.csv: the CPU report's, with the run's name before the note
(errors, skips, what a figure means)."""

SHARES = {"validation": 0.55, "host": 0.66, "kernels": 0.86, "deepspeed": 0.97}
"""Fraction of the budget by which each section must end (cumulative: time a section
leaves unused goes to the next). DeepSpeed comes last: on CUDA its first run may compile
its fused Adam."""

TIME_NOTE = ("measured step and phase times have no communication (the fake process group "
             "moves no data; world 1 has none to speak of); predicted step time is the "
             "simulator's step_time_s minus its exposed collective waits (offload copies "
             "are real and stay in)")

# ------------------------------------------------------------------------- predictions
def predict(spec: ModelSpec, plan: Plan, hw: HardwareProfile) -> dict[str, float | None]:
    """The simulator's figures for the metrics of validation.csv (None: no prediction)."""
    r = simulate(spec, hw, plan)
    blocks, root = predicted_activation_bytes(spec, plan)
    return {
        "step_time_s": r.step_time_without_comm_s,
        "forward_time_s": r.phase_time_s.get("forward"),
        "backward_time_s": r.phase_time_s.get("backward"),
        "optimizer_time_s": r.phase_time_s.get("optimizer", r.host_busy_s),
        "peak_memory_bytes": r.peak_memory_bytes,
        "peak_reserved_bytes": r.reserved_memory_bytes,
        "state_memory_bytes": r.baseline_memory_bytes,
        "activation_bytes_blocks": blocks,
        "activation_bytes_root": root,
        "after_forward_bytes": None,
        "host_issue_s": None,
    }


MEASURED = {"step_time_s": "step_s", "forward_time_s": "forward_s",
            "backward_time_s": "backward_s", "optimizer_time_s": "optimizer_s",
            "peak_memory_bytes": "peak_bytes", "peak_reserved_bytes": "reserved_bytes",
            "state_memory_bytes": "after_first_step_bytes",
            "activation_bytes_blocks": "saved_blocks_bytes",
            "activation_bytes_root": "saved_root_bytes",
            "after_forward_bytes": "after_forward_bytes", "host_issue_s": "host_issue_s"}
"""validation.csv metric -> the measured figure of a run."""


def compare(run: Run, group: Group, result: dict[str, Any],
            hw: HardwareProfile | None) -> list[dict[str, Any]]:
    """validation.csv rows of one run: every metric, or one row saying why there are none."""
    label = run.plan.label + (" fp32+tf32" if run.tf32 else "")
    backend = "fake" if group.backend == "fake" else (
        "nccl" if torch.cuda.is_available() else "gloo")
    common = {"model": run.spec.name, "plan": label, "nproc": run.plan.world_size,
              "backend": backend, "run": run.name}
    if result.get("status") != "ok":
        return [{**common, "metric": "", "predicted": "", "measured": "", "error_pct": "",
                 "note": result.get("note", "no result")}]
    note = "; ".join(x for x in (result.get("note", ""),
                                 f"published: {run.published}" if run.published else "") if x)
    predicted: dict[str, float | None] = dict.fromkeys(MEASURED)
    if hw is None:
        note = "; ".join(x for x in (note, "no hardware profile: no predictions") if x)
    else:
        try:
            predicted = predict(run.spec, run.plan, hw)
        except Exception as e:  # a failed prediction keeps the measurements
            note = "; ".join(x for x in (note, f"prediction failed: {type(e).__name__}: {e}")
                             if x)
    rows = []
    for metric, key in MEASURED.items():
        measured, pred = result.get(key), predicted.get(metric)
        err = (round(100.0 * (pred - measured) / measured, 2)
               if pred is not None and measured else "")
        rows.append({**common, "metric": metric,
                     "predicted": "" if pred is None else float(pred),
                     "measured": "" if measured is None else float(measured),
                     "error_pct": err, "note": note})
    return rows


# ---------------------------------------------------------------------------- sections
Log = Callable[[str], None]

GRACE_S = 30.0
"""How long a group's process may run past its section's end: the run in flight
finishes; a hung process is stopped then."""


def run_validation(plan_groups: list[Group], steps: Steps, section: Deadline, log_path: Path,
                   log: Log) -> list[tuple[Run, Group, dict[str, Any]]]:
    """Every group's runs, each group in its own process with its share of the time left
    before `section` (zsim.validation.budgeted_runs); a run without a result (the process
    died, or the group was skipped) gets a status saying why."""
    return run_groups(plan_groups, partial(measure_run, steps=steps), until=section.at,
                      stop_at=section.at + GRACE_S, log_path=log_path, log=log)


def run_host(quick: bool, deadline: Deadline, raw: Path, log: Log) -> list[dict[str, Any]]:
    """The host sweep on the fake process group as rank 0 of 8."""
    path = raw / "host.jsonl"
    path.unlink(missing_ok=True)
    job = gpu_host_sweep.HostJob(depths=(4, 8) if quick else (4, 16, 32),
                                 configs=QUICK_SWEEP_CONFIGS if quick else SWEEP_CONFIGS,
                                 timed=2 if quick else 6, warmup=1 if quick else 3,
                                 deadline=deadline, log_path=str(path))
    if not deadline.allows(10.0):
        return [{"config": c, "note": "skipped: time budget spent"} for c in job.configs]
    log(f"host sweep: {len(job.configs)} configs x depths {job.depths}")
    try:
        run_fake_rank(gpu_host_sweep.host_rank, job, world_size=8,
                      timeout_s=max(deadline.left_s(), 0.0) + 30.0)
    except RankFailed as e:
        log(f"host sweep: process failed: {str(e)[-300:]}")
        return [*read_jsonl(path), {"config": "", "note": f"error: {str(e)[-1500:]}"}]
    return read_jsonl(path)


def load_hardware(name: str) -> HardwareProfile:
    """A profile YAML path, a profile of the repository's hardware_profiles/ (no install
    needed), or an installed profile name."""
    if name.endswith((".yaml", ".yml")):
        return HardwareProfile.from_yaml(Path(name))
    local = Path(__file__).resolve().parents[2] / "hardware_profiles" / f"{name}.yaml"
    if local.is_file():
        return HardwareProfile.from_yaml(local)
    from zsim.spec.registry import resolve_hardware

    return resolve_hardware(name)


def _csv(rows: list[dict[str, Any]], path: Path, fields: tuple[str, ...]) -> None:
    write_csv([{k: r.get(k, "") for k in fields} for r in rows], path, fields)


def _fmt(x: Any) -> str:
    if x == "" or x is None:
        return ""
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def write_report(out_dir: Path, *, rows: list[dict[str, Any]],
                 runs: list[tuple[Run, Group, dict[str, Any]]],
                 host: list[dict[str, Any]], kernels: list[dict[str, Any]],
                 provenance: dict[str, Any]) -> None:
    """Every output file (see the module docstring)."""
    _csv(rows, out_dir / "validation.csv", FIELDS)
    _csv(host, out_dir / "host.csv", gpu_host_sweep.HOST_FIELDS)
    _csv(gpu_host_sweep.host_fit(host), out_dir / "host_fit.csv",
         gpu_host_sweep.HOST_FIT_FIELDS)
    _csv(kernels, out_dir / "kernels.csv", gpu_kernel_bench.KERNEL_FIELDS)
    (out_dir / "runs.yaml").write_text(yaml.safe_dump({"runs": [
        {"name": run.name, "group": group.key, "backend": group.backend,
         "world_size": group.world_size, "published": run.published, "tf32": run.tf32,
         "model": asdict(run.spec), "plan": run.plan.to_dict(), "measured": result}
        for run, group, result in runs]}, sort_keys=False))
    (out_dir / "provenance.yaml").write_text(yaml.safe_dump(provenance, sort_keys=False))
    lines = [f"# GPU validation report ({provenance['environment']['gpu']})", "",
             f"`{provenance['command']}` on {provenance['generated']}, torch "
             f"{provenance['environment']['torch']}, profile {provenance['hardware']}; "
             f"{provenance['elapsed_s']} s of a {provenance['budget_s']} s budget.", "",
             f"Times: {TIME_NOTE}.", "",
             "| run | backend | metric | predicted | measured | error % | note |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['backend']} n={r['nproc']} | {r['metric']} | "
              f"{_fmt(r['predicted'])} | {_fmt(r['measured'])} | {_fmt(r['error_pct'])} | "
              f"{str(r['note'])[:160]} |" for r in rows]
    skipped = provenance["skipped"]
    lines += ["", f"Skipped or failed: {len(skipped)}"] + [f"- {s}" for s in skipped]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")


def only_runs(plan_groups: list[Group], names: frozenset[str]) -> list[Group]:
    """The groups' runs named in `names`, in their groups.

    Raises:
        ConfigError: a name no group runs.
    """
    known = {r.name for g in plan_groups for r in g.runs}
    if names - known:
        raise ConfigError("runs", ",".join(sorted(names - known)),
                          f"unknown run; known: {', '.join(sorted(known))}")
    kept = [replace(g, runs=tuple(r for r in g.runs if r.name in names)) for g in plan_groups]
    return [g for g in kept if g.runs]


def run_report(out_dir: Path, *, quick: bool, budget_s: float, hardware: str | None = None,
               command: str = "", only: frozenset[str] = frozenset()) -> Path:
    """Run every section within `budget_s` seconds of wall time and write the report
    (`command`: the command line, for the provenance), predicting with the profile
    `hardware` (None: hgx-h200 with CUDA, local-cpu without). With `only`, the validation
    runs of those names and no other section.

    Returns:
        The validation CSV path.

    Raises:
        ConfigError: a name in `only` that no run has (before anything runs).
    """
    start = time.time()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hardware = hardware or ("hgx-h200" if device == "cuda" else "local-cpu")
    chosen = only_runs(groups(quick, device) + deepspeed_groups(quick, device),
                       only) if only else []
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "raw"
    raw.mkdir(exist_ok=True)

    def log(message: str) -> None:
        print(f"[{time.time() - start:6.1f} s] {message}", flush=True)

    def section_deadline(name: str) -> Deadline:
        return Deadline(start + SHARES[name] * budget_s)

    env = environment()
    log(f"environment: {env}")
    hw: HardwareProfile | None = None
    try:
        hw = load_hardware(hardware)
    except Exception as e:  # measurements still run without predictions
        log(f"hardware profile {hardware!r} failed to load: {e}")
    elapsed: dict[str, float] = {}
    runs: list[tuple[Run, Group, dict[str, Any]]] = []
    host: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    failures: list[str] = []
    sections: list[tuple[str, Callable[[], None]]] = [
        ("validation", lambda: runs.extend(run_validation(
            groups(quick, device), QUICK_STEPS if quick else FULL_STEPS,
            section_deadline("validation"), raw / "validation.jsonl", log))),
        ("host", lambda: host.extend(run_host(quick, section_deadline("host"), raw, log))),
        ("kernels", lambda: kernels.extend(gpu_kernel_bench.run_items(
            gpu_kernel_bench.kernel_items(gpu_kernel_bench.QUICK if quick
                                          else gpu_kernel_bench.FULL, device),
            section_deadline("kernels"), need_s=2.0, log=log))),
        ("deepspeed", lambda: runs.extend(run_validation(
            deepspeed_groups(quick, device), QUICK_STEPS if quick else FULL_STEPS,
            section_deadline("deepspeed"), raw / "deepspeed.jsonl", log))),
    ]
    if only:
        sections = [("validation", lambda: runs.extend(run_validation(
            chosen, QUICK_STEPS if quick else FULL_STEPS, section_deadline("deepspeed"),
            raw / "validation.jsonl", log)))]
    for name, section in sections:
        begin = time.time()
        try:
            section()
        except Exception as e:  # a section that fails leaves the others to run
            failures.append(f"section {name}: {type(e).__name__}: {e}")
            log(f"section {name} FAILED: {traceback.format_exc()}")
        elapsed[name] = round(time.time() - begin, 1)
        log(f"section {name} done in {elapsed[name]} s")
    rows = [row for run, group, result in runs for row in compare(run, group, result, hw)]
    skipped = failures + [f"run {r['run']}: {r['note']}" for r in rows if not r["metric"]]
    skipped += [f"host {r.get('config')} layers={r.get('layers')}: {r['note']}"
                for r in host if r.get("note")]
    skipped += [f"kernel {r['kind']}: {r['note']}" for r in kernels
                if str(r["note"]).startswith(("skipped", "error"))]
    provenance = {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": command,
        "environment": env, "hardware": hw.name if hw is not None else f"{hardware} (failed)",
        "quick": quick, "budget_s": budget_s, "elapsed_s": round(time.time() - start, 1),
        "section_s": elapsed, "section_shares": SHARES, "notes": [
            f"Times: {TIME_NOTE}.",
            "peak_reserved_bytes: torch.cuda.max_memory_reserved over the steady-state step "
            "(CPU: equal to the peak); predicted: the simulator's reserved_memory_bytes.",
            "step_time_s: median of unsynchronised steps (synchronised at the end only); "
            "forward/backward/optimizer_time_s: medians of steps synchronised after each "
            "phase; host_issue_s: time Python took to queue an unsynchronised step (it "
            "includes any wait for a full CUDA launch queue, so on device-bound steps it "
            "approaches step_time_s; the host sweep's nano models isolate the host cost).",
            "runs marked tf32 run fp32 storage with TF32 matmuls; the simulator predicts "
            "them as fp32.",
            "kernels.csv: bytes and FLOPs follow zsim.analytic.compute's conventions "
            "(forward + backward = 3x forward); device_s from CUDA events, host_s is the "
            "host's queueing time per call."],
        "skipped": skipped,
    }
    write_report(out_dir, rows=rows, runs=runs, host=host, kernels=kernels,
                 provenance=provenance)
    log(f"wrote {out_dir} ({len(rows)} validation rows, {len(host)} host rows, "
        f"{len(kernels)} kernel rows, {len(skipped)} skipped or failed)")
    return out_dir / "validation.csv"
