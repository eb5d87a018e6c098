"""The GPU validation report (issue 11, deliverable 6): one command that, on a machine with
one CUDA GPU, runs the validation rows that one GPU can host, predicts each with the
simulator, and measures what the GPU fit needs (zsim.calibration.gpu_bench), all within a
wall-clock budget.

    python -m zsim.validation.gpu_report --out DIR [--quick] [--budget-s 360]

Validation rows: world 1 on a real process group (NCCL; gloo on CPU) and rank 0 of N on
the fake process group at N = 8, 64 and 512 (FSDP2: fsdp, fsdp-no-reshard, recomputation,
fp32 with TF32 matmuls, CPU offload, hsdp; DDP at world 1), and last, after the
measurements, DeepSpeed ZeRO-2 at world 1 when deepspeed is installed. The rows of one
world size run in one process, in turn (the caching allocator emptied between them),
each group with its share of the section's time; each row is appended to
DIR/raw/<group>.jsonl as it completes, so a crash keeps the rows before it. Each row
measures, with the protocol of zsim.backend.measured_step, memory over the steady-state step
(allocated after init and after a step, per-phase peaks, peak reserved, saved
activations); then it runs warm-up steps, steps synchronised after each phase (forward,
backward, optimizer), and unsynchronised steps (the step time, and the host's time to
queue the step). Metric names are those of the CPU report
(reports/validation/validation.csv), plus forward/backward/optimizer times, peak
reserved, after-forward memory and host issue time; predictions come from zsim.simulate
with the given hardware profile (hgx-h200 on CUDA). The fake process group moves no
data, so measured step times have no communication: they are compared with the
simulator's step time minus its exposed collective waits (offload copies stay in).

Outputs in DIR: validation.csv (model, plan, nproc, backend, metric, predicted, measured,
error_pct, run, note), runs.yaml (every run's raw figures), host.csv and host_fit.csv
(the host sweep and its per-block slopes), kernels.csv, report.md, provenance.yaml (GPU,
versions, date, command, budget, what was skipped). A failed row is recorded with its
error and the run goes on; items that would start after their section's share of the
budget (SHARES) are skipped and listed. Imports torch.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import yaml

from zsim.backend import programs, training
from zsim.backend.measured_step import _Job, _memory_step, _Meter, _NoTracking
from zsim.backend.runner import RankContext, RankFailed, run_fake_rank, run_ranks
from zsim.calibration import gpu_bench
from zsim.calibration.gpu_bench import P1B3, Deadline, append_jsonl, read_jsonl, timed_step
from zsim.errors import ConfigError
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.validation.report import FIELDS as CPU_FIELDS
from zsim.validation.report import backend_knobs, predicted_activation_bytes, write_csv

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

SMALL = ModelSpec(name="0p4b-v128k", num_layers=16, d_model=1024, num_heads=16,
                  num_kv_heads=4, ffn_hidden=2816, vocab_size=128256, max_seq_len=2048)
"""A 0.44B GQA Llama with Llama 3's 128k vocabulary (the output layer is 60% of it)."""

P7B = ModelSpec(name="7b", num_layers=32, d_model=4096, num_heads=32, num_kv_heads=32,
                ffn_hidden=11008, vocab_size=32000, max_seq_len=4096)
"""Llama-2-7B as in shared/cases/h200-fsdp2-runs.yaml."""

TINY = ModelSpec(name="tiny", num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                 ffn_hidden=176, vocab_size=512, max_seq_len=64)
"""The quick mode's model (CPU smoke test)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One validation row: a model and plan, and how it runs."""

    name: str
    spec: ModelSpec
    plan: Plan
    tf32: bool = False
    """fp32 storage with TF32 matmuls (the simulator has no such precision yet)."""
    published: str = ""
    """The run of shared/cases/h200-fsdp2-runs.yaml with the same model and plan."""


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Steps:
    """Steps per run after the two memory steps."""

    warmup: int
    phased: int
    unsynced: int


FULL_STEPS = Steps(warmup=2, phased=3, unsynced=3)
QUICK_STEPS = Steps(warmup=1, phased=2, unsynced=2)


def _run(name: str, spec: ModelSpec, strategy: str, gpus: int, knobs: dict[str, Any], *,
         shard_group: int | None = None, tf32: bool = False, published: str = "",
         **changes: Any) -> Run:
    plan = Plan.for_strategy(strategy, gpus=gpus, shard_group=shard_group,
                             **{**knobs, **changes})
    return Run(name=name, spec=spec, plan=plan, tf32=tf32, published=published)


