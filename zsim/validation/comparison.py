"""Predicted vs measured for one plan: run it for real (zsim.backend.measured_step) and in
the simulator (zsim.simulate) with the same model, and report the error per metric.

Owns the comparison protocol. The model the backend runs and the model the simulator
predicts are the same ModelSpec, including the kernel knobs of the backend's device
(`backend_knobs`): CPU runs use the composite RMSNorm decomposition (it keeps fp32
copies), while CPU SDPA takes a flash kernel that saves q, k, v, out and the log-sum-exp
like CUDA's, so attention_kernel stays "flash". Metrics: step time, peak memory (CPU: live
tensor bytes), model state at rest (after a step), time the collectives ran (the
backend's own spans from torch.profiler), activation bytes saved by the blocks and by the
root (autograd's saved tensors, deduplicated by storage, vs
zsim.analytic.activations). Plans the simulator does not model yet get measured-only
rows, their note saying why. Bounds (gloo CPU; docs/validation.md): activations 3%, peak
memory 5%, model state 1%, step time 15%. On CPU ranks the host is the device, so what a
plan offloads to the host (zsim.schedule.lower.host_state_bytes) is added to the
predicted state and peak. The report over the grid of plans is zsim.validation.report's.
Imports torch.
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from zsim.analytic.activations import (
    block_input_casts,
    block_saved_tensors,
    root_saved_tensors,
)
from zsim.atomic import write_files
from zsim.backend.measured_step import PlanMeasurement, measure_plan
from zsim.backend.reference_model import scale_model
from zsim.errors import ConfigError
from zsim.schedule.lower import host_state_bytes, rank_model
from zsim.schedule.pipeline_order import rank_layers
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes

BOUNDS_PCT: dict[str, float] = {
    "activation_bytes_blocks": 3.0,
    "activation_bytes_root": 3.0,
    "peak_memory_bytes": 5.0,
    "state_memory_bytes": 1.0,
    "step_time_s": 15.0,
}
"""Largest accepted |error| per metric on gloo/CPU, percent: the CPU bounds of
docs/validation.md, restated in tests/validation/test_validation_report.py."""

MIN_TIMED_S = 6.0
"""Timed steps of one run fill at least this many seconds (see
zsim.backend.measured_step): the shared host has slow and fast spells, and eight 0.2 s
steps would sample only one."""

FIELDS = ("model", "plan", "nproc", "backend", "metric", "predicted", "measured", "error_pct",
          "note")

UNSIMULATED_FIELDS = ("plan.tp", "plan.pp")
"""Plan fields the simulator may refuse as not modelled (ConfigError on that field): a
case refused there gets measured-only rows, with the simulator's reason as their note."""


CPU_VALIDATION_D_MODEL = 256
"""Hidden size presets are scaled to for validation on CPU (layers, and so the plan's
units, are kept)."""
CPU_VALIDATION_MAX_PARAMS = 50_000_000
"""Models larger than this are scaled down before running on CPU."""


def for_this_machine(spec: ModelSpec, seq: int | None) -> tuple[ModelSpec, int | None]:
    """The model and sequence length a validation runs on this machine: as given with
    CUDA; without, a model above CPU_VALIDATION_MAX_PARAMS scaled to d_model
    CPU_VALIDATION_D_MODEL (64 per query head of a kv head at least; every layer, so the
    plan's units, kept; a 2,048-word vocabulary), and a default sequence of 256 tokens."""
    if torch.cuda.is_available() or spec.num_params <= CPU_VALIDATION_MAX_PARAMS:
        return spec, seq
    ratio = spec.num_heads // spec.num_kv_heads
    return (scale_model(spec, d_model=max(CPU_VALIDATION_D_MODEL, 64 * ratio),
                        vocab_size=2048, max_seq_len=max(256, seq or 0)), seq or 256)


def backend_knobs(device_type: str) -> dict[str, Any]:
    """ModelSpec kernel knobs describing what the backend's device actually runs.

    Args:
        device_type: "cpu" or "cuda".
    """
    if device_type == "cpu":
        # torch.nn.RMSNorm on CPU decomposes: x.float(), rsqrt, x * rsqrt kept in fp32.
        return {"norm_kernel": "composite"}
    return {}


