"""One collective call: the bytes it puts on the wire, the links that carry them, and the
algorithm and protocol the collective library runs it with.

Sizes follow nccl-tests (doc/PERFORMANCE.md): `size_bytes` is the full tensor (all_gather
output, reduce_scatter input, all_reduce buffer, broadcast buffer); bus bytes per rank are
(n-1)/n * size for all_gather and reduce_scatter, 2 (n-1)/n * size for all_reduce, size
for broadcast (a ring only: a checkpoint's full-state load). A ring moves exactly
its bus bytes; every other algorithm is charged as the ring's bus bytes over the same
links at its own bandwidth relative to the ring's (`Algorithm.link_loads`), so traces and
byte counts stay comparable across algorithms.

Choice (profile `collectives.model`):
- "ring" (gloo, textbook): every call is a ring paying the link's per-step latency, or,
  for the group size a calibration timed, the measured time of its size (interpolated).
- "rccl": the same tuning model with RCCL's constants (ROCm/rccl src/graph/tuning.cc at
  0023b9b0, RCCL_BASE_LATENCY_S and RCCL_FACTORS below): its base latencies, its ring
  LL bandwidth (1/5 of Simple's), its tree (0.27 of the ring's links, LL 1/2.3 of that);
  no NVLS (the profile gives it no NVLS bandwidth) and no PAT (RCCL's table has none).
  Its medium-size correction factors (tree and ring) are left out, so rings are charged
  their asymptotic bandwidth at every size.
- "nccl": NCCL's tuning model (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel and
  ncclTopoGetAlgoTime, as of 2026): each (algorithm, protocol) it may run the call with
  gets a latency (a base, plus per-step hardware latencies times its step count) and a
  bandwidth; NCCL runs the call with the least latency + size / bandwidth. zsim keeps
  NCCL's base latencies, step counts and bandwidth factors (below, with their sources in
  that file); the per-step latency of each link and protocol, the links' bandwidths and
  the NVLS bandwidth come from the hardware profile. Modelled: ring (all kinds, protocols
  LL, LL128, Simple as the profile offers them), tree (all_reduce, with NCCL's size
  correction), NVLS (all_reduce, all_gather and reduce_scatter inside one NVLink domain
  on NVSwitch systems with NVLink SHARP; `_nvls`),
  NVLS tree (all_reduce across such nodes, several ranks on each), PAT (all_gather and
  reduce_scatter with one rank per node), pairwise all_to_all (expert parallelism's
  dispatch and combine; `_pairwise`). Left out: CollNet/SHARP in-network reduction
  (and so NVLS all_gather/reduce_scatter across nodes, which NCCL runs only with it), the
  ring all_reduce's latency plateau factor, per-channel bandwidth caps, the latency
  grouped calls share, the tree's own per-hop latencies (a tree hop is charged the
  ring's) and the tree network latency NCCL charges rings with one rank per node.

References: Patarasuk & Yuan 2009 (bandwidth-optimal rings); NCCL's tuning model above;
tests/data/cases/published.yaml C-8xH200-allreduce-torch-vs-nccltests (NCCL's choice on one
H200 node: ring/LL up to 1 MiB, NVLS/Simple from 2 MiB) and C-DGXH100-8GPU-allreduce-sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zsim.spec.hardware import HardwareProfile
from zsim.units import US

RING, TREE, NVLS, NVLS_TREE, PAT = "ring", "tree", "nvls", "nvls_tree", "pat"
PAIRWISE = "pairwise"
"""An all_to_all: every rank sends each peer its slice directly (NCCL's grouped
ncclSend/ncclRecv, as torch's all_to_all_single issues it; gloo's pairwise exchange)."""

BASE_LATENCY_S: dict[tuple[str, str], float] = {
    (TREE, "LL"): 6.8 * US, (TREE, "LL128"): 14.0 * US, (TREE, "Simple"): 8.4 * US,
    (RING, "LL"): 6.6 * US, (RING, "LL128"): 14.0 * US, (RING, "Simple"): 8.4 * US,
    (NVLS, "Simple"): 0.0, (NVLS_TREE, "Simple"): 0.0, (PAT, "Simple"): 8.0 * US,
}
"""NCCL's baseLatencies: a call's fixed cost before its steps, by (algorithm, protocol)."""

RCCL_BASE_LATENCY_S: dict[tuple[str, str], float] = {
    (TREE, "LL"): 37.9 * US, (TREE, "LL128"): 37.9 * US, (TREE, "Simple"): 40.4 * US,
    (RING, "LL"): 20.5 * US, (RING, "LL128"): 20.5 * US, (RING, "Simple"): 27.9 * US,
}
"""RCCL's baseLat (ROCm/rccl src/graph/tuning.cc at 0023b9b0), by (algorithm, protocol)."""

