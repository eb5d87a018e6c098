"""Placement: each mesh axis's group and link, worked out by hand from rank numbers (TP
innermost, then CP, PP, DP shard, DP replicate; 8 consecutive ranks to a node)."""

from __future__ import annotations

import itertools

import pytest

from zsim.analytic.collectives import CommGroup, ring_link_loads
from zsim.analytic.comm import replicate_group, shard_group
from zsim.analytic.placement import pipeline_hop_crosses_nodes, place
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware

H100 = resolve_hardware("dgx-h100")  # 8 GPUs per node


def _nodes_of(ranks: list[int]) -> int:
    return len({r // 8 for r in ranks})


def _members(axis_stride: int, size: int) -> list[int]:
    """Ranks of rank 0's group along an axis, from the row-major mesh."""
    return [i * axis_stride for i in range(size)]


@pytest.mark.parametrize(("tp", "cp", "pp", "shard", "repl"), [
    (8, 1, 8, 8, 1),     # 405B-style 3-D: TP fills a node, stages and shards across nodes
    (4, 2, 1, 16, 2),    # TP x CP fill a node
    (2, 1, 2, 4, 4),     # TP x PP share a node with two data-parallel ranks
    (1, 1, 1, 64, 1),    # pure FSDP: unchanged
    (1, 1, 1, 8, 8),     # HSDP: shard within a node, replicas one per node
])
def test_groups_follow_rank_numbers(tp: int, cp: int, pp: int, shard: int, repl: int) -> None:
    plan = Plan(strategy="hsdp" if repl > 1 else "fsdp", dp_shard=shard, dp_replicate=repl,
                tp=tp, cp=cp, pp=pp, grad_accum=pp, seq_len=4096)
    placement = place(plan, H100)
    stride = 1
    for axis, size in (("tp", tp), ("cp", cp), ("pp", pp), ("dp_shard", shard),
                       ("dp_replicate", repl)):
        members = _members(stride, size)
        nodes = _nodes_of(members)
        group = placement.group(axis)
        assert group.ranks == size
        assert group.nodes == nodes, axis
        assert placement.link(axis) == ("inter_node" if nodes > 1 else "intra_node")
        assert placement.strides[axis] == stride
        stride *= size


def test_data_parallel_groups_delegate_to_placement() -> None:
    # A 2-D plan's shard group skips the TP ranks: 8 shards 8 ranks apart, one per node.
    plan = Plan(strategy="fsdp", dp_shard=8, tp=8, seq_len=4096)
    assert shard_group(plan, H100) == CommGroup(ranks=8, ranks_per_node=1)
    # Pure data parallelism keeps the consecutive groups it always had.
    hsdp = Plan(strategy="hsdp", dp_shard=8, dp_replicate=16, seq_len=4096)
    assert shard_group(hsdp, H100) == CommGroup(ranks=8, ranks_per_node=8)
    assert replicate_group(hsdp, H100) == CommGroup(ranks=16, ranks_per_node=1)


@pytest.mark.parametrize(("tp", "pp", "crosses"), [(2, 4, False), (2, 8, True), (8, 2, True),
                                                  (1, 8, False), (4, 2, False)])
def test_pipeline_hop(tp: int, pp: int, crosses: bool) -> None:
    plan = Plan(strategy="fsdp", dp_shard=2, tp=tp, pp=pp, grad_accum=pp, seq_len=4096)
    ranks = _members(tp, pp)
    by_hand = any(a // 8 != b // 8 for a, b in itertools.pairwise(ranks))
    assert by_hand == crosses
    assert pipeline_hop_crosses_nodes(plan, H100) == crosses


def _torchtitan_rank(*, dp_replicate: int, dp_shard: int, cp: int, tp: int,
                     dims: tuple[int, int, int, int]) -> int:
    """Global rank at (dp_replicate, dp_shard, cp, tp) of torchtitan's row-major mesh
    (pp, dp_replicate, dp_shard, cp, tp) with pp = 1 and degrees `dims` (R, S, C, T)."""
    _, s, c, t = dims
    return ((dp_replicate * s + dp_shard) * c + cp) * t + tp


@pytest.mark.parametrize(("tp", "cp", "shard", "repl"), [
    (1, 8, 2, 1),    # 13B on 16 GPUs at cp=8: the 8 CP ranks fill a node, 2 nodes
    (2, 2, 4, 2),    # TP x CP x FSDP: 8 ranks 2 apart, 4 to a node
    (4, 2, 16, 2),   # TP x CP fill a node: 32 ranks 4 apart, 2 to a node
    (8, 2, 4, 1),    # TP fills a node: one rank of the group per node
    (1, 4, 1, 4),    # HSDP over (dp_replicate, cp): shard groups of one node's 4 CP ranks
])
def test_fsdp_group_is_torchtitans_flattened_dp_shard_cp(tp: int, cp: int, shard: int,
                                                         repl: int) -> None:
    # torchtitan (parallel_dims.py, _build_mesh_without_ep) flattens the mesh's dp_shard
    # and cp axes into "dp_shard_cp", and apply_fsdp shards over it: rank 0's group is
    # every (dp_shard, cp) at dp_replicate = tp = 0.
    plan = Plan(strategy="hsdp" if repl > 1 else "fsdp", dp_shard=shard, dp_replicate=repl,
                tp=tp, cp=cp, seq_len=4096)
    dims = (repl, shard, cp, tp)
    members = [_torchtitan_rank(dp_replicate=0, dp_shard=s, cp=c, tp=0, dims=dims)
               for s in range(shard) for c in range(cp)]
    group = shard_group(plan, H100)
    assert group.ranks == len(members) == plan.dp_shard_cp
    assert group.nodes == _nodes_of(members)
    assert group.ranks_per_node == sum(r // 8 == 0 for r in members)
    # The replicas: one rank per shard group, the dp_shard_cp group's size apart.
    replicas = [_torchtitan_rank(dp_replicate=r, dp_shard=0, cp=0, tp=0, dims=dims)
                for r in range(repl)]
    assert replicate_group(plan, H100).nodes == _nodes_of(replicas)


def _groups(degrees: dict[str, int], axis: str) -> list[list[int]]:
    """Every group along `axis` of a row-major mesh (innermost first), as rank lists."""
    names = list(degrees)
    strides = dict(zip(names, itertools.accumulate([1, *degrees.values()][:-1],
                                                   lambda a, b: a * b), strict=True))
    others = [range(degrees[n]) for n in names if n != axis]
    groups = []
    for coords in itertools.product(*others):
        base = sum(c * strides[n] for c, n in zip(coords, [n for n in names if n != axis],
                                                  strict=True))
        groups.append([base + i * strides[axis] for i in range(degrees[axis])])
    return groups


@pytest.mark.parametrize(("tp", "shard", "repl"), [
    (1, 12, 1),   # FSDP on 12 GPUs: 8 + 4
    (2, 6, 1),    # tp=2: the shard group holds 4 ranks of node 0, 2 of node 1
    (4, 3, 1),    # tp=4: 2 + 1
    (1, 4, 3),    # HSDP on 12: shard groups whole in a node, replicas 2 + 1
    (2, 10, 1),   # 20 GPUs, 2.5 nodes: 4 + 4 + 2
    (1, 16, 1),   # whole nodes: unchanged
])
def test_a_partly_filled_last_node_is_placed_from_rank_numbers(tp: int, shard: int,
                                                              repl: int) -> None:
    """A world that is not whole nodes fills its last node in part. Each
    axis's group says how many members the fullest node holds (ranks_per_node) and the
    least filled one (fewest_per_node), over every group of the axis, counted from rank
    numbers (rank // 8 is the node)."""
    plan = Plan(strategy="hsdp" if repl > 1 else "fsdp", dp_shard=shard, dp_replicate=repl,
                tp=tp, seq_len=4096)
    placement = place(plan, H100)
    degrees = {"tp": tp, "cp": 1, "pp": 1, "dp_shard": shard, "dp_replicate": repl}
    for axis in degrees:
        counts = [sum(1 for r in group if r // 8 == node)
                  for group in _groups(degrees, axis) for node in {r // 8 for r in group}]
        group = placement.group(axis)
        assert (group.ranks_per_node, group.fewest_per_node) == (max(counts), min(counts)), axis


def test_the_least_filled_node_carries_the_ring_across_nodes() -> None:
    """12 ranks on 8-GPU nodes, 8 + 4: every channel's ring leaves and enters the 4-GPU
    node once; rotated over channels, each of its 4 NICs sends 1/4 of the bus bytes (a
    full node's 8 NICs send 1/8 each); NVLink carries the fuller node's 7/8."""
    group = place(Plan(strategy="fsdp", dp_shard=12, seq_len=4096), H100).group("dp_shard")
    assert group == CommGroup(ranks=12, ranks_per_node=8, last_node_ranks=4)
    assert ring_link_loads(group) == (("intra_node", 7 / 8), ("inter_node", 1 / 4))
    whole = place(Plan(strategy="fsdp", dp_shard=16, seq_len=4096), H100).group("dp_shard")
    assert ring_link_loads(whole) == (("intra_node", 7 / 8), ("inter_node", 1 / 8))