def groups(quick: bool, device_type: str) -> list[Group]:
    """The FSDP2 and DDP validation rows, by process, in the order they run (most wanted
    first within a process). Specs carry the kernel knobs of `device_type`
    (zsim.validation.report.backend_knobs)."""
    knobs = backend_knobs(device_type)
    fp32 = {"param_dtype": "fp32", "grad_dtype": "fp32"}
    if quick:
        t = replace(TINY, **knobs)
        k = {"seq_len": 64, "micro_batch": 2, "reduce_dtype": "fp32"}
        return [
            Group(key="n1", backend="real", world_size=1, runs=(
                _run("tiny_n1", t, "fsdp", 1, k), _run("tiny_n1_ddp", t, "ddp", 1, k))),
            Group(key="n8", backend="fake", world_size=8, runs=(
                _run("tiny_n8", t, "fsdp", 8, k),
                _run("tiny_n8_fp32", t, "fsdp", 8, k, tf32=True, **fp32))),
            Group(key="n64", backend="fake", world_size=64, runs=(
                _run("tiny_n64_hsdp8x8", t, "hsdp", 64, k, shard_group=8),)),
            Group(key="n512", backend="fake", world_size=512, runs=(
                _run("tiny_n512", t, "fsdp", 512, k),)),
        ]
    b, s, m = (replace(x, **knobs) for x in (P1B3, SMALL, P7B))
    kb = {"seq_len": 2048, "micro_batch": 4, "reduce_dtype": "fp32"}
    ks = {"seq_len": 2048, "micro_batch": 2, "reduce_dtype": "fp32"}
    km = {"seq_len": 4096, "micro_batch": 1, "reduce_dtype": "fp32"}
    return [
        Group(key="n1", backend="real", world_size=1, runs=(
            _run("1p3b_n1", b, "fsdp", 1, kb, published="1p3b_n1"),
            _run("0p4b_n1", s, "fsdp", 1, ks), _run("0p4b_n1_ddp", s, "ddp", 1, ks))),
        Group(key="n8", backend="fake", world_size=8, runs=(
            _run("1p3b_n8", b, "fsdp", 8, kb, published="1p3b_n8"),
            _run("1p3b_n8_raf0", b, "fsdp-no-reshard", 8, kb, published="1p3b_n8_raf0"),
            _run("1p3b_n8_ac", b, "fsdp", 8, kb, recompute="full", published="1p3b_n8_ac"),
            _run("1p3b_n8_sac", b, "fsdp", 8, kb, recompute="selective"),
            _run("1p3b_n8_fp32", b, "fsdp", 8, kb, tf32=True, published="1p3b_n8_fp32",
                 **fp32),
            _run("1p3b_n8_offload", b, "fsdp", 8, kb, offload="params",
                 published="1p3b_n8_offload"),
            _run("0p4b_n8", s, "fsdp", 8, ks), _run("0p4b_n8_raf0", s, "fsdp-no-reshard", 8, ks))),
        Group(key="n64", backend="fake", world_size=64, runs=(
            _run("1p3b_n64", b, "fsdp", 64, kb, published="1p3b_n64"),
            _run("1p3b_n64_raf0", b, "fsdp-no-reshard", 64, kb, published="1p3b_n64_raf0"),
            _run("1p3b_n64_hsdp8x8", b, "hsdp", 64, kb, shard_group=8),
            _run("0p4b_n64", s, "fsdp", 64, ks),
            _run("0p4b_n64_hsdp8x8", s, "hsdp", 64, ks, shard_group=8),
            _run("7b_n64", m, "fsdp", 64, km, published="7b_n64"))),
        Group(key="n512", backend="fake", world_size=512, runs=(
            _run("1p3b_n512", b, "fsdp", 512, kb),
            _run("1p3b_n512_hsdp64x8", b, "hsdp", 512, kb, shard_group=64),
            _run("0p4b_n512", s, "fsdp", 512, ks))),
    ]


def deepspeed_groups(quick: bool, device_type: str) -> list[Group]:
    """DeepSpeed ZeRO-2 at world 1 (skipped when deepspeed is not installed)."""
    knobs = backend_knobs(device_type)
    if quick:
        run = _run("tiny_n1_zero2", replace(TINY, **knobs), "zero2", 1,
                   {"seq_len": 64, "micro_batch": 2, "reduce_dtype": "fp32"})
    else:
        run = _run("0p4b_n1_zero2", replace(SMALL, **knobs), "zero2", 1,
                   {"seq_len": 2048, "micro_batch": 2, "reduce_dtype": "fp32"})
    return [Group(key="deepspeed", backend="real", world_size=1, needs="deepspeed",
                  runs=(run,))]