RCCL_FACTORS: dict[str, float] = {"ring_LL": 1 / 5, "tree": 0.27, "tree_LL": 1 / 2.3}
"""RCCL's bandwidth refinements (the same file): ring LL busBw * 1/5, tree busBw * .27,
tree LL a further * 1/2.3 (NCCL's are RING_PROTOCOL_BANDWIDTH["LL"], TREE_BANDWIDTH,
TREE_PROTOCOL_BANDWIDTH)."""

NVLS_LATENCY_S = 25.0 * US
"""NCCL's hwLatencies for NVLS on NVLink (Simple): the whole latency of an NVLS call, and
the node's part of an NVLS tree call (NVLSTree on NVLink, 25 us too)."""

NET_OVERHEAD_S = 1.0 * US
"""NCCL's getNetOverhead (1 us; 2 on AMD hosts): a ring that spans nodes pays at least
this per step inside a node too, three times it with Simple ("inter-node rings still have
to launch nsteps * net overhead")."""

PAT_LATENCY_PER_RANK_S = 2.8 * US
"""NCCL's linear term of PAT's latency, per rank ("still a linear part")."""

RING_PROTOCOL_BANDWIDTH: dict[str, float] = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
"""Ring bus bandwidth of each protocol relative to Simple: LL sends a 4-byte flag with each
4 bytes of data; LL128 one 8-byte flag per 128-byte line (NCCL: busBw * .5, * 0.92)."""

TREE_BANDWIDTH = 0.92
"""NCCL's tree all_reduce bus bandwidth relative to the ring's links (busBw * .92), whose
algorithm bandwidth is half of it (ratio .5)."""

TREE_PROTOCOL_BANDWIDTH: dict[tuple[str, bool], float] = {
    ("LL", False): 1 / 3.8, ("LL", True): 1 / 3.8,
    ("LL128", False): 7 / 9, ("LL128", True): 120 / 128,
    ("Simple", False): 1.0, ("Simple", True): 1.0,
}
"""Tree bandwidth of each protocol relative to Simple, (protocol, spans nodes)."""

TREE_CORRECTION: dict[str, tuple[float, ...]] = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
           1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9,
              .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7,
               .7, .8, .9, .9, .9),
}
"""NCCL's treeCorrectionFactor: tree bandwidth at medium sizes, indexed by
floor(log2(size / 64 B)) (64 B to 512 MiB); 1 beyond."""

