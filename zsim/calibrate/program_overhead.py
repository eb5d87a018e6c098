"""The host time a program spends that the simulator's other figures do not model
(HardwareProfile.program_overhead_s): DeepSpeed's ZeRO stages (their module hooks, the
parameter fetch and release of stage 3, gradient bucketing and partition bookkeeping, the
engine's step; ZeRO-2 also with the optimizer offloaded, whose gradients go to the host
parameter by parameter), FSDP1 (its FlatParameter hooks, views and padding, beyond the
per-unit host time fitted on FSDP2) and DTensor tensor parallelism (dispatch of every
sharded op).

Measured as the FSDP2 host costs are (zsim.calibrate.microbench): the nano model (width 16,
8 tokens: its kernels cost almost nothing) trained under the program at two depths on
every rank at once, each step's time and the time to its loss; then fitted against the
simulator: what the simulator gives the same nano plans with the rest of the profile
(program_overhead_s empty) is taken off, per block (forward, and the rest of the step) and
once per step, each floored at 0. A program whose library does not import (DeepSpeed is
an optional dependency) or that the world size cannot run (TP needs an even one) is not
measured, and the profile has no entry for it. Imports torch.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from typing import Any

from zsim.calibrate import training
from zsim.calibrate.microbench import NANO_TOKENS, nano_model
from zsim.calibrate.runner import RankContext, sync_device
from zsim.simulate import simulate
from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.hardware import HardwareProfile, overhead_programs
from zsim.spec.plan import Plan

NANO_DS = DeepSpeedZero(reduce_bucket_size=500_000, allgather_bucket_size=500_000,
                        prefetch_bucket_size=500_000, param_persistence_threshold=0)
"""DeepSpeed knobs of the nano runs: every parameter partitioned and fetched under ZeRO-3
(DeepSpeed's default threshold, 1e5 elements, would keep all of the nano model's whole),
and buckets that hold the whole nano model (the defaults' 5e8-element buckets are 1 GB
buffers allocated every backward)."""

STEPS, WARMUP = 25, 5
"""Timed and untimed steps per depth (medians of the timed)."""


def nano_plans(world_size: int) -> dict[str, Plan]:
    """The plan timed for each program of zsim.spec.hardware.OVERHEAD_PROGRAMS this
    machine can run at `world_size`: ZeRO-1/2/3 under DeepSpeed, and ZeRO-2 with
    offload_optimizer (when DeepSpeed imports), FSDP1's FULL_SHARD and SHARD_GRAD_OP,
    TP over 2 ranks (alone at world 2, under FSDP2 over the other ranks at an even world
    above)."""
    mb, seq = NANO_TOKENS
    plans = [Plan.for_strategy(s, gpus=world_size, impl="fsdp1", seq_len=seq, micro_batch=mb)
             for s in ("fsdp", "fsdp-no-reshard")]
    if importlib.util.find_spec("deepspeed") is not None:
        plans += [Plan.for_strategy(s, gpus=world_size, ds=NANO_DS, seq_len=seq,
                                    micro_batch=mb) for s in ("zero1", "zero2", "zero3")]
        plans.append(Plan.for_strategy("zero2", gpus=world_size, ds=NANO_DS,
                                       offload="optimizer", seq_len=seq, micro_batch=mb))
    if world_size % 2 == 0:
        plans.append(Plan(strategy="ddp" if world_size == 2 else "fsdp",
                          dp_shard=world_size // 2, tp=2, seq_len=seq, micro_batch=mb))
    # Each plan runs one program: keyed as the lowering looks it up (its first key).
    return {overhead_programs(p)[0][0]: p for p in plans}


def program_steps_s(ctx: RankContext, layers: tuple[int, int], *, steps: int = STEPS,
                    warmup: int = WARMUP) -> dict[str, dict[str, float]]:
    """This rank's median step time and time to the loss (its forward) of the nano model
    at each depth of `layers` under each of nano_plans, over `steps` steps after `warmup`
    untimed ones: {program: {"lo", "hi", "lo_forward", "hi_forward"}}, seconds."""
    out = {}
    for program, plan in nano_plans(ctx.world_size).items():
        times: dict[str, float] = {}
        for depth, num_layers in zip(("lo", "hi"), layers, strict=True):
            spec = nano_model(num_layers)
            prep = training.prepare(spec, plan, device=ctx.device, world_size=ctx.world_size)
            tokens, labels = training.batches(spec, plan, device=ctx.device,
                                              rank=training.data_rank(plan, ctx.rank),
                                              step=0)[0]
            step_s, forward_s = [], []
            for i in range(warmup + steps):
                training.barrier()
                start = time.perf_counter()
                marks: list[float] = []
                training.forward_backward(prep, tokens, labels, last=True,
                                          after_forward=lambda m=marks: m.append(
                                              time.perf_counter()))
                prep.step()
                sync_device(ctx.device)
                if i >= warmup:
                    step_s.append(time.perf_counter() - start)
                    forward_s.append(marks[0] - start)
            times[depth] = statistics.median(step_s)
            times[f"{depth}_forward"] = statistics.median(forward_s)
            del prep
        out[program] = times
    return out


def fit(measured: list[dict[str, dict[str, float]]], profile: dict[str, Any], *,
        world_size: int, layers: tuple[int, int]) -> dict[str, dict[str, float]]:
    """host.program_overhead_us from the ranks' program_steps_s (medians over ranks) and
    the rest of the profile (its YAML structure, without program_overhead_us): per block,
    forward_block = the measured forward's growth per block less the simulated one's,
    backward_block = the same for the rest of the step; step = what the shallower run
    takes beyond its simulation and the overhead charged to its blocks. Microseconds,
    each >= 0."""
    hw = HardwareProfile.from_dict(profile, name=str(profile["name"]))
    lo, hi = layers
    out = {}
    for program, plan in nano_plans(world_size).items():
        if not all(program in m for m in measured):
            continue
        m = {k: statistics.median(r[program][k] for r in measured)
             for k in ("lo", "hi", "lo_forward", "hi_forward")}
        sim = {depth: simulate(nano_model(n), hw, plan) for depth, n in (("lo", lo), ("hi", hi))}
        s = {depth: r.step_time_s or 0.0 for depth, r in sim.items()}
        s |= {f"{depth}_forward": r.phase_time_s.get("forward", 0.0) for depth, r in sim.items()}
        per_block = ((m["hi"] - m["lo"]) - (s["hi"] - s["lo"])) / (hi - lo)
        forward = ((m["hi_forward"] - m["lo_forward"])
                   - (s["hi_forward"] - s["lo_forward"])) / (hi - lo)
        forward_block = max(forward, 0.0)
        backward_block = max(per_block - forward_block, 0.0)
        step = max(m["lo"] - s["lo"] - lo * (forward_block + backward_block), 0.0)
        out[program] = {"forward_block": forward_block * 1e6,
                        "backward_block": backward_block * 1e6, "step": step * 1e6}
    return out
