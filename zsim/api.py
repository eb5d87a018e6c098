"""The public entry points the CLI calls: resolve names, run the planner or simulator,
and return plain data (dicts/records) for rendering. No printing here. The real-run
commands' entry points are zsim.calibrate_api and zsim.validate_api."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zsim import planner
from zsim.atomic import write_files
from zsim.errors import ConfigError
from zsim.recommend import Ranked, contender, recommend
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan, precision_knobs
from zsim.spec.presets import ALIASES, PRESETS
from zsim.spec.registry import hardware_names, resolve_hardware, resolve_model
from zsim.units import GiB, dtype_bytes


def plan(*, model: str | None, params: float | None, gpus: int, hardware: str,
         seq: int | None, micro_batch: int | None = None, grad_accum: int | None = None,
         precision: str | None = None, ds_config: Path | None = None,
         fsdp_config: Path | None = None, global_batch: str | None = None,
         parallel: dict[str, Any] | None = None, run_days: float | None = None,
         fleet: str = "llama3", restart_s: float | None = None) -> dict[str, Any]:
    """Rank candidate plans for a model on `gpus` GPUs of a hardware profile, all at one
    global batch: every strategy and program (zsim.planner.candidate_plans) at the
    largest micro-batch that fits (zsim.planner.choose; the rest of each GPU's share of
    the global batch accumulated), or, given a user's DeepSpeed or accelerate FSDP
    config, that config and its variations (zsim.planner.config_variations). When the
    world spans nodes and the model's parameters (compute dtype) exceed one GPU's HBM, or
    given `global_batch` or model-parallel degrees in `parallel` (tp, pp, cp: only
    factorizations with those), also every 2-D and 3-D factorization
    (zsim.parallel_planner). One recommendation over both tables (zsim.recommend): the
    plans within the error band of the fastest are tied, and the pick is the tied plan
    that fits at the top of its memory band, is simplest and leaves the most memory.

    The global batch is `global_batch` (sequences, or tokens with a t suffix), else the
    config's, else one micro-batch (`micro_batch`, default 1) times `grad_accum`
    (default 1) per GPU.

    With `run_days`, every fitting plan of the 1-D table and the first RUN_PARALLEL_ROWS of
    the 2-D one also get what they deliver over that many days of `fleet`'s failures
    (zsim.run_api.run_columns, `restart_s` in place of the fleet's restart time where
    given: run_checkpoint, run_checkpoint_interval_min, run_goodput,
    run_tokens_per_day), and the result a "run" entry naming the plan that delivers the
    most tokens per day.

    Returns:
        {"model", "num_params", "hardware", "gpus", "gpus_per_node", "hbm_gib",
        "seq_len", "seq_len_source" (where seq_len came from: "--seq" or
        ModelSpec.seq_len_source), "global_batch_sequences", "global_batch_tokens",
        "recommended" (the pick's label, or None when nothing fits), "recommended_plan"
        (its Plan's fields, or None), "recommended_table"
        ("1-D" or "2-D"), "recommendation" (why, one line; with nothing fitting, what it
        would take), "tie_tolerance_pct", "yours" (the config's plan label, or None),
        "warnings" (the model's, the config's, a partial node's), "candidates": [record,
        ...], "parallel": None or {"global_batch_sequences", "candidates": [record,
        ...]}}, records from zsim.planner.to_record (each with "yours": whether it is the
        config's plan) and zsim.parallel_planner.parallel_record, each table's
        recommended and tied plans first.

    Raises:
        ConfigError: unknown model/hardware, invalid sizes, a global batch no plan can
            split, or a bad config file.
    """
    from zsim import parallel_planner as pp

    _check_positive(gpus=gpus, micro_batch=micro_batch, grad_accum=grad_accum, seq=seq)
    spec = resolve_model(model, params=params)
    hw = resolve_hardware(hardware)
    seq_len = seq if seq is not None else spec.max_seq_len
    knobs = precision_knobs(precision or "bf16")
    warnings: tuple[str, ...] = ()
    yours: Plan | None = None
    ranked: list[planner.Choice] = []
    if ds_config is not None or fsdp_config is not None:
        from zsim.spec.user_config import config_plan  # its readers: only with a config

        yours, warnings = config_plan(spec, hw, ds_config=ds_config, fsdp_config=fsdp_config,
                                      gpus=gpus, seq=seq, micro_batch=micro_batch,
                                      grad_accum=grad_accum, precision=precision)
        ranked = planner.choose_among(spec, hw, planner.config_variations(yours, hw))
        sequences = yours.micro_batch * yours.grad_accum * yours.dp_degree
        micro_batch = yours.micro_batch
    else:
        sequences = (pp.parse_global_batch(global_batch, seq_len) if global_batch is not None
                     else gpus * (micro_batch or 1) * (grad_accum or 1))
        if sequences % gpus == 0:
            ranked = planner.choose(spec, hw, gpus=gpus, sequences_per_rank=sequences // gpus,
                                    micro_batch=micro_batch, grad_accum=grad_accum,
                                    seq_len=seq_len, **knobs)
    searched = _parallel_search(spec, hw, gpus=gpus, seq_len=seq_len, sequences=sequences,
                                micro_batch=micro_batch, precision=precision,
                                asked=global_batch is not None, parallel=parallel or {},
                                one_d=[c.plan for c in ranked])
    if not ranked and searched is None:
        raise ConfigError("global_batch", global_batch or sequences,
                          f"{sequences} sequences do not split evenly over {gpus} GPUs")
    rows: list[Ranked] = [*ranked, *(searched or [])]
    contenders = {id(row): c for row in rows
                  if (c := contender(row.plan, row.result)) is not None}
    rec = recommend(list(contenders.values()))
    fastest = None if rec is None else next(r for r in rows if contenders.get(id(r))
                                            is rec.fastest)

    def place(row: Ranked) -> tuple[str, str]:
        tier, why = judge(row)
        note = pp.expert_note(row.plan, row.result)
        return tier, f"{why}; {note}" if note else why

    def judge(row: Ranked) -> tuple[str, str]:
        c = contenders.get(id(row))
        if rec is not None and c is rec.pick:
            return "recommended", f"recommended: {rec.reason()}"
        if rec is not None and c is not None and rec.is_tied(c):
            return "tied", rec.why_tied(c)
        explained = (planner.explain(row, fastest) if isinstance(row, planner.Choice)
                     else pp.explain_parallel(row, fastest))  # type: ignore[arg-type]
        return "", explained

    def order(table: Sequence[Ranked]) -> list[Ranked]:
        """The recommended and tied plans first, in the order of preference."""
        if rec is None:
            return list(table)
        rank = {id(c): i for i, c in enumerate(rec.tied)}
        first = sorted((r for r in table if id(contenders.get(id(r))) in rank),
                       key=lambda r: rank[id(contenders[id(r)])])
        return first + [r for r in table if id(contenders.get(id(r))) not in rank]

    per_day = _per_day(spec, hw, run_days, fleet, restart_s)
    candidates = []
    for row in order(ranked):
        tier, why = place(row)
        candidates.append({**planner.to_record(spec, row, why=why, tier=tier),  # type: ignore[arg-type]
                           "yours": row.plan == yours, **per_day(row)})
    parallel_rows = None if searched is None else {
        "global_batch_sequences": sequences,
        "candidates": [{**pp.parallel_record(spec, row, why=w, tier=t),  # type: ignore[arg-type]
                        **(per_day(row) if i < RUN_PARALLEL_ROWS else {})}
                       for i, row in enumerate(order(searched)) for t, w in [place(row)]]}
    return {
        "model": spec.name,
        "num_params": spec.num_params,
        "hardware": hw.name,
        "gpus": gpus,
        "gpus_per_node": hw.gpus_per_node,
        "hbm_gib": round(hw.hbm_bytes / GiB, 2),
        "seq_len": seq_len,
        "seq_len_source": "--seq" if seq is not None else spec.seq_len_source,
        "global_batch_sequences": sequences,
        "global_batch_tokens": sequences * seq_len,
        "recommended": None if rec is None else rec.pick.plan.label,
        "recommended_plan": None if rec is None else rec.pick.plan.to_dict(),
        "run": None if run_days is None else _most_per_day(
            run_days, fleet, restart_s,
            [*candidates, *(parallel_rows or {}).get("candidates", [])]),
        "recommended_table": None if rec is None else (
            "1-D" if any(contenders.get(id(r)) is rec.pick for r in ranked) else "2-D"),
        "recommendation": _no_fit_hint(rows, hw, seq_len, searched is not None)
        if rec is None else rec.reason(),
        "tie_tolerance_pct": None if rec is None else round(100 * rec.tolerance, 2),
        "yours": yours.label if yours is not None else None,
        "warnings": [*spec.warnings, *warnings, *_partial_node(gpus, hw)],
        "candidates": candidates,
        "parallel": parallel_rows,
    }


RUN_PARALLEL_ROWS = 20
"""2-D/3-D plans (in the table's order) that `run_days` runs; the rest get no per-day
columns (the table prints 20)."""


def _per_day(spec: ModelSpec, hw: Any, run_days: float | None, fleet: str,
             restart_s: float | None) -> Callable[[Ranked], dict[str, Any]]:
    """A row's per-day columns (zsim.run_api.run_columns), {} without `run_days`."""
    if run_days is None:
        return lambda row: {}
    from zsim.run_api import run_columns
    from zsim.spec.failures import failure_model

    failures = failure_model(fleet, restart_s=restart_s)  # refused before any work
    if not (run_days > 0 and run_days < float("inf")):
        raise ConfigError("run_days", run_days, "must be a positive number of days")

    def columns(row: Ranked) -> dict[str, Any]:
        r = row.result
        if r is None or not r.fits or r.step_time_s is None:
            return {}
        return run_columns(spec, hw, row.plan, r.step_time_s, days=run_days,
                           failures=failures)

    return columns


def _most_per_day(days: float, fleet: str, restart_s: float | None,
                  records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The plan whose row delivers the most tokens per day."""
    rows = [r for r in records if r.get("run_tokens_per_day") is not None]
    best = max(rows, key=lambda r: r["run_tokens_per_day"]) if rows else None
    return {"days": days, "fleet": fleet, "restart_s": restart_s,
            "most_tokens_per_day": None if best is None else best["plan"]}


def _check_positive(**sizes: int | None) -> None:
    """Each size given is a positive integer.

    Raises:
        ConfigError: naming the first that is not.
    """
    for name, value in sizes.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value <= 0):
            raise ConfigError(name, value, "must be a positive integer")


def _no_fit_hint(rows: Sequence[Ranked], hw: Any, seq_len: int, searched: bool) -> str:
    """With no plan fitting: the one that comes closest, and what would make room."""
    leanest = min(rows, key=lambda r: r.peak_bytes)
    moves = [f"a shorter sequence (--seq below {seq_len:,})", "more GPUs (--gpus)",
             "a profile with more HBM (--hardware)"]
    if not searched:
        moves.insert(2, "tensor or pipeline parallelism (--tp, --pp)")
    return (f"no plan fits in {hw.hbm_bytes / GiB:.1f} GiB of HBM: the leanest, "
            f"{leanest.plan.label}, needs {leanest.peak_bytes / GiB:.1f} GiB; try "
            f"{', '.join(moves[:-1])} or {moves[-1]}")


ROUTING_FIELDS: tuple[str, ...] = ("expert_imbalance", "capacity_factor")
"""MoE routing knobs `zsim plan` takes (--expert-imbalance, --capacity-factor)."""


def _parallel_search(spec: ModelSpec, hw: Any, *, gpus: int, seq_len: int, sequences: int,
                     micro_batch: int | None, precision: str | None, asked: bool,
                     parallel: dict[str, Any], one_d: list[Plan]) -> list[Any] | None:
    """The 2-D and 3-D plans of `api.plan` (zsim.parallel_planner.choose_parallel) at
    the global batch of `sequences`, or None where not asked for (one node, no
    --global-batch, no model-parallel degree). Plans without model parallelism are the
    1-D table's (`one_d`), and left out unless it has none."""
    from zsim import parallel_planner as pp

    for key in parallel:
        if key not in ("tp", "pp", "cp", "ep", *ROUTING_FIELDS):
            raise ConfigError(key, parallel[key], "zsim plan fixes only tp, pp, cp, ep, "
                              "expert_imbalance and capacity_factor")
    # The routing knobs describe every MoE plan rather than select some.
    routing = {k: parallel[k] for k in ROUTING_FIELDS if k in parallel}
    parallel = {k: v for k, v in parallel.items() if k not in ROUTING_FIELDS}
    # Asked for, or the usual case for TP and PP: a multi-node world whose model's
    # parameters alone (compute dtype) outgrow one GPU; or an MoE model on several GPUs,
    # whose experts may be split (expert parallelism).
    params_bytes = spec.num_params * dtype_bytes(precision_knobs(precision or "bf16")[
        "param_dtype"])
    needed = ((gpus > hw.domain_gpus and params_bytes > hw.hbm_bytes)
              or (spec.moe is not None and gpus > 1))
    if not asked and not parallel and not needed:
        return None
    plans = [p for p in pp.parallel_plans(spec, hw, gpus=gpus, seq_len=seq_len,
                                          global_batch=sequences, micro_batch=micro_batch,
                                          **precision_knobs(precision or "bf16"), **routing)
             if all(getattr(p, k) == v for k, v in parallel.items())
             and (p.model_parallel > 1 or p.ep > 1 or not one_d)]
    if not plans:
        if not parallel:
            return None
        named = [f"{k}={v}" for k, v in parallel.items()]
        fixed = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
        why = pp.degree_problem(spec, hw, gpus=gpus, seq_len=seq_len,
                                **{k: v for k, v in parallel.items() if k != "ep"})
        if why is None and "ep" in parallel:
            why = (f"{spec.name} is dense: expert parallelism needs a mixture of experts"
                   if spec.moe is None else "expert parallelism runs with FSDP2 without TP "
                   "or PP, on an EP degree that divides the experts and dp_shard x cp")
        raise ConfigError("gpus", gpus, f"no 2-D or 3-D factorization of {gpus} GPUs runs "
                          f"a global batch of {sequences} sequences of {spec.name}"
                          + (f" with {fixed}" if fixed else "") + (f": {why}" if why else ""))
    return pp.choose_parallel(spec, hw, plans)


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


PARALLEL_FIELDS: tuple[str, ...] = ("tp", "pp", "cp", "ep", "sp", "async_tp", "tp_across_nodes",
                                    "pp_schedule", "virtual_stages", "capacity_factor",
                                    "expert_imbalance")
"""The Plan's model-parallel fields the CLI's --tp, --pp, --cp, --ep, --sp, --async-tp,
--tp-across-nodes, --pp-schedule, --virtual-stages, --capacity-factor and
--expert-imbalance set."""


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
    fewer), given the model-parallel degrees in `parallel` (1 where absent).

    Raises:
        ConfigError: a node's data-parallel ranks do not divide the job's (12 GPUs on
            8-GPU nodes), naming the shard groups that would.
    """
    model_parallel = 1
    for axis in ("tp", "cp", "pp"):
        degree = parallel.get(axis, 1)
        model_parallel *= degree if isinstance(degree, int) and degree > 0 else 1
    dp = max(1, gpus // model_parallel)
    group = max(1, min(gpus_per_node // model_parallel, dp))
    if dp % group:
        # Shard groups that divide a node or are whole nodes, up to 8 nodes (an absurd
        # --gpus must not make this a search over its divisors).
        fit = [str(g) for g in range(2, min(dp, 8 * gpus_per_node + 1)) if dp % g == 0 and (
            gpus_per_node % (g * model_parallel) == 0 or (g * model_parallel) % gpus_per_node
            == 0)]
        raise ConfigError("shard_group", None, f"HSDP shards over a node's {group} data-"
                          f"parallel ranks by default, which do not divide the {dp} of "
                          f"--gpus {gpus} ({gpus / gpus_per_node:g} nodes of {gpus_per_node})"
                          + (f": give --shard-group ({' or '.join(fit)})" if fit else ""))
    return group


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
        Result.to_dict() plus "model", "num_params", "hardware", "gpus_per_node", "plan"
        (the Plan's fields), "seq_len_source" (where the plan's seq_len came from:
        "--seq" or ModelSpec.seq_len_source), "warnings" (model and config keys read but
        not modelled, a partial node), "host_memory_bytes_per_gpu" (the state an offload
        plan keeps in host memory per rank, zsim.schedule.lower.host_state_bytes; 0
        without offload), "ranks_per_node" and "host_memory_bytes_per_node" (that of
        every rank on a node).

    Raises:
        ConfigError: invalid names, sizes or combinations, or a bad config file.
    """
    from zsim.schedule.lower import host_state_bytes
    from zsim.simulate import chrome_trace
    from zsim.simulate import simulate as run

    _check_positive(gpus=gpus, micro_batch=micro_batch, grad_accum=grad_accum, seq=seq)
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
            shard_group = default_shard_group(hw.domain_gpus, gpus, parallel or {})
        plan = build_plan(spec, gpus=gpus, strategy=strategy, shard_group=shard_group,
                          seq=seq, micro_batch=1 if micro_batch is None else micro_batch,
                          grad_accum=1 if grad_accum is None else grad_accum, ac=ac,
                          precision=precision or "bf16", offload=offload, impl=impl,
                          parallel=parallel, grad_sync=grad_sync)
    if trace is not None and plan.pp > 1:
        raise ConfigError("trace", str(trace), "a pipeline step is replayed per pipeline "
                          "rank (zsim.engine.pipeline_replay): it has no per-op timeline to "
                          "write")
    result = run(spec, hw, plan, trace=trace is not None, fit_only=fit_only)
    if trace is not None and not result.spans:
        raise ConfigError("trace", str(trace), "the plan was not simulated (its memory floor "
                          "exceeds HBM): there is no timeline to write")
    if trace is not None:
        write_files(trace.parent, {trace.name: json.dumps(chrome_trace(result)).encode()})
    host = host_state_bytes(spec, plan)
    ranks_per_node = min(plan.world_size, hw.gpus_per_node)
    return {"model": spec.name, "num_params": spec.num_params, "hardware": hw.name,
            "gpus_per_node": hw.gpus_per_node, "plan": plan.to_dict(),
            "seq_len_source": "--seq" if seq is not None else spec.seq_len_source,
            "warnings": [*spec.warnings, *warnings, *_partial_node(gpus, hw)],
            "host_memory_bytes_per_gpu": host, "ranks_per_node": ranks_per_node,
            "host_memory_bytes_per_node": host * ranks_per_node, **result.to_dict()}


def _partial_node(gpus: int, hw: Any) -> list[str]:
    """The warning of a world that is not a whole number of nodes, if it is one."""
    from zsim.analytic.placement import partial_node_warning

    note = partial_node_warning(gpus, hw)
    return [note] if note else []


def sweep(scenario: Path, out: Path | None = None, *, executor: str = "local",
          ray_address: str | None = None,
          progress: Callable[[int, int, str], None] | None = None,
          overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Simulate every run of a scenario YAML (its sweep expanded) and, with `out`, write its
    results and report there.

    With `out`, each finished run is first appended to `out/journal.jsonl`, and a run
    already there is not simulated again, so an interrupted sweep resumes (zsim.sweep);
    at the end `results.csv` (and `results.parquet` where pyarrow is installed) and, for
    a scenario of at most zsim.report.files.REPORT_MAX_RUNS runs, the report
    (`<name>.csv`, `<name>.md` and the `<name>-*.svg` figures) are written, all or nothing. Their
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
        {"scenario": name, "rows": one record per run (zsim.report.dataframes.sweep_frame
        columns), "csv": the CSV text, "written": the paths written, "warnings": the
        runs' config keys read but not modelled, each once, "simulated": runs simulated
        by this call (the others were read back from the journal)}.

    Raises:
        ConfigError: a bad scenario file (the field path names where), a run the simulator
            does not model, a bad report template, an unknown executor, ray not
            installed, or an `out` folder that cannot be written.
    """
    from zsim.report.dataframes import csv_text, rows_frame
    from zsim.report.files import REPORT_MAX_RUNS, report_files, results_files
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


SHIPPED_SCENARIOS = "zsim.scenarios"
"""The data package of the shipped studies: the repository's scenarios/ folder, installed
with zsim (pyproject.toml), each with its report template beside it (<name>.template.md)."""


def shipped_scenarios() -> list[Path]:
    """Every shipped study, SHIPPED_SCENARIOS/*.yaml in name order, wherever zsim is
    installed (an editable install: the repository's scenarios/).

    Raises:
        ConfigError: the data package is not installed (an editable install made before
            it was added: reinstall).
    """
    from importlib.resources import files

    try:
        folder = Path(str(files(SHIPPED_SCENARIOS)))
    except ModuleNotFoundError:
        raise ConfigError("all", SHIPPED_SCENARIOS, "the shipped studies are not installed "
                          "with this zsim: reinstall it (pip install -e . in the repository)"
                          ) from None
    return sorted(folder.glob("*.yaml"))


def report(scenarios: Sequence[Path], out: Path, *, shipped: bool = False,
           overrides: Sequence[str] = (),
           progress: Callable[[str, int, int, str], None] | None = None) -> dict[str, Any]:
    """Simulate each scenario and write its report into `out`: `<name>.csv`, `<name>.md`
    and `<name>-<figure>.svg` (zsim.report.files), all scenarios' files all or nothing.

    Args:
        scenarios: scenario files (schema in zsim.scenario), each with a distinct name.
        out: folder for the report files.
        shipped: also every shipped study (shipped_scenarios()).
        overrides: `KEY=VALUE` settings over every file (zsim.scenario.apply_overrides).
        progress: called after each run with (scenario name, runs done, runs in total,
            run name).

    Returns:
        {"scenarios": their names, "written": the paths written}.

    Raises:
        ConfigError: no scenario, two scenarios of one name, or any error of api.sweep.
    """
    from zsim.report.dataframes import rows_frame
    from zsim.report.files import report_files
    from zsim.scenario import load_scenario, simulate_timeline
    from zsim.sweep import run_sweep

    if shipped:
        scenarios = [*scenarios, *shipped_scenarios()]
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