# ------------------------------------------------------------------- in the rank process
@dataclass(frozen=True, slots=True, kw_only=True)
class _GroupJob:
    runs: tuple[Run, ...]
    steps: Steps
    deadline: Deadline
    log_path: str


_FIRST_RUN_S = 15.0
"""Time assumed for a group's first run before one has been measured, seconds."""
_START_RUNS = 2
"""A process's start-up (torch import, CUDA and process group initialisation), counted in
runs when the section's time is shared between groups."""


def _group_rank(ctx: RankContext, job: _GroupJob) -> int:
    """Rank function: each run of the group in turn, its result appended to job.log_path
    (an error or a skip recorded in its place). Returns the number of runs written."""
    need_s = _FIRST_RUN_S
    for run in job.runs:
        start = time.time()
        if not job.deadline.allows(need_s):
            result: dict[str, Any] = {"run": run.name, "status": "skipped",
                                      "note": "skipped: time budget spent"}
        else:
            try:
                result = _measure_run(ctx, run, job.steps)
                need_s = 1.2 * (time.time() - start)
            except Exception as e:  # one failed run must not end the group
                result = {"run": run.name, "status": "error",
                          "note": f"error: {type(e).__name__}: {e} | "
                                  + traceback.format_exc(limit=-4).replace("\n", " ")}
        result["seconds"] = round(time.time() - start, 2)
        append_jsonl(job.log_path, result)
        print(f"  [{ctx.backend} n={ctx.world_size}] {run.name}: {result['status']} "
              f"({result['seconds']} s)", flush=True)
        gc.collect()
        if ctx.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return len(job.runs)


def _measure_run(ctx: RankContext, run: Run, steps: Steps) -> dict[str, Any]:
    """Memory over the steady-state step (zsim.backend.measured_step's protocol), then timed
    steps (zsim.calibration.gpu_bench.timed_step)."""
    spec, plan = run.spec, run.plan
    meter = _Meter(ctx.device)
    if meter.cuda:
        torch.cuda.reset_peak_memory_stats()
    leftover = meter.live() if meter.cuda else 0
    tracking = meter.tracker if meter.tracker is not None else _NoTracking()
    with gpu_bench.matmul_precision("tf32") if run.tf32 else nullcontext():
        with tracking:
            prep = programs.prepare(spec, plan, device=ctx.device, world_size=ctx.world_size)
            after_init = meter.live()
            training.train_step(prep, training.batches(spec, plan, device=ctx.device,
                                                       rank=ctx.rank, step=0))
            after_first = meter.live()
            memory, saved, _ = _memory_step(prep, _Job(spec=spec, plan=plan, steps=0,
                                                       warmup_steps=0), ctx, meter)
        micro = training.batches(spec, plan, device=ctx.device, rank=ctx.rank, step=2)
        for _ in range(steps.warmup):
            timed_step(prep, micro, ctx.device, phases=False)
        phased = [timed_step(prep, micro, ctx.device, phases=True)
                  for _ in range(steps.phased)]
        unsynced = [timed_step(prep, micro, ctx.device, phases=False)
                    for _ in range(steps.unsynced)]
    del prep
    allocated = {k: v - leftover for k, v in memory.items() if k != "reserved_bytes"}
    return {
        "run": run.name, "status": "ok", "leftover_bytes": leftover,
        "after_init_bytes": after_init - leftover,
        "after_first_step_bytes": after_first - leftover, **allocated,
        "reserved_bytes": memory["reserved_bytes"],
        "saved_blocks_bytes": sum(t.bytes for t in saved if t.scope != "root"),
        "saved_root_bytes": sum(t.bytes for t in saved if t.scope == "root"),
        "step_s": statistics.median(s["step_s"] for s in unsynced),
        "host_issue_s": statistics.median(s["host_issue_s"] for s in unsynced),
        **{k: statistics.median(s[k] for s in phased)
           for k in ("forward_s", "backward_s", "optimizer_s")},
        "step_phased_s": statistics.median(s["step_s"] for s in phased),
        "step_times_s": [round(s["step_s"], 6) for s in unsynced],
        "note": (f"{leftover} B left allocated by the previous run were subtracted"
                 if leftover else ""),
    }


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


