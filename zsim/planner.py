"""Planner: enumerate candidate plans for a model on a cluster, estimate, rank, explain.

Owns candidate enumeration, the closed-form evaluation of each candidate (memory,
communication, a first step-time estimate) and the ranking with a one-line reason per
losing plan. No I/O; the CLI renders what this returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.analytic.comm import bus_bytes, step_comm
from zsim.analytic.compute import step_flops
from zsim.analytic.memory import MemoryEstimate, estimate_memory
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.validate import validate
from zsim.units import GB, GiB, dtype_bytes

RECOMPUTE_ORDER: tuple[str, ...] = ("none", "selective", "full")


def candidate_plans(hw: HardwareProfile, *, gpus: int, **knobs: object) -> list[Plan]:
    """Every strategy x recomputation policy on `gpus` GPUs; HSDP shards within a node.

    Args:
        hw: cluster (its gpus_per_node sets the HSDP shard group).
        gpus: world size.
        knobs: Plan fields shared by every candidate (seq_len, micro_batch, ...).
    """
    shapes: list[tuple[str, int | None]] = [("ddp", None), ("zero1", None), ("zero2", None),
                                            ("fsdp", None), ("fsdp-no-reshard", None)]
    node = min(hw.gpus_per_node, gpus)
    if 1 < node < gpus and gpus % node == 0:
        shapes.append(("hsdp", node))
    return [Plan.for_strategy(strategy, gpus=gpus, shard_group=group, recompute=rc, **knobs)  # type: ignore[arg-type]
            for strategy, group in shapes for rc in RECOMPUTE_ORDER]


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A plan with its closed-form estimates."""

    plan: Plan
    memory: MemoryEstimate
    hbm_bytes: float
    comm_bus_bytes: float
    """Bytes each rank sends per optimizer step, all collectives."""
    comm_volume_model_sizes: float
    """Communication volume in units of S (the param-dtype model size), counted as the
    seed card does: all_reduce = 2S, reduce_scatter = all_gather = 1S (per micro-batch)."""
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

    @property
    def bound(self) -> str:
        return "comm" if self.comm_time_s > self.compute_time_s else "compute"


def evaluate(model: ModelSpec, hw: HardwareProfile, plan: Plan) -> Candidate:
    """Closed-form memory, communication and step-time estimate of one plan."""
    validate(model, hw, plan)
    mem = estimate_memory(model, plan)
    comm = step_comm(model, plan, hw)
    model_flops, hw_flops = step_flops(model, micro_batch=plan.micro_batch,
                                       seq_len=plan.seq_len, grad_accum=plan.grad_accum,
                                       recompute=plan.recompute)
    peak = hw.peak(plan.param_dtype)
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


def why_not(candidate: Candidate, best: Candidate) -> str:
    """One line on why `candidate` loses to `best`."""
    if candidate is best:
        return "recommended"
    if not candidate.fits:
        return (f"does not fit: needs {candidate.memory.peak_bytes / GiB:.1f} GiB "
                f"> {candidate.hbm_bytes / GiB:.1f} GiB HBM")
    slower = best.tokens_per_s_per_gpu / candidate.tokens_per_s_per_gpu - 1
    if candidate.bound == "comm":
        cause = (f"communication-bound ({candidate.comm_time_s:.2f} s of collectives, "
                 f"{candidate.comm_bus_bytes / GB:.1f} GB per rank)")
    elif candidate.compute_time_s > best.compute_time_s * 1.001:
        cause = f"recomputation ({candidate.plan.recompute}) adds compute"
    else:
        cause = "same speed, ranked by enumeration order"
    return f"slower by {slower:.1%}: {cause}"


def plan_candidates(model: ModelSpec, hw: HardwareProfile, *, gpus: int,
                    **knobs: object) -> list[Candidate]:
    """Enumerate, evaluate and rank candidate plans."""
    return rank([evaluate(model, hw, p) for p in candidate_plans(hw, gpus=gpus, **knobs)])


def to_record(candidate: Candidate, best: Candidate) -> dict[str, object]:
    """One flat row with units in every key (GiB for memory, GB for traffic)."""
    mem = candidate.memory.by_category
    return {
        "plan": candidate.plan.label,
        "strategy": candidate.plan.strategy,
        "dp_shard": candidate.plan.dp_shard,
        "dp_replicate": candidate.plan.dp_replicate,
        "recompute": candidate.plan.recompute,
        "micro_batch": candidate.plan.micro_batch,
        "fits": candidate.fits,
        "peak_gib": round(candidate.memory.peak_bytes / GiB, 3),
        "hbm_gib": round(candidate.hbm_bytes / GiB, 3),
        "model_state_gb": round(candidate.memory.steady_state_bytes / GB, 4),
        **{f"{cat}_gib": round(mem[cat] / GiB, 3) for cat in mem},
        "comm_volume_model_sizes": round(candidate.comm_volume_model_sizes, 4),
        "comm_gb_per_step": round(candidate.comm_bus_bytes / GB, 3),
        "comm_time_s": round(candidate.comm_time_s, 4),
        "compute_time_s": round(candidate.compute_time_s, 4),
        "step_time_s": round(candidate.step_time_s, 4),
        "tokens_per_s_per_gpu": round(candidate.tokens_per_s_per_gpu, 1),
        "tokens_per_s": round(candidate.tokens_per_s_per_gpu * candidate.plan.dp_degree, 1),
        "mfu": round(candidate.mfu, 4),
        "why": why_not(candidate, best),
    }
