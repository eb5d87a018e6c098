"""Schedule vocabulary: ops on streams with dependencies and memory effects.

Owns the data the lowering produces and the engine consumes: `Op` (one kernel or
collective on one stream), `Buffer` (one allocation with its memory category) and
`Schedule` (the ops of one optimizer step of one representative rank, in issue order, plus
the state live before the step). Pure data; imports nothing beyond the standard library.

Vocabulary follows Chakra's execution-trace nodes (compute and collective nodes with data
and control dependencies) and CUDA stream semantics: each stream runs its ops in issue
order; an op starts once its stream is free and its dependencies are met.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, NamedTuple

Stream = Literal["compute", "all_gather", "reduce_scatter", "all_reduce", "tp", "cp", "ep",
                 "h2d", "d2h", "host"]
STREAMS: tuple[str, ...] = ("compute", "all_gather", "reduce_scatter", "all_reduce", "tp",
                            "cp", "ep", "h2d", "d2h", "host")
"""Streams of one rank, in display order: the GPU's compute and data-parallel collective
streams, tensor, context and expert parallelism's collectives, the host<->device copy
streams (offload) and the host CPU (offloaded optimizer step)."""
TRANSFER_STREAMS: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce", "tp",
                                     "cp", "ep", "h2d", "d2h")
"""Streams whose busy time is communication."""

OpKind = Literal["forward", "backward", "optimizer", "sync",
                 "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "h2d", "d2h"]
COLLECTIVE_KINDS: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
COPY_KINDS: tuple[str, ...] = ("h2d", "d2h")
"""Host<->device copies over PCIe (copy engines: they do not slow compute)."""

class Buffer(NamedTuple):
    """One allocation held in HBM (a NamedTuple, as Op)."""

    name: str
    """Unique within a schedule, e.g. "mb0/unit3/gathered"."""
    category: str
    """A memory category of zsim.analytic.memory.CATEGORIES."""
    bytes: int
    """Size in bytes."""
    pieces: tuple[int, ...] = ()
    """The real tensors the buffer stands for, as the CUDA caching allocator sees them
    (zsim.engine.allocator), in program order: an entry n >= 0 allocates a tensor of n
    bytes, an entry ~i (= -i - 1) frees the tensor of entry i, a transient of the op
    that allocates the buffer. What the entries leave allocated is freed with the
    buffer. Empty: one tensor of `bytes`. The ledger's allocated bytes count `bytes`
    whatever the pieces."""


class Op(NamedTuple):
    """One kernel or collective on one stream of the representative rank. A NamedTuple
    rather than a frozen dataclass: the lowering makes one per op of every plan, and the
    dataclass's __init__ (an object.__setattr__ per field) took a twentieth of `zsim
    plan`. Build it with keywords (its fields may grow)."""

    index: int
    """Position in Schedule.ops; dependencies refer to these indices."""
    name: str
    """Human label, e.g. "unit 17 backward (mb 0)"; used in OOM messages and traces."""
    kind: str
    """One of OpKind."""
    stream: str
    """One of STREAMS."""
    unit: int | None = None
    """FSDP unit (or bucket) index; None for the root and step-level ops."""
    microbatch: int = 0
    """Micro-batch index within the optimizer step."""
    after: tuple[int, ...] = ()
    """Ops that must have finished before this one starts (data dependencies)."""
    issue_after: tuple[int, ...] = ()
    """Ops that must have finished before the CPU issues this one: an issue point, not a
    data dependency (FSDP with prefetch disabled issues the next all-gather only after the
    current unit's kernel)."""
    after_start: tuple[int, ...] = ()
    """Ops that must have started before this one starts: the point where the CPU issues
    it (FSDP's implicit forward / explicit backward prefetch, a rate limit)."""
    compute_s: float = 0.0
    """Kernel time at the full achievable rate (compute-stream ops), or host CPU time
    (host-stream ops), seconds."""
    flops: float = 0.0
    """FLOPs the op executes (hardware FLOPs, recomputation included)."""
    size_bytes: float = 0.0
    """Collective size as nccl-tests counts it (all_gather output, reduce_scatter input,
    all_reduce buffer), bytes."""
    bus_bytes: float = 0.0
    """Bytes each rank puts on its link for the collective (ring), bytes."""
    link: str = ""
    """Name of the collective's bottleneck link ("intra_node", "inter_node"), for display."""
    link_loads: tuple[tuple[str, float], ...] = ()
    """Links the collective loads, each with the bytes it carries per bus byte (1 for the
    ring's own link; 1/ranks_per_node for the NIC share of a ring spanning nodes)."""
    latency_s: float = 0.0
    """Start-up (alpha) term of the collective, seconds; not slowed by link sharing."""
    algorithm: str = ""
    """The collective's algorithm/protocol ("ring/Simple", "tree/LL", "nvls/Simple")."""
    group_ranks: int = 1
    """Ranks in the collective's process group."""
    group: str = ""
    """Which process group: "shard" (ranks sharing one sharded copy, consecutive),
    "replicate" (ranks holding the same shard, one per shard group), "tp", "cp" or "ep"
    (the tensor-, context- and expert-parallel groups), "expert_shard" (the ranks
    sharding the same routed experts)."""
    async_op: bool = False
    """Issued with async_op=True (DDP's reducer, DeepSpeed's parameter fetches): the host
    gets a Work back and goes on. FSDP2 and DeepSpeed's gradient reductions issue theirs
    without it (a CUDA stream overlaps them), which on a synchronous host
    (Schedule.launch) blocks the thread until they complete."""
    allocs: tuple[Buffer, ...] = ()
    """Buffers allocated when the op starts."""
    frees_at_start: tuple[str, ...] = ()
    """Buffers released when the op starts (e.g. gradients copied into a flat input)."""
    frees: tuple[str, ...] = ()
    """Buffers released when the op finishes."""

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVE_KINDS

    @property
    def is_copy(self) -> bool:
        return self.kind in COPY_KINDS

    @property
    def is_transfer(self) -> bool:
        """Moves bytes over a link: a collective or a host<->device copy."""
        return self.kind in COLLECTIVE_KINDS or self.kind in COPY_KINDS


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """One optimizer step of one representative rank."""

    ops: tuple[Op, ...]
    """All ops in issue order (the order a CPU thread would launch them)."""
    baseline: tuple[Buffer, ...]
    """Buffers live before the step starts and after it ends (model state)."""
    link_bytes_per_s: dict[str, float]
    """Achievable bandwidth of each link the collectives use, per GPU per direction."""
    comm_compute_slowdown: float
    """Fraction by which compute slows while a collective runs on the rank (0 = none)."""
    compute_comm_slowdown: float = 0.0
    """Fraction by which a collective slows while compute runs on the rank (0 = none)."""
    hbm_bytes: float
    """HBM the allocator can hand out, bytes."""
    model_flops: float
    """Model FLOPs per rank per step (6N + attention, no recomputation)."""
    hardware_flops: float
    """FLOPs executed per rank per step (recomputation included)."""
    tokens_per_rank: float
    """Tokens per GPU per step: those of one data-parallel rank, shared by its
    model-parallel group (tp * cp * pp GPUs)."""
    world_size: int
    """GPUs in the job."""
    peak_flop_per_s: float
    """Dense peak of the compute dtype, for MFU."""
    dp_shard: int
    """Ranks per shard group, dp_shard x cp (Plan.dp_shard_cp; rank-level mode, which
    runs without CP, builds the groups from it)."""
    collective_threads: int = 1
    """Collectives of one process group a rank runs at once (HardwareProfile.
    collective_threads): with more than 1, each data-parallel collective stream takes up
    to this many of its ops at once, in issue order, and a rank's group runs at most this
    many collectives in all (gloo's worker threads)."""
    launch: str = "async"
    """How the host drives the device (zsim.spec.hardware.HardwareProfile.launch); with
    "synchronous" the lowering has already chained the ops the host thread runs or waits
    for in issue order, and compute waits on a blocking collective are "blocking_call"."""
    notes: tuple[str, ...] = field(default=())
    """Modelling choices the lowering made for this plan (shown in reports)."""
    nic_share: dict[str, float] = field(default_factory=dict)
    """Per process group (Op.group: "shard", "replicate", "tp", "cp", "ep", "expert_shard"),
    the share of a
    collective's bus bytes each GPU sends over its NIC rather than NVLink
    (zsim.analytic.collectives.nic_share); groups absent run inside a node."""

    def key(self) -> tuple[object, ...]:
        """Every field as a hashable tuple (the link bandwidths as sorted items): two
        schedules with equal keys are the same simulation, whatever plans lowered them."""
        return tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v
                     for v in (getattr(self, f.name) for f in fields(self)))

    def by_stream(self) -> dict[str, list[Op]]:
        """Ops grouped by stream, each list in issue order; streams in STREAMS order."""
        out: dict[str, list[Op]] = {s: [] for s in STREAMS}
        for op in self.ops:
            out[op.stream].append(op)
        return {s: ops for s, ops in out.items() if ops}