def run_validation(plan_groups: list[Group], steps: Steps, section: Deadline, raw: Path,
                   log: Log) -> list[tuple[Run, Group, dict[str, Any]]]:
    """Every group's runs, each group in its own process with its share of the time left
    before `section`; a run without a result (the process died, or the group was skipped)
    gets a status saying why."""
    out: list[tuple[Run, Group, dict[str, Any]]] = []
    for i, group in enumerate(plan_groups):
        # Each group's share of the time left, by its runs (and start-up), so that a slow
        # group cannot starve the world sizes after it.
        weight = len(group.runs) + _START_RUNS
        rest = sum(len(g.runs) + _START_RUNS for g in plan_groups[i:])
        deadline = Deadline(min(section.at, time.time() + section.left_s() * weight / rest))
        path = raw / f"validation-{group.key}.jsonl"
        path.unlink(missing_ok=True)
        failure = ""
        if group.needs and importlib.util.find_spec(group.needs) is None:
            failure = f"skipped: {group.needs} is not installed"
        elif not deadline.allows(_FIRST_RUN_S):
            failure = "skipped: time budget spent"
        else:
            log(f"validation: group {group.key} ({len(group.runs)} runs, "
                f"{deadline.left_s():.0f} s for them)")
            job = _GroupJob(runs=group.runs, steps=steps, deadline=deadline,
                            log_path=str(path))
            # The child stops starting runs at the deadline; the grace lets the run in
            # flight finish and is the most a hung process can take beyond it.
            timeout_s = max(deadline.left_s(), 0.0) + 30.0
            try:
                if group.backend == "fake":
                    run_fake_rank(_group_rank, job, world_size=group.world_size,
                                  timeout_s=timeout_s)
                else:
                    run_ranks(_group_rank, job, nproc=1, timeout_s=timeout_s,
                              backend="nccl" if torch.cuda.is_available() else "gloo")
            except RankFailed as e:
                failure = f"error: the group's process failed: {str(e)[-1500:]}"
                log(f"validation: group {group.key} failed: {str(e)[-300:]}")
        done = {r["run"]: r for r in read_jsonl(path)}
        for run in group.runs:
            result = done.get(run.name) or {"run": run.name, "status": "missing",
                                            "note": failure or "no result"}
            out.append((run, group, result))
    return out


def run_host(quick: bool, deadline: Deadline, raw: Path, log: Log) -> list[dict[str, Any]]:
    """The host sweep on the fake process group as rank 0 of 8."""
    path = raw / "host.jsonl"
    path.unlink(missing_ok=True)
    job = gpu_bench.HostJob(depths=(4, 8) if quick else (4, 16, 32),
                            configs=gpu_bench.QUICK_HOST_CONFIGS if quick
                            else gpu_bench.HOST_CONFIGS, timed=2 if quick else 6,
                            warmup=1 if quick else 3, deadline=deadline, log_path=str(path))
    if not deadline.allows(10.0):
        return [{"config": c, "note": "skipped: time budget spent"} for c in job.configs]
    log(f"host sweep: {len(job.configs)} configs x depths {job.depths}")
    try:
        run_fake_rank(gpu_bench.host_rank, job, world_size=8,
                      timeout_s=max(deadline.left_s(), 0.0) + 30.0)
    except RankFailed as e:
        log(f"host sweep: process failed: {str(e)[-300:]}")
        return [*read_jsonl(path), {"config": "", "note": f"error: {str(e)[-1500:]}"}]
    return read_jsonl(path)


HOST_FIT_FIELDS = ("config", "depths", "host_issue_s_per_block", "host_issue_s_base",
                   "step_s_per_block", "aten_ops_per_block", "launches_per_block",
                   "kernels_per_block", "host_s_per_aten_op")
"""Columns of host_fit.csv: least-squares lines over depth of the host sweep."""


