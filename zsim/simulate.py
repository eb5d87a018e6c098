"""Public entry of the simulator: simulate one plan, export its timeline.

Owns `simulate(model, hw, plan)` (lower -> engine -> summarize) and `chrome_trace(result)`.
The CLI (`zsim simulate`, `zsim plan`) and the calibration backend call these; nothing
here does I/O.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from zsim.analytic.compute import step_flops
from zsim.engine.pipeline_replay import PipelineTimeline, run_pipeline
from zsim.engine.replay import Jitter, run
from zsim.engine.trace import chrome_trace_events
from zsim.errors import ConfigError
from zsim.result import Result, StageFigures, closed_form_result, summarize
from zsim.schedule.lower import (
    check_modelled,
    fixed_bytes,
    lower,
    memory_floor_bytes,
    program_plan,
    rank_model,
)
from zsim.schedule.ops import COPY_KINDS, Schedule
from zsim.schedule.pipeline_order import rank_actions, rank_stages
from zsim.schedule.pipeline_work import PipelineWork, pipeline_work
from zsim.spec.consistency import check_plan
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

RANK_LEVEL_STEPS = 16
"""Steps sampled in rank-level mode for the p50/p99 step time."""


class SimulationCache:
    """The Results of symmetric-mode simulations, by their lowered schedule
    (zsim.schedule.ops.Schedule.key) and simulate's options: plans that lower to the same
    schedule (a knob their program ignores, such as DeepSpeed's ZeRO under FSDP's prefetch
    depth) are simulated once. The engine and the summary read nothing but the schedule,
    so a cached Result, given the plan's names, is the one simulating it again would give.
    Plans their program reads alike (zsim.schedule.lower.program_plan) are also lowered
    once. Owned by its caller (zsim.executor.evaluate keeps one per batch of runs); it grows
    with every distinct schedule simulated."""

    __slots__ = ("results", "schedules")

    def __init__(self) -> None:
        self.results: dict[int, tuple[tuple[object, ...], Result]] = {}
        """Hash of (schedule key, trace, fit_only, reserved) -> that key and the Result
        simulate made. A tuple hashes itself anew at every lookup (about 1.5 ms for a
        1,600-op schedule), so `find` takes the hash once for its `keep`."""
        self.schedules: dict[tuple[int, int, Plan],
                             tuple[ModelSpec, HardwareProfile, Schedule]] = {}
        """(id of the model, id of the hardware, program_plan of the plan) -> those
        objects and the schedule lowered for them (a hardware profile does not hash; the
        objects are kept, so their ids stay theirs)."""

    def lower(self, model: ModelSpec, hw: HardwareProfile, plan: Plan) -> Schedule:
        """zsim.schedule.lower.lower(model, hw, plan), lowered once for the plans whose
        program reads them alike (zsim.schedule.lower.program_plan: DDP's and DeepSpeed's
        plans over unit sizes and prefetch depths) on the same model and hardware."""
        key = (id(model), id(hw), program_plan(plan))
        known = self.schedules.get(key)
        if known is not None and known[0] is model and known[1] is hw:
            return known[2]
        schedule = lower(model, hw, plan)
        self.schedules[key] = (model, hw, schedule)
        return schedule

    def find(self, key: tuple[object, ...]) -> tuple[int, Result | None]:
        """The key's hash, and the Result kept for it (None: not simulated yet)."""
        h = hash(key)
        entry = self.results.get(h)
        return h, entry[1] if entry is not None and entry[0] == key else None

    def keep(self, h: int, key: tuple[object, ...], result: Result) -> None:
        """Keep `result` for `key`, whose hash `find` gave as `h`."""
        self.results[h] = (key, result)


