"""The public entry points the CLI calls: resolve names, run the planner or simulator,
and return plain data (dicts/records) for rendering. No printing here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zsim import planner
from zsim.atomic import write_files
from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan, precision_knobs
from zsim.spec.presets import ALIASES, PRESETS
from zsim.spec.registry import hardware_names, resolve_hardware, resolve_model
from zsim.units import GiB


def plan(*, model: str | None, params: float | None, gpus: int, hardware: str,
         seq: int | None, micro_batch: int | None = None, grad_accum: int | None = None,
         precision: str | None = None, ds_config: Path | None = None,
         fsdp_config: Path | None = None) -> dict[str, Any]:
    """Rank candidate plans for a model on `gpus` GPUs of a hardware profile: every
    strategy and program (zsim.planner.candidate_plans), or, given a user's DeepSpeed or
    accelerate FSDP config, that config and its variations (zsim.planner.config_variations).

    Returns:
        {"model", "num_params", "hardware", "gpus", "seq_len", "micro_batch",
        "recommended", "yours" (the config's plan label, or None), "warnings",
        "candidates": [record, ...]} with records from zsim.planner.to_record, each with
        "yours" (whether it is the config's own plan).

    Raises:
        ConfigError: unknown model/hardware, invalid sizes, or a bad config file.
    """
    spec = resolve_model(model, params=params)
    hw = resolve_hardware(hardware)
    seq_len = seq if seq is not None else spec.max_seq_len
    warnings: tuple[str, ...] = ()
    yours: Plan | None = None
    if ds_config is not None or fsdp_config is not None:
        from zsim.spec.user_config import config_plan  # its readers: only with a config

        yours, warnings = config_plan(spec, hw, ds_config=ds_config, fsdp_config=fsdp_config,
                                      gpus=gpus, seq=seq, micro_batch=micro_batch,
                                      grad_accum=grad_accum, precision=precision)
        ranked = planner.choose_among(spec, hw, planner.config_variations(yours, hw))
    else:
        ranked = planner.choose(spec, hw, gpus=gpus, seq_len=seq_len,
                                micro_batch=1 if micro_batch is None else micro_batch,
                                grad_accum=1 if grad_accum is None else grad_accum,
                                **precision_knobs(precision or "bf16"))
    best = ranked[0]
    return {
        "model": spec.name,
        "num_params": spec.num_params,
        "hardware": hw.name,
        "gpus": gpus,
        "seq_len": seq_len,
        "micro_batch": best.plan.micro_batch,
        "recommended": best.plan.label if best.fits else None,
        "yours": yours.label if yours is not None else None,
        "warnings": list(warnings),
        "candidates": [{**planner.to_record(spec, c, best), "yours": c.plan == yours}
                       for c in ranked],
    }


def models() -> list[dict[str, Any]]:
    """One row per model preset, with its aliases and exact parameter count."""
    aliases: dict[str, list[str]] = {}
    for alias, name in ALIASES.items():
        aliases.setdefault(name, []).append(alias)
    return [{"name": m.name, "aliases": ",".join(aliases.get(m.name, [])) or "-",
             "params": f"{m.num_params:,}", "layers": m.num_layers, "d_model": m.d_model,
             "heads": m.num_heads, "kv_heads": m.num_kv_heads, "seq_len": m.max_seq_len}
            for m in PRESETS.values()]


def hardware() -> list[dict[str, Any]]:
    """One row per shipped hardware profile."""
    rows = []
    for name in hardware_names():
        hw = resolve_hardware(name)
        rows.append({"name": hw.name, "gpu": hw.gpu_name, "hbm_gib": round(hw.hbm_bytes / GiB, 1),
                     "gpus_per_node": hw.gpus_per_node, "intra_node": hw.intra_node.name,
                     "inter_node": hw.inter_node.name})
    return rows


def build_plan(spec: ModelSpec, *, gpus: int, strategy: str, shard_group: int | None,
               seq: int | None, micro_batch: int, grad_accum: int, ac: str,
               precision: str, offload: str, impl: str | None = None) -> Plan:
    """The Plan the CLI's plan flags describe (shared by simulate and validate); `impl`
    None runs the strategy's default program.

    Raises:
        ConfigError: an invalid flag value or combination.
    """
    return Plan.for_strategy(
        strategy, gpus=gpus, shard_group=shard_group,
        seq_len=seq if seq is not None else spec.max_seq_len, micro_batch=micro_batch,
        grad_accum=grad_accum, recompute=ac, offload=offload, impl=impl or "",
        **precision_knobs(precision))


def simulate(*, model: str, gpus: int, strategy: str | None, shard_group: int | None = None,
             hardware: str, seq: int | None = None, micro_batch: int | None = None,
             grad_accum: int | None = None, ac: str = "none", precision: str | None = None,
             offload: str = "none", impl: str | None = None, trace: Path | None = None,
             fit_only: bool = False, ds_config: Path | None = None,
             fsdp_config: Path | None = None) -> dict[str, Any]:
    """Simulate one plan; optionally write its Chrome trace (Perfetto) to `trace`. HSDP
    shards within a node unless `shard_group` says otherwise. With `fit_only` the engine
    stops at the first allocation over HBM (zsim.simulate.simulate). With `ds_config`
    the plan is the DeepSpeed config's (zsim.spec.ds_config), the other arguments filling
    what it leaves "auto" (micro-batch 1, one micro-batch per step and bf16 by default);
    with `fsdp_config` the accelerate FSDP config's (zsim.spec.fsdp_config).

    Returns:
        Result.to_dict() plus "model", "hardware", "plan" (the Plan's fields) and
        "warnings" (config keys read but not modelled).

    Raises:
        ConfigError: invalid names, sizes or combinations, or a bad config file.
    """
    from zsim.simulate import chrome_trace
    from zsim.simulate import simulate as run

    spec = resolve_model(model)
    hw = resolve_hardware(hardware)
    warnings: tuple[str, ...] = ()
    if ds_config is not None or fsdp_config is not None:
        from zsim.spec.user_config import config_plan  # its readers: only with a config

        plan, warnings = config_plan(spec, hw, ds_config=ds_config, fsdp_config=fsdp_config,
                                     gpus=gpus, strategy=strategy, shard_group=shard_group,
                                     seq=seq, micro_batch=micro_batch, grad_accum=grad_accum,
                                     ac=ac, precision=precision, offload=offload)
    else:
        if strategy is None:
            raise ConfigError("strategy", None,
                              "give --strategy (or a --ds-config or --fsdp-config)")
        if strategy == "hsdp" and shard_group is None:
            shard_group = min(hw.gpus_per_node, gpus)  # shard within a node, the usual HSDP
        plan = build_plan(spec, gpus=gpus, strategy=strategy, shard_group=shard_group,
                          seq=seq, micro_batch=1 if micro_batch is None else micro_batch,
                          grad_accum=1 if grad_accum is None else grad_accum, ac=ac,
                          precision=precision or "bf16", offload=offload, impl=impl)
    result = run(spec, hw, plan, trace=trace is not None, fit_only=fit_only)
    if trace is not None and not result.spans:
        raise ConfigError("trace", str(trace), "the plan was not simulated (its memory floor "
                          "exceeds HBM): there is no timeline to write")
    if trace is not None:
        write_files(trace.parent, {trace.name: json.dumps(chrome_trace(result)).encode()})
    return {"model": spec.name, "hardware": hw.name, "plan": plan.to_dict(),
            "warnings": list(warnings), **result.to_dict()}


def sweep(scenario: Path, out: Path | None = None, *,
          progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """Simulate every run of a scenario YAML (its sweep expanded) and, with `out`, write its
    report there: `<name>.csv`, `<name>.md` and `<name>-*.png`, all or nothing.

    Args:
        scenario: the scenario file (schema in zsim.scenario).
        out: folder for the report files, or None to write nothing.
        progress: called after each run with (runs done, runs in total, run name).

    Returns:
        {"scenario": name, "rows": one record per run (zsim.report.frame.sweep_frame
        columns), "csv": the CSV text, "written": the paths written, "warnings": the
        runs' config keys read but not modelled, each once}.

    Raises:
        ConfigError: a bad scenario file (the field path names where), a run the simulator
            does not model, or a bad report template.
    """
    from zsim.report.build import report_files
    from zsim.report.frame import csv_text, sweep_frame
    from zsim.scenario import load_scenario, simulate_runs

    loaded = load_scenario(scenario)
    pairs = simulate_runs(loaded, progress=progress)
    frame = sweep_frame(pairs)
    written = [] if out is None else write_files(out, report_files(loaded, pairs))
    warnings = list(dict.fromkeys(w for run in loaded.runs for w in run.warnings))
    return {"scenario": loaded.name, "rows": frame.to_dict(orient="records"),
            "csv": csv_text(frame), "written": [str(p) for p in written],
            "warnings": warnings}


CPU_VALIDATION_D_MODEL = 256
"""Hidden size presets are scaled to for validation on CPU (layers, and so the plan's
units, are kept)."""
CPU_VALIDATION_MAX_PARAMS = 50_000_000
"""Models larger than this are scaled down before running on CPU."""


def calibrate(*, backend: str, nproc: int, out: Path) -> Path:
    """Benchmark this machine's collectives and kernels on `nproc` ranks and write a
    hardware profile YAML (with provenance) to `out`.

    Raises:
        ConfigError: unknown backend or non-positive nproc.
    """
    if backend not in ("gloo", "nccl"):
        raise ConfigError("backend", backend, "must be gloo or nccl")
    if nproc < 1:
        raise ConfigError("nproc", nproc, "must be a positive integer")
    from zsim.calibrate import calibrate as run

    return run(backend, nproc, Path(out))


def validate(*, model: str, nproc: int, strategy: str, shard_group: int | None = None,
             profile: str = "local-cpu", seq: int | None = None, micro_batch: int = 1,
             grad_accum: int = 1, ac: str = "none", precision: str = "bf16",
             offload: str = "none", impl: str | None = None,
             out: Path | None = None) -> dict[str, Any]:
    """Run one plan for real on `nproc` processes and in the simulator with a calibrated
    profile; compare; with `out`, also write the rows there as a CSV. On a machine
    without CUDA, models above CPU_VALIDATION_MAX_PARAMS are scaled to d_model
    CPU_VALIDATION_D_MODEL (same layers and units) and the default sequence is 256
    tokens.

    Returns:
        {"model", "profile", "plan", "rows": [{metric, predicted, measured, error_pct,
        bound_pct, note}], "written": the CSV path or None}; predicted and error_pct
        are None, and the note says why, for a plan the simulator does not model yet.

    Raises:
        ConfigError: invalid names, sizes or combinations.
        RankFailed: the real run crashed or hung (the message carries the rank's error).
    """
    import torch

    from zsim.calibrate import validate as run
    from zsim.calibrate.model import scale_model
    from zsim.calibrate.validate import BOUNDS_PCT, csv_name

    spec = resolve_model(model)
    hw = resolve_hardware(profile)
    if not torch.cuda.is_available() and spec.num_params > CPU_VALIDATION_MAX_PARAMS:
        ratio = spec.num_heads // spec.num_kv_heads
        spec = scale_model(spec, d_model=max(CPU_VALIDATION_D_MODEL, 64 * ratio),
                           vocab_size=2048, max_seq_len=max(256, seq or 0))
        seq = seq or 256
    if strategy == "hsdp" and shard_group is None:
        shard_group = max(1, nproc // 2)
    plan = build_plan(spec, gpus=nproc, strategy=strategy, shard_group=shard_group, seq=seq,
                      micro_batch=micro_batch, grad_accum=grad_accum, ac=ac,
                      precision=precision, offload=offload, impl=impl)
    rows = run(spec, plan, nproc=nproc, profile=hw, out_dir=out)
    written = None if out is None else str(Path(out) / csv_name(spec, plan))
    return {"model": spec.name, "profile": hw.name, "plan": plan.label, "written": written,
            "rows": [{"metric": r["metric"], "predicted": r["predicted"],
                      "measured": r["measured"], "error_pct": r["error_pct"],
                      "bound_pct": BOUNDS_PCT.get(r["metric"]), "note": r["note"]}
                     for r in rows]}
