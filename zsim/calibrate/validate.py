"""Predicted vs measured: run a plan for real (zsim.calibrate.step) and in the simulator
(zsim.simulate) with the same model, and report the error per metric; regenerate the
committed validation report (CSV + plots) over a grid of plans.

Owns the comparison protocol. The model the backend runs and the model the simulator
predicts are the same ModelSpec, including the kernel knobs of the backend's device
(`backend_knobs`): CPU runs use the composite RMSNorm decomposition (it keeps fp32
copies), while CPU SDPA takes a flash kernel that saves q, k, v, out and the log-sum-exp
like CUDA's, so attention_kernel stays "flash". Metrics: step time, peak memory (CPU: live
tensor bytes), model state at rest (after a step), time the collectives ran (the
backend's own spans from torch.profiler), activation bytes saved by the blocks and by the
root (autograd's saved tensors, deduplicated by storage, vs
zsim.analytic.activations). Plans the simulator does not model yet (tensor and pipeline
parallelism) get measured-only rows, their note saying why. Bounds (issues 4 and 10,
gloo CPU): activations 3%, peak memory 5%, model state 1%, step time 15%. On CPU ranks
the host is the device, so what a plan offloads to the host
(zsim.schedule.lower.host_state_bytes) is added to the predicted state and peak.
Imports torch (through step) and matplotlib (report only).
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from zsim.analytic.activations import (
    block_input_casts,
    block_saved_tensors,
    root_saved_tensors,
)
from zsim.atomic import write_files
from zsim.calibrate.step import PlanMeasurement, measure_plan
from zsim.errors import ConfigError
from zsim.schedule.lower import host_state_bytes, rank_model, runs_autocast
from zsim.schedule.pipeline_order import rank_layers
from zsim.simulate import simulate
from zsim.spec.deepspeed import DeepSpeedZero
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
"""Largest accepted |error| per metric on gloo/CPU, percent (issue 4, item 5; the model
state at rest, issue 10, item 6)."""

MIN_TIMED_S = 6.0
"""Timed steps of one run fill at least this many seconds (see zsim.calibrate.step): the
shared host has slow and fast spells, and eight 0.2 s steps would sample only one."""

REPORT_RUNS = 3
"""Runs of each plan in the report, in separate passes over the grid (minutes apart): the
shared host has slow spells lasting minutes, in which one run of a plan measured up to 20%
slower than another; the report's step time is the median over every run's steps."""

FIELDS = ("model", "plan", "nproc", "backend", "metric", "predicted", "measured", "error_pct",
          "note")

UNSIMULATED_FIELDS = ("plan.tp", "plan.pp")
"""Plan fields the simulator may refuse as not modelled (ConfigError on that field): a
case refused there gets measured-only rows, with the simulator's reason as their note."""


def backend_knobs(device_type: str) -> dict[str, Any]:
    """ModelSpec kernel knobs describing what the backend's device actually runs.

    Args:
        device_type: "cpu" or "cuda".
    """
    if device_type == "cpu":
        # torch.nn.RMSNorm on CPU decomposes: x.float(), rsqrt, x * rsqrt kept in fp32.
        return {"norm_kernel": "composite"}
    return {}