def simulate(model: ModelSpec, hw: HardwareProfile, plan: Plan, *, trace: bool = False,
             rank_level: bool = False, seed: int = 0, jitter: Jitter | None = None,
             rank_level_steps: int = RANK_LEVEL_STEPS, fit_only: bool = False,
             reserved: bool = True, cache: SimulationCache | None = None) -> Result:
    """Simulate one optimizer step of `plan` for `model` on `hw`.

    Args:
        model, hw, plan: what to simulate.
        trace: keep every op's span in the Result (needed by `chrome_trace`).
        rank_level: simulate every rank with seeded per-rank compute jitter and
            stragglers (`jitter`), `rank_level_steps` times; the Result then carries the
            p50/p99 step time and the figures of the first sampled step. Default
            (symmetric mode) simulates one representative rank.
        seed: seeds the jitter draws (rank-level mode).
        jitter: jitter distribution for rank-level mode (default `Jitter()`).
        rank_level_steps: steps sampled in rank-level mode.
        fit_only: stop at the first allocation over HBM (a plan that fits still runs to
            the end of its step); the Result then says where, with no time figures.
        reserved: replay the step's allocations on the caching-allocator model for the
            peak reserved (off: reserved_memory_bytes None, the replay costs about as
            much as the engine).
        cache: results of the symmetric-mode simulations already made (SimulationCache):
            a plan whose lowered schedule is in it is not simulated again.

    Returns:
        The Result; `result.fits` is False and `result.oom` says where when the memory
        ledger exceeds HBM (the step time is still reported unless `fit_only`). A plan
        whose memory floor (its model state and the activations of one micro-batch,
        zsim.schedule.lower.memory_floor_bytes) exceeds HBM is not simulated: its Result
        comes from the closed form (`evaluated == "closed form"`, no time figures).

    Raises:
        ConfigError: a plan that breaks a cross-object rule (zsim.spec.consistency: world
            size, head/layer divisibility, unit size, sequence length), or one the
            simulator does not model (zsim.schedule.lower.check_modelled, parameter
            offload without sharded parameters).
    """
    check_plan(model, hw, plan)
    check_modelled(plan)
    if plan.pp > 1:
        if rank_level:
            raise ConfigError("rank_level", True, "a pipeline is replayed per pipeline rank "
                              "already: simulate it in symmetric mode")
        return with_bands(simulate_pipeline(model, hw, plan), hw, plan)
    floor = memory_floor_bytes(model, plan, hw)
    if sum(floor.values()) > hw.hbm_bytes:
        return closed_form_result(model=model.name, hardware=hw.name, plan_label=plan.label,
                                  floor_bytes=floor, hbm_bytes=hw.hbm_bytes,
                                  world_size=plan.world_size)
    schedule = lower(model, hw, plan) if cache is None else cache.lower(model, hw, plan)
    if not rank_level:
        key = (schedule.key(), trace, fit_only, reserved) if cache is not None else ()
        h, known = (0, None) if cache is None else cache.find(key)
        if known is None:
            out = run(schedule, stop_at_oom=fit_only)
            known = summarize(schedule, out.trace, out.memory, model=model.name,
                              hardware=hw.name, plan_label=plan.label, keep_spans=trace,
                              stopped_at_oom=out.stopped_at_oom, reserved=reserved)
            if cache is not None:
                cache.keep(h, key, known)
        return with_bands(replace(known, model=model.name, hardware=hw.name,
                                  plan_label=plan.label), hw, plan)
    if rank_level_steps < 1:
        raise ConfigError("rank_level_steps", rank_level_steps, "must be >= 1")
    if plan.tp > 1 or plan.cp > 1:
        raise ConfigError("rank_level", True, "rank-level mode builds data-parallel groups "
                          "only: simulate a TP or CP plan in symmetric mode")
    runs = [run(schedule, num_ranks=plan.world_size, seed=seed * 1_000_003 + i,
                jitter=jitter, stop_at_oom=fit_only) for i in range(rank_level_steps)]
    first = runs[0]
    return with_bands(summarize(schedule, first.trace, first.memory, model=model.name,
                                hardware=hw.name, plan_label=plan.label, keep_spans=trace,
                                step_samples_s=[r.trace.step_time_s for r in runs],
                                stopped_at_oom=first.stopped_at_oom, reserved=reserved),
                      hw, plan)


def simulate_pipeline(model: ModelSpec, hw: HardwareProfile, plan: Plan) -> Result:
    """One step of a pipeline-parallel plan: every pipeline rank's forwards and backwards
    replayed in its schedule's order (zsim.engine.pipeline_replay) with the work of each stage
    (zsim.schedule.pipeline_work), the rank's data-parallel work before and after. The
    Result's figures are the worst rank's (the last to finish, the highest peak); each
    rank's are in `pipeline_stages`."""
    local = rank_model(model, plan)
    work = pipeline_work(local, hw, plan)
    actions = [rank_actions(plan, r) for r in range(plan.pp)]
    timeline = run_pipeline(actions, forward_s=work.forward_s, backward_s=work.backward_s,
                            send_s=work.send_s)
    return pipeline_result(local, hw, plan, work, timeline)


