"""Planner: enumerate candidate plans for a model on a cluster, estimate, simulate, rank,
explain.

Owns candidate enumeration, the closed-form evaluation of each candidate (memory,
communication, a first step-time estimate), the prune of plans whose model state alone
cannot fit, the simulation of the survivors, and the ranking with a one-line reason per
losing plan. No I/O; the CLI renders what this returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from zsim.analytic.collectives import bus_bytes
from zsim.analytic.comm import step_comm
from zsim.analytic.compute import step_flops
from zsim.analytic.memory import CATEGORIES, MemoryEstimate, estimate_memory
from zsim.errors import ConfigError
from zsim.multicore import simulate_all
from zsim.recommend import Ranked
from zsim.result import Result
from zsim.schedule.lower import memory_floor_bytes, saved_activation_bytes, state_at_rest_bytes
from zsim.spec.consistency import check_plan
from zsim.spec.error_bands import band_pct
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import STRATEGIES, Plan
from zsim.spec.programs import programs_for
from zsim.units import GB, GiB, dtype_bytes

RECOMPUTE_ORDER: tuple[str, ...] = ("none", "selective", "full")


def program_shapes() -> tuple[tuple[str, str], ...]:
    """(strategy, program) pairs the planner ranks side by side, by strategy, the default
    program first: each program under the strategies its registry entry ranks it
    (zsim.spec.programs.ProgramEntry.ranked): torch DDP, DeepSpeed's ZeRO stages, and
    FSDP2 and FSDP1 with and without resharding and hybrid."""
    return tuple((s, e.name) for s in STRATEGIES for e in programs_for(s) if s in e.ranked)


def candidate_plans(hw: HardwareProfile, *, gpus: int, **knobs: object) -> list[Plan]:
    """Every (strategy, program) of program_shapes x recomputation policy on `gpus` GPUs;
    HSDP shards within a node (and is left out where the world is one node).

    Args:
        hw: cluster (its gpus_per_node sets the HSDP shard group).
        gpus: world size.
        knobs: Plan fields shared by every candidate (seq_len, micro_batch, ...).
    """
    node = min(hw.gpus_per_node, gpus)
    hybrid = 1 < node < gpus and gpus % node == 0
    return [Plan.for_strategy(strategy, gpus=gpus, impl=impl, recompute=rc,  # type: ignore[arg-type]
                              shard_group=node if strategy == "hsdp" else None, **knobs)
            for strategy, impl in program_shapes() if strategy != "hsdp" or hybrid
            for rc in RECOMPUTE_ORDER]


def expert_parallel_variants(model: ModelSpec, hw: HardwareProfile,
                             shapes: list[Plan]) -> list[Plan]:
    """For an MoE model, each candidate of a program that runs expert parallelism in
    this table (DeepSpeed-MoE under ZeRO-1/2: ProgramEntry.expert_parallel, the FSDP2
    ones being the 2-D table's) again with EP inside one NVLink domain, as DeepSpeed-MoE
    is usually run: the largest power of two dividing the experts, the data-parallel
    ranks and the domain; none for a dense model."""
    if model.moe is None:
        return []
    out = []
    for plan in shapes:
        if plan.program.comm != "zero" or plan.strategy not in plan.program.expert_parallel:
            continue
        ep = 1
        while (ep * 2 <= hw.domain_gpus and model.moe.experts % (ep * 2) == 0
               and plan.dp_shard % (ep * 2) == 0):
            ep *= 2
        if ep > 1 and plan.offload == "none":
            out.append(plan.with_(ep=ep))
    return out


def config_variations(base: Plan, hw: HardwareProfile) -> list[Plan]:
    """The user's own plan first, then the same program with every strategy it is ranked
    under (DeepSpeed: ZeRO stages 1-3; FSDP1/FSDP2: resharding, no resharding, HSDP within
    a node) x recomputation policy x offload (the program's ProgramEntry.
    offload_variations, DeepSpeed's none, optimizer, parameters; else the config's and
    none), every other setting of the config kept, the program's options set for each
    offload (ProgramOptions.for_offload). Variations the program cannot run (parameter
    offload below stage 3, FSDP1 with offload) are left out.
    """
    world = base.world_size
    node = min(hw.gpus_per_node, world)
    group = base.dp_shard if base.strategy == "hsdp" else node
    hybrid = 1 < group < world and world % group == 0
    offloads = (base.program.offload_variations
                or tuple(dict.fromkeys((base.offload, "none"))))
    plans = [base]
    for strategy in (s for s in STRATEGIES if s in base.program.ranked):
        if strategy == "hsdp" and not hybrid:
            continue
        shard = group if strategy == "hsdp" else (1 if strategy == "ddp" else world)
        for offload in offloads:
            options = base.options.for_offload(offload) if base.options is not None else None
            for rc in RECOMPUTE_ORDER:
                try:
                    plan = base.with_(strategy=strategy, dp_shard=shard,
                                      dp_replicate=world // shard, recompute=rc,
                                      offload=offload, options=options)
                except ConfigError:
                    continue
                if plan not in plans and (plan.shards_params or plan.offload != "params"):
                    plans.append(plan)
    return plans


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A plan with its closed-form estimates."""

    plan: Plan
    memory: MemoryEstimate
    hbm_bytes: float
    comm_bus_bytes: float
    """Bytes each rank sends per optimizer step, all collectives."""
    comm_volume_model_sizes: float
    """The step's bus bytes in units of S (the param-dtype model size) as the seed card
    counts them (a ring all_reduce of S = 2, reduce_scatter or all_gather of S = 1): what
    the program sends (zsim.analytic.comm.step_comm), e.g. 4 for DDP's fp32 buckets where
    the card says 2."""
    comm_time_s: float
    """Alpha-beta time of all collectives if run back to back."""
    compute_time_s: float
    step_time_s: float
    """First estimate: compute and communication fully overlapped, max of the two."""
    tokens_per_s_per_gpu: float
    """Training tokens per second per data-parallel GPU."""
    mfu: float

    @property
    def fits(self) -> bool:
        return self.memory.peak_bytes <= self.hbm_bytes


@lru_cache(maxsize=64)
def _step_flops(model: ModelSpec, micro_batch: int, seq_len: int, grad_accum: int,
                recompute: str) -> tuple[float, float]:
    """zsim.analytic.compute.step_flops, worked out once per model, batch shape and
    recomputation policy (the candidates of one model share three: half of `evaluate`)."""
    return step_flops(model, micro_batch=micro_batch, seq_len=seq_len, grad_accum=grad_accum,
                      recompute=recompute)


def evaluate(model: ModelSpec, hw: HardwareProfile, plan: Plan) -> Candidate:
    """Closed-form memory, communication and step-time estimate of one plan."""
    check_plan(model, hw, plan)
    mem = estimate_memory(model, plan)
    comm = step_comm(model, plan, hw)
    model_flops, hw_flops = _step_flops(model, plan.micro_batch, plan.seq_len,
                                        plan.grad_accum, plan.recompute)
    peak = hw.peak(plan.compute_dtype)
    # Time from FLOPs at the achievable matmul rate (attention is a small share at the
    # sequence lengths planned here; the simulator splits the two).
    compute_s = hw_flops / (peak * hw.matmul_efficiency)
    step_s = max(compute_s, comm.total_time_s)
    tokens = plan.tokens_per_step / plan.dp_degree
    s_bytes = model.num_params * dtype_bytes(plan.param_dtype)
    ring = bus_bytes("all_gather", s_bytes, plan.dp_degree) or 1.0
    return Candidate(
        plan=plan, memory=mem, hbm_bytes=hw.hbm_bytes, comm_bus_bytes=comm.total_bus_bytes,
        comm_volume_model_sizes=comm.total_bus_bytes / ring if plan.dp_degree > 1 else 0.0,
        comm_time_s=comm.total_time_s, compute_time_s=compute_s, step_time_s=step_s,
        tokens_per_s_per_gpu=tokens / step_s, mfu=model_flops / step_s / peak,
    )


def rank(candidates: list[Candidate]) -> list[Candidate]:
    """Fitting plans first, fastest first; then non-fitting ones by peak memory. Ties keep
    enumeration order (sorted is stable), so the output is deterministic."""
    return sorted(candidates, key=lambda c: (
        not c.fits, -c.tokens_per_s_per_gpu if c.fits else c.memory.peak_bytes))


def plan_candidates(model: ModelSpec, hw: HardwareProfile, *, gpus: int,
                    **knobs: object) -> list[Candidate]:
    """Enumerate, evaluate and rank candidate plans."""
    return rank([evaluate(model, hw, p) for p in candidate_plans(hw, gpus=gpus, **knobs)])


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """A candidate after both planner stages: its closed-form estimate and its Result
    (simulated, or from the closed form when the program's memory floor exceeds HBM)."""

    estimate: Candidate
    result: Result

    @property
    def plan(self) -> Plan:
        return self.estimate.plan

    @property
    def fits(self) -> bool:
        return self.result.fits

    @property
    def peak_bytes(self) -> float:
        return float(self.result.peak_memory_bytes)

    @property
    def memory_at_peak(self) -> dict[str, float]:
        return {c: float(self.result.memory_at_peak.get(c, 0)) for c in CATEGORIES}

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        return self.result.tokens_per_s_per_gpu

    @property
    def bubble_fraction(self) -> float:
        """No pipeline: never idle for one."""
        return 0.0


def batch_splits(sequences_per_rank: int, *, micro_batch: int | None = None,
                 grad_accum: int | None = None) -> list[tuple[int, int]]:
    """The (micro_batch, grad_accum) pairs that give a data-parallel rank
    `sequences_per_rank` sequences per step, largest micro-batch first: every divisor,
    or the one a fixed `micro_batch` or `grad_accum` leaves.

    Raises:
        ConfigError: a fixed micro-batch or accumulation that does not divide the rank's
            sequences.
    """
    if micro_batch is not None and sequences_per_rank % micro_batch:
        raise ConfigError("micro_batch", micro_batch, f"does not divide the "
                          f"{sequences_per_rank} sequences each data-parallel GPU trains per "
                          f"step (the global batch over the GPUs)")
    if grad_accum is not None and sequences_per_rank % grad_accum:
        raise ConfigError("grad_accum", grad_accum, f"does not divide the "
                          f"{sequences_per_rank} sequences each data-parallel GPU trains per "
                          f"step (the global batch over the GPUs)")
    sizes = [micro_batch] if micro_batch is not None else (
        [sequences_per_rank // grad_accum] if grad_accum is not None else
        [m for m in range(sequences_per_rank, 0, -1) if sequences_per_rank % m == 0])
    return [(m, sequences_per_rank // m) for m in sizes]


def choose(model: ModelSpec, hw: HardwareProfile, *, gpus: int, sequences_per_rank: int = 1,
           micro_batch: int | None = None, grad_accum: int | None = None,
           **knobs: object) -> list[Choice]:
    """The candidate plans of `gpus` GPUs (candidate_plans), each at the largest
    micro-batch that fits of those that split `sequences_per_rank` (batch_splits; the
    rest accumulated): the largest whose memory floor fits is simulated, then, while it
    runs out of memory, the next smaller one. With accumulation, FSDP2's plans also
    reduce every micro-batch (grad_sync "every") as a candidate of their own. Ranked as
    choose_among ranks."""
    splits = batch_splits(sequences_per_rank, micro_batch=micro_batch, grad_accum=grad_accum)
    shapes = candidate_plans(hw, gpus=gpus, micro_batch=splits[0][0],
                             grad_accum=splits[0][1], **knobs)
    shapes += expert_parallel_variants(model, hw, shapes)
    ladders = [[s.with_(micro_batch=m, grad_accum=a) for m, a in splits] for s in shapes]
    # FSDP2 with accumulation either reduces once per step (the default here: unsharded
    # gradients accumulate) or every micro-batch (fully_shard's own default, torchtitan's
    # loop): both are candidates.
    ladders += [[p.with_(grad_sync="every") for p in ladder if p.grad_accum > 1]
                for ladder in ladders if ladder[0].program.grad_sync_every
                and ladder[0].offload == "none"]
    ladders = [ladder for ladder in ladders if ladder]
    fits_floor = [[sum(memory_floor_bytes(model, p, hw).values()) <= hw.hbm_bytes
                   for p in ladder] for ladder in ladders]

    def next_try(i: int, start: int) -> int | None:
        return next((k for k in range(start, len(ladders[i])) if fits_floor[i][k]), None)

    # A shape none of whose micro-batches fits by its floor takes the smallest one's
    # closed form (simulate gives it).
    at = [next_try(i, 0) for i in range(len(ladders))]
    at = [len(ladders[i]) - 1 if k is None else k for i, k in enumerate(at)]
    settled: dict[int, tuple[Plan, Result]] = {}
    while pending := [i for i in range(len(ladders)) if i not in settled]:
        plans = [ladders[i][at[i]] for i in pending]
        for i, plan, result in zip(pending, plans, simulate_all(model, hw, plans),
                                   strict=True):
            smaller = next_try(i, at[i] + 1) if result.simulated and not result.fits else None
            if smaller is None:
                settled[i] = (plan, result)
            else:
                at[i] = smaller
    choices = [Choice(estimate=evaluate(model, hw, settled[i][0]), result=settled[i][1])
               for i in range(len(ladders))]
    return rank_choices(choices)


def choose_among(model: ModelSpec, hw: HardwareProfile, plans: list[Plan]) -> list[Choice]:
    """Closed forms for every plan, then zsim.simulate.simulate on every local core
    (zsim.multicore), which simulates those whose memory floor fits in HBM; ranked by
    rank_choices."""
    estimates = [evaluate(model, hw, p) for p in plans]
    results = simulate_all(model, hw, plans)
    return rank_choices([Choice(estimate=c, result=r)
                         for c, r in zip(estimates, results, strict=True)])


def rank_choices(choices: list[Choice]) -> list[Choice]:
    """Fitting plans by simulated throughput, then the simulated ones that do not fit by
    peak, then the closed-form ones by floor. Ties keep the order of `choices` (sorted
    is stable), so the output is deterministic."""
    def key(ch: Choice) -> tuple[bool, bool, float]:
        r = ch.result
        if r.fits and r.tokens_per_s_per_gpu is not None:
            return (False, False, -r.tokens_per_s_per_gpu)
        return (True, not r.simulated, ch.peak_bytes)

    return sorted(choices, key=key)


def explain(choice: Choice, fastest: Ranked | None) -> str:
    """One line on why `choice`, not tied with the fastest fitting plan, is not
    recommended: it does not fit, or how much slower than `fastest` it is and the
    largest cause."""
    hbm = choice.estimate.hbm_bytes / GiB
    r = choice.result
    if not r.simulated:
        return r.oom or ""
    if not r.fits:
        where = (r.oom or "").split(":")[0]
        return (f"does not fit: peak {r.peak_memory_bytes / GiB:.1f} GiB > {hbm:.1f} GiB HBM "
                f"({where})")
    # A fitting choice exists, so the fastest one was simulated to its end.
    assert fastest is not None and fastest.result is not None
    b = fastest.result
    assert b.step_time_s is not None and b.tokens_per_s_per_gpu is not None
    assert r.tokens_per_s_per_gpu is not None
    slower = b.tokens_per_s_per_gpu / r.tokens_per_s_per_gpu - 1
    more_exposed = _exposed_s(r) - _exposed_s(b)
    more_compute = (r.compute_time_s or 0.0) - (b.compute_time_s or 0.0)
    if max(more_exposed, more_compute) <= 0.001 * b.step_time_s:
        cause = "the same work, ranked by enumeration order"
    elif more_exposed >= more_compute:
        waits = {**r.exposed_by_kind_s, "host optimizer step": r.exposed_host_s or 0.0}
        kind = max(waits, key=lambda k: waits[k])
        cause = f"{more_exposed:.3f} s more exposed communication (mostly {kind})"
    elif choice.plan.recompute != fastest.plan.recompute:
        cause = f"recomputation ({choice.plan.recompute}) adds {more_compute:.3f} s of compute"
    elif choice.plan.micro_batch != fastest.plan.micro_batch:
        cause = (f"{more_compute:.3f} s more compute (micro-batch {choice.plan.micro_batch} "
                 f"against {fastest.plan.micro_batch})")
    else:
        cause = f"{more_compute:.3f} s more compute (collectives slow the kernels they overlap)"
    return f"slower than the fastest by {slower:.1%}: {cause}"


def _exposed_s(r: Result) -> float:
    """Time the compute stream waited, on collectives and on the host."""
    return (r.exposed_comm_s or 0.0) + (r.exposed_host_s or 0.0)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def to_record(model: ModelSpec, choice: Choice, *, why: str,
              tier: str = "") -> dict[str, object]:
    """One flat row with units in every key (GiB for memory and traffic). Simulated
    figures where the plan was simulated, the memory floor where the closed form rules it
    out; the closed-form estimates are also kept as estimate_* columns (the ZeRO paper's
    accounting: estimate_model_state_gb in GB, as the seed card prints it).
    model_state_gib is what the plan's program holds between steps
    (zsim.schedule.lower.state_at_rest_bytes), the state the simulated peak starts from;
    saved_activations_gib_per_microbatch what autograd keeps for one micro-batch
    (zsim.schedule.lower.saved_activation_bytes); at_peak_*_gib what is live at the
    peak, by category. `tier`: "recommended", "tied" (within the error band of the
    fastest) or ""; `why`: one line on its place."""
    est, r, p = choice.estimate, choice.result, choice.plan
    band = r.step_time_band_s
    return {
        "plan": p.label,
        "layout": p.layout,
        "strategy": p.strategy,
        "impl": p.impl,
        "dp_shard": p.dp_shard,
        "dp_replicate": p.dp_replicate,
        "ep": p.ep,
        "recompute": p.recompute,
        "micro_batch": p.micro_batch,
        "grad_accum": p.grad_accum,
        "evaluated": r.evaluated,
        "tier": tier,
        "fits": choice.fits,
        "peak_gib": round(choice.peak_bytes / GiB, 3),
        "hbm_gib": round(est.hbm_bytes / GiB, 3),
        "model_state_gib": round(sum(state_at_rest_bytes(model, p).values()) / GiB, 3),
        "saved_activations_gib_per_microbatch": round(
            saved_activation_bytes(model, p) / GiB, 3),
        **{f"at_peak_{cat}_gib": round(v / GiB, 3) for cat, v in choice.memory_at_peak.items()},
        "comm_volume_model_sizes": round(est.comm_volume_model_sizes, 4),
        "comm_gib_per_step": round(est.comm_bus_bytes / GiB, 3),
        # Time figures only where simulated to the end of the step.
        "step_time_s": _rounded(r.step_time_s, 4),
        "step_time_band_pct": band_pct(band, r.step_time_s),
        "step_time_s_low": _rounded(band and band[0], 4),
        "step_time_s_high": _rounded(band and band[1], 4),
        # Why the band is wider than its evidence's range ("; " between reasons), and
        # where it comes from (zsim.spec.error_bands).
        "step_time_band_extrapolated": "; ".join(r.step_time_band_extrapolated),
        "step_time_band_source": r.step_time_band_source,
        "compute_time_s": _rounded(r.compute_time_s, 4),
        "exposed_comm_s": _rounded(r.exposed_comm_s, 4),
        "all_to_all_exposed_s": _rounded(r.exposed_by_kind_s.get("all_to_all", 0.0)
                                         if r.step_time_s else None, 4),
        "tokens_per_s_per_gpu": _rounded(r.tokens_per_s_per_gpu, 1),
        "tokens_per_s": _rounded(r.tokens_per_s, 1),
        "mfu": _rounded(r.mfu, 4),
        "estimate_model_state_gb": round(est.memory.steady_state_bytes / GB, 4),
        "estimate_peak_gib": round(est.memory.peak_bytes / GiB, 3),
        "estimate_step_time_s": round(est.step_time_s, 4),
        "why": why,
    }
