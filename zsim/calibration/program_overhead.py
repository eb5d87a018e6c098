"""The host time a program spends that the simulator's other figures do not model
(HardwareProfile.program_overhead_s): DeepSpeed's ZeRO stages (their module hooks, the
parameter fetch and release of stage 3, gradient bucketing and partition bookkeeping, the
engine's step; ZeRO-2 also with the optimizer offloaded, whose gradients go to the host
parameter by parameter), FSDP1 (its FlatParameter hooks, views and padding, beyond the
per-unit host time fitted on FSDP2) and DTensor tensor parallelism (dispatch of every
sharded op).

Measured as the FSDP2 host costs are (zsim.calibration.host_bench): the nano model
(zsim.calibration.nano: width 16, 8 tokens, its kernels cost almost nothing) trained under
the program at two depths on every rank at once, with Llama's block and GPT's (NANO_BLOCKS),
each step's time and the time to its loss; then fitted against the simulator: what the
simulator gives the same nano plans (zsim.calibration.nano.program_plans) with the rest of
the profile (program_overhead_s empty) is taken off, per block (forward, and the rest of the
step), split between a figure per block and one per parameter tensor by the two blocks, and
once per step, each floored at 0. A program whose library does not import (DeepSpeed is an
optional dependency) or that the world size cannot run (TP needs an even one) is not
measured, and the profile has no entry for it. Imports torch.
"""

from __future__ import annotations

import statistics
from typing import Any, NamedTuple

from zsim.backend import programs, training
from zsim.backend.runner import RankContext
from zsim.backend.step_timing import timed_step
from zsim.calibration.nano import NanoBlock, nano_model, program_plans
from zsim.simulate import simulate
from zsim.spec.hardware import TP_OVERHEAD_KEY, HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

STEPS, WARMUP = 25, 5
"""Timed and untimed steps per depth (medians of the timed)."""


NANO_BLOCKS: dict[str, NanoBlock] = {"": "llama", "gpt_": "gpt"}
"""The nano blocks each program is timed with (zsim.calibration.nano.nano_model), by the
prefix of their figures' keys: Llama's (9 parameter tensors) and GPT's (16: LayerNorm and linear
biases). Two counts of tensors per block separate a program's host time per block (module
hooks, FSDP1's FlatParameter per unit) from its time per parameter tensor (DeepSpeed's
gradient hook per parameter, its partition bookkeeping): DeepSpeed's nano backward per
block grows from Llama's block to GPT's while the forwards do not (docs/log.md,
2026-12-01). TP runs the Llama block only (the backend applies torchtitan's Llama
plan)."""


def _blocks(program: str) -> dict[str, NanoBlock]:
    return {"": "llama"} if program == TP_OVERHEAD_KEY else NANO_BLOCKS


def program_steps_s(ctx: RankContext, layers: tuple[int, int], *, steps: int = STEPS,
                    warmup: int = WARMUP) -> dict[str, dict[str, float]]:
    """This rank's median step time and time to the loss (its forward) of the nano model
    at each depth of `layers` under each of program_plans, with each of its NANO_BLOCKS,
    over `steps` steps after `warmup` untimed ones: {program: {"lo", "hi", "lo_forward",
    "hi_forward", and the same prefixed "gpt_"}}, seconds."""
    out = {}
    for program, plan in program_plans(ctx.world_size).items():
        times: dict[str, float] = {}
        for prefix, block in _blocks(program).items():
            for depth, num_layers in zip(("lo", "hi"), layers, strict=True):
                spec = nano_model(num_layers, block=block)
                step_s, forward_s = _steps_s(ctx, spec, plan, steps=steps, warmup=warmup)
                times[f"{prefix}{depth}"] = step_s
                times[f"{prefix}{depth}_forward"] = forward_s
        out[program] = times
    return out


def _steps_s(ctx: RankContext, spec: ModelSpec, plan: Plan, *, steps: int,
             warmup: int) -> tuple[float, float]:
    """Median step time and time to the loss (the forward, zsim.backend.step_timing's
    phases: on a CPU host the device synchronisations they add are no-ops) of `spec`
    under `plan`, seconds."""
    prep = programs.prepare(spec, plan, device=ctx.device, world_size=ctx.world_size)
    micro = training.batches(spec, plan, device=ctx.device,
                             rank=training.data_rank(plan, ctx.rank), step=0)[:1]
    step_s, forward_s = [], []
    for i in range(warmup + steps):
        training.barrier()
        timing = timed_step(prep, micro, ctx.device, phases=True, read_loss=True)
        if i >= warmup:
            step_s.append(timing["step_s"])
            forward_s.append(timing["forward_s"])
    return statistics.median(step_s), statistics.median(forward_s)


