"""Fuzz campaign over every input zsim reads: 10,000+ generated inputs through
the oracles of tests/fuzz/fuzz_inputs.py, counting valid inputs, rejected ones (a
ConfigError naming its field), crashes (any other exception, or a broken invariant) and
hangs (past the time bound). Prints one row per target and every crash and hang found.

Run: python bench/fuzz.py [--scale 0.1] [--seed N]
Exit code 1 when anything crashed or hung. The suite runs the same oracles on a small
profile (tests/fuzz/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fuzz"))
from fuzz_inputs import TARGETS, Hang, time_bound

INPUTS = {"model": 2000, "hardware": 2000, "plan": 2000, "simulate": 1500, "scenario": 800,
          "hf_config": 1500, "cli": 700, "ds_config": 1000, "fsdp_config": 1000,
          "cli_config": 400}
"""Inputs per target at --scale 1 (12,900 in all)."""


def campaign(target: str, count: int, rng_seed: int) -> tuple[Counter[str], dict[str, Any]]:
    """Run `count` generated inputs of `target`; return outcome counts and, for each
    distinct failure (kind, exception, where it was raised), how often it happened and
    the first input that caused it."""
    strategy, oracle = TARGETS[target]
    outcomes: Counter[str] = Counter()
    failures: dict[str, Any] = {}

    @seed(rng_seed)
    @settings(max_examples=count, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(value=strategy)
    def run(value: Any) -> None:
        try:
            with time_bound():
                outcomes[oracle(value)] += 1
        except Hang as e:
            outcomes["hang"] += 1
            failures.setdefault(f"HANG {e}", [0, value])[0] += 1
        except Exception as e:  # a crash is what the campaign counts
            outcomes["crash"] += 1
            cause = e.__cause__ or e  # SimPy re-raises a process's failure as its cause
            frames = traceback.extract_tb(cause.__traceback__)
            where = next((f for f in reversed(frames) if "/zsim/" in f.filename), frames[-1])
            key = (f"CRASH {type(e).__name__}: {str(e)[:200]} at "
                   f"{Path(where.filename).name}:{where.lineno} ({where.name})")
            failures.setdefault(key, [0, value])[0] += 1

    run()
    return outcomes, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of the full campaign's inputs per target")
    parser.add_argument("--seed", type=int, default=9, help="hypothesis seed")
    parser.add_argument("--targets", nargs="+", choices=list(INPUTS), default=list(INPUTS),
                        help="which inputs to generate (default: all)")
    args = parser.parse_args()
    print(f"{'target':<10} {'inputs':>7} {'valid':>7} {'rejected':>8} {'crashes':>7} "
          f"{'hangs':>5} {'wall_s':>7}")
    total: Counter[str] = Counter()
    failures: list[str] = []
    for target in args.targets:
        full = INPUTS[target]
        t0 = time.perf_counter()
        outcomes, found = campaign(target, max(1, round(full * args.scale)), args.seed)
        wall = time.perf_counter() - t0
        n = sum(outcomes.values())
        print(f"{target:<10} {n:>7} {outcomes['valid']:>7} {outcomes['rejected']:>8} "
              f"{outcomes['crash']:>7} {outcomes['hang']:>5} {wall:>7.1f}", flush=True)
        total.update(outcomes)
        failures += [f"[{target}] {key} x{count}\n  first input: {value!r}"
                     for key, (count, value) in found.items()]
    print(f"{'all':<10} {sum(total.values()):>7} {total['valid']:>7} {total['rejected']:>8} "
          f"{total['crash']:>7} {total['hang']:>5}")
    for f in failures:
        print(f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
