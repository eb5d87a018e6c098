"""Real runs shared between the tests that check different things on the same run (the
`real_runs` fixture of conftest.py hands out one RealRuns for each test process: with
xdist's two workers, a file's tests share its runs, and files on one worker each other's).

A real run of a plan on gloo ranks takes seconds to tens of seconds (each rank is a
spawned process that imports torch; bf16 matmuls are emulated on a CPU without native
bf16), so a run is measured once for every test that asks for the same one: the same
model, plan, world size and step counts, nothing else.
"""

from __future__ import annotations

from typing import Any

from zsim.backend.measured_step import PlanMeasurement, measure_plan
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


class RealRuns:
    """zsim.backend.measured_step.measure_plan, run once per distinct set of arguments."""

    def __init__(self) -> None:
        self._measured: dict[tuple[Any, ...], PlanMeasurement] = {}

    def measure(self, spec: ModelSpec, plan: Plan, *, nproc: int, steps: int = 3,
                warmup_steps: int = 1, min_timed_s: float = 0.0) -> PlanMeasurement:
        """measure_plan(spec, plan, ...) on this host's default backend: the earlier run
        with these very arguments, else a new one."""
        key = (spec, plan, nproc, steps, warmup_steps, min_timed_s)
        if key not in self._measured:
            self._measured[key] = measure_plan(spec, plan, nproc=nproc, steps=steps,
                                               warmup_steps=warmup_steps,
                                               min_timed_s=min_timed_s)
        return self._measured[key]
