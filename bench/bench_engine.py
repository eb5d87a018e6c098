"""Benchmark of zsim's own speed (not a timed test): simulated events per second, one step
of a 70B model on 1,024 GPUs in symmetric mode, and the simulation of 13B/128 candidates.

Run: python bench/bench_engine.py
Targets (issue 3): >= 200k events/s; 70B/1024 < 1 s; `zsim plan --model 13b --gpus 128`
< 1 s wall including start-up. Issue 9: the four absurd plans that used to hang answer in
under 2 s each, start-up included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from zsim.engine.simulate import run
from zsim.fanout import workers_for
from zsim.planner import candidate_plans
from zsim.schedule.lower import lower
from zsim.simulate import simulate
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

    # Issue 9: absurd plans answer (each hung before), fresh process, target < 2 s.
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
