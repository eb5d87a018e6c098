"""Placement: where a plan's ranks sit on the machine, and so which links each of its
process groups runs on. Owns the mapping of the plan's mesh axes to ranks and nodes:
row-major over consecutive global ranks, `domain_gpus` consecutive ranks to a node (an
NVLink domain: one host's GPUs, or a GB200 NVL72 rack's 72),
tensor parallelism innermost (inside a node), then context, then pipeline, then data
parallelism (shard, then replicate). torchtitan's
ParallelDims._build_mesh puts pp outermost instead (pp, dp_replicate, dp_shard, cp, tp);
the two differ only in which of the pipeline and the data-parallel groups is packed into
a node first. A group along an axis of stride `stride` (the product of the inner
degrees) and `ranks` members keeps min(ranks, max(1, domain_gpus // stride)) members
in a node: its collectives run on NVLink when that is all of them, else on the inter-
node fabric for the hops between nodes (zsim.analytic.collectives.ring_link_loads). A
world that is not a whole number of nodes (12 ranks on 8-GPU nodes) leaves its last node
partly filled (8 + 4): the outermost axis's groups, which reach it, hold fewer members
there (CommGroup.last_node_ranks), and partial_node_warning says so. A flattened group
(FLATTENED: FSDP's dp_shard_cp) spans every rank of its axes, placed as one axis of their
degrees' product at the innermost one's stride. Expert parallelism splits dp_shard x cp
x tp (Plan.expert_region): its "ep" group is the innermost Plan.ep of those ranks, its
"expert_shard" group (the ranks that hold the same experts and shard their state) the
rest, ep apart. Pure
arithmetic; imports only zsim.analytic.collectives and zsim.spec. Mesh axes, not tensor
dims: see "axis vs dim" in zsim/__init__.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zsim.analytic.collectives import CommGroup
from zsim.spec.hardware import HardwareProfile
from zsim.spec.plan import Plan

AXES: tuple[str, ...] = ("tp", "cp", "pp", "dp_shard", "dp_replicate")
"""The plan's mesh axes from innermost to outermost."""
FLATTENED: dict[str, tuple[str, ...]] = {"dp_shard_cp": ("cp", "dp_shard")}
"""Groups over several axes at once, as torchtitan's ParallelDims flattens them:
"dp_shard_cp", the ranks FSDP shards the model state over (zsim.spec.plan.Plan.dp_shard_cp).
CP runs without PP, so cp and dp_shard are adjacent at stride tp here as in torchtitan's
mesh (pp, dp_replicate, dp_shard, cp, tp): the group is tp ranks apart."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """The process group along each mesh axis of a plan on a profile's nodes."""

    groups: dict[str, CommGroup]
    """Axis name (AXES) or flattened group (FLATTENED) -> its group as one rank sees it."""
    strides: dict[str, int]
    """Axis name -> rank distance between consecutive members of its group."""

    def group(self, axis: str) -> CommGroup:
        return self.groups[axis]

    def link(self, axis: str) -> str:
        """The bottleneck link of the axis's collectives: "intra_node" when its group
        lies in one node, else "inter_node"."""
        return "inter_node" if self.groups[axis].spans_nodes else "intra_node"


def axis_degrees(plan: Plan) -> dict[str, int]:
    """Each mesh axis's degree, innermost first."""
    return {"tp": plan.tp, "cp": plan.cp, "pp": plan.pp, "dp_shard": plan.dp_shard,
            "dp_replicate": plan.dp_replicate}


def place(plan: Plan, hw: HardwareProfile) -> Placement:
    """Each axis's group on `hw`'s nodes (see the module docstring): pipeline stages
    sit tp * cp ranks apart, data-parallel shard groups tp * cp * pp apart."""
    world = plan.world_size
    left = world % hw.domain_gpus if world > hw.domain_gpus else 0

    def group(stride: int, ranks: int) -> CommGroup:
        per_node = min(ranks, max(1, hw.domain_gpus // stride))
        # Only the groups of the axis that spans the world reach its partial last node.
        last = max(1, left // stride) if left and stride * ranks == world else 0
        return CommGroup(ranks=ranks, ranks_per_node=per_node,
                         last_node_ranks=last if 0 < last < per_node else 0)

    groups: dict[str, CommGroup] = {}
    strides: dict[str, int] = {}
    stride = 1
    for axis, ranks in axis_degrees(plan).items():
        groups[axis] = group(stride, ranks)
        strides[axis] = stride
        stride *= ranks
    for name, axes in FLATTENED.items():
        groups[name] = group(strides[axes[0]], math.prod(groups[a].ranks for a in axes))
    # Expert parallelism: the innermost ep ranks of dp_shard x cp x tp, and the ranks
    # holding the same experts, ep apart within them (torchtitan's ep and efsdp).
    groups["ep"] = group(1, plan.ep)
    groups["expert_shard"] = group(plan.ep, plan.expert_region // plan.ep)
    strides |= {"ep": 1, "expert_shard": plan.ep}
    return Placement(groups=groups, strides=strides)


def partial_node_warning(gpus: int, hw: HardwareProfile) -> str | None:
    """One line saying that `gpus` GPUs are not a whole number of `hw`'s nodes, and how
    zsim places them; None when they are (or fit in one node)."""
    per_node, node = hw.domain_gpus, hw.domain_name
    if gpus <= per_node or gpus % per_node == 0:
        return None
    full, left = divmod(gpus, per_node)
    return (f"{gpus} GPUs are {gpus / per_node:g} {node}s of {per_node} ({hw.name}): placed in "
            f"rank order on {full} full {node}{'s' if full > 1 else ''} and one of {left}, "
            f"whose {left} NICs carry a larger share of each collective across {node}s")


def pipeline_hop_crosses_nodes(plan: Plan, hw: HardwareProfile) -> bool:
    """Whether the point-to-point send from one pipeline stage to the next leaves the
    node: the stages sit `stride` ranks apart, so the worst hop crosses a node boundary
    once the stride reaches the node or the stages do not all fit in one node."""
    stride = place(plan, hw).strides["pp"]
    return stride >= hw.domain_gpus or stride * plan.pp > hw.domain_gpus
