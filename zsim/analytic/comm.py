"""Per-step communication of a plan: the process groups a plan's collectives run over
and the closed-form volume and time of its collectives per optimizer step.

One call's bytes, links, algorithm and time live in zsim.analytic.collectives.

References:
- ZeRO communication: Rajbhandari et al. 2020, Sec. 7 (2 Psi for DDP and ZeRO-1/2,
  3 Psi for ZeRO-3).
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.analytic.collectives import CommGroup, bus_bytes, collective_time_s
from zsim.analytic.placement import place
from zsim.spec.hardware import COLLECTIVES, HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes


def shard_group(plan: Plan, hw: HardwareProfile) -> CommGroup:
    """The group a model-state shard is spread over: the dp_shard x cp ranks of FSDP's
    flattened dp_shard_cp group (Plan.dp_shard_cp; consecutive ranks of a purely
    data-parallel plan, tp ranks apart with CP, tp * pp apart with PP,
    zsim.analytic.placement)."""
    return place(plan, hw).group("dp_shard_cp")


def replicate_group(plan: Plan, hw: HardwareProfile) -> CommGroup:
    """Ranks holding the same shard in different replicas: one per shard group, so one
    per node once a shard group fills a node."""
    return place(plan, hw).group("dp_replicate")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepComm:
    """Per-rank communication of one optimizer step, by collective and group."""

    size_bytes: dict[str, float]
    """Full tensor bytes through each collective kind per step (nccl-tests 'size')."""
    bus_bytes: dict[str, float]
    """Bytes each rank puts on the wire per collective kind per step."""
    time_s: dict[str, float]
    """Alpha-beta time per collective kind, if each ran alone (no overlap), seconds."""

    @property
    def total_bus_bytes(self) -> float:
        return sum(self.bus_bytes.values())

    @property
    def total_time_s(self) -> float:
        return sum(self.time_s.values())


def step_comm(model: ModelSpec, plan: Plan, hw: HardwareProfile) -> StepComm:
    """Data-parallel communication per rank per optimizer step.

    S = parameters x param-dtype bytes. Gradients reduce once per step (FSDP2 and DDP's
    no_sync keep accumulating locally across micro-batches); FSDP all-gathers once per
    micro-batch in forward and, when resharding, again in backward.

    - ddp: all_reduce of the gradients (reduce dtype) over dp_replicate.
    - zero1 / zero2: reduce_scatter of gradients + all_gather of updated params (2S).
    - fsdp: all_gather fwd + bwd per micro-batch, reduce_scatter of grads (3S).
    - fsdp-no-reshard: one all_gather per micro-batch + reduce_scatter (2S).
    - hsdp: as fsdp inside the shard group, plus an all_reduce of the gradient shard
      across replicas.

    With context parallelism the sharded strategies' collectives run over the dp_shard x
    cp ranks (shard_group), as torchtitan's FSDP over dp_shard_cp.
    """
    n_params = model.num_params
    s_param = n_params * dtype_bytes(plan.param_dtype)
    s_reduce = n_params * dtype_bytes(plan.reduce_dtype)
    sizes: dict[str, float] = dict.fromkeys(COLLECTIVES, 0.0)
    bus: dict[str, float] = dict.fromkeys(COLLECTIVES, 0.0)
    time: dict[str, float] = dict.fromkeys(COLLECTIVES, 0.0)

    def add(kind: str, size: float, group: CommGroup, times: int = 1) -> None:
        if group.ranks <= 1:
            return
        sizes[kind] += times * size
        bus[kind] += times * bus_bytes(kind, size, group.ranks)
        time[kind] += times * collective_time_s(kind, size, group, hw, plan.reduce_dtype)

    shard, repl = shard_group(plan, hw), replicate_group(plan, hw)
    if plan.strategy == "ddp":
        add("all_reduce", s_reduce, repl)
    elif plan.strategy in ("zero1", "zero2"):
        add("reduce_scatter", s_reduce, shard)
        add("all_gather", s_param, shard)
    else:
        gathers = 2 if plan.reshard_after_forward else 1
        add("all_gather", s_param, shard, times=gathers * plan.grad_accum)
        add("reduce_scatter", s_reduce, shard)
        add("all_reduce", s_reduce / plan.dp_shard_cp, repl)
    return StepComm(size_bytes=sizes, bus_bytes=bus, time_s=time)
