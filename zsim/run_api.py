"""`zsim run`: what a plan delivers over days of wall time, checkpoints and failures
included. Simulates the plan's step (zsim.simulate), prices each checkpoint method its
program saves with (zsim.analytic.checkpoint), and runs the job over `days` as a SimPy
process (zsim.engine.run_replay) at a range of checkpoint intervals around Young's, per
method; returns plain data for rendering (zsim.report.run_text, zsim.report.run_plots).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from zsim.analytic.checkpoint import CheckpointCost, checkpoint_cost, checkpoint_methods
from zsim.analytic.stragglers import StepFactors, effective_kernels, step_factors
from zsim.analytic.young_daly import daly_interval_s, young_interval_s
from zsim.engine.replay import Jitter
from zsim.engine.run_replay import DAY_S, RunInputs, RunOutcome, best_interval, simulate_run
from zsim.errors import ConfigError
from zsim.result import Result
from zsim.spec.failures import FailureModel, failure_model, job_failures_per_day
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model
from zsim.units import GB, GiB

INTERVAL_FACTORS: tuple[float, ...] = (0.25, 0.5, 0.71, 1.0, 1.41, 2.0, 4.0)
"""Checkpoint intervals tried, as multiples of Young's (and of an async save's first write
after a restart, where longer): the simulated optimum is looked for among them (two
octaves either side)."""

GPU_FACTORS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Job sizes of the goodput-against-GPUs curve, as multiples of the plan's."""

STRAGGLER_STEPS = 1000
"""Step factors drawn for the straggler distribution (p50/p99 and the run's slowdowns)."""

FAILURES_PER_SEARCH = 200
"""Failures the interval search wants over its seeds: a small job fails a few times a
month, and the best interval of a few failures is noise; seeds are added (up to
MAX_SEEDS) until the expected failures over them reach this."""
MAX_SEEDS = 64

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """How a run is simulated, beyond the plan."""

    days: float = 30.0
    fleet: str = "llama3"
    restart_s: float | None = None
    """Seconds from a failure to training again, without the load (None: the fleet's)."""
    methods: tuple[str, ...] = ()
    """Checkpoint methods to compare (empty: every one the plan's program saves with)."""
    target: str = "shared"
    interval_steps: int | None = None
    """A checkpoint interval to evaluate besides the searched ones (None: search only)."""
    jitter: Jitter | None = None
    """Per-rank jitter and stragglers (None: every step takes its simulated time)."""
    seed: int = 0
    seeds: int = 4
    """Runs per interval (different failure draws; their mean goodput is compared)."""
    gpu_curve: bool = True
    """Also run the plan at GPU_FACTORS times its size (the goodput-against-GPUs curve)."""


def resolve_plan(*, model: str, gpus: int, hardware: str, strategy: str | None,
                 seq: int | None, micro_batch: int | None, grad_accum: int | None,
                 ac: str, precision: str | None, offload: str, impl: str | None,
                 shard_group: int | None = None, parallel: dict[str, Any] | None = None
                 ) -> tuple[ModelSpec, HardwareProfile, Plan, str]:
    """The plan a run simulates, and where it came from: the flags' plan with `strategy`,
    else the plan `zsim plan` recommends for the model on `gpus` (its other flags then
    set the planner's search: sequence, micro-batch, accumulation, precision, tp/pp/cp).

    Raises:
        ConfigError: as zsim.api.plan / zsim.api.build_plan; nothing fits.
    """
    from zsim import api

    spec, hw = resolve_model(model), resolve_hardware(hardware)
    if strategy is None:
        ranking = api.plan(model=model, params=None, gpus=gpus, hardware=hardware, seq=seq,
                           micro_batch=micro_batch, grad_accum=grad_accum,
                           precision=precision, parallel=parallel)
        if ranking["recommended_plan"] is None:
            raise ConfigError("gpus", gpus, f"no plan fits: {ranking['recommendation']}")
        return spec, hw, Plan.from_dict(ranking["recommended_plan"]), "zsim plan's pick"
    if strategy == "hsdp" and shard_group is None:
        shard_group = api.default_shard_group(hw.gpus_per_node, gpus, parallel or {})
    plan = api.build_plan(spec, gpus=gpus, strategy=strategy, shard_group=shard_group,
                          seq=seq, micro_batch=micro_batch or 1, grad_accum=grad_accum or 1,
                          ac=ac, precision=precision or "bf16", offload=offload, impl=impl,
                          parallel=parallel)
    return spec, hw, plan, "--strategy"


