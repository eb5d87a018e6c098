"""Collectives: bytes on the wire, which link carries them, and alpha-beta time.

Owns the closed forms of ring collectives and the per-step communication volume of each
strategy. Sizes follow nccl-tests (doc/PERFORMANCE.md): `size_bytes` is the full tensor
(all_gather output, reduce_scatter input, all_reduce buffer); bus bytes per rank are
(n-1)/n * size for all_gather and reduce_scatter, 2 (n-1)/n * size for all_reduce.

References:
- Ring algorithms: Patarasuk & Yuan 2009; NCCL's ring all-reduce = reduce-scatter +
  all-gather, each moving (n-1)/n of the data per rank.
- Latency: NCCL's own cost model (src/graph/tuning.cc, ncclTopoTuneModel): a ring pays
  one per-step latency per step, the network's for the steps that cross nodes
  (nNodes - 1 per pass) and NVLink's for the others.
- ZeRO communication: Rajbhandari et al. 2020, Sec. 7 (2 Psi for DDP and ZeRO-1/2,
  3 Psi for ZeRO-3).
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.spec.hardware import COLLECTIVES, HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class CommGroup:
    """A process group: `ranks` GPUs placed `ranks_per_node` to a node.

    A group of consecutive ranks (an FSDP shard group of 8 on 8-GPU nodes) has
    ranks_per_node = min(ranks, gpus_per_node); a replicate group that takes one rank
    from each node has ranks_per_node = 1.
    """

    ranks: int
    ranks_per_node: int

    @property
    def spans_nodes(self) -> bool:
        return self.ranks > self.ranks_per_node

    @property
    def nodes(self) -> int:
        """Nodes the group touches."""
        return -(-self.ranks // self.ranks_per_node)


def bus_bytes(kind: str, size_bytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring collective over n ranks."""
    if n <= 1:
        return 0.0
    factor = 2.0 if kind == "all_reduce" else 1.0
    return factor * (n - 1) / n * size_bytes


def latency_steps(kind: str, n: int) -> int:
    """Sequential ring steps, each paying a per-step latency: n-1, twice for all_reduce."""
    if n <= 1:
        return 0
    return (2 if kind == "all_reduce" else 1) * (n - 1)


def ring_link_loads(group: CommGroup) -> tuple[tuple[str, float], ...]:
    """Link bytes per bus byte of a ring collective over `group`, per GPU: (link, load).

    Inside one node every hop is NVLink (load 1). A ring that spans nodes with
    r = ranks_per_node consecutive GPUs per node: NCCL runs one ring (channel) per NIC,
    rotated so that each GPU's outgoing hop crosses nodes in 1 of r rings; so NVLink
    carries (r-1)/r and each GPU's own NIC 1/r of the bus bytes, and the ring's bus
    bandwidth is min(NVLink * r/(r-1), NIC * r). On 8-NIC NDR nodes that is 8 x ~47 =
    ~376 GB/s, the NCCL maintainers' expectation of 370-385 GB/s ring busbw
    (shared/cases/published.yaml C-NCCL-maintainer-multinode-reference-points). With one
    rank per node (HSDP replicas) every hop uses the NIC (load 1).
    """
    if not group.spans_nodes:
        return (("intra_node", 1.0),)
    r = group.ranks_per_node
    if r == 1:
        return (("inter_node", 1.0),)
    return (("intra_node", (r - 1) / r), ("inter_node", 1.0 / r))


def link_loads(kind: str, group: CommGroup, hw: HardwareProfile
               ) -> tuple[tuple[str, float], ...]:
    """ring_link_loads of a `kind` collective, each load divided by that link's
    collective_efficiency for the kind: a backend that moves more bytes for it (or moves
    them slower) loads the link more per bus byte."""
    return tuple((link, load / getattr(hw, link).kind_efficiency[kind])
                 for link, load in ring_link_loads(group))


def collective_latency_s(kind: str, group: CommGroup, hw: HardwareProfile) -> float:
    """Start-up term of a ring collective (NCCL tuning model): the steps that cross nodes
    (nodes - 1 per pass) pay the network's per-step latency, the rest NVLink's."""
    steps = latency_steps(kind, group.ranks)
    inter = latency_steps(kind, group.nodes) if group.spans_nodes else 0
    return (steps - inter) * hw.intra_node.latency_s + inter * hw.inter_node.latency_s


def link_bandwidths(hw: HardwareProfile) -> dict[str, float]:
    """Achievable bytes/s per GPU per direction of each link a ring can load."""
    return {"intra_node": hw.intra_node.achievable_bytes_per_s,
            "inter_node": hw.inter_node.achievable_bytes_per_s}


def collective_time_s(kind: str, size_bytes: float, group: CommGroup,
                      hw: HardwareProfile) -> float:
    """Alpha-beta time of a ring collective running alone: latency plus bus bytes over
    the ring's bottleneck (the link whose load / bandwidth is largest)."""
    bandwidth = link_bandwidths(hw)
    seconds_per_bus_byte = max(load / bandwidth[link]
                               for link, load in link_loads(kind, group, hw))
    return (collective_latency_s(kind, group, hw)
            + bus_bytes(kind, size_bytes, group.ranks) * seconds_per_bus_byte)


def shard_group(plan: Plan, hw: HardwareProfile) -> CommGroup:
    """The group a model-state shard is spread over (consecutive ranks)."""
    return CommGroup(ranks=plan.dp_shard, ranks_per_node=min(plan.dp_shard, hw.gpus_per_node))


def replicate_group(plan: Plan, hw: HardwareProfile) -> CommGroup:
    """Ranks holding the same shard in different replicas: one per shard group, so one
    per node once a shard group fills a node."""
    per_node = max(1, hw.gpus_per_node // plan.dp_shard)
    return CommGroup(ranks=plan.dp_replicate, ranks_per_node=min(plan.dp_replicate, per_node))


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
        time[kind] += times * collective_time_s(kind, size, group, hw)

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
        add("all_reduce", s_reduce / plan.dp_shard, repl)
    return StepComm(size_bytes=sizes, bus_bytes=bus, time_s=time)
