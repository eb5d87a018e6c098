"""The public entry points the CLI calls: resolve names, run the planner or simulator,
and return plain data (dicts/records) for rendering. No printing here."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zsim import planner
from zsim.atomic import write_files
from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan, precision_knobs
from zsim.spec.presets import ALIASES, PRESETS
from zsim.spec.registry import hardware_names, resolve_hardware, resolve_model
from zsim.units import GiB, dtype_bytes


def plan(*, model: str | None, params: float | None, gpus: int, hardware: str,
         seq: int | None, micro_batch: int | None = None, grad_accum: int | None = None,
         precision: str | None = None, ds_config: Path | None = None,
         fsdp_config: Path | None = None, global_batch: str | None = None,
         parallel: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rank candidate plans for a model on `gpus` GPUs of a hardware profile: every
    strategy and program (zsim.planner.candidate_plans), or, given a user's DeepSpeed or
    accelerate FSDP config, that config and its variations (zsim.planner.config_variations).
    When the world spans nodes and the model's parameters (compute dtype) exceed one
    GPU's HBM, or given `global_batch` or model-parallel degrees in `parallel` (tp, pp,
    cp: only factorizations with those), also every 2-D and 3-D factorization
    (zsim.parallel_planner), for a global batch of `global_batch` (default: one sequence
    per GPU).

    Returns:
        {"model", "num_params", "hardware", "gpus", "seq_len", "seq_len_source" (where
        seq_len came from: "--seq" or ModelSpec.seq_len_source), "micro_batch",
        "recommended", "yours" (the config's plan label, or None), "warnings" (the
        model's and the config's),
        "candidates": [record, ...], "parallel": None or {"global_batch_sequences",
        "recommended", "candidates": [record, ...]}} with records from
        zsim.planner.to_record, each with "yours" (whether it is the config's own plan),
        and zsim.parallel_planner.parallel_record.

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
    searched = _parallel_search(spec, hw, gpus=gpus, seq_len=seq_len,
                                micro_batch=1 if micro_batch is None else micro_batch,
                                precision=precision, global_batch=global_batch,
                                parallel=parallel or {})
    return {
        "parallel": searched,
        "model": spec.name,
        "num_params": spec.num_params,
        "hardware": hw.name,
        "gpus": gpus,
        "seq_len": seq_len,
        "seq_len_source": "--seq" if seq is not None else spec.seq_len_source,
        "micro_batch": best.plan.micro_batch,
        "recommended": best.plan.label if best.fits else None,
        "yours": yours.label if yours is not None else None,
        "warnings": [*spec.warnings, *warnings],
        "candidates": [{**planner.to_record(spec, c, best), "yours": c.plan == yours}
                       for c in ranked],
    }


def _parallel_search(spec: ModelSpec, hw: Any, *, gpus: int, seq_len: int, micro_batch: int,
                     precision: str | None, global_batch: str | None,
                     parallel: dict[str, Any]) -> dict[str, Any] | None:
    """The 2-D and 3-D plans of `api.plan`, or None where not asked for (one node, no
    --global-batch, no model-parallel degree)."""
    from zsim import parallel_planner as pp

    for key in parallel:
        if key not in ("tp", "pp", "cp"):
            raise ConfigError(key, parallel[key], "zsim plan fixes only tp, pp and cp")
    # Asked for, or the usual case for TP and PP: a multi-node world whose model's
    # parameters alone (compute dtype) outgrow one GPU.
    params_bytes = spec.num_params * dtype_bytes(precision_knobs(precision or "bf16")[
        "param_dtype"])
    needed = gpus > hw.gpus_per_node and params_bytes > hw.hbm_bytes
    if global_batch is None and not parallel and not needed:
        return None
    sequences = gpus if global_batch is None else pp.parse_global_batch(global_batch, seq_len)
    plans = [p for p in pp.parallel_plans(spec, hw, gpus=gpus, seq_len=seq_len,
                                          global_batch=sequences, micro_batch=micro_batch,
                                          **precision_knobs(precision or "bf16"))
             if all(getattr(p, k) == v for k, v in parallel.items())]
    if not plans:
        raise ConfigError("gpus", gpus, f"no 2-D or 3-D factorization of {gpus} GPUs runs "
                          f"a global batch of {sequences} sequences of {spec.name}"
                          + (f" with {parallel}" if parallel else ""))
    ranked = pp.choose_parallel(spec, hw, plans)
    best = ranked[0]
    return {"global_batch_sequences": sequences,
            "recommended": best.plan.label if best.fits else None,
            "candidates": [pp.parallel_record(c, best) for c in ranked]}


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


PARALLEL_FIELDS: tuple[str, ...] = ("tp", "pp", "cp", "sp", "async_tp", "tp_across_nodes",
                                    "pp_schedule", "virtual_stages")
"""The Plan's model-parallel fields the CLI's --tp, --pp, --cp, --sp, --async-tp,
--tp-across-nodes, --pp-schedule and --virtual-stages set."""


def build_plan(spec: ModelSpec, *, gpus: int, strategy: str, shard_group: int | None,
               seq: int | None, micro_batch: int, grad_accum: int, ac: str,
               precision: str, offload: str, impl: str | None = None,
               parallel: dict[str, Any] | None = None, grad_sync: str = "last") -> Plan:
    """The Plan the CLI's plan flags describe (shared by simulate and validate); `impl`
    None runs the strategy's default program; `grad_sync` when FSDP2 reduces accumulated
    gradients (Plan.grad_sync); `parallel` holds the model-parallel fields
    (PARALLEL_FIELDS) that differ from their defaults, the data-parallel size being what
    they leave of `gpus`.

    Raises:
        ConfigError: an invalid flag value or combination.
    """
    parallel = dict(parallel or {})
    for key in parallel:
        if key not in PARALLEL_FIELDS:
            raise ConfigError("parallel", key, f"must be one of {', '.join(PARALLEL_FIELDS)}")
    return Plan.for_strategy(
        strategy, gpus=gpus, shard_group=shard_group,
        seq_len=seq if seq is not None else spec.max_seq_len, micro_batch=micro_batch,
        grad_accum=grad_accum, recompute=ac, offload=offload, impl=impl or "",
        grad_sync=grad_sync, **precision_knobs(precision), **parallel)


def default_shard_group(gpus_per_node: int, gpus: int, parallel: dict[str, Any]) -> int:
    """HSDP's usual shard group: the data-parallel ranks of one node (all of them when
    fewer), given the model-parallel degrees in `parallel` (1 where absent)."""
    model_parallel = 1
    for axis in ("tp", "cp", "pp"):
        degree = parallel.get(axis, 1)
        model_parallel *= degree if isinstance(degree, int) and degree > 0 else 1
    dp = max(1, gpus // model_parallel)
    return max(1, min(gpus_per_node // model_parallel, dp))


def simulate(*, model: str, gpus: int, strategy: str | None, shard_group: int | None = None,
             hardware: str, seq: int | None = None, micro_batch: int | None = None,
             grad_accum: int | None = None, ac: str = "none", precision: str | None = None,
             offload: str = "none", impl: str | None = None, trace: Path | None = None,
             fit_only: bool = False, ds_config: Path | None = None,
             fsdp_config: Path | None = None,
             parallel: dict[str, Any] | None = None,
             grad_sync: str = "last") -> dict[str, Any]:
    """Simulate one plan; optionally write its Chrome trace (Perfetto) to `trace`. HSDP
    shards within a node unless `shard_group` says otherwise. `parallel`: the plan's
    model-parallel fields (build_plan), not with a config file. With `fit_only` the engine
    stops at the first allocation over HBM (zsim.simulate.simulate). With `ds_config`
    the plan is the DeepSpeed config's (zsim.spec.ds_config), the other arguments filling
    what it leaves "auto" (micro-batch 1, one micro-batch per step and bf16 by default);
    with `fsdp_config` the accelerate FSDP config's (zsim.spec.fsdp_config).

    Returns:
        Result.to_dict() plus "model", "hardware", "plan" (the Plan's fields),
        "seq_len_source" (where the plan's seq_len came from: "--seq" or
        ModelSpec.seq_len_source) and "warnings" (model and config keys read but not
        modelled).

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

        if parallel:
            key = next(iter(parallel))
            raise ConfigError(key, parallel[key], "model-parallel flags are not read "
                              "together with --ds-config/--fsdp-config")
        plan, warnings = config_plan(spec, hw, ds_config=ds_config, fsdp_config=fsdp_config,
                                     gpus=gpus, strategy=strategy, shard_group=shard_group,
                                     seq=seq, micro_batch=micro_batch, grad_accum=grad_accum,
                                     ac=ac, precision=precision, offload=offload)
    else:
        if strategy is None:
            raise ConfigError("strategy", None,
                              "give --strategy (or a --ds-config or --fsdp-config)")
        if strategy == "hsdp" and shard_group is None:
            # Shard within a node, the usual HSDP.
            shard_group = default_shard_group(hw.gpus_per_node, gpus, parallel or {})
        plan = build_plan(spec, gpus=gpus, strategy=strategy, shard_group=shard_group,
                          seq=seq, micro_batch=1 if micro_batch is None else micro_batch,
                          grad_accum=1 if grad_accum is None else grad_accum, ac=ac,
                          precision=precision or "bf16", offload=offload, impl=impl,
                          parallel=parallel, grad_sync=grad_sync)
    if trace is not None and plan.pp > 1:
        raise ConfigError("trace", str(trace), "a pipeline step is replayed per pipeline "
                          "rank (zsim.engine.pipeline): it has no per-op timeline to write")
    result = run(spec, hw, plan, trace=trace is not None, fit_only=fit_only)
    if trace is not None and not result.spans:
        raise ConfigError("trace", str(trace), "the plan was not simulated (its memory floor "
                          "exceeds HBM): there is no timeline to write")
    if trace is not None:
        write_files(trace.parent, {trace.name: json.dumps(chrome_trace(result)).encode()})
    return {"model": spec.name, "hardware": hw.name, "plan": plan.to_dict(),
            "seq_len_source": "--seq" if seq is not None else spec.seq_len_source,
            "warnings": [*spec.warnings, *warnings], **result.to_dict()}


def sweep(scenario: Path, out: Path | None = None, *, executor: str = "local",
          ray_address: str | None = None,
          progress: Callable[[int, int, str], None] | None = None,
          overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Simulate every run of a scenario YAML (its sweep expanded) and, with `out`, write its
    results and report there.

    With `out`, each finished run is first appended to `out/journal.jsonl`, and a run
    already there is not simulated again, so an interrupted sweep resumes (zsim.sweep);
    at the end `results.csv` (and `results.parquet` where pyarrow is installed) and, for
    a scenario of at most zsim.report.build.REPORT_MAX_RUNS runs, the report
    (`<name>.csv`, `<name>.md` and `<name>-*.png` and `.svg`) are written, all or nothing. Their
    bytes do not depend on the executor, the number of workers or the interruptions.

    Args:
        scenario: the scenario file (schema in zsim.scenario).
        out: folder for the journal, results and report, or None to write nothing.
        executor: "local" (every local core; ZSIM_WORKERS=N caps them) or "ray".
        ray_address: the Ray cluster (executor "ray"; None: RAY_ADDRESS, else a local
            one).
        progress: called with (runs done, runs in total, last run finished): once before
            any run is simulated, then after each finished batch.
        overrides: `KEY=VALUE` settings over the file (zsim.scenario.apply_overrides).

    Returns:
        {"scenario": name, "rows": one record per run (zsim.report.frame.sweep_frame
        columns), "csv": the CSV text, "written": the paths written, "warnings": the
        runs' config keys read but not modelled, each once, "simulated": runs simulated
        by this call (the others were read back from the journal)}.

    Raises:
        ConfigError: a bad scenario file (the field path names where), a run the simulator
            does not model, a bad report template, an unknown executor, ray not
            installed, or an `out` folder that cannot be written.
    """
    from zsim.report.build import REPORT_MAX_RUNS, report_files, results_files
    from zsim.report.frame import csv_text, rows_frame
    from zsim.scenario import load_scenario, simulate_timeline
    from zsim.sweep import run_sweep

    loaded = load_scenario(scenario, overrides)
    report = out is not None and len(loaded.runs) <= REPORT_MAX_RUNS
    done = run_sweep(loaded, out, curves=loaded.memory_curves if report else (),
                     executor=executor, ray_address=ray_address, progress=progress)
    frame = rows_frame(done.rows)
    files = {} if out is None else results_files(frame)
    if report:
        files |= report_files(loaded, frame, done.curves,
                              timeline=simulate_timeline(loaded))
    written = [] if out is None else write_files(out, files)
    warnings = list(dict.fromkeys(w for run in loaded.runs for w in run.warnings))
    return {"scenario": loaded.name, "rows": frame.to_dict(orient="records"),
            "csv": csv_text(frame), "written": [str(p) for p in written],
            "warnings": warnings, "simulated": done.simulated}


SHIPPED_SCENARIOS = Path("scenarios")
"""Where `zsim report --all` finds the shipped studies: every *.yaml directly in this
folder, relative to the working folder (the repository root)."""


def report(scenarios: Sequence[Path], out: Path, *, shipped: bool = False,
           overrides: Sequence[str] = (),
           progress: Callable[[str, int, int, str], None] | None = None) -> dict[str, Any]:
    """Simulate each scenario and write its report into `out`: `<name>.csv`, `<name>.md`
    and `<name>-<figure>.png`/`.svg` (zsim.report.build), all scenarios' files all or
    nothing.

    Args:
        scenarios: scenario files (schema in zsim.scenario), each with a distinct name.
        out: folder for the report files.
        shipped: also every shipped study (SHIPPED_SCENARIOS/*.yaml, in name order).
        overrides: `KEY=VALUE` settings over every file (zsim.scenario.apply_overrides).
        progress: called after each run with (scenario name, runs done, runs in total,
            run name).

    Returns:
        {"scenarios": their names, "written": the paths written}.

    Raises:
        ConfigError: no scenario, two scenarios of one name, or any error of api.sweep.
    """
    from zsim.report.build import report_files
    from zsim.report.frame import rows_frame
    from zsim.scenario import load_scenario, simulate_timeline
    from zsim.sweep import run_sweep

    if shipped:
        found = sorted(SHIPPED_SCENARIOS.glob("*.yaml"))
        if not found:
            raise ConfigError("all", f"{SHIPPED_SCENARIOS}/", "no scenario files here; "
                              "run from the repository root")
        scenarios = [*scenarios, *found]
    if not scenarios:
        raise ConfigError("scenario", None, "give at least one --scenario file")
    names: dict[str, Path] = {}
    every = []
    for path in scenarios:  # all checked before any is simulated
        loaded = load_scenario(path, overrides)
        if loaded.name in names:
            raise ConfigError("name", loaded.name, f"in {path} and {names[loaded.name]}: "
                              "each report needs its own name")
        names[loaded.name] = path
        every.append((path, loaded))
    files: dict[str, bytes] = {}
    for path, loaded in every:
        tick = None if progress is None else (
            lambda done, total, run, name=loaded.name: progress(name, done, total, run))
        try:
            done = run_sweep(loaded, None, curves=loaded.memory_curves, progress=tick)
            files |= report_files(loaded, rows_frame(done.rows), done.curves,
                                  timeline=simulate_timeline(loaded))
        except ConfigError as e:  # a run, a figure or a template placeholder: name the file
            raise ConfigError(e.field, e.value, f"{e.reason} (in {path})") from None
    return {"scenarios": list(names), "written": [str(p) for p in write_files(out, files)]}


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
             offload: str = "none", impl: str | None = None, steps: int | None = None,
             out: Path | None = None) -> dict[str, Any]:
    """Run one plan for real on `nproc` processes and in the simulator with a calibrated
    profile; compare; with `out`, also write the rows there as a CSV. On a machine
    without CUDA, models above CPU_VALIDATION_MAX_PARAMS are scaled to d_model
    CPU_VALIDATION_D_MODEL (same layers and units) and the default sequence is 256
    tokens. The real run times `steps` steps, or by default as many as fill
    zsim.calibrate.validate.MIN_TIMED_S (3 at least).

    Returns:
        {"model", "profile", "plan", "rows": [{metric, predicted, measured, error_pct,
        bound_pct, note}], "written": the CSV path or None}; predicted and error_pct
        are None, and the note says why, for a plan the simulator does not model yet.

    Raises:
        ConfigError: invalid names, sizes or combinations.
        RankFailed: the real run crashed or hung (the message carries the rank's error).
    """
    import torch

    from zsim.calibrate.model import scale_model
    from zsim.calibrate.validate import BOUNDS_PCT, csv_name
    from zsim.calibrate.validate import validate as run

    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or steps < 1):
        raise ConfigError("steps", steps, "must be a positive integer")
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
    timing = {} if steps is None else {"steps": steps, "min_timed_s": 0.0}
    rows = run(spec, plan, nproc=nproc, profile=hw, out_dir=out, **timing)
    written = None if out is None else str(Path(out) / csv_name(spec, plan))
    return {"model": spec.name, "profile": hw.name, "plan": plan.label, "written": written,
            "rows": [{"metric": r["metric"], "predicted": r["predicted"],
                      "measured": r["measured"], "error_pct": r["error_pct"],
                      "bound_pct": BOUNDS_PCT.get(r["metric"]), "note": r["note"]}
                     for r in rows]}