def host_fit(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per config with at least two timed depths: the slope per block (and the intercept
    of the host issue time) of each host figure measured at every depth, and the host
    seconds per ATen op added by a block."""
    timed = [r for r in rows if isinstance(r.get("host_issue_s"), float)]
    out = []
    for config in dict.fromkeys(r["config"] for r in timed):
        ok = [r for r in timed if r["config"] == config]
        if len({r["layers"] for r in ok}) < 2:
            continue
        xs = [float(r["layers"]) for r in ok]

        def line(key: str, ok: list[dict[str, Any]] = ok,
                 xs: list[float] = xs) -> tuple[float | str, float | str]:
            ys = [r.get(key) for r in ok]
            if not all(isinstance(y, int | float) for y in ys):
                return "", ""
            fit = statistics.linear_regression(xs, [float(y) for y in ys])
            return fit.slope, fit.intercept

        host, base = line("host_issue_s")
        aten = line("aten_ops")[0]
        out.append({"config": config, "depths": " ".join(str(r["layers"]) for r in ok),
                    "host_issue_s_per_block": host, "host_issue_s_base": base,
                    "step_s_per_block": line("step_s")[0], "aten_ops_per_block": aten,
                    "launches_per_block": line("launches")[0],
                    "kernels_per_block": line("kernels")[0],
                    "host_s_per_aten_op": (host / aten if isinstance(host, float)
                                           and isinstance(aten, float) and aten else "")})
    return out


# ------------------------------------------------------------------------------ output
def environment() -> dict[str, Any]:
    """What the measurements ran on."""
    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": str(torch.__version__),
        "cuda_runtime": torch.version.cuda, "host": platform.node(),
        "machine": platform.machine(), "cpus": os.cpu_count(),
        "packages": {p: _version(p) for p in ("numpy", "simpy", "PyYAML", "pandas",
                                              "deepspeed", "zsim")},
        "git_commit": _git_commit(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env |= {"gpu": props.name, "gpu_memory_bytes": props.total_memory,
                "gpu_capability": f"{props.major}.{props.minor}",
                "gpu_count": torch.cuda.device_count(),
                "cudnn": torch.backends.cudnn.version(),
                "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    else:
        env["gpu"] = "none (CPU run)"
    return env


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_commit() -> str:
    """The checkout's commit, read from .git without running git (zsim starts no
    programs); "unknown" where the tree is a copy without .git."""
    git = Path(__file__).resolve().parents[2] / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head.removeprefix("ref: ")
        loose = git / ref
        if loose.is_file():
            return loose.read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return "unknown (not a git checkout)"


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
    _csv(host, out_dir / "host.csv", gpu_bench.HOST_FIELDS)
    _csv(host_fit(host), out_dir / "host_fit.csv", HOST_FIT_FIELDS)
    _csv(kernels, out_dir / "kernels.csv", gpu_bench.KERNEL_FIELDS)
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


def _only(plan_groups: list[Group], names: frozenset[str]) -> list[Group]:
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


def run_report(out_dir: Path, *, quick: bool, budget_s: float, hardware: str,
               command: str = "", only: frozenset[str] = frozenset()) -> Path:
    """Run every section within `budget_s` seconds of wall time and write the report
    (`command`: the command line, for the provenance). With `only`, the validation runs
    of those names and no other section.

    Returns:
        The validation CSV path.
    """
    start = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "raw"
    raw.mkdir(exist_ok=True)

    def log(message: str) -> None:
        print(f"[{time.time() - start:6.1f} s] {message}", flush=True)

    def section_deadline(name: str) -> Deadline:
        return Deadline(start + SHARES[name] * budget_s)

    env = environment()
    log(f"environment: {env}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
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
            section_deadline("validation"), raw, log))),
        ("host", lambda: host.extend(run_host(quick, section_deadline("host"), raw, log))),
        ("kernels", lambda: kernels.extend(gpu_bench.run_items(
            gpu_bench.kernel_items(gpu_bench.QUICK if quick else gpu_bench.FULL, device),
            section_deadline("kernels"), need_s=2.0, log=log))),
        ("deepspeed", lambda: runs.extend(run_validation(
            deepspeed_groups(quick, device), QUICK_STEPS if quick else FULL_STEPS,
            section_deadline("deepspeed"), raw, log))),
    ]
    if only:
        sections = [("validation", lambda: runs.extend(run_validation(
            _only(groups(quick, device) + deepspeed_groups(quick, device), only),
            QUICK_STEPS if quick else FULL_STEPS, section_deadline("deepspeed"), raw,
            log)))]
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


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m zsim.validation.gpu_report",
        description="GPU validation report: validation rows on one GPU (world 1 and rank 0 "
                    "of N on the fake process group) against the simulator, plus host, "
                    "matmul, attention and memory-bound measurements.")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models and shapes (a smoke test; runs on CPU)")
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="wall-clock budget, seconds (default 360)")
    parser.add_argument("--runs", default="",
                        help="comma-separated validation run names: run only these (and "
                             "no other section), e.g. to redo runs that failed")
    parser.add_argument("--hardware", default=None,
                        help="hardware profile for predictions (default hgx-h200 with "
                             "CUDA, local-cpu without)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    hardware = args.hardware or ("hgx-h200" if torch.cuda.is_available() else "local-cpu")
    only = frozenset(n for n in args.runs.split(",") if n)
    print(run_report(args.out, quick=args.quick, budget_s=args.budget_s, hardware=hardware,
                     command=" ".join([parser.prog, *argv]), only=only))
    return 0


if __name__ == "__main__":
    # Through the importable module, so the rank functions and jobs pickled into spawned
    # processes name zsim.validation.gpu_report, not __main__.
    from zsim.validation.gpu_report import main as module_main

    sys.exit(module_main())