def run(spec: ModelSpec, hw: HardwareProfile, plan: Plan, options: RunOptions, *,
        progress: Progress | None = None) -> dict[str, Any]:
    """The run of `plan` (module docstring). Returns a dict: "model", "hardware", "plan"
    (its fields), "plan_label", "gpus", "days", "fleet" (its rates and source),
    "failures_per_day", "mtbf_h", "step" (time, p50/p99 factors, tokens), "methods" (one
    record per checkpoint method: bytes, times, host memory, intervals, goodput and its
    parts, tokens per day; "curve": goodput by interval), "best_method", "by_gpus".

    Raises:
        ConfigError: a plan that does not fit or was not simulated to its end, an unknown
            fleet or method, a profile without storage, non-positive days.
    """
    from zsim.multicore import fan_out
    from zsim.simulate import simulate

    if not (math.isfinite(options.days) and options.days > 0):
        raise ConfigError("days", options.days, "must be a positive number of days")
    fleet = failure_model(options.fleet, restart_s=options.restart_s)
    methods = options.methods or checkpoint_methods(plan)
    for m in methods:  # every method checked before any work
        checkpoint_cost(spec, hw, plan, method=m, target=options.target)
    result = simulate(spec, hw, plan, trace=options.jitter is not None, reserved=False)
    step_s = _step_time(result, plan)
    factors = _stragglers(result, plan, options)
    rate = job_failures_per_day(fleet, plan.world_size, hw.gpus_per_node)
    sizes = _gpu_sizes(plan, hw) if options.gpu_curve else []
    total = len(methods) + len(sizes)
    # Each method's interval search, and each size of the curve, on its own core.
    records = fan_out(lambda m: _method_record(spec, hw, plan, m, options, fleet, step_s,
                                               factors), methods, per_worker=1)
    if progress:
        progress(len(methods), total, "checkpoint intervals")
    fitting = [r for r in records if r["fits_host"]]
    best = max(fitting or records, key=lambda r: r["tokens_per_day"])
    by_gpus = [row for rows in fan_out(
        lambda g: _by_gpus_rows(spec, hw, plan, g, methods, options, fleet), sizes,
        per_worker=1) for row in rows]
    if progress and sizes:
        progress(total, total, "goodput against GPUs")
    return {
        "model": spec.name, "num_params": spec.num_params, "hardware": hw.name,
        "gpus": plan.world_size, "gpus_per_node": hw.gpus_per_node,
        "plan": plan.to_dict(), "plan_label": plan.label, "plan_layout": plan.layout,
        "days": options.days, "target": options.target,
        "fleet": {"name": options.fleet, "gpu_failures_per_gpu_day":
                  fleet.gpu_failures_per_gpu_day, "node_failures_per_node_day":
                  fleet.node_failures_per_node_day, "restart_s": fleet.restart_s,
                  "restart_assumed": fleet.restart_assumed, "source": fleet.source},
        "failures_per_day": rate, "mtbf_h": 24.0 / rate if rate > 0 else None,
        "step": {"time_s": step_s, "tokens": plan.tokens_per_step,
                 "p50_factor": factors.p50 if factors else 1.0,
                 "p99_factor": factors.p99 if factors else 1.0,
                 "jitter": None if options.jitter is None else {
                     "cv": options.jitter.cv, "straggler_prob": options.jitter.straggler_prob,
                     "straggler_slowdown": options.jitter.straggler_slowdown}},
        "methods": records, "best_method": best["method"], "by_gpus": by_gpus,
    }


def _step_time(result: Result, plan: Plan) -> float:
    if result.step_time_s is None or not result.fits:
        raise ConfigError("plan", plan.label, "does not fit in HBM (or was not simulated to "
                          "its end): a run needs a step; see `zsim simulate` for where")
    return result.step_time_s


def _stragglers(result: Result, plan: Plan, options: RunOptions) -> StepFactors | None:
    """Step factors of the plan's world size from its compute kernels (None: no jitter)."""
    if options.jitter is None:
        return None
    kernels = [s.end_s - s.start_s for s in result.spans
               if s.stream == "compute" and s.rank == 0 and s.end_s > s.start_s]
    if not kernels:
        raise ConfigError("straggler_prob", options.jitter.straggler_prob,
                          "stragglers are drawn from the step's compute kernels, and a "
                          "pipeline plan is replayed without a per-op timeline")
    assert result.step_time_s is not None and result.compute_time_s is not None
    return step_factors(options.jitter, ranks=plan.world_size,
                        kernels=effective_kernels(kernels), steps=STRAGGLER_STEPS,
                        seed=options.seed,
                        compute_fraction=min(1.0, result.compute_time_s / result.step_time_s))


def _inputs(plan: Plan, hw: HardwareProfile, fleet: FailureModel, cost: CheckpointCost,
            step_s: float, factors: StepFactors | None, options: RunOptions) -> RunInputs:
    return RunInputs(step_time_s=step_s,
                     step_slowdown_samples=factors.samples if factors else (),
                     tokens_per_step=plan.tokens_per_step, gpus=plan.world_size,
                     gpus_per_node=hw.gpus_per_node, failures=fleet,
                     checkpoint_interval_steps=1, checkpoint_stall_s=cost.save_stall_s,
                     checkpoint_background_s=cost.save_background_s, load_s=cost.load_s,
                     first_checkpoint_extra_s=cost.plan_s, days=options.days,
                     seed=options.seed)


