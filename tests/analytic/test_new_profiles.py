"""The dgx-b200, gb200-nvl72 and mi300x profiles: collective times worked out by hand from
the profile's numbers and the tuning model's constants (NCCL's, RCCL's), and where each
one places a plan's groups (a GB200 NVL72 rack is one NVLink domain of 72 GPUs)."""

from __future__ import annotations

import pytest

from zsim.analytic.collectives import CommGroup, choose, collective_time_s
from zsim.analytic.placement import partial_node_warning, place
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware

B200 = resolve_hardware("dgx-b200")
NVL72 = resolve_hardware("gb200-nvl72")
MI300X = resolve_hardware("mi300x")
GIB = 2**30
US = 1e-6


def test_b200_ring_all_gather_is_the_bus_bytes_over_nvlink5_plus_nccl_latencies() -> None:
    """1 GiB all-gather over one DGX B200: ring/Simple (the largest bandwidth; NCCL has no
    NVLS all-gather in zsim's model, no PAT inside a node): (7/8) S over 900 GB/s x 0.82,
    plus NCCL's ring/Simple base latency 8.4 us and 7 steps x 3.4 us on NVLink."""
    node = CommGroup(ranks=8, ranks_per_node=8)
    expected = 8.4 * US + 7 * 3.4 * US + 0.875 * GIB / (900e9 * 0.82)
    assert choose("all_gather", GIB, node, B200).name == "ring/Simple"
    assert collective_time_s("all_gather", GIB, node, B200) == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(1.30527e-3, rel=1e-4)


def test_b200_large_all_reduce_runs_nvls_at_its_published_bus_bandwidth() -> None:
    """4 GiB all-reduce in one node: NVLS, 25 us + 2 (7/8) S / 830 GB/s (nccl issue 1807)."""
    node = CommGroup(ranks=8, ranks_per_node=8)
    assert choose("all_reduce", 4 * GIB, node, B200).name == "nvls/Simple"
    expected = 25 * US + 2 * 0.875 * 4 * GIB / 830e9
    assert collective_time_s("all_reduce", 4 * GIB, node, B200) == pytest.approx(expected,
                                                                                rel=1e-9)


def _fsdp(gpus: int) -> Plan:
    return Plan(strategy="fsdp", dp_shard=gpus, seq_len=4096)


def test_a_shard_group_of_64_stays_on_nvlink_in_an_nvl72_rack_but_not_on_dgx_b200() -> None:
    """64 consecutive ranks: one NVL72 domain (72 GPUs), eight DGX B200 nodes of 8."""
    assert place(_fsdp(64), NVL72).link("dp_shard") == "intra_node"
    assert place(_fsdp(64), B200).link("dp_shard") == "inter_node"
    nvl = place(_fsdp(64), NVL72).group("dp_shard")
    assert (nvl.ranks, nvl.ranks_per_node, nvl.spans_nodes) == (64, 64, False)
    # The all-gather of 1 GiB on the rack: the NVLink ring over 64 ranks, (63/64) S at
    # 900 x 0.82 GB/s and 63 steps of 3.4 us, on no NIC.
    t = collective_time_s("all_gather", GIB, nvl, NVL72)
    assert t == pytest.approx(8.4 * US + 63 * 3.4 * US + 63 / 64 * GIB / (900e9 * 0.82),
                              rel=1e-9)
    b200 = place(_fsdp(64), B200).group("dp_shard")
    assert (b200.ranks_per_node, b200.nodes) == (8, 8)
    # On eight DGX B200: 7 of the 63 steps cross InfiniBand (14 us each), the other 56 pay
    # 3.4 us; each GPU sends 7/8 of its bus bytes over NVLink and 1/8 over its own NIC
    # (47 GB/s), which is the bottleneck: (63/64) S / 8 / 47 GB/s.
    latency = 8.4 * US + 56 * 3.4 * US + 7 * 14 * US
    wire = 63 / 64 * GIB * max(7 / 8 / (900e9 * 0.82), 1 / 8 / (50e9 * 0.94))
    assert collective_time_s("all_gather", GIB, b200, B200) == pytest.approx(latency + wire,
                                                                            rel=1e-9)


