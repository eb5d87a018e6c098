"""Run a plan for real on N ranks and return what was measured: step time, per-unit
forward/backward time, memory per phase and saved-activation bytes per block.

Owns the measurement protocol of one plan. Each rank (1) builds the model and applies the
plan (zsim.backend.programs); (2) runs two steps with memory instruments on (CPU: the live
tensor tracker of zsim.backend.instruments; CUDA: the caching allocator's counters): the
first step allocates lazy state (optimizer moments, FSDP buffers), the second is the
steady-state step whose phases are reported, and its first micro-batch's saved tensors
are recorded; (3) runs `warmup_steps`, then timed steps with the instruments off: `steps`
of them, or more if that many would not fill `min_timed_s` at the warm-up's pace (a host
shared with other machines has slow and fast spells of seconds, so a run of short steps
must last long enough to sample both), each timed by zsim.backend.step_timing reading
its losses back. The step time of a step is the slowest rank's (ranks start aligned by a
barrier); the reported figure is the median over steps. Steps (1) and (2) are
steady_state, which the GPU report's runs share (zsim.validation.gpu_runs). Imports
torch.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from zsim.backend import programs, training
from zsim.backend.instruments import LiveMemory, SavedTensor, record_saved_tensors, time_units
from zsim.backend.runner import RankContext, run_fake_rank, run_ranks, sync_device
from zsim.backend.step_timing import timed_step
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseMemory:
    """Memory of one rank over the steady-state step, bytes. On CPU these are live tensor
    bytes from the tracker; on CUDA, torch.cuda.memory_allocated figures."""

    after_init_bytes: int
    """Live after the model is built and sharded (parameters and buffers)."""
    after_first_step_bytes: int
    """Live after the first step (adds optimizer state)."""
    peak_forward_bytes: int
    peak_backward_bytes: int
    peak_optimizer_bytes: int
    after_forward_bytes: int
    """Live at the end of the (last micro-batch's) forward."""
    peak_bytes: int
    """Highest of the three phase peaks."""
    reserved_bytes: int
    """CUDA max_memory_reserved over the step; on CPU equal to peak_bytes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankMeasurement:
    """What one rank measured."""

    rank: int
    step_times_s: list[float]
    """Wall time of each timed step on this rank, seconds."""
    forward_s: dict[str, float]
    """Per timing scope ("layers.<i>", "root": the whole forward), last timed step."""
    backward_s: dict[str, float]
    memory: PhaseMemory
    collective_busy_s: dict[str, float]
    """Summed duration of the backend's collective spans in one profiled step, by the
    kind that actually ran ("all_gather", "reduce_scatter", "all_reduce"; gloo runs
    reduce_scatter_tensor as an all-reduce of the full buffer), seconds."""
    saved: list[SavedTensor]
    """Storages autograd saved in the first micro-batch of the steady-state step."""
    loss: float
    collective_calls: dict[str, int] = field(default_factory=dict)
    """The same profiled step's collective spans, counted by kind as collective_busy_s
    names them: the calls the program issued."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanMeasurement:
    """A plan's real run across all ranks."""

    spec: ModelSpec
    plan: Plan
    backend: str
    ranks: list[RankMeasurement]
    torch_version: str = field(default=torch.__version__)

    @property
    def step_time_s(self) -> float:
        """Median over steps of the slowest rank's step time, seconds."""
        per_step = [max(r.step_times_s[i] for r in self.ranks)
                    for i in range(len(self.ranks[0].step_times_s))]
        return statistics.median(per_step)

    @property
    def peak_bytes(self) -> int:
        """Highest peak over ranks, bytes."""
        return max(r.memory.peak_bytes for r in self.ranks)

    def pooled(self, *others: PlanMeasurement) -> PlanMeasurement:
        """This run with the timed steps of other runs of the same plan appended, rank by
        rank (so step_time_s is the median over every run's steps); everything else is
        this run's."""
        ranks = [replace(r, step_times_s=r.step_times_s + [t for o in others
                                                           for t in o.ranks[i].step_times_s])
                 for i, r in enumerate(self.ranks)]
        return replace(self, ranks=ranks)

    def saved_block_bytes(self, block: str = "layers.0") -> int:
        """Saved-activation bytes attributed to one block on rank 0."""
        return sum(t.bytes for t in self.ranks[0].saved if t.scope == block)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
    spec: ModelSpec
    plan: Plan
    steps: int
    warmup_steps: int
    min_timed_s: float = 0.0


def measure_plan(spec: ModelSpec, plan: Plan, *, nproc: int, steps: int = 3,
                 warmup_steps: int = 1, min_timed_s: float = 0.0, backend: str | None = None,
                 timeout_s: float = 600.0) -> PlanMeasurement:
    """Run `plan` on `nproc` processes and measure it.

    Args:
        spec: the model (already scaled to fit this machine if needed).
        plan: the plan; its world size must equal nproc.
        nproc: number of processes.
        steps: timed steps, at least.
        warmup_steps: untimed steps before them (after the two memory steps).
        min_timed_s: run more timed steps if `steps` of them would take less than this
            at the pace of the last warm-up step (the slowest rank's), seconds.
        backend: "gloo" or "nccl"; default nccl when CUDA is available, else gloo.
        timeout_s: deadline for the whole run, seconds.

    Raises:
        ConfigError: the plan cannot run on this backend (see programs.check_plan).
        RankFailed: a rank raised, died or hung.
    """
    programs.check_plan(plan, nproc, spec)
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    job = _Job(spec=spec, plan=plan, steps=steps, warmup_steps=warmup_steps,
               min_timed_s=min_timed_s)
    ranks = run_ranks(_measure_rank, job, nproc=nproc, backend=backend, timeout_s=timeout_s)
    return PlanMeasurement(spec=spec, plan=plan, backend=backend, ranks=ranks)


def measure_fake_rank(spec: ModelSpec, plan: Plan, *, timeout_s: float = 600.0) -> PhaseMemory:
    """Memory per phase of rank 0 when `plan.world_size` ranks run `plan`, measured in
    one process on the fake process group (collectives move no data; shards have their
    real sizes): on the GPU with the CUDA allocator's figures when one is present, else on
    CPU with the live tensor tracker. Times are meaningless there and are not returned.

    Raises:
        ConfigError: the plan cannot run on this backend.
        RankFailed: the process raised or hung.
    """
    programs.check_plan(plan, plan.world_size, spec)
    job = _Job(spec=spec, plan=plan, steps=0, warmup_steps=0)
    result: RankMeasurement = run_fake_rank(_measure_rank, job, world_size=plan.world_size,
                                            timeout_s=timeout_s)
    return result.memory


class _Meter:
    """Live/peak bytes from the CPU tracker or the CUDA allocator, one interface."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.tracker = None if self.cuda else LiveMemory()

    def live(self) -> int:
        if self.cuda:
            return torch.cuda.memory_allocated()
        assert self.tracker is not None
        return self.tracker.live_bytes

    def peak(self) -> int:
        if self.cuda:
            return torch.cuda.max_memory_allocated()
        assert self.tracker is not None
        return self.tracker.peak_bytes

    def reserved(self) -> int:
        return torch.cuda.max_memory_reserved() if self.cuda else self.peak()

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            assert self.tracker is not None
            self.tracker.reset_peak()


_REST_S = 0.05
"""How long a rank sleeps, without the GIL, before its state at rest is read, seconds."""


def _come_to_rest(device: str) -> None:
    """Let the rank come to rest before its model state is read: the device finishes its
    queued work, then the main thread sleeps without the GIL. A gloo worker thread drops a
    finished collective, and the buffers it holds, only once it takes the GIL, and a rank
    read straight after a step's last reduce-scatter sometimes still counted that
    collective's output (the FSDP1 test: the root's gradient shard, 1 step in 60)."""
    sync_device(device)
    time.sleep(_REST_S)


def _batches(spec: ModelSpec, plan: Plan, ctx: RankContext, *, step: int
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The micro-batches of `step` on this rank: its data-parallel rank's."""
    return training.batches(spec, plan, device=ctx.device,
                            rank=training.data_rank(plan, ctx.rank), step=step)


