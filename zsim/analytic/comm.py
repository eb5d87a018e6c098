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
    """The group a model-state shard is spread over (consecutive ranks of a purely
    data-parallel plan; tp * cp * pp ranks apart otherwise, zsim.analytic.placement)."""
    return place(plan, hw).group("dp_shard")


def replicate_group(plan: Plan, hw: HardwareProfile) -> CommGroup:
    """Ranks holding the same shard in different replicas: one per shard group, so one
    per node once a shard group fills a node."""
    return place(plan, hw).group("dp_replicate")


def ddp_bucket_dtype(plan: Plan) -> str:
    """The dtype of torch DDP's gradient buckets, and so of its all-reduces (impl
    "torch": ddp, and zero1's DDP under ZeroRedundancyOptimizer): the parameters' own.
    The reducer allocates each bucket in its parameters' dtype and the gradients must
    match it (torch/csrc/distributed/c10d/reducer.cpp, initialize_buckets and
    check_grad_layout); the all-reduce runs on the bucket. The module's parameters are
    the master weights (plan.master_dtype): fp32 under torch.autocast, whatever the
    compute dtype, and the compute dtype only for a model cast to it (master_dtype equal
    to param_dtype). DDP has no reduce dtype of its own, so plan.reduce_dtype is not read:
    a bucket cast down in flight (the bf16_compress_hook / fp16_compress_hook comm hooks)
    or DDP's private _MixedPrecision (buckets in its param_dtype, all-reduced in its
    reduce_dtype) is not modelled."""
    return plan.master_dtype


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

    - ddp (and zero1 as torch runs it, DDP + ZeroRedundancyOptimizer): all_reduce of
      the gradients over the data-parallel group in DDP's bucket dtype
      (ddp_bucket_dtype: fp32 under autocast, so 2 (n-1)/n 4P bytes where the ZeRO
      paper, Sec. 7, counts 16-bit gradients); zero1 then sends each rank's updated
      partition to the others, in the same dtype: an all_gather (zsim's stand-in for
      torch's broadcasts).
    - zero1 / zero2 (DeepSpeed): reduce_scatter of gradients + all_gather of updated
      params (2S).
    - fsdp: all_gather fwd + bwd per micro-batch, reduce_scatter of grads (3S).
    - fsdp-no-reshard: one all_gather per micro-batch + reduce_scatter (2S).
    - hsdp: as fsdp inside the shard group, plus an all_reduce of the gradient shard
      across replicas.
    """
    n_params = model.num_params
    s_param = n_params * dtype_bytes(plan.param_dtype)
    s_reduce = n_params * dtype_bytes(plan.reduce_dtype)
    sizes: dict[str, float] = dict.fromkeys(COLLECTIVES, 0.0)
    bus: dict[str, float] = dict.fromkeys(COLLECTIVES, 0.0)
    time: dict[str, float] = dict.fromkeys(COLLECTIVES, 0.0)

    def add(kind: str, size: float, group: CommGroup, times: int = 1,
            dtype: str = plan.reduce_dtype) -> None:
        if group.ranks <= 1:
            return
        sizes[kind] += times * size
        bus[kind] += times * bus_bytes(kind, size, group.ranks)
        time[kind] += times * collective_time_s(kind, size, group, hw, dtype)

    shard, repl = shard_group(plan, hw), replicate_group(plan, hw)
    if plan.impl == "torch":
        bucket = ddp_bucket_dtype(plan)
        g = n_params * dtype_bytes(bucket)
        add("all_reduce", g, repl if plan.strategy == "ddp" else shard, dtype=bucket)
        if plan.strategy == "zero1":
            add("all_gather", g, shard, dtype=bucket)
    elif plan.strategy in ("zero1", "zero2"):
        add("reduce_scatter", s_reduce, shard)
        add("all_gather", s_param, shard)
    else:
        gathers = 2 if plan.reshard_after_forward else 1
        add("all_gather", s_param, shard, times=gathers * plan.grad_accum)
        add("reduce_scatter", s_reduce, shard)
        add("all_reduce", s_reduce / plan.dp_shard, repl)
    return StepComm(size_bytes=sizes, bus_bytes=bus, time_s=time)
