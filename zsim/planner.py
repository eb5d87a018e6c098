"""Planner: enumerate candidate plans for a model on a cluster, estimate, simulate, rank,
explain.

Owns candidate enumeration, the closed-form evaluation of each candidate (memory,
communication, a first step-time estimate), the prune of plans whose model state alone
cannot fit, the simulation of the survivors, and the ranking with a one-line reason per
losing plan. No I/O; the CLI renders what this returns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from zsim.analytic.collectives import bus_bytes
from zsim.analytic.comm import step_comm
from zsim.analytic.compute import step_flops
from zsim.analytic.memory import CATEGORIES, MemoryEstimate, estimate_memory
from zsim.errors import ConfigError
from zsim.fanout import simulate_all
from zsim.result import Result
from zsim.schedule.lower import state_at_rest_bytes
from zsim.spec.error_bands import band_pct
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.validate import validate
from zsim.units import GB, GiB, dtype_bytes

RECOMPUTE_ORDER: tuple[str, ...] = ("none", "selective", "full")


PROGRAM_SHAPES: tuple[tuple[str, str], ...] = (
    ("ddp", "torch"), ("zero1", "deepspeed"), ("zero2", "deepspeed"), ("zero3", "deepspeed"),
    ("fsdp", "fsdp2"), ("fsdp", "fsdp1"), ("fsdp-no-reshard", "fsdp2"),
    ("fsdp-no-reshard", "fsdp1"), ("hsdp", "fsdp2"), ("hsdp", "fsdp1"))
"""(strategy, program) pairs the planner ranks side by side: torch DDP, DeepSpeed's ZeRO
stages, and FSDP2 and FSDP1 with and without resharding and hybrid."""


def candidate_plans(hw: HardwareProfile, *, gpus: int, **knobs: object) -> list[Plan]:
    """Every (strategy, program) of PROGRAM_SHAPES x recomputation policy on `gpus` GPUs;
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
            for strategy, impl in PROGRAM_SHAPES if strategy != "hsdp" or hybrid
            for rc in RECOMPUTE_ORDER]


def config_variations(base: Plan, hw: HardwareProfile) -> list[Plan]:
    """The user's own plan first, then the same program with every strategy it runs
    (DeepSpeed: ZeRO stages 1-3; FSDP1/FSDP2: resharding, no resharding, HSDP within a
    node) x recomputation policy x offload (DeepSpeed: none, optimizer, parameters;
    FSDP2: the config's and none), every other setting of the config kept. Variations the
    program cannot run (parameter offload below stage 3, FSDP1 with offload) are left out.
    """
    world = base.world_size
    node = min(hw.gpus_per_node, world)
    group = base.dp_shard if base.strategy == "hsdp" else node
    hybrid = 1 < group < world and world % group == 0
    offloads = ("none", "optimizer", "params") if base.impl == "deepspeed" else \
        tuple(dict.fromkeys((base.offload, "none")))
    plans = [base]
    for strategy in (s for s, impl in PROGRAM_SHAPES if impl == base.impl):
        if strategy == "hsdp" and not hybrid:
            continue
        shard = group if strategy == "hsdp" else (1 if strategy == "ddp" else world)
        for offload in offloads:
            ds = base.ds
            if base.impl == "deepspeed":
                device = base.ds.offload_device if base.ds.offload_device != "none" else "cpu"
                ds = replace(ds, offload_device=device if offload != "none" else "none")
            for rc in RECOMPUTE_ORDER:
                try:
                    plan = base.with_(strategy=strategy, dp_shard=shard,
                                      dp_replicate=world // shard, recompute=rc,
                                      offload=offload, ds=ds)
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
    validate(model, hw, plan)
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


def choose(model: ModelSpec, hw: HardwareProfile, *, gpus: int,
           **knobs: object) -> list[Choice]:
    """choose_among the candidate plans of `gpus` GPUs (candidate_plans)."""
    return choose_among(model, hw, candidate_plans(hw, gpus=gpus, **knobs))


def choose_among(model: ModelSpec, hw: HardwareProfile, plans: list[Plan]) -> list[Choice]:
    """Closed forms for every plan, then zsim.simulate.simulate on every local core
    (zsim.fanout), which simulates those whose memory floor fits in HBM; ranked:
    fitting plans by simulated throughput, then the simulated ones that do not fit by
    peak, then the closed-form ones by floor. Ties keep the order of `plans` (sorted is
    stable), so the output is deterministic."""
    estimates = rank([evaluate(model, hw, p) for p in plans])
    results = simulate_all(model, hw, [c.plan for c in estimates])
    choices = [Choice(estimate=c, result=r) for c, r in zip(estimates, results, strict=True)]

    def key(ch: Choice) -> tuple[bool, bool, float]:
        r = ch.result
        if r.fits and r.tokens_per_s_per_gpu is not None:
            return (False, False, -r.tokens_per_s_per_gpu)
        return (True, not r.simulated, ch.peak_bytes)

    return sorted(choices, key=key)