PAT_BANDWIDTH = 0.75
"""NCCL's PAT bus bandwidth relative to the ring's links (busBw * .75), used as the
algorithm bandwidth."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommGroup:
    """A process group: `ranks` GPUs placed `ranks_per_node` to a node.

    A group of consecutive ranks (an FSDP shard group of 8 on 8-GPU nodes) has
    ranks_per_node = min(ranks, gpus_per_node); a replicate group that takes one rank
    from each node has ranks_per_node = 1.
    """

    ranks: int
    ranks_per_node: int
    last_node_ranks: int = 0
    """Members in the group's last node when that node holds fewer than ranks_per_node
    (a world that is not a whole number of nodes: 12 ranks on 8-GPU nodes, 8 + 4); 0:
    every node holds ranks_per_node."""

    @property
    def spans_nodes(self) -> bool:
        return self.ranks > self.ranks_per_node

    @property
    def fewest_per_node(self) -> int:
        """Members in the group's least filled node, whose NICs carry the largest share of
        a collective across nodes."""
        return self.last_node_ranks or self.ranks_per_node

    @property
    def nodes(self) -> int:
        """Nodes the group touches."""
        return -(-self.ranks // self.ranks_per_node)


@dataclass(frozen=True, slots=True, kw_only=True)
class Algorithm:
    """How one call runs: NCCL's algorithm and protocol, its start-up latency and the link
    bytes it puts on each link per bus byte."""

    algorithm: str
    """ring, tree, nvls, nvls_tree or pat."""
    protocol: str
    """LL, LL128 or Simple."""
    latency_s: float
    link_loads: tuple[tuple[str, float], ...]
    """(link, link bytes per bus byte): the ring's loads divided by the algorithm's
    bandwidth relative to the ring's."""

    @property
    def name(self) -> str:
        return f"{self.algorithm}/{self.protocol}"

    def time_s(self, bus: float, hw: HardwareProfile) -> float:
        """Latency plus `bus` bus bytes over the bottleneck link, running alone."""
        bandwidth = link_bandwidths(hw)
        return self.latency_s + bus * max(load / bandwidth[link]
                                          for link, load in self.link_loads)


def bus_bytes(kind: str, size_bytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring collective over n ranks; a
    broadcast's chain passes the whole buffer through every rank (nccl-tests: its bus
    bandwidth is its algorithm bandwidth)."""
    if n <= 1:
        return 0.0
    if kind == "broadcast":
        return size_bytes
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
    (tests/data/cases/published.yaml C-NCCL-maintainer-multinode-reference-points). With one
    rank per node (HSDP replicas) every hop uses the NIC (load 1). A node holding fewer
    members (the last node of a world that is not whole nodes: r' of them) sends the
    ring's crossing hops of every channel through its r' NICs, 1/r' each: the NIC load
    is the least filled node's, the NVLink load the fullest's.
    """
    if not group.spans_nodes:
        return (("intra_node", 1.0),)
    r = group.ranks_per_node
    if r == 1:
        return (("inter_node", 1.0),)
    return (("intra_node", (r - 1) / r), ("inter_node", 1.0 / group.fewest_per_node))


def nic_share(group: CommGroup) -> float:
    """The share of a collective's bus bytes each GPU of `group` sends over its NIC, as a
    ring splits them (ring_link_loads): 0 inside a node, 1/ranks_per_node across nodes
    (1 with one rank per node). What the rest of the bus bytes take is NVLink."""
    return dict(ring_link_loads(group)).get("inter_node", 0.0)


def pairwise_nic_share(group: CommGroup) -> float:
    """The share of an all_to_all's bus bytes each GPU of `group` sends over its NIC: the
    slices for the peers in other nodes, (n - r) / (n - 1) (`_pairwise`)."""
    n, r = group.ranks, group.ranks_per_node
    return (n - r) / (n - 1) if n > 1 else 0.0


def link_loads(kind: str, group: CommGroup, hw: HardwareProfile
               ) -> tuple[tuple[str, float], ...]:
    """ring_link_loads of a `kind` collective, each load divided by that link's
    collective_efficiency for the kind: a backend that moves more bytes for it (or moves
    them slower) loads the link more per bus byte. On a fully connected mesh (a profile's
    intra_node.mesh_link_gb_per_s) a group with r members in the node reaches its peers
    over r - 1 direct links only: its NVLink-class load is scaled by the link's line rate
    over those links' (Link.group_bytes_per_s)."""
    mesh = hw.intra_node.bandwidth_bytes_per_s / hw.intra_node.group_bytes_per_s(
        group.ranks_per_node)
    return tuple((link, load / getattr(hw, link).kind_efficiency[kind]
                  * (mesh if link == "intra_node" else 1.0))
                 for link, load in ring_link_loads(group))


