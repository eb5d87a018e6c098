"""A training run over days as a SimPy process: steps, checkpoints, failures, restarts.

Owns `simulate_run(inputs)` and `best_interval(inputs, candidates)`. One process trains in
segments (the steps up to the next checkpoint, one SimPy timeout each, not one per step),
stalls for each checkpoint, and restarts after each failure; a second process draws the
job's failures as a Poisson process over wall time (zsim.spec.failures rates) and
interrupts the first wherever it is: training, a checkpoint, a wait, or a restart (which
then starts over). A failure loses every step since the last completed checkpoint, then
costs the restart and the checkpoint load. An async checkpoint's write runs on in the
background after its stall; the next checkpoint waits for it to end, and a failure before
it ends loses that checkpoint too (recovery goes back to the one before). The first
checkpoint of each process (the job's start and every restart) pays a one-off extra,
DCP's planning of a save plan no process has cached yet: in its stall, or in an async
save's background write.

Without slowdown samples, whole checkpoint cycles (a segment and its stall) that no
failure interrupts run as one timeout: a run of millions of steps with a checkpoint every
few minutes costs an event per failure, not per checkpoint; a failure inside such a batch
is booked as if the cycles had run one by one.

Each step takes its nominal time times a factor drawn (seeded numpy, vectorised per
segment) from the step slowdown samples (stragglers and jitter, zsim.analytic.stragglers).
Failures and slowdowns draw from separate streams of the seed, so the failure times of a
seed are the same whatever the checkpoint interval (common random numbers for
best_interval). Same inputs, same outcome, to the bit.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import simpy

from zsim.errors import ConfigError
from zsim.spec.failures import FailureModel, job_failures_per_day

DAY_S = 86_400.0
MAX_SEGMENT_STEPS = 1 << 16
"""Most steps drawn at once (a run without checkpoints trains in segments this long)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInputs:
    """What a run simulation needs: the step, the job's size and failures, checkpoints."""

    step_time_s: float
    """Nominal time of one optimizer step (zsim.simulate), seconds."""
    step_slowdown_samples: tuple[float, ...] = ()
    """Per-step time factors >= 1 (stragglers, jitter), each step drawing one at random;
    empty: every step takes its nominal time."""
    tokens_per_step: int
    """Tokens the whole job trains on per step."""
    gpus: int
    """GPUs of the job."""
    gpus_per_node: int
    """GPUs per node (node failures scale with the nodes)."""
    failures: FailureModel
    """Failure rates and restart time (zsim.spec.failures)."""
    checkpoint_interval_steps: int
    """Steps between checkpoints; 0: never checkpoint."""
    checkpoint_stall_s: float = 0.0
    """Seconds training is blocked per checkpoint (a sync save, or an async save's
    staging)."""
    checkpoint_background_s: float = 0.0
    """Seconds an async save's write runs on while training goes on (0: none)."""
    load_s: float = 0.0
    """Seconds to load the checkpoint on a restart (added to failures.restart_s)."""
    first_checkpoint_extra_s: float = 0.0
    """Seconds the first checkpoint after the start and after every restart takes beyond
    the others (DCP's uncached planning, zsim.analytic.checkpoint plan_s): added to its
    stall, or to its background write where the save is async."""
    days: float
    """Wall time simulated, days."""
    seed: int = 0
    """Seeds the failure times and the slowdown draws."""

    def __post_init__(self) -> None:
        _finite("step_time_s", self.step_time_s, low=0.0, open_low=True)
        for i, f in enumerate(self.step_slowdown_samples):
            _finite(f"step_slowdown_samples[{i}]", f, low=1.0)
        _integer("tokens_per_step", self.tokens_per_step, low=0)
        _integer("gpus", self.gpus, low=1)
        _integer("gpus_per_node", self.gpus_per_node, low=1)
        if not isinstance(self.failures, FailureModel):
            raise ConfigError("failures", self.failures, "must be a FailureModel")
        _integer("checkpoint_interval_steps", self.checkpoint_interval_steps, low=0)
        for name in ("checkpoint_stall_s", "checkpoint_background_s", "load_s",
                     "first_checkpoint_extra_s"):
            _finite(name, getattr(self, name), low=0.0)
        _finite("days", self.days, low=0.0, open_low=True)
        _integer("seed", self.seed, low=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """What a run achieved, and where its wall time went: useful_s + straggler_s +
    checkpoint_stall_s + checkpoint_wait_s + lost_work_s + restart_s = wall_s."""

    wall_s: float
    """Wall time simulated, seconds."""
    steps_done: int
    """Steps kept: those of completed checkpoints, plus the progress at the end."""
    tokens: int
    """steps_done * tokens_per_step."""
    tokens_per_day: float
    """tokens per day of wall time."""
    goodput: float
    """useful_s / wall_s."""
    useful_s: float
    """Nominal time of the steps kept, seconds."""
    straggler_s: float
    """Time the steps kept took beyond nominal (slowdown factors), seconds."""
    checkpoint_stall_s: float
    """Training blocked by checkpoints (those a failure cut short included), seconds."""
    checkpoint_wait_s: float
    """Checkpoints waiting for the previous async write to end, seconds."""
    lost_work_s: float
    """Training time of steps a failure rolled back (and of the step cut by the end of
    the run), seconds."""
    restart_s: float
    """Restarts and checkpoint loads (those a failure cut short included), seconds."""
    failures: int
    """Failures that interrupted the job."""
    checkpoints: int
    """Checkpoints completed (their stall and write ended before any failure)."""


def simulate_run(inputs: RunInputs) -> RunOutcome:
    """Simulate the run (module docstring) for inputs.days of wall time."""
    return _Run(inputs).outcome()


def best_interval(inputs: RunInputs, candidates: Sequence[int], *, seeds: int = 4
                  ) -> tuple[int, dict[int, tuple[RunOutcome, ...]]]:
    """The checkpoint interval among `candidates` with the best mean goodput over
    `seeds` runs (seeds inputs.seed .. inputs.seed + seeds - 1, the same for every
    candidate: common random numbers), the first one listed on a tie; and each
    candidate's outcomes.

    Raises:
        ConfigError: no candidates, a candidate below 1, or seeds below 1.
    """
    if not candidates:
        raise ConfigError("candidates", candidates, "must name at least one interval")
    for i, c in enumerate(candidates):
        _integer(f"candidates[{i}]", c, low=1)
    _integer("seeds", seeds, low=1)
    outcomes = {c: tuple(simulate_run(replace(inputs, checkpoint_interval_steps=c,
                                              seed=inputs.seed + s)) for s in range(seeds))
                for c in candidates}
    best = max(candidates, key=lambda c: math.fsum(o.goodput for o in outcomes[c]))
    return best, outcomes


def _finite(name: str, value: float, *, low: float, open_low: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(name, value, "must be a number")
    if not math.isfinite(value) or value < low or (open_low and value == low):
        raise ConfigError(name, value, f"must be finite and {'>' if open_low else '>='} {low}")


def _integer(name: str, value: int, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(name, value, f"must be an integer >= {low}")


class _Work:
    """Steps trained since some point, and their time."""

    __slots__ = ("nominal_s", "steps", "stretch_s")

    def __init__(self) -> None:
        self.steps = 0
        self.nominal_s = 0.0
        self.stretch_s = 0.0

    def add(self, steps: int, nominal_s: float, took_s: float) -> None:
        self.steps += steps
        self.nominal_s += nominal_s
        self.stretch_s += took_s - nominal_s

    @property
    def took_s(self) -> float:
        return self.nominal_s + self.stretch_s


class _Run:
    """State of one run simulation."""

    def __init__(self, inputs: RunInputs) -> None:
        self.x = inputs
        self.env = simpy.Environment()
        self.end_s = inputs.days * DAY_S
        fail_seed, slow_seed = np.random.SeedSequence(inputs.seed).spawn(2)
        self.fail_rng = np.random.default_rng(fail_seed)
        self.slow_rng = np.random.default_rng(slow_seed)
        self.samples = np.asarray(inputs.step_slowdown_samples, dtype=np.float64)
        self.recovery_s = inputs.failures.restart_s + inputs.load_s
        self.kept = _Work()
        """Steps of completed checkpoints."""
        self.pending: _Work | None = None
        """Steps of the checkpoint whose async write is running."""
        self.write_end_s = 0.0
        self.open = _Work()
        """Steps since the last checkpoint's snapshot."""
        self.recovering = False
        self.first = inputs.first_checkpoint_extra_s > 0
        """The process has not completed a checkpoint's stall yet, and its first one pays
        first_checkpoint_extra_s."""
        self.batch_cycles = 0
        """Checkpoint cycles of the running "cycles" phase."""
        self.stall_s = self.wait_s = self.lost_s = self.restart_s = 0.0
        self.failures = self.checkpoints = 0

    def outcome(self) -> RunOutcome:
        env = self.env
        train = env.process(self.train())
        env.process(self.fail(train))
        env.run(until=train)
        kept = self.kept
        for work in (self.pending, self.open):
            if work is not None:  # the progress at the end counts
                kept.add(work.steps, work.nominal_s, work.took_s)
        tokens = kept.steps * self.x.tokens_per_step
        return RunOutcome(
            wall_s=self.end_s, steps_done=kept.steps, tokens=tokens,
            tokens_per_day=tokens / self.x.days, goodput=kept.nominal_s / self.end_s,
            useful_s=kept.nominal_s, straggler_s=kept.stretch_s,
            checkpoint_stall_s=self.stall_s, checkpoint_wait_s=self.wait_s,
            lost_work_s=self.lost_s, restart_s=self.restart_s, failures=self.failures,
            checkpoints=self.checkpoints)

    # ------------------------------------------------------------------ processes
    def fail(self, train: simpy.Process) -> Generator[simpy.Event, Any, None]:
        """Failures as a Poisson process over wall time, each interrupting `train`."""
        x = self.x
        per_s = job_failures_per_day(x.failures, x.gpus, x.gpus_per_node) / DAY_S
        if per_s <= 0:
            return
        env = self.env
        while True:
            gap = float(self.fail_rng.exponential(1.0 / per_s))
            if env.now + gap >= self.end_s:
                return
            yield env.timeout(gap)
            train.interrupt()

    def train(self) -> Generator[simpy.Event, Any, None]:
        """The job: one phase (a segment of steps, a checkpoint's wait or stall, a
        restart) per timeout, until the end of the run."""
        env = self.env
        while env.now < self.end_s:
            self._settle(env.now)
            kind, took_s, cum_s = self._next_phase()
            start = env.now
            dur = min(took_s, self.end_s - start)
            try:
                if dur > 0:
                    yield env.timeout(dur)
            except simpy.Interrupt:
                self._account(kind, env.now - start, cum_s, cut=True)
                self._failure(env.now)
                continue
            self._account(kind, dur, cum_s, cut=dur < took_s)

    # ------------------------------------------------------------------ phases
    def _next_phase(self) -> tuple[str, float, np.ndarray | None]:
        """The next phase: its kind, its duration, and for a segment the end times of
        its steps from its start."""
        x = self.x
        if self.recovering:
            return "restart", self.recovery_s, None
        every = x.checkpoint_interval_steps
        cycles = self._whole_cycles()
        if cycles >= 2:
            self.batch_cycles = cycles
            return "cycles", cycles * self._cycle_s(), None
        if every and self.open.steps == every:
            if self.pending is not None:
                return "wait", self.write_end_s - self.env.now, None
            extra = (x.first_checkpoint_extra_s
                     if self.first and not x.checkpoint_background_s else 0.0)
            return "stall", x.checkpoint_stall_s + extra, None
        left_s = self.end_s - self.env.now
        n = min(MAX_SEGMENT_STEPS, math.ceil(left_s / x.step_time_s) + 1)
        if every:
            n = min(n, every - self.open.steps)
        if self.samples.size:
            factors = self.samples[self.slow_rng.integers(0, self.samples.size, size=n)]
            cum_s = np.cumsum(factors * x.step_time_s)
        else:
            cum_s = np.arange(1, n + 1, dtype=np.float64) * x.step_time_s
        return "train", float(cum_s[-1]), cum_s

    def _account(self, kind: str, spent_s: float, cum_s: np.ndarray | None, *,
                 cut: bool) -> None:
        """Book `spent_s` of phase `kind`; `cut`: it did not run to its end."""
        if kind == "cycles":
            self._account_cycles(spent_s, cut=cut)
        elif kind == "restart":
            self.restart_s += spent_s
            self.recovering = cut
        elif kind == "wait":
            self.wait_s += spent_s
            if not cut:
                self._commit(self.pending)
                self.pending = None
        elif kind == "stall":
            self.stall_s += spent_s
            if not cut:
                self._snapshot()
        else:
            assert cum_s is not None
            done = len(cum_s) if not cut else int(np.searchsorted(cum_s, spent_s,
                                                                  side="right"))
            took = float(cum_s[done - 1]) if done else 0.0
            self.open.add(done, done * self.x.step_time_s, took)
            self.lost_s += spent_s - took

    def _cycle_s(self) -> float:
        x = self.x
        return x.checkpoint_interval_steps * x.step_time_s + x.checkpoint_stall_s

    def _whole_cycles(self) -> int:
        """How many whole checkpoint cycles can run as one phase from now: none with
        slowdown samples (every step draws its factor), mid-interval, or while the
        previous write would outlast the next segment (the cycle would include a wait)."""
        x = self.x
        train_s = x.checkpoint_interval_steps * x.step_time_s
        if (not x.checkpoint_interval_steps or self.samples.size or self.open.steps
                or self.first or x.checkpoint_background_s > train_s
                or (self.pending is not None and self.write_end_s - self.env.now > train_s)):
            return 0
        return int((self.end_s - self.env.now) // self._cycle_s())

    def _account_cycles(self, spent_s: float, *, cut: bool) -> None:
        """Book `spent_s` of a "cycles" phase: the whole cycles it ran, then the part of
        the one a failure cut (steps done so far, or the stall's part)."""
        x = self.x
        every, step_s = x.checkpoint_interval_steps, x.step_time_s
        train_s, cycle_s = every * step_s, self._cycle_s()
        start = self.env.now - spent_s
        whole = min(int(spent_s // cycle_s), self.batch_cycles - 1) if cut \
            else self.batch_cycles
        self._settle(min(self.env.now, start + train_s))
        async_ = x.checkpoint_background_s > 0
        done = whole - 1 if async_ and whole else whole
        self.kept.add(done * every, done * train_s, done * train_s)
        self.checkpoints += done
        self.stall_s += whole * x.checkpoint_stall_s
        if async_ and whole:
            self.pending = _Work()
            self.pending.add(every, train_s, train_s)
            self.write_end_s = start + whole * cycle_s + x.checkpoint_background_s
        if not cut:
            return
        into = spent_s - whole * cycle_s
        if into < train_s:
            steps = min(every, int(into // step_s))
            self.open.add(steps, steps * step_s, steps * step_s)
            self.lost_s += into - steps * step_s
        else:
            self.open.add(every, train_s, train_s)
            self.stall_s += into - train_s

    def _snapshot(self) -> None:
        """A checkpoint's stall ended: its write runs on, or it is complete."""
        x = self.x
        if x.checkpoint_background_s > 0:
            self.pending = self.open
            self.write_end_s = self.env.now + x.checkpoint_background_s + (
                x.first_checkpoint_extra_s if self.first else 0.0)
        else:
            self._commit(self.open)
        self.open = _Work()
        self.first = False

    def _settle(self, now: float) -> None:
        """Complete the pending checkpoint if its write ended by `now`."""
        if self.pending is not None and self.write_end_s <= now:
            self._commit(self.pending)
            self.pending = None

    def _commit(self, work: _Work | None) -> None:
        assert work is not None
        self.kept.add(work.steps, work.nominal_s, work.took_s)
        self.checkpoints += 1

    def _failure(self, now: float) -> None:
        """Roll back to the last completed checkpoint and start the recovery."""
        self.failures += 1
        self._settle(now)
        for work in (self.pending, self.open):
            if work is not None:
                self.lost_s += work.took_s
        self.pending = None
        self.open = _Work()
        self.recovering = True
        self.first = self.x.first_checkpoint_extra_s > 0