def explain(choice: Choice, best: Choice) -> str:
    """One line on why `choice` loses to `best` (or "recommended")."""
    if choice is best and choice.fits:
        return "recommended"
    hbm = choice.estimate.hbm_bytes / GiB
    r, b = choice.result, best.result
    if not r.simulated:
        return r.oom or ""
    if not r.fits:
        where = (r.oom or "").split(":")[0]
        return (f"does not fit: peak {r.peak_memory_bytes / GiB:.1f} GiB > {hbm:.1f} GiB HBM "
                f"({where})")
    # A fitting choice exists, so the best one was simulated to its end.
    assert b.step_time_s is not None and b.tokens_per_s_per_gpu is not None
    assert r.tokens_per_s_per_gpu is not None
    slower = b.tokens_per_s_per_gpu / r.tokens_per_s_per_gpu - 1
    more_exposed = _exposed_s(r) - _exposed_s(b)
    more_compute = (r.compute_time_s or 0.0) - (b.compute_time_s or 0.0)
    if max(more_exposed, more_compute) <= 0.001 * b.step_time_s:
        cause = "same speed, ranked by enumeration order"
    elif more_exposed >= more_compute:
        waits = {**r.exposed_by_kind_s, "host optimizer step": r.exposed_host_s or 0.0}
        kind = max(waits, key=lambda k: waits[k])
        cause = f"{more_exposed:.3f} s more exposed communication (mostly {kind})"
    elif choice.plan.recompute != best.plan.recompute:
        cause = f"recomputation ({choice.plan.recompute}) adds {more_compute:.3f} s of compute"
    else:
        cause = f"{more_compute:.3f} s more compute (collectives slow the kernels they overlap)"
    return f"slower by {slower:.1%}: {cause}"


def _exposed_s(r: Result) -> float:
    """Time the compute stream waited, on collectives and on the host."""
    return (r.exposed_comm_s or 0.0) + (r.exposed_host_s or 0.0)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def to_record(model: ModelSpec, choice: Choice, best: Choice) -> dict[str, object]:
    """One flat row with units in every key (GiB for memory, GB for traffic). Simulated
    figures where the plan was simulated, the memory floor where the closed form rules it
    out; the closed-form estimates are also kept as estimate_* columns. model_state_gb is
    what the plan's program holds between steps (zsim.schedule.lower.state_at_rest_bytes),
    the same state the simulated peak starts from; estimate_model_state_gb is the ZeRO
    paper's accounting of the strategy (zsim.analytic.memory, the seed card's table)."""
    est, r = choice.estimate, choice.result
    return {
        "plan": choice.plan.label,
        "strategy": choice.plan.strategy,
        "impl": choice.plan.impl,
        "dp_shard": choice.plan.dp_shard,
        "dp_replicate": choice.plan.dp_replicate,
        "recompute": choice.plan.recompute,
        "micro_batch": choice.plan.micro_batch,
        "evaluated": r.evaluated,
        "fits": choice.fits,
        "peak_gib": round(choice.peak_bytes / GiB, 3),
        "hbm_gib": round(est.hbm_bytes / GiB, 3),
        "model_state_gb": round(sum(state_at_rest_bytes(model, choice.plan).values()) / GB, 4),
        **{f"{cat}_gib": round(v / GiB, 3) for cat, v in choice.memory_at_peak.items()},
        "comm_volume_model_sizes": round(est.comm_volume_model_sizes, 4),
        "comm_gb_per_step": round(est.comm_bus_bytes / GB, 3),
        # Time figures only where simulated to the end of the step.
        "step_time_s": _rounded(r.step_time_s, 4),
        "step_time_band_pct": band_pct(r.step_time_band_s, r.step_time_s),
        "step_time_s_low": _rounded(r.step_time_band_s and r.step_time_band_s[0], 4),
        "step_time_s_high": _rounded(r.step_time_band_s and r.step_time_band_s[1], 4),
        "compute_time_s": _rounded(r.compute_time_s, 4),
        "exposed_comm_s": _rounded(r.exposed_comm_s, 4),
        "tokens_per_s_per_gpu": _rounded(r.tokens_per_s_per_gpu, 1),
        "tokens_per_s": _rounded(r.tokens_per_s, 1),
        "mfu": _rounded(r.mfu, 4),
        "estimate_model_state_gb": round(est.memory.steady_state_bytes / GB, 4),
        "estimate_peak_gib": round(est.memory.peak_bytes / GiB, 3),
        "estimate_step_time_s": round(est.step_time_s, 4),
        "why": explain(choice, best),
    }