def steady_state(ctx: RankContext, spec: ModelSpec,
                 plan: Plan) -> tuple[training.Prepared, PhaseMemory, list[SavedTensor], float]:
    """Steps (1) and (2) of the protocol on this rank: build the model and apply `plan`,
    then the first step and the steady-state step with the memory instruments on.

    Returns:
        The prepared program (ready for more steps, the instruments off), its memory
        over the steady-state step, the storages autograd saved in that step's first
        micro-batch, and that step's loss.
    """
    meter = _Meter(ctx.device)
    tracking = meter.tracker if meter.tracker is not None else _NoTracking()
    with tracking:
        prep = programs.prepare(spec, plan, device=ctx.device, world_size=ctx.world_size)
        _come_to_rest(ctx.device)
        after_init = meter.live()
        training.train_step(prep, _batches(spec, plan, ctx, step=0))
        _come_to_rest(ctx.device)
        after_first = meter.live()
        memory, saved, loss = _memory_step(prep, spec, plan, ctx, meter)
    return prep, PhaseMemory(after_init_bytes=after_init, after_first_step_bytes=after_first,
                             **memory), saved, loss


def _measure_rank(ctx: RankContext, job: _Job) -> RankMeasurement:
    prep, memory, saved, loss = steady_state(ctx, job.spec, job.plan)
    forward_s: dict[str, float] = {}
    backward_s: dict[str, float] = {}

    def timed(step: int) -> float:
        nonlocal forward_s, backward_s, loss
        micro = _batches(job.spec, job.plan, ctx, step=2 + step)
        sync_device(ctx.device)
        training.barrier()
        with time_units(prep.units) as unit_times:
            timing = timed_step(prep, micro, ctx.device, phases=False, read_loss=True)
        forward_s, backward_s = unit_times.forward_s, unit_times.backward_s
        loss = timing["loss"]
        return timing["step_s"]

    warm_s = [timed(step) for step in range(job.warmup_steps)]
    steps = _timed_steps(job, warm_s[-1] if warm_s else 0.0, ctx.device)
    step_times = [timed(job.warmup_steps + i) for i in range(steps)]
    busy, calls = (_profile_collectives(prep, job, ctx, 2 + job.warmup_steps + steps)
                   if steps else ({}, {}))
    return RankMeasurement(rank=ctx.rank, step_times_s=step_times, forward_s=forward_s,
                           backward_s=backward_s, memory=memory, collective_busy_s=busy,
                           saved=saved, loss=loss, collective_calls=calls)