def link_bandwidths(hw: HardwareProfile) -> dict[str, float]:
    """Achievable bytes/s per GPU per direction of each link a ring can load."""
    return {"intra_node": hw.intra_node.achievable_bytes_per_s,
            "inter_node": hw.inter_node.achievable_bytes_per_s}


def ring_latency_s(kind: str, group: CommGroup, hw: HardwareProfile,
                   protocol: str = "Simple") -> float:
    """Per-step latencies of a ring (NCCL tuning model): the steps that cross nodes
    (nodes - 1 per pass) pay the network's per-step latency, the rest the node's (at
    least NCCL's network overhead when the ring spans nodes)."""
    steps = latency_steps(kind, group.ranks)
    intra_s = hw.intra_node.latency_for(protocol)
    if not group.spans_nodes:
        return steps * intra_s
    if hw.collectives == "nccl":
        intra_s = max(intra_s, NET_OVERHEAD_S * (3 if protocol == "Simple" else 1))
    inter = latency_steps(kind, group.nodes)
    return (steps - inter) * intra_s + inter * hw.inter_node.latency_for(protocol)


def _ring(kind: str, size_bytes: float, group: CommGroup, hw: HardwareProfile,
          loads: tuple[tuple[str, float], ...], dtype: str) -> Algorithm:
    """The one algorithm of the "ring" model: the fitted per-step latency and link loads,
    or, for a group the profile measured calls of (HardwareProfile.measured_collectives:
    as many ranks, inside a node), the time measured for the size: the latency is what
    it leaves beyond the bytes' time on the link, the loads are stretched when the
    measured call is faster than the fitted link (so a lone call takes the measured time
    and concurrent calls still share the link). A reduction in `dtype` takes the
    profile's calls in that dtype where it measured them apart."""
    measured = hw.measured_collectives
    t = (measured.time_s(kind, size_bytes, dtype) if measured is not None
         and measured.ranks == group.ranks and not group.spans_nodes else None)
    if t is None:
        return Algorithm(algorithm=RING, protocol="Simple", link_loads=loads,
                         latency_s=ring_latency_s(kind, group, hw))
    wire = Algorithm(algorithm=RING, protocol="Simple", link_loads=loads,
                     latency_s=0.0).time_s(bus_bytes(kind, size_bytes, group.ranks), hw)
    if t >= wire:
        return Algorithm(algorithm=RING, protocol="Simple", link_loads=loads, latency_s=t - wire)
    return Algorithm(algorithm=RING, protocol="Simple", latency_s=0.0,
                     link_loads=tuple((link, load * t / wire) for link, load in loads))


