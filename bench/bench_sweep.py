"""Benchmark of `zsim sweep` at scale (not a timed test): plans per second for a
10,080-plan study, serial (ZSIM_WORKERS=1) and on every local core, side by side, start-up
included, and whether the two wrote the same bytes.

The study: Llama-2-13B and Llama-2-7B on dgx-h100, each over the seven programs of `zsim
plan` (ddp, zero1, zero2, zero3, fsdp, fsdp-no-reshard, hsdp in nodes of 8) x gpus 16-256
x sequence 2048/4096 x micro-batch 1-8 x recomputation none/selective/full x unit size
1/2/4 x prefetch 1/2: 5,040 plans per model, one scenario file and one `zsim sweep --out`
process each. Plans whose memory floor exceeds HBM are answered by the closed form, as
`zsim plan` does (the `evaluated` column says which).

Run: python bench/bench_sweep.py [--models 13b,7b] [--keep DIR]
Target: 10,000 plans in under 60 s on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zsim.multicore import workers_for

SCENARIO = """name: grid-{model}
model: {model}
hardware: dgx-h100
plans:
  ddp: {{strategy: ddp}}
  zero1: {{strategy: zero1}}
  zero2: {{strategy: zero2}}
  zero3: {{strategy: zero3}}
  fsdp: {{strategy: fsdp}}
  fsdp-no-reshard: {{strategy: fsdp-no-reshard}}
  hsdp: {{strategy: hsdp, shard_group: 8}}
sweep:
  gpus: [16, 32, 64, 128, 256]
  seq_len: [2048, 4096]
  micro_batch: [1, 2, 4, 8]
  recompute: [none, selective, full]
  unit_size: [1, 2, 4]
  prefetch: [1, 2]
report:
  memory_curves:
    - fsdp gpus=128 seq_len=4096 micro_batch=1 recompute=selective unit_size=1 prefetch=1
"""


RESULTS = ("results.csv", "results.parquet")
"""The files compared between the two modes (5,040 runs is past the report's limit)."""


def _sweep(scenario: Path, out: Path, workers: int | None) -> tuple[float, float]:
    """Wall seconds of one `zsim sweep --out` process, start-up included, and the CPU
    seconds it and its workers used (on a shared host, the wall time an idle one would
    take is about the CPU time divided by the workers)."""
    env = dict(os.environ)
    env.pop("ZSIM_WORKERS", None)
    if workers is not None:
        env["ZSIM_WORKERS"] = str(workers)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "zsim", "sweep", "--scenario", str(scenario),
                    "--out", str(out), "--format", "csv"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    wall_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall_s, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="13b,7b", help="comma-separated presets")
    parser.add_argument("--keep", type=Path, help="leave the scenarios and outputs here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="zsim-bench-sweep-"))
    models = args.models.split(",")
    scenarios = []
    for model in models:
        path = root / f"grid-{model}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(SCENARIO.format(model=model))
        scenarios.append(path)
    cores = workers_for(1_000_000)
    modes = {"serial": 1, f"parallel ({cores} workers)": None}
    wall_s = {mode: 0.0 for mode in modes}
    cpu_s = {mode: 0.0 for mode in modes}
    for mode, workers in modes.items():
        for path in scenarios:
            wall, cpu = _sweep(path, root / mode.split()[0] / path.stem, workers)
            wall_s[mode] += wall
            cpu_s[mode] += cpu
    plans, closed = 0, 0
    for path in scenarios:
        with open(root / "serial" / path.stem / "results.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        plans += len(rows)
        closed += sum(r["evaluated"] == "closed form" for r in rows)
    same = all((root / "serial" / p.stem / name).read_bytes()
               == (root / "parallel" / p.stem / name).read_bytes()
               for p in scenarios for name in RESULTS
               if (root / "serial" / p.stem / name).exists())
    print(f"{plans:,} plans ({', '.join(models)} on dgx-h100; {closed:,} answered by the "
          f"closed form)")
    print(f"{'mode':24s} {'wall s':>8s} {'plans/s':>8s} {'CPU s':>8s} {'plans/CPU-s':>11s}")
    for mode, t in wall_s.items():
        print(f"{mode:24s} {t:8.1f} {plans / t:8.1f} {cpu_s[mode]:8.1f} "
              f"{plans / cpu_s[mode]:11.1f}")
    serial, parallel = wall_s.values()
    print(f"speed-up {serial / parallel:.2f}x; same bytes serial vs parallel: "
          f"{'yes' if same else 'NO'}; 10,000 plans in {10_000 * parallel / plans:.0f} s "
          f"wall (target < 60 s); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(f"outputs in {root}")


if __name__ == "__main__":
    main()
