"""zsim.analytic.comm: which link a group uses, the latency term, and per-strategy step
communication worked by hand on the two-tier toy cluster (4 GPUs per node, 100 GB/s and
1 us inside a node, 10 GB/s and 10 us across nodes)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from zsim.analytic.collectives import CommGroup, bus_bytes, collective_time_s
from zsim.analytic.comm import replicate_group, shard_group, step_comm
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import synthetic
from zsim.spec.plan import Plan

MODEL = synthetic(100_000_000)
S_BF16 = 2 * 100_000_000


def test_bus_bytes_follow_nccl_tests_factors() -> None:
    # nccl-tests doc/PERFORMANCE.md: all_reduce 2(n-1)/n, all_gather/reduce_scatter (n-1)/n
    assert bus_bytes("all_gather", 800.0, 8) == 700.0
    assert bus_bytes("reduce_scatter", 800.0, 8) == 700.0
    assert bus_bytes("all_reduce", 800.0, 8) == 1400.0
    assert bus_bytes("all_reduce", 800.0, 1) == 0.0
    # broadcast: the whole buffer through every rank (its bus bandwidth is its algbw)
    assert bus_bytes("broadcast", 800.0, 8) == 800.0


def test_broadcast_is_a_ring_at_the_link_rate(two_tier_hw: HardwareProfile) -> None:
    # 4 ranks in a node: 3 steps of 1 us, then 1 GB at 100 GB/s x the toy's efficiency;
    # no other algorithm is a candidate (NCCL runs broadcast as a ring).
    inside = CommGroup(ranks=4, ranks_per_node=4)
    rate = two_tier_hw.intra_node.achievable_bytes_per_s
    assert collective_time_s("broadcast", 1e9, inside, two_tier_hw) == pytest.approx(
        3e-6 + 1e9 / rate)


def test_latency_term_inside_and_across_nodes(two_tier_hw: HardwareProfile) -> None:
    inside = CommGroup(ranks=4, ranks_per_node=4)
    across = CommGroup(ranks=8, ranks_per_node=4)
    # zero bytes: only the alpha term remains, (n-1) hops for a ring, 2(n-1) for all_reduce
    assert math.isclose(collective_time_s("all_gather", 0.0, inside, two_tier_hw), 3e-6)
    assert math.isclose(collective_time_s("all_reduce", 0.0, inside, two_tier_hw), 6e-6)
    # 8 ranks on 2 nodes (NCCL tuning model): 1 of the 7 steps crosses nodes (10 us),
    # 6 stay on NVLink (1 us); all_reduce doubles both counts.
    assert math.isclose(collective_time_s("all_gather", 0.0, across, two_tier_hw), 16e-6)
    assert math.isclose(collective_time_s("all_reduce", 0.0, across, two_tier_hw), 32e-6)
    # One rank per node: every step crosses nodes.
    replicas = CommGroup(ranks=4, ranks_per_node=1)
    assert math.isclose(collective_time_s("all_gather", 0.0, replicas, two_tier_hw), 30e-6)


def test_a_ring_leaving_the_node_uses_every_nic(two_tier_hw: HardwareProfile) -> None:
    across = CommGroup(ranks=8, ranks_per_node=4)
    # One ring per NIC: NVLink carries 3/4 of the bus bytes, each GPU's NIC 1/4.
    # Bottleneck max(0.75 / 100 GB/s, 0.25 / 10 GB/s) = 25 ps per bus byte;
    # 7/8 * 1 GB * 25 ps = 21.875 ms, plus the 16 us latency above.
    assert math.isclose(collective_time_s("all_gather", 1e9, across, two_tier_hw),
                        0.021875 + 16e-6)
    # With one rank per node the ring runs at NIC speed: 3/4 GB at 10 GB/s + 3 x 10 us.
    replicas = CommGroup(ranks=4, ranks_per_node=1)
    assert math.isclose(collective_time_s("all_gather", 1e9, replicas, two_tier_hw),
                        0.075 + 30e-6)


def test_a_kind_with_lower_collective_efficiency_loads_the_link_more(
        two_tier_hw: HardwareProfile) -> None:
    # gloo-like reduce-scatter at 0.4 of all-gather's rate on NVLink, 0.5 on the NIC:
    # inside a node 3/4 GB at 40 GB/s = 18.75 ms; across nodes the NIC's load
    # 0.25 / 0.5 over 10 GB/s (50 ps per bus byte) beats NVLink's 0.75 / 0.4 over
    # 100 GB/s (18.75 ps): 7/8 GB * 50 ps = 43.75 ms. Latencies as above.
    intra = replace(two_tier_hw.intra_node,
                    kind_efficiency={"all_gather": 1.0, "reduce_scatter": 0.4, "all_reduce": 1.0})
    inter = replace(two_tier_hw.inter_node,
                    kind_efficiency={"all_gather": 1.0, "reduce_scatter": 0.5, "all_reduce": 1.0})
    hw = replace(two_tier_hw, intra_node=intra, inter_node=inter)
    inside = CommGroup(ranks=4, ranks_per_node=4)
    across = CommGroup(ranks=8, ranks_per_node=4)
    assert math.isclose(collective_time_s("reduce_scatter", 1e9, inside, hw), 0.01875 + 3e-6)
    assert math.isclose(collective_time_s("reduce_scatter", 1e9, across, hw), 0.04375 + 16e-6)
    # other kinds keep the link's own rate
    assert math.isclose(collective_time_s("all_gather", 1e9, across, hw), 0.021875 + 16e-6)


def test_groups_of_a_hybrid_plan(two_tier_hw: HardwareProfile) -> None:
    plan = Plan.for_strategy("hsdp", gpus=16, shard_group=4, seq_len=1024)
    assert shard_group(plan, two_tier_hw) == CommGroup(ranks=4, ranks_per_node=4)
    # one rank of each replicate group per node: the gradient all_reduce crosses nodes
    assert replicate_group(plan, two_tier_hw) == CommGroup(ranks=4, ranks_per_node=1)


def test_hsdp_step_by_hand(two_tier_hw: HardwareProfile) -> None:
    plan = Plan.for_strategy("hsdp", gpus=8, shard_group=4, seq_len=1024)
    comm = step_comm(MODEL, plan, two_tier_hw)
    s, root = S_BF16, 2 * MODEL.root_params
    # inside the node: the blocks all-gathered fwd + bwd, the root once (never resharded
    # after forward), 3/4 of each; reduce_scatter 3/4 S; at 100 GB/s, 1 us a ring step
    # across nodes: all_reduce of the S/4 shard over 2 replicas, 2 x 1/2 x S/4 at 10 GB/s
    assert comm.bus_bytes == pytest.approx({"all_gather": 0.75 * (2 * (s - root) + root),
                                            "reduce_scatter": 0.75 * s,
                                            "all_reduce": 0.25 * s})
    assert comm.time_s == pytest.approx({
        "all_gather": 2 * (0.75 * (s - root) / 100e9 + 3e-6) + 0.75 * root / 100e9 + 3e-6,
        "reduce_scatter": 0.75 * s / 100e9 + 3e-6,
        "all_reduce": 0.25 * s / 10e9 + 2 * 10e-6,
    })


@pytest.mark.parametrize(("strategy", "reduction"), [
    ("zero1", "all_reduce"), ("zero2", "all_reduce"),  # DeepSpeed all-reduces its buckets
    ("fsdp", "reduce_scatter"), ("fsdp-no-reshard", "reduce_scatter")])
def test_fp32_reduction_doubles_the_gradient_reduction_only(
        strategy: str, reduction: str, two_tier_hw: HardwareProfile) -> None:
    bf16 = step_comm(MODEL, Plan.for_strategy(strategy, gpus=8, seq_len=1024), two_tier_hw)
    fp32 = step_comm(MODEL, Plan.for_strategy(strategy, gpus=8, seq_len=1024,
                                              reduce_dtype="fp32"), two_tier_hw)
    # DeepSpeed's step also all-reduces its gradient norm and inf/NaN flag: 5 bytes.
    assert fp32.bus_bytes[reduction] == pytest.approx(2 * bf16.bus_bytes[reduction], rel=1e-7)
    assert fp32.bus_bytes["all_gather"] == bf16.bus_bytes["all_gather"] > 0


def test_ddp_all_reduces_its_buckets_in_the_parameters_dtype(
        two_tier_hw: HardwareProfile) -> None:
    # torch.autocast leaves the parameters, their gradients and so DDP's buckets in fp32:
    # 2 x 7/8 x 4P whatever the reduce dtype; only a model cast to bf16 reduces 2 bytes.
    plans = {k: Plan.for_strategy("ddp", gpus=8, seq_len=1024, **knobs) for k, knobs in {
        "autocast": {}, "fp32 reduce": {"reduce_dtype": "fp32"},
        "bf16 model": {"master_dtype": "bf16"}}.items()}
    bus = {k: step_comm(MODEL, p, two_tier_hw).bus_bytes for k, p in plans.items()}
    fp32 = 2 * 7 / 8 * 4 * MODEL.num_params
    assert bus["autocast"] == bus["fp32 reduce"] == pytest.approx(
        {"all_gather": 0.0, "reduce_scatter": 0.0, "all_reduce": fp32})
    assert bus["bf16 model"]["all_reduce"] == pytest.approx(fp32 / 2)


@pytest.mark.parametrize(("strategy", "gathers_per_micro_batch"),
                         [("fsdp", 2), ("fsdp-no-reshard", 1)])
def test_fsdp_gathers_every_micro_batch(strategy: str, gathers_per_micro_batch: int,
                                        two_tier_hw: HardwareProfile) -> None:
    # FSDP frees gathered parameters after each micro-batch's backward, so each micro-batch
    # all-gathers again (forward, and backward when resharded after forward: the blocks,
    # not the root, which is never resharded after forward).
    plan = Plan.for_strategy(strategy, gpus=4, seq_len=1024, grad_accum=3)
    comm = step_comm(MODEL, plan, two_tier_hw)
    root = 2 * MODEL.root_params
    assert comm.bus_bytes["all_gather"] == pytest.approx(
        3 * 0.75 * (gathers_per_micro_batch * (S_BF16 - root) + root))