def _first_write_s(cost: CheckpointCost) -> float:
    """An async save's first background write after a (re)start, its uncached planning
    included (0 for a sync save: nothing waits for it)."""
    return cost.plan_s + cost.save_background_s if cost.save_background_s else 0.0


def _candidates(young_s: float, step_s: float, extra: int | None,
                first_write_s: float = 0.0) -> list[int]:
    """Intervals (steps) to simulate: INTERVAL_FACTORS times Young's, and times the first
    async write after a (re)start where that is longer (an interval that lets it end
    before the next checkpoint may beat a wait for it), and `extra`."""
    scales = [young_s] + ([first_write_s] if first_write_s > young_s else [])
    steps = sorted({max(1, round(scale * f / step_s)) for scale in scales
                    for f in INTERVAL_FACTORS})
    if extra is not None and extra not in steps:
        steps = sorted([*steps, extra])
    return steps


def _method_record(spec: ModelSpec, hw: HardwareProfile, plan: Plan, method: str,
                   options: RunOptions, fleet: FailureModel, step_s: float,
                   factors: StepFactors | None) -> dict[str, Any]:
    cost = checkpoint_cost(spec, hw, plan, method=method, target=options.target)
    rate = job_failures_per_day(fleet, plan.world_size, hw.gpus_per_node)
    mtbf_s = DAY_S / rate if rate > 0 else math.inf
    # Young's interval counts the time training is blocked per checkpoint; an async save
    # blocks for its staging only (its write is charged if the next one must wait).
    stall = max(cost.save_stall_s, 1e-9)
    young = young_interval_s(stall, mtbf_s) if math.isfinite(mtbf_s) else options.days * DAY_S
    daly = daly_interval_s(stall, mtbf_s) if math.isfinite(mtbf_s) else young
    inputs = _inputs(plan, hw, fleet, cost, step_s, factors, options)
    cands = _candidates(young, step_s, options.interval_steps, _first_write_s(cost))
    per_run = rate * options.days
    seeds = max(options.seeds, min(MAX_SEEDS, math.ceil(FAILURES_PER_SEARCH / per_run)))\
        if per_run > 0 else options.seeds
    best, outcomes = best_interval(inputs, cands, seeds=seeds)
    chosen = options.interval_steps if options.interval_steps is not None else best
    mean = _mean(outcomes[chosen])
    return {
        "method": method,
        "bytes_total_gb": cost.bytes_total / GB,
        "bytes_per_rank_max_gb": cost.bytes_per_rank_max / GB,
        "files": cost.files,
        "save_stall_s": cost.save_stall_s,
        "save_background_s": cost.save_background_s,
        "state_dict_s": cost.state_dict_s,
        "first_save_planning_s": cost.plan_s,
        "load_s": cost.load_s,
        "convert_offline_s": cost.convert_offline_s,
        "host_gib_per_node": cost.host_bytes_per_node / GiB,
        "fits_host": cost.fits_host,
        "young_interval_min": young / 60.0,
        "daly_interval_min": daly / 60.0,
        "best_interval_steps": best,
        "best_interval_min": best * step_s * (factors.p50 if factors else 1.0) / 60.0,
        "interval_steps": chosen,
        "seeds": seeds,
        "failures_expected": per_run,
        **mean,
        "curve": [{"interval_steps": c, "interval_min": c * step_s / 60.0,
                   "goodput": _mean(outcomes[c])["goodput"]} for c in cands],
    }


PARTS: tuple[str, ...] = ("useful_s", "straggler_s", "checkpoint_stall_s",
                          "checkpoint_wait_s", "lost_work_s", "restart_s")
"""RunOutcome's parts of wall time, in the order reports show them."""


def _mean(outcomes: Sequence[RunOutcome]) -> dict[str, float]:
    """Mean over the seeds: goodput, tokens per day, failures, checkpoints, and each part
    of wall time as a fraction of it."""
    n = len(outcomes)
    mean = {"goodput": math.fsum(o.goodput for o in outcomes) / n,
            "tokens_per_day": math.fsum(o.tokens_per_day for o in outcomes) / n,
            "failures": math.fsum(o.failures for o in outcomes) / n,
            "checkpoints": math.fsum(o.checkpoints for o in outcomes) / n}
    for part in PARTS:
        mean[part.removesuffix("_s") + "_frac"] = math.fsum(
            getattr(o, part) / o.wall_s for o in outcomes) / n
    return mean


