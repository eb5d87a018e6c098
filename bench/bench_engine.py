"""Benchmark of zsim's own speed (not a timed test): simulated events per second, one step
of a 70B model on 1,024 GPUs in symmetric mode, each candidate of `zsim plan --model 13b
--gpus 128` (lowering, engine, summary), and the simulation of 13B/128 candidates.

Run: python bench/bench_engine.py
Targets: >= 200k events/s; 70B/1024 < 1 s; `zsim plan --model 13b --gpus 128` < 1 s wall
including start-up; the four absurd plans that used to hang answer in under 2 s each,
start-up included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from zsim.engine.replay import run
from zsim.multicore import workers_for
from zsim.planner import candidate_plans
from zsim.result import summarize
from zsim.schedule.lower import lower, memory_floor_bytes
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model

T = TypeVar("T")


def _timed(fn: Callable[[], T], repeat: int = 3) -> tuple[float, T]:
    """Best wall time of `repeat` calls, seconds, and the last result."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _plan_candidates(model: ModelSpec, hw: HardwareProfile) -> None:
    """Where `zsim plan --model 13b --gpus 128` spends its simulation time: each candidate's
    lowering, engine run and summary (best of 3, one process), and the engine's events/s
    over all of them."""
    print(f"{'13b/128 planner candidate':44s} {'ops':>5s} {'events':>6s} {'lower ms':>8s} "
          f"{'engine ms':>9s} {'summary ms':>10s}")
    totals = [0.0, 0.0, 0.0]
    events = 0
    for plan in candidate_plans(hw, gpus=128, seq_len=model.max_seq_len):
        if sum(memory_floor_bytes(model, plan).values()) > hw.hbm_bytes:
            continue  # the closed form answers: nothing simulated
        t_lower, schedule = _timed(lambda p=plan: lower(model, hw, p))
        t_run, out = _timed(lambda s=schedule: run(s))
        t_sum, _ = _timed(lambda s=schedule, o=out: summarize(
            s, o.trace, o.memory, model=model.name, hardware=hw.name, plan_label=""))
        for i, t in enumerate((t_lower, t_run, t_sum)):
            totals[i] += t
        events += out.trace.events
        print(f"{plan.label:44s} {len(schedule.ops):5d} {out.trace.events:6d} "
              f"{t_lower * 1e3:8.1f} {t_run * 1e3:9.1f} {t_sum * 1e3:10.1f}")
    print(f"{'total (one core)':44s} {'':5s} {events:6d} {totals[0] * 1e3:8.1f} "
          f"{totals[1] * 1e3:9.1f} {totals[2] * 1e3:10.1f}; engine {events / totals[1]:,.0f} "
          "events/s")


def main() -> None:
    hw = resolve_hardware("dgx-h100")
    m70, m13 = resolve_model("70b"), resolve_model("13b")

    for name, model, plan in (
            ("13b zero2 128 GPUs, 25 MiB buckets, grad_accum 4", m13,
             Plan.for_strategy("zero2", gpus=128, seq_len=4096, grad_accum=4)),
            ("70b fsdp 1024 GPUs, grad_accum 8", m70,
             Plan.for_strategy("fsdp", gpus=1024, seq_len=4096, recompute="full",
                               grad_accum=8))):
        schedule = lower(model, hw, plan)
        wall, out = _timed(lambda s=schedule: run(s), repeat=7)
        print(f"engine events/s, {name} ({out.trace.events} events, {len(schedule.ops)} ops):"
              f" {out.trace.events / wall:,.0f}")

    plan = Plan.for_strategy("fsdp", gpus=1024, seq_len=4096, recompute="full", grad_accum=8)
    wall, r = _timed(lambda: simulate(m70, hw, plan))
    print(f"simulate() 70b fsdp on 1024 GPUs, grad_accum 8 (lower + engine + summary): "
          f"{wall:.3f} s; simulated step {r.step_time_s:.2f} s, mfu {r.mfu:.3f}")

    _plan_candidates(m13, hw)

    candidates = [Plan.for_strategy(s, gpus=128, seq_len=8192, shard_group=g, recompute=ac,
                                    micro_batch=mb)
                  for s, g in (("fsdp", None), ("hsdp", 8), ("fsdp-no-reshard", None))
                  for ac in ("selective", "full") for mb in (1, 2)]
    wall, _ = _timed(lambda: [simulate(m13, hw, p) for p in candidates])
    print(f"13b/128: {len(candidates)} candidates simulated in {wall:.3f} s "
          f"({wall / len(candidates) * 1e3:.1f} ms each)")

    code = ("from zsim.simulate import simulate; from zsim.spec.plan import Plan; "
            "from zsim.spec.registry import resolve_hardware, resolve_model; "
            "hw = resolve_hardware('dgx-h100'); m = resolve_model('13b'); "
            "[simulate(m, hw, Plan.for_strategy(s, gpus=128, seq_len=4096, shard_group=g)) "
            "for s, g in (('fsdp', None), ('hsdp', 8), ('fsdp-no-reshard', None))]")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    print(f"fresh interpreter: import + 3 simulations of 13b/128: "
          f"{time.perf_counter() - t0:.3f} s")

    # The user's first command, start-up included (fresh process): its candidates (every
    # strategy and program) on every local core, and on one (ZSIM_WORKERS=1).
    cmd = [sys.executable, "-m", "zsim", "plan", "--model", "13b", "--gpus", "128"]
    walls = {}
    for workers in ("", "1"):
        env = {**os.environ, "ZSIM_WORKERS": workers}
        walls[workers], _ = _timed(lambda e=env: subprocess.run(cmd, check=True,
                                                                capture_output=True, env=e))
    count = len(candidate_plans(hw, gpus=128, seq_len=4096))
    print(f"zsim plan --model 13b --gpus 128 (fresh process, {count} candidates): "
          f"{walls['']:.3f} s on {workers_for(10**6)} cores, {walls['1']:.3f} s "
          f"on one ({walls['1'] / walls['']:.2f}x)")

    # Absurd plans answer (each hung before), fresh process, target < 2 s.
    for args in (("--gpus", "128", "--micro-batch", "4096"),
                 ("--gpus", "128", "--micro-batch", "100000"),
                 ("--gpus", "1048576"), ("--gpus", "10000000")):
        cmd = [sys.executable, "-m", "zsim", "simulate", "--model", "13b", "--strategy",
               "fsdp", *args]
        wall, _ = _timed(lambda c=cmd: subprocess.run(c, check=True, capture_output=True))
        print(f"zsim simulate --model 13b --strategy fsdp {' '.join(args)} "
              f"(fresh process): {wall:.3f} s")


if __name__ == "__main__":
    main()