def candidates(kind: str, size_bytes: float, group: CommGroup, hw: HardwareProfile,
               dtype: str = "fp32") -> list[Algorithm]:
    """Every (algorithm, protocol) the profile's collective library may run the call
    with, in NCCL's order (tree, ring, NVLS, PAT; LL, LL128, Simple). `dtype`: what a
    reduction adds in (NCCL's reductions are bound by the links in every dtype; a
    profile's measured gloo calls may differ by it)."""
    if kind == "all_to_all":
        return [_pairwise(group, hw)]
    ring = link_loads(kind, group, hw)
    if group.ranks <= 1:  # nothing to exchange
        return [Algorithm(algorithm=RING, protocol="Simple", link_loads=ring, latency_s=0.0)]
    if hw.collectives == "ring":
        return [_ring(kind, size_bytes, group, hw, ring, dtype)]
    links = (hw.intra_node, hw.inter_node) if group.spans_nodes else (hw.intra_node,)
    protocols = [p for p in ("LL", "LL128", "Simple")
                 if all(link.offers(p) for link in links)]
    n, nodes, per_node = group.ranks, group.nodes, group.ranks_per_node
    out = []

    def scaled(factor: float) -> tuple[tuple[str, float], ...]:
        return tuple((link, load / factor) for link, load in ring)

    rccl = hw.collectives == "rccl"
    base = RCCL_BASE_LATENCY_S if rccl else BASE_LATENCY_S
    if kind == "all_reduce":
        size_index = int(math.log2(max(size_bytes, 64) / 64))
        for p in protocols:
            correction = TREE_CORRECTION[p][size_index] if size_index < 24 else 1.0
            factor = (TREE_BANDWIDTH * (n - 1) / n * correction
                      * TREE_PROTOCOL_BANDWIDTH[(p, group.spans_nodes)])
            if rccl:
                factor = (RCCL_FACTORS["tree"] * (n - 1) / n
                          * (RCCL_FACTORS["tree_LL"] if p == "LL" else 1.0))
            hops = (per_node - 1) * hw.intra_node.latency_for(p)
            if group.spans_nodes:
                hops += math.floor(math.log2(nodes)) * hw.inter_node.latency_for(p)
            out.append(Algorithm(algorithm=TREE, protocol=p, link_loads=scaled(factor),
                                 latency_s=base[(TREE, p)] + 2 * hops))
    for p in protocols:
        factor = RCCL_FACTORS["ring_LL"] if rccl and p == "LL" else RING_PROTOCOL_BANDWIDTH[p]
        out.append(Algorithm(algorithm=RING, protocol=p, link_loads=scaled(factor),
                             latency_s=base[(RING, p)] + ring_latency_s(kind, group, hw, p)))
    if kind == "broadcast":  # NCCL runs it as a ring only
        return out
    if not group.spans_nodes and hw.nvls_bus_bytes_per_s > 0:
        out.append(_nvls(kind, group, hw))
    if (kind == "all_reduce" and group.spans_nodes and per_node > 1
            and hw.nvls_bus_bytes_per_s > 0):
        out.append(_nvls_tree(group, hw))
    if kind != "all_reduce" and per_node == 1 and nodes > 1 and not rccl:
        latency = (BASE_LATENCY_S[(PAT, "Simple")]
                   + math.floor(math.log2(nodes)) * hw.inter_node.latency_for("Simple") / 3.5
                   + n * PAT_LATENCY_PER_RANK_S)
        out.append(Algorithm(algorithm=PAT, protocol="Simple", latency_s=latency,
                             link_loads=scaled(PAT_BANDWIDTH * (n - 1) / n)))
    return out


def _nvls(kind: str, group: CommGroup, hw: HardwareProfile) -> Algorithm:
    """NCCL's NVLS inside one NVLink domain (tuning.cc): a per-GPU NVLS bandwidth X
    (channels x bwIntra x nvlsEfficiency), doubled for an all_reduce, which pipelines a
    reduce-scatter and an all-gather, so the profile's NVLS all-reduce bus bandwidth is
    2X. An all_gather or reduce_scatter runs at an algorithm bandwidth of X (r-1)/r, which
    NCCL does not convert to bus bandwidth as it does a ring's: per bus byte ((r-1)/r of
    the buffer), X ((r-1)/r)^2. So at large sizes it runs at about half NVLS's all-reduce
    rate, below an NVSwitch ring's, and wins where its one 25 us latency beats the ring's
    r-1 steps: medium calls over many GPUs (a 72-GPU NVLink domain)."""
    bus_per_s = hw.nvls_bus_bytes_per_s
    if kind != "all_reduce":
        share = (group.ranks - 1) / group.ranks
        bus_per_s = bus_per_s / 2.0 * share * share
    return Algorithm(algorithm=NVLS, protocol="Simple", latency_s=NVLS_LATENCY_S,
                     link_loads=(("intra_node", hw.intra_node.achievable_bytes_per_s / bus_per_s),))