def pipeline_result(local: ModelSpec, hw: HardwareProfile, plan: Plan, work: PipelineWork,
                    timeline: PipelineTimeline) -> Result:
    """The Result of a pipeline replay: `timeline`, the replay of `work` (the stages of
    `plan` on the rank's model `local`), and each rank's work before and after it."""
    head = max(work.head_s)
    ends = [head + timeline.spans[r][-1][2] + work.tail_s[r] for r in range(plan.pp)]
    step = max(ends)
    fixed = sum(fixed_bytes(local, hw).values())
    peaks = [math.ceil(sum(m.values())) + fixed for m in work.memory_bytes]
    worst_mem = max(range(plan.pp), key=lambda r: peaks[r])
    slowest = max(range(plan.pp), key=lambda r: ends[r])
    stages = tuple(StageFigures(
        rank=r, stages=rank_stages(plan, r), step_time_s=ends[r],
        busy_s=timeline.busy_s(r), bubble_fraction=1.0 - timeline.busy_s(r) / step,
        in_flight_microbatches=work.in_flight[r], peak_memory_bytes=peaks[r])
        for r in range(plan.pp))
    busy = timeline.busy_s(slowest) + work.tail_s[slowest]
    tokens_per_gpu = plan.micro_batch * plan.seq_len * plan.grad_accum / plan.model_parallel
    model_flops, hw_flops = step_flops(local, micro_batch=plan.micro_batch,
                                       seq_len=plan.seq_len, grad_accum=plan.grad_accum,
                                       recompute=plan.recompute)
    peak = hw.peak(plan.compute_dtype)
    tflops = model_flops / plan.pp / step / 1e12
    at_peak = {c: math.ceil(v) for c, v in work.memory_bytes[worst_mem].items() if v > 0}
    for category, nbytes in fixed_bytes(local, hw).items():
        at_peak[category] = at_peak.get(category, 0) + nbytes
    oom = None if peaks[worst_mem] <= hw.hbm_bytes else (
        f"pipeline rank {worst_mem} holds {peaks[worst_mem] / 2**30:.2f} GiB at its peak > "
        f"{hw.hbm_bytes / 2**30:.2f} GiB HBM")
    bubble = step - busy
    state = math.ceil(work.state_bytes[worst_mem]) + fixed
    return Result(
        model=local.name, hardware=hw.name, plan_label=plan.label, step_time_s=step,
        compute_time_s=busy, exposed_comm_s=head, exposed_by_reason_s={
            "pipeline_bubble": max(0.0, bubble - head)},
        exposed_by_kind_s=({"all_to_all": work.all_to_all_s[slowest]} if plan.ep > 1 else {}),
        exposed_host_s=0.0, host_busy_s=0.0, waits=(), comm_busy_s={}, comm_busy_total_s=None,
        comm_bus_bytes={"tp": work.tp_bytes_per_rank}
        | ({"ep": work.ep_bytes_per_rank} if plan.ep > 1 else {}),
        peak_memory_bytes=peaks[worst_mem], reserved_memory_bytes=None, memory_at_peak=at_peak,
        peak_time_s=None, peak_op=f"pipeline rank {worst_mem}", baseline_memory_bytes=state,
        end_memory_bytes=state, hbm_bytes=hw.hbm_bytes, phase_time_s={}, phase_peak_bytes={},
        time_to_loss_s=None, memory_curve=(), oom=oom,
        tokens_per_s=tokens_per_gpu * plan.world_size / step,
        tokens_per_s_per_gpu=tokens_per_gpu / step, tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / peak, hfu=hw_flops / plan.pp / step / peak,
        world_size=plan.world_size, events=sum(len(sp) for sp in timeline.spans), num_ops=0,
        pipeline_stages=stages,
        notes=("pipeline replayed per rank (zsim.engine.pipeline_replay); data-parallel "
               "collectives other than FSDP2's first all-gather and last reduce-scatter "
               "(DDP's all-reduce after the last backward) taken as hidden",))


def with_bands(result: Result, hw: HardwareProfile, plan: Plan) -> Result:
    """The result with the intervals its profile's error bands give its step time and
    peak (zsim.spec.error_bands), why each is wider than its evidence's range, and their
    source; unchanged for a profile without bands. The step's collective time (its
    collective streams' busy time, summed) and the time it waited on them are what the
    bands' world rule bounds; a pipeline replay keeps no streams, so there both are the
    data-parallel collectives it leaves exposed."""
    bands = hw.error_bands
    if bands is None:
        return result
    memory = bands.interval("peak_memory_bytes", plan, result.peak_memory_bytes)
    collective_s = sum(v for k, v in result.comm_busy_s.items() if k not in COPY_KINDS)
    exposed_s = sum(v for k, v in result.exposed_by_kind_s.items() if k not in COPY_KINDS)
    if result.pipeline_stages:
        collective_s = exposed_s = result.exposed_comm_s or 0.0
    step = None if result.step_time_s is None else bands.interval(
        "step_time_s", plan, result.step_time_s, collective_s=collective_s,
        exposed_collective_s=exposed_s)
    return replace(
        result,
        step_time_band_s=None if step is None else (step.low, step.high),
        step_time_band_extrapolated=() if step is None else step.extrapolated,
        peak_memory_band_bytes=(memory.low, memory.high),
        peak_memory_band_extrapolated=memory.extrapolated,
        step_time_spread=bands.spread(plan),
        step_time_band_source=bands.describe())


def chrome_trace(result: Result) -> dict[str, Any]:
    """The step's timeline as Trace Event Format JSON (open in ui.perfetto.dev): one track
    per rank and stream, plus an HBM counter track.

    Raises:
        ConfigError: the result was simulated without `trace=True`.
    """
    if not result.spans:
        raise ConfigError("trace", False, "simulate with trace=True to export a timeline")
    return chrome_trace_events(result.trace, title=f"{result.model} {result.plan_label}")
