"""Benchmark of the run simulation (not a timed test): 30 days of a 405B-like job on
16,384 GPUs (8 per node) with the Llama 3 fleet's failures (zsim.spec.failures), a 15 s
step of 16M tokens, a 30 s checkpoint stall every Young interval, and per-step straggler
factors from the engine's default Jitter at 16,384 ranks (zsim.analytic.stragglers).
Prints the wall seconds the simulation took and its outcome, then the best interval of a
grid around Young's (common random numbers over 4 seeds) against Young's and Daly's.

Last, `zsim run` end to end in a fresh process (planning, the step, every checkpoint
method, the interval search): 13B on 128 GPUs, 405B on 16,384 (zsim plan's pick, then
fsdp at tp 8).

Run: python bench/bench_run.py
Targets: the 30-day run simulates in < 10 s; each `zsim run` answers in about a second.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import asdict, replace

from zsim.analytic.stragglers import step_factors
from zsim.analytic.young_daly import daly_interval_s, young_interval_s
from zsim.engine.replay import Jitter
from zsim.engine.run_replay import RunInputs, best_interval, simulate_run
from zsim.spec.failures import failure_model, job_failures_per_day

GPUS, GPUS_PER_NODE = 16_384, 8
STEP_S = 15.0
TOKENS_PER_STEP = 16 * 2**20
STALL_S = 30.0
KERNELS = 1000
"""Effective compute kernels per rank per step (assumed: ~126 layers of ~8 kernels)."""


def main() -> None:
    fleet = failure_model("llama3")
    mtbf_s = 86_400.0 / job_failures_per_day(fleet, GPUS, GPUS_PER_NODE)
    young_s = young_interval_s(STALL_S, mtbf_s)
    daly_s = daly_interval_s(STALL_S, mtbf_s)
    t0 = time.perf_counter()
    stragglers = step_factors(Jitter(), ranks=GPUS, kernels=KERNELS, steps=512, seed=0)
    t_strag = time.perf_counter() - t0
    print(f"job MTBF {mtbf_s / 3600:.2f} h; Young {young_s:.0f} s, Daly {daly_s:.0f} s; "
          f"step factors at {GPUS} ranks (default Jitter): p50 {stragglers.p50:.4f} "
          f"p99 {stragglers.p99:.4f} (512 samples in {t_strag:.2f} s)")
    inputs = RunInputs(step_time_s=STEP_S, step_slowdown_samples=stragglers.samples,
                       tokens_per_step=TOKENS_PER_STEP, gpus=GPUS,
                       gpus_per_node=GPUS_PER_NODE, failures=fleet,
                       checkpoint_interval_steps=round(young_s / STEP_S),
                       checkpoint_stall_s=STALL_S, days=30.0, seed=0)
    t0 = time.perf_counter()
    out = simulate_run(inputs)
    wall = time.perf_counter() - t0
    print(f"30 days, {GPUS} GPUs, interval {inputs.checkpoint_interval_steps} steps: "
          f"simulated in {wall:.3f} s (target < 10 s)")
    for name, value in asdict(out).items():
        print(f"  {name:20s} {value:,.4f}" if isinstance(value, float)
              else f"  {name:20s} {value:,}")
    young_steps = young_s / STEP_S
    grid = sorted({max(1, round(young_steps * f)) for f in (0.5, 0.7, 0.85, 1.0, 1.18, 1.4,
                                                              2.0)})
    t0 = time.perf_counter()
    best, outcomes = best_interval(replace(inputs, step_slowdown_samples=()), grid, seeds=4)
    wall = time.perf_counter() - t0
    print(f"best interval over {grid} (4 seeds, {len(grid) * 4} runs in {wall:.2f} s): "
          f"{best} steps = {best * STEP_S:.0f} s; Young {young_s:.0f} s "
          f"({best * STEP_S / young_s:.2f}x), Daly {daly_s:.0f} s "
          f"({best * STEP_S / daly_s:.2f}x)")
    for c in grid:
        mean = sum(o.goodput for o in outcomes[c]) / len(outcomes[c])
        print(f"  {c:4d} steps: mean goodput {mean:.4f}")
    for args in (["--model", "13b", "--gpus", "128"],
                 ["--model", "405b", "--gpus", "16384"],
                 ["--model", "405b", "--gpus", "16384", "--strategy", "fsdp", "--ac", "full",
                  "--tp", "8"]):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "zsim", "run", *args], check=True,
                       capture_output=True)
        print(f"zsim run {' '.join(args)}: {time.perf_counter() - t0:.2f} s (fresh process)")


if __name__ == "__main__":
    main()