def fit(measured: list[dict[str, dict[str, float]]], profile: dict[str, Any], *,
        world_size: int, layers: tuple[int, int]) -> dict[str, dict[str, float]]:
    """host.program_overhead_us from the ranks' program_steps_s (medians over ranks) and
    the rest of the profile (its YAML structure, without program_overhead_us). Per block
    of each nano block timed, the forward's extra = the measured forward's growth per
    block less the simulated one's (each the time to the loss: Result.time_to_loss_s), the
    backward's = the same for the rest of the step (each >= 0). With both blocks, each
    phase's extra is split as a + b x tensors per block through the two points (b >= 0,
    then a >= 0): *_block = a, *_tensor = b; with Llama's alone, *_block = its extra and
    no *_tensor. step = what Llama's shallower run takes beyond its simulation and what
    its blocks are charged. Microseconds."""
    hw = HardwareProfile.from_dict(profile, name=str(profile["name"]))
    lo, _ = layers
    tensors = {block: len(nano_model(1, block=block).block_tensors())
               for block in NANO_BLOCKS.values()}
    out = {}
    for program, plan in program_plans(world_size).items():
        if not all(program in m for m in measured):
            continue
        m = {k: statistics.median(r[program][k] for r in measured) for k in measured[0][program]}
        extra = {block: _extra_per_block(m, prefix, hw, plan, layers, block)
                 for prefix, block in _blocks(program).items() if f"{prefix}lo" in m}
        llama = extra["llama"]
        parts: dict[str, float] = {}
        for phase in ("forward", "backward"):
            slope = 0.0
            if "gpt" in extra:
                slope = max((getattr(extra["gpt"], phase) - getattr(llama, phase))
                            / (tensors["gpt"] - tensors["llama"]), 0.0)
                parts[f"{phase}_tensor"] = slope * 1e6
            parts[f"{phase}_block"] = max(getattr(llama, phase) - tensors["llama"] * slope,
                                          0.0) * 1e6
        charged = 1e-6 * sum(parts[f"{ph}_block"]
                             + tensors["llama"] * parts.get(f"{ph}_tensor", 0.0)
                             for ph in ("forward", "backward"))
        parts["step"] = max(m["lo"] - llama.simulated_lo_step - lo * charged, 0.0) * 1e6
        out[program] = parts
    return out


class _Extra(NamedTuple):
    """What the measured nano runs with one block take beyond their simulation, seconds."""

    forward: float
    """Per block, in the forward (>= 0)."""
    backward: float
    """Per block, in the rest of the step (>= 0)."""
    simulated_lo_step: float
    """The shallower run's simulated step."""


def _extra_per_block(m: dict[str, float], prefix: str, hw: HardwareProfile, plan: Plan,
                     layers: tuple[int, int], block: NanoBlock) -> _Extra:
    """What the measured runs with `block` (their figures prefixed `prefix` in `m`) take
    beyond their simulation."""
    lo, hi = layers
    sim = {d: simulate(nano_model(n, block=block), hw, plan) for d, n in (("lo", lo), ("hi", hi))}
    step = {d: r.step_time_s or 0.0 for d, r in sim.items()}
    # The forward's compute alone (phase_time_s["forward"]) would leave out the blocking
    # all-gathers of ZeRO-3 and FSDP1 and TP's all-reduces, and charge their time to the
    # program's forward figure a second time (FSDP1's nano forward spends most of its
    # time to the loss in those all-gathers: docs/log.md, 2026-12-02, 21:30 UTC).
    fwd = {d: r.time_to_loss_s or 0.0 for d, r in sim.items()}
    per_block = ((m[f"{prefix}hi"] - m[f"{prefix}lo"]) - (step["hi"] - step["lo"])) / (hi - lo)
    forward = max(((m[f"{prefix}hi_forward"] - m[f"{prefix}lo_forward"])
                   - (fwd["hi"] - fwd["lo"])) / (hi - lo), 0.0)
    return _Extra(forward=forward, backward=max(per_block - forward, 0.0),
                  simulated_lo_step=step["lo"])