def validate(model: ModelSpec, plan: Plan, *, nproc: int, profile: HardwareProfile,
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
    autocast = runs_autocast(plan)
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
    return [_row(common, metric, predicted, value, note)
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


def _row(common: dict[str, Any], metric: str, predicted: dict[str, float | None] | None,
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


GRID_STRATEGIES: tuple[str, ...] = ("ddp", "fsdp", "fsdp-no-reshard")
"""Strategies of the report grid run by torch (DDP, FSDP2), plus hsdp 2x2 at world 4."""

GRID_DS = DeepSpeedZero(reduce_bucket_size=500_000, allgather_bucket_size=500_000,
                        prefetch_bucket_size=500_000, param_persistence_threshold=1_000)
"""DeepSpeed knobs of the report's ZeRO plans, scaled to its d_model-256 models as
DeepSpeed's defaults are to billion-parameter ones: buckets of about half a million
elements (a block or two, not the whole model: the defaults' 5e8-element buckets are
1 GB buffers that would swamp every other term of the peak), and only the norms and
the d-wide biases whole (persistent) under ZeRO-3, not every 256 x 256 weight."""

KNOBS: dict[str, Any] = {"seq_len": 256, "micro_batch": 2}
"""Sequence and micro-batch of every plan of the grid."""


LLAMA_TINY = ModelSpec(name="llama-tiny", num_layers=4, d_model=256, num_heads=4,
                       num_kv_heads=2, ffn_hidden=688, vocab_size=2048, max_seq_len=256)
"""The report's small Llama block (GQA, SwiGLU, RMSNorm, RoPE, untied)."""
GPT_TINY = ModelSpec(name="gpt-tiny", num_layers=4, d_model=256, num_heads=4, num_kv_heads=4,
                     ffn_hidden=1024, mlp="gelu", norm="layernorm", bias=True,
                     vocab_size=2048, tied_embeddings=True, learned_pos_emb=True,
                     max_seq_len=256)
"""The report's small GPT block, GPT-3's structure at llama-tiny's size (LayerNorm with
biases, biased projections, GELU MLP of 4d, learned positions, tied embeddings)."""


def grid_models() -> list[ModelSpec]:
    """The models of the report's torch plans: a 4-block GQA Llama and Llama-3-8B scaled
    to d_model 256 (all 32 blocks kept), both small enough for 2 CPU cores."""
    from zsim.calibrate.model import scale_model
    from zsim.spec.presets import PRESETS

    return [LLAMA_TINY, scale_model(PRESETS["llama3-8b"], d_model=256, vocab_size=2048,
                                    max_seq_len=256)]


def grid_plans(world_sizes: tuple[int, ...] = (2, 4)) -> list[Plan]:
    """Torch plans of the report grid: every GRID_STRATEGIES entry at each world size,
    hsdp with shard groups of 2 where the world allows two groups, and fsdp with selective
    and full recomputation at the smallest world size."""
    plans = [Plan.for_strategy(s, gpus=n, **KNOBS)
             for n in world_sizes for s in GRID_STRATEGIES]
    plans += [Plan.for_strategy("hsdp", gpus=n, shard_group=2, **KNOBS)
              for n in world_sizes if n >= 4]
    plans += [Plan.for_strategy("fsdp", gpus=world_sizes[0], recompute=r, **KNOBS)
              for r in ("selective", "full")]
    return plans


def library_plans(world_sizes: tuple[int, ...] = (2, 4)) -> list[Plan]:
    """Plans of the report grid run by DeepSpeed and FSDP1 at each world size: ZeRO-1,
    ZeRO-2 (also with the optimizer offloaded to the CPU) and ZeRO-3 with GRID_DS, and
    FSDP1's FULL_SHARD (fsdp) and SHARD_GRAD_OP (fsdp-no-reshard)."""
    plans = []
    for n in world_sizes:
        plans += [Plan.for_strategy(s, gpus=n, ds=GRID_DS, **KNOBS)
                  for s in ("zero1", "zero2", "zero3")]
        plans.append(Plan.for_strategy("zero2", gpus=n, ds=GRID_DS, offload="optimizer",
                                       **KNOBS))
        plans += [Plan.for_strategy(s, gpus=n, impl="fsdp1", **KNOBS)
                  for s in ("fsdp", "fsdp-no-reshard")]
    return plans


def parallel_plans() -> list[Plan]:
    """Plans of the report grid with tensor or pipeline parallelism (issue 12, item 5),
    one data-parallel rank unless said: TP over 2 ranks (zsim.calibrate.tensor_parallel),
    FSDP2 x TP on a 2 x 2 mesh of 4 ranks, and a 2-stage 1F1B pipeline over 4
    micro-batches (zsim.calibrate.pipeline)."""
    return [Plan(strategy="ddp", dp_shard=1, tp=2, **KNOBS),
            Plan(strategy="fsdp", dp_shard=2, tp=2, **KNOBS),
            Plan(strategy="ddp", dp_shard=1, pp=2, grad_accum=4, **KNOBS)]


def grid() -> list[tuple[ModelSpec, Plan]]:
    """Every (model, plan) of the report: the torch plans on both grid_models, the
    library plans on llama-tiny and gpt-tiny, the parallel plans on llama-tiny."""
    cases = [(m, p) for m in grid_models() for p in grid_plans()]
    cases += [(m, p) for m in (LLAMA_TINY, GPT_TINY) for p in library_plans()]
    return cases + [(LLAMA_TINY, p) for p in parallel_plans()]


def case_key(spec: ModelSpec, plan: Plan) -> str:
    """A case's name for --only, as its rows name it: "<model> <plan label> n<N>" (the
    label names a program other than the strategy's default, e.g. fsdp[fsdp1])."""
    return f"{spec.name} {plan.label} n{plan.world_size}"


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

    from zsim.calibrate.profile import machine_description

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
        "command": f"python -m zsim.calibrate.validate --out {out_dir} --runs {runs}"
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
        out.append(_row(common, row["metric"], predicted, row["measured"], note))
    path = write_csv(out, csv_path)
    _plot(out, out_dir)
    batch = {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"python -m zsim.calibrate.validate --out {out_dir} --repredict",
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
    over the sessions, zsim.calibrate.profile.write_profile)."""

    def __init__(self, worlds: list[int], out_dir: Path, *, backend: str,
                 rounds: int) -> None:
        from zsim.calibrate.microbench import BenchConfig

        self.worlds, self.out_dir, self.backend = worlds, out_dir, backend
        self.config = BenchConfig(rounds=rounds)
        self.sessions: dict[int, list[Any]] = {n: [] for n in worlds}
        self.started = datetime.now(timezone.utc)

    def session(self) -> None:
        from zsim.calibrate.profile import bench_ranks

        for n in self.worlds:
            self.sessions[n].append(bench_ranks(self.backend, n, config=self.config))

    def profiles(self) -> dict[int, HardwareProfile]:
        from zsim.calibrate.profile import write_profile

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
    from zsim.calibrate.microbench import BenchConfig
    from zsim.calibrate.profile import calibrate

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


def main(argv: list[str] | None = None) -> Path:
    """`python -m zsim.calibrate.validate`: parse `argv` (default sys.argv[1:]) and
    regenerate the report, or the batch of it that --only names.

    Returns:
        The CSV path.
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m zsim.calibrate.validate",
        description="Regenerate the validation report (every case of the grid, or a batch "
                    "of them with --only, for real and in the simulator).")
    parser.add_argument("--out", type=Path, required=True,
                        help="report folder (the repository's is reports/validation)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--profile", default="local-cpu",
                       help="calibrated hardware profile (name or YAML path) of its world "
                            "size; the batch's other world sizes are calibrated here")
    where.add_argument("--calibrate-here", action="store_true",
                       help="calibrate every world size of the batch on this host (into "
                            "--out) instead of using --profile: for a host other than the "
                            "committed profiles'")
    parser.add_argument("--only", action="append", default=[], metavar="PATTERN",
                        help="measure only the cases whose '<model> <plan label> n<N>' "
                             "matches this fnmatch pattern (repeatable); their rows replace "
                             "theirs in the existing report")
    parser.add_argument("--no-time", action="store_true",
                        help="keep only host-independent metrics (memory, state, "
                             "activations): for a host other than the profiles'")
    parser.add_argument("--runs", type=int, default=REPORT_RUNS, help="runs of each case")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run, at least")
    parser.add_argument("--calibration-rounds", type=int, metavar="N",
                        help="rounds of the benchmarks of each profile calibrated here: "
                             "before each pass over the cases when timed (default 1), "
                             "else once before the runs (default: "
                             "zsim.calibrate.microbench.BenchConfig's)")
    parser.add_argument("--min-timed-s", type=float, default=MIN_TIMED_S, metavar="SECONDS",
                        help="time more steps until each run's timed steps fill this many "
                             "seconds (default %(default)g)")
    parser.add_argument("--repredict", action="store_true",
                        help="measure nothing: predict the report's rows again with the "
                             "simulator as it is now, keeping their measured figures")
    args = parser.parse_args(argv)
    if args.min_timed_s < 0:
        parser.error("--min-timed-s must be >= 0")
    if args.calibration_rounds is not None and args.calibration_rounds < 1:
        parser.error("--calibration-rounds must be >= 1")
    profile = None
    if not args.calibrate_here:
        from zsim.spec.registry import resolve_hardware

        profile = resolve_hardware(args.profile)
    if args.repredict:
        if profile is None:
            parser.error("--repredict predicts with --profile, not --calibrate-here")
        return repredict_report(profile, out_dir=args.out)
    return regenerate_report(profile, out_dir=args.out, steps=args.steps, runs=args.runs,
                             only=tuple(args.only), keep_time=not args.no_time,
                             min_timed_s=args.min_timed_s,
                             calibration_rounds=args.calibration_rounds)


if __name__ == "__main__":
    print(main())