def _gpu_sizes(plan: Plan, hw: HardwareProfile) -> list[int]:
    """GPU counts of the curve: GPU_FACTORS times the plan's, whole nodes only (at least
    one node)."""
    sizes = set()
    for f in GPU_FACTORS:
        g = int(plan.world_size * f)
        if g >= hw.gpus_per_node and g % hw.gpus_per_node == 0:
            sizes.add(g)
    return sorted(sizes | {plan.world_size})


def _scaled(plan: Plan, gpus: int) -> Plan | None:
    """The plan at `gpus` GPUs: more or fewer data-parallel replicas (HSDP) or shards (the
    others), every other knob kept; None where its size does not divide."""
    dp_ranks = plan.dp_replicate if plan.dp_replicate > 1 else plan.dp_shard
    other = plan.world_size // dp_ranks
    if gpus % other:
        return None
    ranks = gpus // other
    try:
        return (plan.with_(dp_replicate=ranks) if plan.dp_replicate > 1
                else plan.with_(dp_shard=ranks))
    except ConfigError:
        return None


def _by_gpus_rows(spec: ModelSpec, hw: HardwareProfile, plan: Plan, gpus: int,
                  methods: Sequence[str], options: RunOptions, fleet: FailureModel
                  ) -> list[dict[str, Any]]:
    """The goodput-against-GPUs curve at `gpus`, one point per method: the plan scaled to
    it (none where its size does not divide), with its own step (simulated again: its
    collectives grow with it) at its own best interval, one seed fewer."""
    from zsim.simulate import simulate

    scaled = _scaled(plan, gpus)
    if scaled is None:
        return []
    result = simulate(spec, hw, scaled, reserved=False)
    if result.step_time_s is None or not result.fits:
        return [{"gpus": gpus, "method": m, "fits": False} for m in methods]
    quick = replace(options, seeds=max(1, options.seeds // 2), interval_steps=None,
                    jitter=None)
    rows = []
    for m in methods:
        rec = _method_record(spec, hw, scaled, m, quick, fleet, result.step_time_s, None)
        rows.append({"gpus": gpus, "method": m, "fits": True,
                     "step_time_s": result.step_time_s, "goodput": rec["goodput"],
                     "tokens_per_day": rec["tokens_per_day"],
                     "best_interval_min": rec["best_interval_min"]})
    return rows


PLAN_COLUMN_SEEDS = 4
"""Runs per plan behind the planner's per-day columns (run_columns)."""


def run_columns(spec: ModelSpec, hw: HardwareProfile, plan: Plan, step_s: float, *,
                days: float, failures: FailureModel, seed: int = 0) -> dict[str, Any]:
    """What `zsim plan --run-days` adds to a plan's row: the checkpoint method (among
    those of its program whose save fits the host) that delivers the most tokens per
    day, checkpointing at Young's interval (or, for an async save whose first write after
    a restart outlasts it, that write's length where better), over PLAN_COLUMN_SEEDS runs
    of `days` of `failures` (zsim.spec.failures.failure_model). Cheaper than `run` (no
    interval search), so that every fitting plan gets one.

    Returns:
        {"run_checkpoint", "run_checkpoint_interval_min", "run_goodput",
        "run_tokens_per_day"}; None values where no method fits the host.
    """
    rate = job_failures_per_day(failures, plan.world_size, hw.gpus_per_node)
    mtbf_s = DAY_S / rate if rate > 0 else math.inf
    best: dict[str, Any] = {"run_checkpoint": None, "run_checkpoint_interval_min": None,
                            "run_goodput": None, "run_tokens_per_day": None}
    options = RunOptions(days=days, seed=seed)
    for method in checkpoint_methods(plan):
        cost = checkpoint_cost(spec, hw, plan, method=method)
        if not cost.fits_host:
            continue
        young = (young_interval_s(max(cost.save_stall_s, 1e-9), mtbf_s)
                 if math.isfinite(mtbf_s) else days * DAY_S)
        # An async save's first write after a restart (DCP's uncached planning) may
        # outlast Young's interval: an interval that long is tried too.
        first_write = _first_write_s(cost)
        inputs = _inputs(plan, hw, failures, cost, step_s, None, options)
        for interval_s in (young, *([first_write] if first_write > young else [])):
            steps = max(1, round(interval_s / step_s))
            mean = _mean([simulate_run(replace(inputs, checkpoint_interval_steps=steps,
                                               seed=seed + i))
                          for i in range(PLAN_COLUMN_SEEDS)])
            if best["run_tokens_per_day"] is None or mean["tokens_per_day"] > \
                    best["run_tokens_per_day"]:
                best = {"run_checkpoint": method,
                        "run_checkpoint_interval_min": steps * step_s / 60,
                        "run_goodput": mean["goodput"],
                        "run_tokens_per_day": mean["tokens_per_day"]}
    return best
