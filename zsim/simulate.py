"""Public entry of the simulator: simulate one plan, export its timeline.

Owns `simulate(model, hw, plan)` (lower -> engine -> summarize) and `chrome_trace(result)`.
The CLI (`zsim simulate`, `zsim plan`) and the calibration backend call these; nothing
here does I/O.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from zsim.engine.simulate import Jitter, run
from zsim.engine.trace import chrome_trace_events
from zsim.errors import ConfigError
from zsim.result import Result, closed_form_result, summarize
from zsim.schedule.lower import check_modelled, lower, memory_floor_bytes
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.validate import validate

RANK_LEVEL_STEPS = 16
"""Steps sampled in rank-level mode for the p50/p99 step time."""


def simulate(model: ModelSpec, hw: HardwareProfile, plan: Plan, *, trace: bool = False,
             rank_level: bool = False, seed: int = 0, jitter: Jitter | None = None,
             rank_level_steps: int = RANK_LEVEL_STEPS, fit_only: bool = False,
             reserved: bool = True) -> Result:
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

    Returns:
        The Result; `result.fits` is False and `result.oom` says where when the memory
        ledger exceeds HBM (the step time is still reported unless `fit_only`). A plan
        whose memory floor (its model state and the activations of one micro-batch,
        zsim.schedule.lower.memory_floor_bytes) exceeds HBM is not simulated: its Result
        comes from the closed form (`evaluated == "closed form"`, no time figures).

    Raises:
        ConfigError: a plan that breaks a cross-object rule (zsim.spec.validate: world
            size, head/layer divisibility, unit size, sequence length), or one the
            simulator does not model (zsim.schedule.lower.check_modelled, parameter
            offload without sharded parameters).
    """
    validate(model, hw, plan)
    check_modelled(plan)
    floor = memory_floor_bytes(model, plan)
    if sum(floor.values()) > hw.hbm_bytes:
        return closed_form_result(model=model.name, hardware=hw.name, plan_label=plan.label,
                                  floor_bytes=floor, hbm_bytes=hw.hbm_bytes,
                                  world_size=plan.world_size)
    schedule = lower(model, hw, plan)
    if not rank_level:
        out = run(schedule, stop_at_oom=fit_only)
        return with_bands(summarize(schedule, out.trace, out.memory, model=model.name,
                                    hardware=hw.name, plan_label=plan.label, keep_spans=trace,
                                    stopped_at_oom=out.stopped_at_oom, reserved=reserved),
                          hw, plan)
    if rank_level_steps < 1:
        raise ConfigError("rank_level_steps", rank_level_steps, "must be >= 1")
    if plan.tp > 1:
        raise ConfigError("rank_level", True, "rank-level mode builds data-parallel groups "
                          "only: simulate a TP plan in symmetric mode")
    runs = [run(schedule, num_ranks=plan.world_size, seed=seed * 1_000_003 + i,
                jitter=jitter, stop_at_oom=fit_only) for i in range(rank_level_steps)]
    first = runs[0]
    return with_bands(summarize(schedule, first.trace, first.memory, model=model.name,
                                hardware=hw.name, plan_label=plan.label, keep_spans=trace,
                                step_samples_s=[r.trace.step_time_s for r in runs],
                                stopped_at_oom=first.stopped_at_oom, reserved=reserved),
                      hw, plan)


def with_bands(result: Result, hw: HardwareProfile, plan: Plan) -> Result:
    """The result with the intervals its profile's error bands give its step time and
    peak (zsim.spec.error_bands); unchanged for a profile without bands."""
    bands = hw.error_bands
    if bands is None:
        return result
    step = result.step_time_s
    return replace(
        result,
        step_time_band_s=None if step is None else bands.interval("step_time_s", plan, step),
        peak_memory_band_bytes=bands.interval("peak_memory_bytes", plan,
                                              result.peak_memory_bytes))


def chrome_trace(result: Result) -> dict[str, Any]:
    """The step's timeline as Trace Event Format JSON (open in ui.perfetto.dev): one track
    per rank and stream, plus an HBM counter track.

    Raises:
        ConfigError: the result was simulated without `trace=True`.
    """
    if not result.spans:
        raise ConfigError("trace", False, "simulate with trace=True to export a timeline")
    return chrome_trace_events(result.trace, title=f"{result.model} {result.plan_label}")