_KINDS = (("all_gather", "all_gather"), ("allgather", "all_gather"),
          ("reduce_scatter", "reduce_scatter"), ("reducescatter", "reduce_scatter"),
          ("all_reduce", "all_reduce"), ("allreduce", "all_reduce"))
"""Substrings of gloo span names (gloo:all_gather) and NCCL kernel names
(ncclDevKernel_AllGather_RING_LL), lower-cased, and the collective kind they mean."""


def _timed_steps(job: _Job, warm_step_s: float, device: str) -> int:
    """How many steps to time: job.steps, or as many as fill job.min_timed_s at the pace
    of the slowest rank's last warm-up step (every rank gets the same count)."""
    if job.min_timed_s <= 0 or warm_step_s <= 0:
        return job.steps
    pace = torch.tensor([warm_step_s], device=device)
    torch.distributed.all_reduce(pace, op=torch.distributed.ReduceOp.MAX)
    return max(job.steps, math.ceil(job.min_timed_s / float(pace.item())))


def _profile_collectives(prep: training.Prepared, job: _Job, ctx: RankContext,
                         batch_step: int) -> tuple[dict[str, float], dict[str, int]]:
    """One more step under torch.profiler; the backend's own spans (gloo's worker-thread
    spans, or NCCL kernels on the GPU) give how long each collective really ran and how
    many ran, by kind."""
    activities = [ProfilerActivity.CPU]
    if ctx.device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    micro = _batches(job.spec, job.plan, ctx, step=batch_step)
    training.barrier()
    with profile(activities=activities) as prof:
        training.train_step(prep, micro)
        sync_device(ctx.device)
    busy: dict[str, float] = {}
    calls: dict[str, int] = {}
    for event in prof.events():
        name = event.name.lower()
        if not (name.startswith("gloo:") or name.startswith("nccl")):
            continue
        kind = next((k for sub, k in _KINDS if sub in name), None)
        if kind is not None:
            busy[kind] = busy.get(kind, 0.0) + event.time_range.elapsed_us() * 1e-6
            calls[kind] = calls.get(kind, 0) + 1
    return busy, calls


def _memory_step(prep: training.Prepared, spec: ModelSpec, plan: Plan, ctx: RankContext,
                 meter: _Meter) -> tuple[dict[str, int], list[SavedTensor], float]:
    micro = _batches(spec, plan, ctx, step=1)
    peaks = {"peak_forward_bytes": 0, "peak_backward_bytes": 0, "after_forward_bytes": 0}
    reserved = 0
    saved: list[SavedTensor] = []
    loss = 0.0

    @contextmanager
    def phase(name: str) -> Iterator[None]:
        yield
        if name == "forward":  # the forward's peak; the backward's is measured from here
            peaks["peak_forward_bytes"] = max(peaks["peak_forward_bytes"], meter.peak())
            peaks["after_forward_bytes"] = meter.live()
            meter.reset()

    block_names = [n for n in prep.units if n != "root"]
    for i, (tokens, labels) in enumerate(micro):
        last = i == len(micro) - 1
        meter.reset()
        if i == 0:
            with record_saved_tensors(prep.inner, block_names) as records:
                loss = float(training.forward_backward(prep, tokens, labels, last=last,
                                                       phase=phase).detach())
            saved = list(records)
        else:
            loss = float(training.forward_backward(prep, tokens, labels, last=last,
                                                   phase=phase).detach())
        peaks["peak_backward_bytes"] = max(peaks["peak_backward_bytes"], meter.peak())
        reserved = max(reserved, meter.reserved())
    meter.reset()
    prep.step()
    peaks["peak_optimizer_bytes"] = meter.peak()
    reserved = max(reserved, meter.reserved())
    peaks["peak_bytes"] = max(peaks["peak_forward_bytes"], peaks["peak_backward_bytes"],
                              peaks["peak_optimizer_bytes"])
    peaks["reserved_bytes"] = max(reserved, peaks["peak_bytes"])
    return peaks, saved, loss


class _NoTracking:
    """Stands in for LiveMemory on CUDA, where the allocator keeps the counts."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None