def _nvls_tree(group: CommGroup, hw: HardwareProfile) -> Algorithm:
    """NCCL's NVLSTree all_reduce across NVLink-SHARP nodes: inside each node an NVLS
    reduce-scatter and all-gather (2 (r-1)/r of the buffer at the profile's NVLS bus
    bandwidth), between nodes a tree over every GPU's own NIC carrying that GPU's 1/r
    of the buffer, once each way on two nodes and twice beyond (NCCL: bwInter, halved for
    more than two nodes), the two pipelined. As link loads per bus byte (2 (n-1)/n of
    the buffer), the NIC's divided by the all_reduce efficiency of the network.
    Latency (tuning.cc): NVLS's 25 us on NVLink plus 2 log2(nodes) network steps.
    On two nodes its algorithm bandwidth is the node's NICs together where a ring's is
    limited by one NIC per channel: NCCL's maintainers' "on 2 nodes NCCL picks
    Tree/NVLSTree and busbw can exceed NIC bandwidth" (tests/data/cases/published.yaml
    C-NCCL-maintainer-multinode-reference-points, C-GCP-A3Mega-2node-allreduce-TCPXO)."""
    n, r = group.ranks, group.ranks_per_node
    bus_per_buffer = 2.0 * (n - 1) / n
    passes = 1 if group.nodes <= 2 else 2
    inter = (passes / group.fewest_per_node / bus_per_buffer
             / hw.inter_node.kind_efficiency["all_reduce"])
    intra = (hw.intra_node.achievable_bytes_per_s / hw.nvls_bus_bytes_per_s
             * 2.0 * (r - 1) / r / bus_per_buffer)
    latency = (BASE_LATENCY_S[(NVLS_TREE, "Simple")] + NVLS_LATENCY_S
               + 2 * math.floor(math.log2(group.nodes)) * hw.inter_node.latency_for("Simple"))
    return Algorithm(algorithm=NVLS_TREE, protocol="Simple", latency_s=latency,
                     link_loads=(("intra_node", intra), ("inter_node", inter)))


def _pairwise(group: CommGroup, hw: HardwareProfile) -> Algorithm:
    """An all_to_all over `group` (size_bytes: what one rank sends in all, its own slice
    included; bus bytes (n-1)/n of it). Of the bus bytes, the slices for the r-1 peers
    in the rank's node cross NVLink, those for the n-r peers in other nodes its own NIC:
    loads (r-1)/(n-1) and (n-r)/(n-1), both links busy at once, each divided by the
    link's all_gather efficiency (no all_to_all figure of its own: assumed alike). The
    sends to all peers are issued together (one NCCL group), so the call pays one
    step of latency on each link it uses, after NCCL's base, not one per peer: assumed
    (NCCL spreads the peers over its channels; at large n this understates the
    latency)."""
    if group.ranks <= 1:
        return Algorithm(algorithm=PAIRWISE, protocol="Simple", latency_s=0.0,
                         link_loads=(("intra_node", 1.0),))
    nic = pairwise_nic_share(group)
    shares = (("intra_node", 1.0 - nic), ("inter_node", nic))
    loads = tuple((link, share / getattr(hw, link).kind_efficiency["all_gather"])
                  for link, share in shares if share > 0)
    latency = hw.intra_node.latency_for("Simple") + (
        hw.inter_node.latency_for("Simple") if group.spans_nodes else 0.0)
    base = BASE_LATENCY_S[(RING, "Simple")] if hw.collectives == "nccl" else 0.0
    return Algorithm(algorithm=PAIRWISE, protocol="Simple", latency_s=base + latency,
                     link_loads=loads)


def choose(kind: str, size_bytes: float, group: CommGroup, hw: HardwareProfile,
           dtype: str = "fp32") -> Algorithm:
    """The algorithm and protocol the library runs the call with: the candidate of least
    time running alone (NCCL's choice; the first on a tie)."""
    bus = bus_bytes(kind, size_bytes, group.ranks)
    return min(candidates(kind, size_bytes, group, hw, dtype), key=lambda a: a.time_s(bus, hw))


def collective_time_s(kind: str, size_bytes: float, group: CommGroup,
                      hw: HardwareProfile, dtype: str = "fp32") -> float:
    """Time of one call running alone, with the algorithm the library picks for it."""
    if group.ranks <= 1:
        return 0.0
    bus = bus_bytes(kind, size_bytes, group.ranks)
    return choose(kind, size_bytes, group, hw, dtype).time_s(bus, hw)