def test_hsdp_of_two_racks_shards_on_nvlink_and_replicates_over_the_nics() -> None:
    plan = Plan(strategy="hsdp", dp_shard=72, dp_replicate=2, seq_len=4096)
    placement = place(plan, NVL72)
    assert placement.link("dp_shard") == "intra_node"
    replicate = placement.group("dp_replicate")
    assert (replicate.ranks, replicate.ranks_per_node) == (2, 1)


def test_tp_inside_the_rack_is_on_nvlink() -> None:
    plan = Plan(strategy="fsdp", tp=16, dp_shard=9, seq_len=4096)
    assert place(plan, NVL72).link("tp") == "intra_node"


def test_1024_gpus_are_14_racks_and_16_and_the_warning_says_so() -> None:
    group = place(_fsdp(1024), NVL72).group("dp_shard")
    assert (group.ranks_per_node, group.last_node_ranks, group.nodes) == (72, 16, 15)
    assert partial_node_warning(1024, NVL72) == (
        "1024 GPUs are 14.2222 NVLink domains of 72 (gb200-nvl72): placed in rank order on "
        "14 full NVLink domains and one of 16, whose 16 NICs carry a larger share of each "
        "collective across NVLink domains")
    assert partial_node_warning(12, B200).startswith("12 GPUs are 1.5 nodes of 8 (dgx-b200)")


def test_host_resources_stay_per_tray_on_nvl72() -> None:
    """Host memory and cores are a compute tray's (4 GPUs), not the rack's: 144 Grace cores
    give each GPU 36 threads for an offloaded optimizer step."""
    assert NVL72.gpus_per_node == 4
    assert NVL72.cpu_cores // NVL72.gpus_per_node == 36


@pytest.mark.parametrize(("ranks", "links"), [(2, 1), (4, 3), (8, 7)])
def test_mi300x_ring_uses_one_xgmi_link_per_peer(ranks: int, links: int) -> None:
    """A fully connected mesh, not a switch: r GPUs reach each other over r - 1 links of
    64 GB/s, 48 usable (x 0.75). 1 GiB all-gather, RCCL's ring/Simple: base 27.9 us plus
    (r - 1) steps x 2.7 us (ROCm/rccl tuning.cc), (r-1)/r S over (r - 1) x 48 GB/s."""
    group = CommGroup(ranks=ranks, ranks_per_node=ranks)
    expected = (27.9 * US + (ranks - 1) * 2.7 * US
                + (ranks - 1) / ranks * GIB / (links * 64e9 * 0.75))
    assert choose("all_gather", GIB, group, MI300X).name == "ring/Simple"
    assert collective_time_s("all_gather", GIB, group, MI300X) == pytest.approx(expected,
                                                                               rel=1e-9)


def test_mi300x_pair_is_slower_than_an_nvswitch_pair() -> None:
    """TP=2 on the mesh gets one 64 GB/s link; on an NVSwitch the pair gets the whole port."""
    pair = CommGroup(ranks=2, ranks_per_node=2)
    h100 = resolve_hardware("dgx-h100")
    assert (collective_time_s("all_gather", GIB, pair, MI300X)
            > 5 * collective_time_s("all_gather", GIB, pair, h100))


def test_mi300x_has_no_nvls_and_no_pat() -> None:
    node = CommGroup(ranks=8, ranks_per_node=8)
    assert choose("all_reduce", 4 * GIB, node, MI300X).algorithm == "ring"
    across = CommGroup(ranks=16, ranks_per_node=1)
    assert choose("all_gather", GIB, across, MI300X).algorithm == "ring"