def validate_plan(model: ModelSpec, plan: Plan, *, nproc: int, profile: HardwareProfile,
                  steps: int = 3, min_timed_s: float = MIN_TIMED_S,
                  out_dir: Path | None = None) -> list[dict[str, Any]]:
    """Run `plan` for real on `nproc` ranks and in the simulator; compare.

    Args:
        model: the model to run (scaled to this machine by the caller if needed); the
            backend's kernel knobs are applied to it for both sides.
        plan: the plan; world size must equal nproc.
        nproc: processes.
        profile: the hardware profile the simulator uses (a calibrated one).
        steps: timed steps of the real run, at least.
        min_timed_s: time more steps if `steps` would take less than this, seconds.
        out_dir: folder to write the rows to as a CSV (named by csv_name); None writes
            nothing.

    Returns:
        Rows {metric, predicted, measured, error_pct} (plus model, plan, nproc, backend).

    Raises:
        ConfigError: the plan cannot run on the backend or in the simulator.
        RankFailed: the real run failed or hung.
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = replace(model, **backend_knobs(device))
    measured = measure_plan(spec, plan, nproc=nproc, steps=steps, min_timed_s=min_timed_s)
    rows = compare(spec, plan, profile, measured)
    if out_dir is not None:
        write_csv(rows, Path(out_dir) / csv_name(spec, plan))
    return rows


def csv_name(spec: ModelSpec, plan: Plan) -> str:
    """File name of one validation's rows: `<model>-<strategy>[-tp<T>[-sp]][-pp<P>-<pipeline
    schedule>]-n<world size>.csv`."""
    parallel = ((f"-tp{plan.tp}" + ("-sp" if plan.sp else "") if plan.tp > 1 else "")
                + (f"-pp{plan.pp}-{plan.pp_schedule}" if plan.pp > 1 else ""))
    return f"{_slug(spec.name)}-{plan.strategy}{parallel}-n{plan.world_size}.csv"


def predicted_activation_bytes(spec: ModelSpec, plan: Plan) -> tuple[int, int]:
    """Saved-activation bytes of the blocks and of the root on rank 0 (measured_figures
    reads rank 0's), as the backend's recorder attributes them: the RoPE tables are saved
    first inside layers.0, so they count under the blocks (or each block its own cast of
    them, zsim.analytic.activations.block_input_casts). A rank saves what its TP
    shard of the model computes (zsim.schedule.lower.rank_model: its heads and MLP
    slice, the norms and the loss whole). A pipeline's first rank records every
    micro-batch of the step (the recorder sees the schedule as one step): its stages'
    blocks grad_accum times, and of the root only the step's token ids (one int64
    tensor the schedule slices)."""
    act = dtype_bytes(plan.param_dtype)
    autocast = plan.runs_autocast
    model = rank_model(spec, plan)
    per_block = sum(t.bytes for t in block_saved_tensors(
        model, micro_batch=plan.micro_batch, seq_len=plan.seq_len, recompute=plan.recompute,
        act_bytes=act, autocast=autocast))
    casts = sum(t.bytes for t in block_input_casts(
        model, seq_len=plan.seq_len, act_bytes=act, casts_inputs=plan.casts_block_inputs))
    per_block += casts
    root = root_saved_tensors(model, micro_batch=plan.micro_batch, seq_len=plan.seq_len,
                              act_bytes=act, autocast=autocast)
    tables = sum(t.bytes for t in root if t.name.startswith("rope."))
    # Blocks that get their own casts of the tables save those, not the root's tables.
    rope = 0 if casts else tables
    if plan.pp == 1:
        return spec.num_layers * per_block + rope, sum(t.bytes for t in root) - tables
    layers = rank_layers(plan, spec.num_layers, 0)
    ids = sum(t.bytes for t in root if t.name == "tok_embeddings.indices")
    return plan.grad_accum * layers * per_block + rope, plan.grad_accum * ids


def compare(spec: ModelSpec, plan: Plan, profile: HardwareProfile,
            measured: PlanMeasurement, *, times: bool = True) -> list[dict[str, Any]]:
    """Rows of predicted (simulator, activation model) vs measured figures; without
    `times`, only the host-independent ones (a measurement with no timed step). A plan
    the simulator refuses on an UNSIMULATED_FIELDS field (tensor or pipeline parallelism
    before the simulator models it) gets its measured figures with predicted and
    error_pct None and the simulator's reason as the note; so does a figure the
    simulator does not give for the plan (a pipeline's collective and forward times);
    other rows have no note.

    Raises:
        ConfigError: the simulator refuses the plan on any other field.
    """
    predicted, note = predictions(spec, plan, profile, backend=measured.backend)
    common = {"model": spec.name, "plan": plan.label, "nproc": plan.world_size,
              "backend": measured.backend}
    return [metric_row(common, metric, predicted, value, note)
            for metric, value in measured_figures(measured, times=times).items()]


def predictions(spec: ModelSpec, plan: Plan, profile: HardwareProfile, *, backend: str
                ) -> tuple[dict[str, float | None] | None, str]:
    """The simulator's figures of a case by metric (None where it gives none), and "";
    or None and why, for a plan it refuses on an UNSIMULATED_FIELDS field.

    Raises:
        ConfigError: the simulator refuses the plan on any other field.
    """
    try:
        result = simulate(spec, profile, plan)
    except ConfigError as e:
        if e.field not in UNSIMULATED_FIELDS:
            raise
        return None, f"not simulated: {e}"
    # On CPU ranks the host is the device: what offload moves there is measured too.
    host = host_state_bytes(spec, plan) if backend == "gloo" else 0.0
    block_pred, root_pred = predicted_activation_bytes(spec, plan)
    return {"peak_memory_bytes": result.peak_memory_bytes + host,
            "state_memory_bytes": result.baseline_memory_bytes + host,
            "activation_bytes_blocks": block_pred,
            "activation_bytes_root": root_pred, "step_time_s": result.step_time_s,
            "comm_busy_s": result.comm_busy_total_s,
            "forward_time_s": result.time_to_loss_s}, ""


def metric_row(common: dict[str, Any], metric: str,
               predicted: dict[str, float | None] | None,
               value: float, note: str) -> dict[str, Any]:
    """One report row: the measured `value` of `metric`, its prediction and error."""
    figure = None if predicted is None else predicted[metric]
    pred = None if figure is None else float(figure)
    err = (None if pred is None else
           round(100.0 * (pred - value) / value, 2) if value else float("nan"))
    why = note or ("" if pred is not None else
                   "not predicted: a pipeline is replayed per rank without its "
                   "collectives' or forward phase's times (zsim.simulate.simulate_pipeline)")
    return {**common, "metric": metric, "predicted": pred, "measured": float(value),
            "error_pct": err, "note": why}


def measured_figures(measured: PlanMeasurement, *, times: bool = True) -> dict[str, float]:
    """The figures of a real run that the report compares, by metric, in row order: step
    time (the median of the slowest rank's steps), peak and model state at rest (the
    highest rank's: a pipeline's worst stage), saved activations of the blocks and of the
    root (rank 0's), time the collectives ran (median over ranks) and forward time (the
    root module's forward, hook to hook, the slowest rank's: its blocking collectives and
    waits included, as in the simulated time to the loss it is compared with,
    Result.time_to_loss_s); without `times`, the host-independent ones only."""
    saved = measured.ranks[0].saved
    figures = {
        "peak_memory_bytes": float(measured.peak_bytes),
        "state_memory_bytes": float(max(r.memory.after_first_step_bytes
                                        for r in measured.ranks)),
        "activation_bytes_blocks": float(sum(t.bytes for t in saved if t.scope != "root")),
        "activation_bytes_root": float(sum(t.bytes for t in saved if t.scope == "root")),
    }
    if not times:
        return figures
    # The root's forward hooks span the whole forward (every block runs inside it).
    return {"step_time_s": measured.step_time_s, **figures,
            "comm_busy_s": statistics.median(sum(r.collective_busy_s.values())
                                             for r in measured.ranks),
            "forward_time_s": max(r.forward_s["root"] for r in measured.ranks)}


def write_csv(rows: list[dict[str, Any]], path: Path,
              fields: tuple[str, ...] = FIELDS) -> Path:
    """Write rows with the `fields` columns, in order (atomically: zsim.atomic)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    for row in rows:
        # None (no prediction) and a missing note are empty cells.
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in fields})
    (written,) = write_files(path.parent, {path.name: text.getvalue().encode()})
    return written


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
