"""HardwareProfile: one cluster's GPUs, nodes and links, loaded from strict YAML.

Owns the profile schema and its conversion from human units (GiB, GB/s, us, TFLOP/s in
YAML keys) to SI base units (bytes, bytes/s, s, FLOP/s) once, at load. Every section of a
profile file carries a `source:` saying where its numbers come from (a datasheet, a
published measurement in tests/data/cases/, or a `zsim calibrate` run). Hardware numbers live
only in hardware_profiles/*.yaml; no code branches on device names.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from zsim.errors import ConfigError
from zsim.spec.error_bands import ErrorBands
from zsim.spec.kernel_rates import KernelRates
from zsim.spec.programs import overhead_chain, programs
from zsim.spec.storage import Storage
from zsim.spec.yaml_file import read_yaml
from zsim.units import GB, US, GiB, MiB

if TYPE_CHECKING:
    from zsim.spec.plan import Plan

_SCHEMA: dict[str, tuple[str, ...]] = {
    "": ("name", "description", "gpu", "node", "intra_node", "inter_node", "collectives",
         "efficiency", "host"),
    "gpu": ("name", "hbm_gib", "hbm_bandwidth_gb_per_s", "peak_tflops", "source"),
    "node": ("gpus_per_node", "host_memory_gib", "pcie_gb_per_s", "nvme_read_gb_per_s",
             "nvme_write_gb_per_s", "source"),
    "intra_node": ("name", "bandwidth_gb_per_s", "latency_us", "efficiency",
                   "collective_efficiency", "source"),
    "inter_node": ("name", "bandwidth_gb_per_s", "latency_us", "efficiency",
                   "collective_efficiency", "source"),
    "collectives": ("model", "nvls_busbw_gb_per_s", "source"),
    "efficiency": ("matmul", "attention", "memory_bound", "pcie", "host_adam_params_per_s",
                   "comm_compute_slowdown", "compute_comm_slowdown", "kernel_overhead_us",
                   "source"),
    "host": ("launch", "collective_overhead_us", "rank_skew", "fsdp_unit_overhead_us",
             "checkpoint_overhead_us", "source"),
}
"""Required keys of each section; no others are accepted."""

OPTIONAL: dict[str, tuple[str, ...]] = {
    "": ("kernels", "error_bands", "storage"), "gpu": ("blas_workspace_mib",),
    "node": ("cpu_cores", "pageable_pcie_gb_per_s", "nvlink_domain_gpus"),
    "intra_node": ("mesh_link_gb_per_s",),
    "collectives": ("measured_us",),
    "efficiency": ("host_adam_threads", "host_adam_serial_fraction",
                   "deepspeed_adam_params_per_s", "foreach_kernels"),
    "host": ("optimizer_tensor_us", "fsdp2_block_host_us", "program_overhead_us",
             "sync_overhead_us", "collective_threads")}
"""Keys a section may leave out: measured kernel rates, the host's cores and how the host
AdamW scales with threads, the host time of the optimizer step per parameter tensor, the
cost of a synchronisation after compute (a profile without them keeps the simpler model
their fields describe)."""

TENSOR_KINDS: tuple[str, ...] = ("plain", "dtensor")
"""Keys of host.optimizer_tensor_us: parameters as plain tensors (DDP, FSDP1's flat
parameters, DeepSpeed's partitions) or as DTensors (FSDP2)."""

COLLECTIVES: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce")
"""The collective kinds (keys of a link's collective_efficiency); zsim.schedule.ops keeps
its own copy, as it imports only the standard library."""
OPTIONAL_COLLECTIVES: tuple[str, ...] = ("broadcast",)
"""Kinds a link's collective_efficiency may also give (1 when absent: the ring moves a
broadcast's bytes as an all_gather's, as NCCL's does); a checkpoint's full-state load
broadcasts (zsim.analytic.checkpoint)."""
REDUCING_COLLECTIVES: tuple[str, ...] = ("reduce_scatter", "all_reduce")
"""The kinds that add their inputs, whose time may depend on the dtype they add in."""

COLLECTIVE_MODELS: tuple[str, ...] = ("nccl", "rccl", "ring")
"""Values of collectives.model (see HardwareProfile.collectives)."""

PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")
"""NCCL's protocols (keys of a link's latency_us when it is a mapping)."""

LAUNCH_MODES: tuple[str, ...] = ("async", "synchronous")
"""Values of host.launch (see HardwareProfile.launch)."""

GLOO_THREADS = 2
"""Worker threads of a gloo process group as torch creates it (ProcessGroupGloo's
Options.threads, 2 unless the caller passes others; torch.distributed.new_group and
init_process_group do not): the collectives a synchronous host runs at once per group
(HardwareProfile.collective_threads)."""

FOREACH_KERNELS: tuple[str, ...] = ("per_tensor", "multi_tensor_apply")
"""Values of efficiency.foreach_kernels (see HardwareProfile.foreach_kernels)."""

CHECKPOINT_MODES: tuple[str, ...] = ("full", "selective")
"""Keys of host.checkpoint_overhead_us: the recompute modes that checkpoint a block."""

PHASES: tuple[str, ...] = ("forward", "backward")
"""Keys of each host.checkpoint_overhead_us entry."""

TP_OVERHEAD_KEY = "tp"
"""The key of host.program_overhead_us for DTensor tensor parallelism (plan.tp > 1), on top
of the plan's data-parallel program."""


def overhead_keys() -> tuple[str, ...]:
    """Keys of host.program_overhead_us: each program's (zsim.spec.programs.ProgramEntry.
    overhead_keys: DeepSpeed's ZeRO stages, ZeRO-2 with offload_optimizer its own; FSDP1's
    FULL_SHARD and SHARD_GRAD_OP), then TP_OVERHEAD_KEY."""
    return (*(k.name for e in programs() for k in e.overhead_keys), TP_OVERHEAD_KEY)


def overhead_programs(plan: Plan) -> tuple[tuple[str, ...], ...]:
    """The plan's programs that host.program_overhead_us may hold, each as its keys in
    order of preference: the data-parallel program's (zsim.spec.programs.overhead_chain:
    DeepSpeed's ZeRO stage, with the optimizer offloaded the stage's offload key where
    there is one, then the stage's; FSDP1's sharding strategy's key, then FULL_SHARD's),
    and TP's on top of it."""
    out: list[tuple[str, ...]] = []
    if chain := overhead_chain(plan.program, plan.strategy, plan.offload):
        out.append(chain)
    if plan.tp > 1:
        out.append((TP_OVERHEAD_KEY,))
    return tuple(out)


OVERHEAD_PARTS: tuple[str, ...] = ("forward_block", "backward_block", "forward_tensor",
                                   "backward_tensor", "step")
"""Keys of each host.program_overhead_us entry: per block per micro-batch in forward, in
backward (with its share of the optimizer step); the same per parameter tensor of a block
(OPTIONAL_OVERHEAD_PARTS: a block pays them times its tensors); and once per step outside
the blocks."""

OPTIONAL_OVERHEAD_PARTS: tuple[str, ...] = ("forward_tensor", "backward_tensor")
"""Parts an entry may leave out (0): a profile fitted on one kind of block has no per-
tensor figures."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """One level of the network, per GPU and per direction."""

    name: str
    """e.g. "NVLink4/NVSwitch", "InfiniBand NDR 400G"."""
    bandwidth_bytes_per_s: float
    """Line rate per GPU per direction."""
    latency_s: float
    """Per-step latency of a ring over this link with the Simple protocol (the alpha of
    an alpha-beta model)."""
    efficiency: float
    """Achievable fraction of line rate for large collectives (nccl-tests bus bandwidth /
    line rate)."""
    kind_efficiency: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(COLLECTIVES + OPTIONAL_COLLECTIVES, 1.0))
    """Bus bandwidth of each collective kind relative to `efficiency` (YAML
    collective_efficiency): 1 where the backend's rings move the same bytes for every
    kind (NCCL); below 1 for a kind its backend runs with more traffic (gloo's
    reduce_scatter_tensor is an all-reduce of the whole buffer)."""

    protocol_latency_s: dict[str, float] = field(default_factory=dict)
    """Per-step latency of the other protocols the collective library may use over this
    link (YAML latency_us as a mapping: NCCL's LL and LL128); none: Simple only."""
    mesh_link_bytes_per_s: float = 0.0
    """Line rate per direction of one direct GPU-to-GPU link where the node's GPUs are
    fully connected by point-to-point links rather than through a switch (YAML
    intra_node.mesh_link_gb_per_s, optional; 0: a switch). A group of r ranks in the node
    then reaches its peers over r - 1 links: min(bandwidth, (r - 1) x this) per GPU
    (zsim.analytic.collectives.link_loads)."""

    def group_bytes_per_s(self, ranks_in_node: int) -> float:
        """Line rate per GPU per direction a group with `ranks_in_node` members in the
        node can use: the whole link on a switch, r - 1 direct links on a mesh."""
        if not self.mesh_link_bytes_per_s or ranks_in_node < 2:
            return self.bandwidth_bytes_per_s
        return min(self.bandwidth_bytes_per_s,
                   (ranks_in_node - 1) * self.mesh_link_bytes_per_s)

    @property
    def achievable_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency

    def offers(self, protocol: str) -> bool:
        """Whether a call may use `protocol` over this link."""
        return protocol == "Simple" or protocol in self.protocol_latency_s

    def latency_for(self, protocol: str) -> float:
        """Per-step latency of `protocol` over this link, seconds."""
        return self.latency_s if protocol == "Simple" else self.protocol_latency_s[protocol]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredCollectives:
    """Median times of lone collective calls over `ranks` ranks, by kind and size."""

    ranks: int
    points: dict[str, tuple[tuple[float, float], ...]]
    """By kind (COLLECTIVES): (size_bytes, seconds), sizes ascending, at least two; calls
    in fp32 (an all-gather's time does not depend on its dtype)."""
    reductions: dict[str, dict[str, tuple[tuple[float, float], ...]]] = field(
        default_factory=dict)
    """By dtype other than fp32, by reducing kind (REDUCING_COLLECTIVES): the same, for
    calls that add in that dtype (gloo adds bf16 element by element through fp32)."""

    def time_s(self, kind: str, size_bytes: float, dtype: str = "fp32") -> float | None:
        """The call's time, linear between the measured sizes around `size_bytes`, along
        the last two points' line past the largest, the smallest's time below it, from
        the table of the call's dtype where the call reduces in a dtype measured apart,
        else fp32's; None for a kind not measured."""
        points = self.reductions.get(dtype, {}).get(kind) or self.points.get(kind)
        if not points:
            return None
        if size_bytes <= points[0][0]:
            return points[0][1]
        i = next((k for k in range(1, len(points)) if points[k][0] >= size_bytes),
                 len(points) - 1)
        (s0, t0), (s1, t1) = points[i - 1], points[i]
        return max(t0 + (t1 - t0) * (size_bytes - s0) / (s1 - s0), 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockHost:
    """Host time to issue one transformer block: its own ops and the wrapper's hooks
    around it, seconds."""

    per_phase: dict[str, tuple[float, float]]
    """By phase (PHASES): (base, per rank of the shard group)."""
    checkpoint_s: float
    """Extra forward time of a checkpointed block (torch.utils.checkpoint's set-up)."""

    def issue_s(self, phase: str, shard_ranks: int) -> float:
        base, per_rank = self.per_phase[phase]
        return base + per_rank * shard_ranks


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareProfile:
    """A homogeneous GPU cluster."""

    name: str
    """Profile name (file stem in hardware_profiles/)."""
    description: str
    gpu_name: str
    hbm_bytes: float
    """Usable HBM per GPU, bytes (what the allocator can hand out)."""
    hbm_bandwidth_bytes_per_s: float
    blas_workspace_bytes: float = 0.0
    """The cuBLAS workspace torch allocates per cuBLAS handle and stream, bytes (YAML
    gpu.blas_workspace_mib, optional; 0: none, as on a CPU). torch takes it from its
    caching allocator at a handle's first matmul on a stream and keeps it for the
    process's life (aten/src/ATen/cuda/CublasHandlePool.cpp, cuBLASLt sharing it)."""
    peak_flop_per_s: dict[str, float]
    """Dense peak per dtype ("bf16", "fp16", "fp32", "tf32"), FLOP/s."""
    gpus_per_node: int
    """GPUs per host (the CPUs, DRAM, NVMe and storage NICs they share)."""
    host_memory_bytes: float
    """Host DRAM per node, bytes."""
    pcie_bytes_per_s: float
    """Host<->GPU bandwidth per GPU per direction."""
    nvme_read_bytes_per_s: float
    """Per node."""
    nvme_write_bytes_per_s: float
    intra_node: Link
    inter_node: Link
    collectives: str
    """How a collective call runs (YAML collectives.model): "nccl" (NCCL's tuning model
    picks the algorithm and protocol of each call, zsim.analytic.collectives) or "ring"
    (every call a ring with the Simple latency: gloo, or a textbook profile)."""
    nvls_bus_bytes_per_s: float
    """All-reduce bus bandwidth with NVLink SHARP (NVLS) inside a node, per GPU; 0 where
    the NVSwitch has none."""
    measured_collectives: MeasuredCollectives | None = None
    """Call times measured by zsim calibrate for its world size (YAML
    collectives.measured_us, optional): under the "ring" model a call of a group of that
    many ranks inside a node takes the time interpolated from them
    (zsim.analytic.collectives.candidates) rather than the alpha-beta fit's."""
    matmul_efficiency: float
    """Achievable fraction of peak for transformer matmuls."""
    attention_efficiency: float
    """Achievable fraction of peak for (flash) attention forward + backward."""
    memory_bound_efficiency: float
    """Achievable fraction of HBM bandwidth for elementwise/norm kernels."""
    pcie_efficiency: float
    """Achievable fraction of PCIe line rate for pinned copies."""
    host_adam_params_per_s: float
    """CPU AdamW throughput for offloaded optimizer steps, parameters per second per node."""
    deepspeed_adam_params_per_s: float = 0.0
    """The same for DeepSpeedCPUAdam, the vectorised kernel DeepSpeed's offload_optimizer
    runs (YAML efficiency.deepspeed_adam_params_per_s, optional; 0: not measured, its
    steps take host_adam_params_per_s)."""
    comm_compute_slowdown: float
    """Fraction by which compute slows while communication kernels hold SMs (0 = none)."""
    compute_comm_slowdown: float = 0.0
    """Fraction of its rate a collective loses while compute runs on its rank (0 = none:
    GPU collectives run on their own SMs; on a CPU, gloo's threads share the cores)."""
    kernel_overhead_s: float = 0.0
    """Fixed cost per kernel on the compute stream (dispatch and launch not hidden behind
    earlier work), seconds; YAML key efficiency.kernel_overhead_us (required there).
    Profiles built in code may leave it 0."""
    foreach_kernels: str = "per_tensor"
    """How the device runs a foreach op over a list of tensors (YAML
    efficiency.foreach_kernels, optional): "per_tensor", a kernel per tensor (the CPU's
    fallback loop), or "multi_tensor_apply", CUDA's launches that pack chunks of many
    tensors (zsim.analytic.compute.foreach_launches)."""
    launch: str = "async"
    """How the host thread drives the device (YAML host.launch): "async" (CUDA streams:
    kernels and collectives queue on device streams while the host runs ahead) or
    "synchronous" (the device is the host CPU: every kernel runs on the issuing thread
    and a collective issued without async_op blocks it until it completes)."""
    collective_threads: int = 1
    """How many collectives of one process group a rank runs at once (YAML
    host.collective_threads, optional; absent: GLOO_THREADS on a synchronous host, else
    1). NCCL runs a communicator's kernels in order on its stream: 1. gloo hands every
    call to a pool of worker threads per process group, and calls issued with async_op
    (DeepSpeed's parameter fetches, DDP's buckets) run as many at once as it has
    threads."""
    collective_overhead_s: float = 0.0
    """Host time of a blocking collective call beyond the link model (thread hand-off,
    waiting for the other ranks, the framework's Python and copies around it), seconds
    per call; YAML host.collective_overhead_us. Applies to collectives issued without
    async_op on a synchronous host."""
    rank_skew: float = 0.0
    """How far the slowest rank falls behind per second of compute between
    synchronisations (a fraction): every rank waits for it at the next collective, so
    compute is stretched by 1 + rank_skew. 0 = ranks run in lock step."""
    sync_overhead_s: float = 0.0
    """What a blocking collective costs beyond collective_overhead_s when the ranks reach
    it from model compute rather than straight from the call before, seconds (YAML
    host.sync_overhead_us, optional; absent: 0). Measured as the intercept of the
    rank_skew line (the call's extra time after compute, extrapolated to no compute)
    less the same call back to back: ranks that arrive apart pay a fixed cost beyond the
    wait (a waiting rank's thread sleeps and must be woken, presumably). On the step's
    timeline only when launch is "synchronous" (zsim.schedule.build.on_synchronous_host,
    which charges it to the calls zsim.schedule.build.synchronising finds)."""
    fsdp_unit_overhead_s: float = 0.0
    """Host time FSDP2 spends per unit per micro-batch in its hooks (unshard bookkeeping,
    views, post-backward) and the DTensor optimizer step, outside kernels and
    collectives, seconds; on the step's timeline only when launch is "synchronous"
    (an async host does it while the device runs earlier kernels)."""
    checkpoint_overhead_s: dict[str, dict[str, float]] = field(
        default_factory=lambda: {m: dict.fromkeys(PHASES, 0.0) for m in CHECKPOINT_MODES})
    """Host time of activation checkpointing beyond the kernels it re-runs, per forward
    kernel of a checkpointed block, by recompute mode (CHECKPOINT_MODES) and phase
    (PHASES), seconds; YAML host.checkpoint_overhead_us. It is torch.utils.checkpoint's
    saved-tensor hooks and recomputation set-up, and for selective recomputation
    (op-level SAC) the Python dispatch modes every op of the block passes through, in
    forward and again when it is recomputed. On the step's timeline only when launch is
    "synchronous"."""

    nvlink_domain_gpus: int = 0
    """GPUs that reach each other over intra_node (the NVLink domain), a multiple of
    gpus_per_node (YAML node.nvlink_domain_gpus, optional; 0: one host's GPUs): 72 on a
    GB200 NVL72 rack of 18 hosts of 4. Placement (zsim.analytic.placement) puts
    `domain_gpus` consecutive ranks on one domain, so a group inside it runs on
    intra_node; host memory, cores and NVMe stay per host."""
    cpu_cores: int = 0
    """Host CPU cores per node (YAML node.cpu_cores, optional; 0 = not given): each of
    the node's ranks gets cpu_cores // gpus_per_node threads for an offloaded step."""
    pageable_pcie_bytes_per_s: dict[str, float] = field(default_factory=dict)
    """Achieved host<->GPU rate of copies from or to pageable host memory, by direction
    ("h2d", "d2h"), bytes/s (YAML node.pageable_pcie_gb_per_s, optional; absent: as
    pinned). The driver stages them through a pinned buffer with a CPU memcpy."""
    host_adam_threads: int = 0
    """Threads host_adam_params_per_s was measured with (0 = it is the node's rate)."""
    host_adam_serial_fraction: float = 0.0
    """Amdahl serial fraction of the host AdamW: t threads run 1 + f (t - 1) times
    slower than t times one thread."""
    optimizer_tensor_s: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(TENSOR_KINDS, 0.0))
    """Host time of a device optimizer step per parameter tensor, by TENSOR_KINDS,
    seconds (YAML host.optimizer_tensor_us): the foreach ops' Python and dispatch (and
    DTensor's unwrapping), the launches, zero_grad. The step takes at least this long
    when the host issues it alone on an async host; 0 = not modelled."""
    error_bands: ErrorBands | None = None
    """How far its predictions were from real runs, by kind of plan (YAML error_bands,
    optional): the interval each predicted step time and peak carries."""
    fsdp2_block_host: BlockHost | None = None
    """Host time to issue one FSDP2-wrapped block on an async host (YAML
    host.fsdp2_block_host_us, optional; None: the host keeps ahead). A block's kernels
    cannot run faster than the host issues them."""
    program_overhead_s: dict[str, dict[str, float]] = field(default_factory=dict)
    """Host time a program spends beyond what the other fields model, by program
    (overhead_keys) and part (OVERHEAD_PARTS), seconds (YAML host.program_overhead_us,
    optional; a program absent: none): DeepSpeed's hooks, bucket and partition
    bookkeeping and engine step, DTensor's dispatch. Measured by zsim calibrate as the
    nano model's step time under the program less what the simulator gives it without
    this field; on the step's timeline only when launch is "synchronous"."""
    storage: Storage | None = None
    """The shared file system checkpoints go to (YAML storage, optional in a user's
    profile; every shipped profile has one): zsim.analytic.checkpoint needs it."""
    kernels: KernelRates | None = None
    """Measured kernel rates by shape (YAML kernels, optional): with them a kernel's time
    follows its shape (zsim.analytic.compute.compute_time_s); without, the flat
    efficiencies above apply."""

    def rank_host_adam_params_per_s(self, program: Literal["torch", "deepspeed"] = "torch"
                                    ) -> float:
        """CPU AdamW rate of one rank's offloaded step: the node's rate shared by its GPUs,
        or, with the node's cores and the threads the rate was measured with, the rate of
        cpu_cores // gpus_per_node threads by Amdahl's law. `program` "deepspeed" runs
        DeepSpeedCPUAdam: its node rate where measured, shared the same way."""
        node = (self.deepspeed_adam_params_per_s
                if program == "deepspeed" and self.deepspeed_adam_params_per_s
                else self.host_adam_params_per_s)
        if not (self.cpu_cores and self.host_adam_threads):
            return node / self.gpus_per_node

        def speedup(threads: int) -> float:
            return threads / (1.0 + self.host_adam_serial_fraction * (threads - 1))

        threads = max(1, self.cpu_cores // self.gpus_per_node)
        return node * speedup(threads) / speedup(self.host_adam_threads)

    @property
    def domain_gpus(self) -> int:
        """GPUs per NVLink domain (nvlink_domain_gpus, or a host's GPUs): the "node" of
        placement and of the collectives' link choice."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    @property
    def domain_name(self) -> str:
        """What messages call a domain: "node" where it is one host, else "NVLink
        domain"."""
        return "NVLink domain" if self.domain_gpus != self.gpus_per_node else "node"

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for a compute dtype.

        Raises:
            ConfigError: the profile has no peak for that dtype.
        """
        if dtype not in self.peak_flop_per_s:
            raise ConfigError(f"hardware.gpu.peak_tflops.{dtype}", None,
                              f"profile {self.name} has no peak for {dtype}")
        return self.peak_flop_per_s[dtype]

    @classmethod
    def from_dict(cls, data: Any, *, name: str) -> HardwareProfile:
        """Build from the YAML structure; strict about keys and types.

        Raises:
            ConfigError: a section or key is unknown, missing or of the wrong type.
        """
        _check_keys(data, "")
        for section in ("gpu", "node", "intra_node", "inter_node", "collectives",
                        "efficiency", "host"):
            _check_keys(data[section], section)
            _text(data[section], section, "source")
        for section, key in (("", "name"), ("", "description"), ("gpu", "name"),
                             ("intra_node", "name"), ("inter_node", "name")):
            _text(data[section] if section else data, section, key)
        gpu, node, eff, host = data["gpu"], data["node"], data["efficiency"], data["host"]
        coll = data["collectives"]
        collectives = _choice(coll, "collectives", "model", COLLECTIVE_MODELS)
        launch = _choice(host, "host", "launch", LAUNCH_MODES)
        peaks = gpu["peak_tflops"]
        if not isinstance(peaks, dict) or not peaks:
            raise ConfigError("gpu.peak_tflops", peaks, "must map dtype names to TFLOP/s")
        profile = cls(
            name=name,
            description=str(data["description"]),
            gpu_name=str(gpu["name"]),
            hbm_bytes=_pos(gpu, "gpu", "hbm_gib") * GiB,
            hbm_bandwidth_bytes_per_s=_pos(gpu, "gpu", "hbm_bandwidth_gb_per_s") * GB,
            blas_workspace_bytes=(_pos(gpu, "gpu", "blas_workspace_mib") * MiB
                                  if "blas_workspace_mib" in gpu else 0.0),
            peak_flop_per_s={k: _pos(peaks, "gpu.peak_tflops", k) * 1e12 for k in peaks},
            gpus_per_node=_count(node, "node", "gpus_per_node"),
            host_memory_bytes=_pos(node, "node", "host_memory_gib") * GiB,
            pcie_bytes_per_s=_pos(node, "node", "pcie_gb_per_s") * GB,
            nvme_read_bytes_per_s=_pos(node, "node", "nvme_read_gb_per_s") * GB,
            nvme_write_bytes_per_s=_pos(node, "node", "nvme_write_gb_per_s") * GB,
            intra_node=_link(data["intra_node"], "intra_node"),
            inter_node=_link(data["inter_node"], "inter_node"),
            collectives=collectives,
            nvls_bus_bytes_per_s=_non_negative(coll, "collectives", "nvls_busbw_gb_per_s") * GB,
            measured_collectives=_measured_collectives(coll.get("measured_us")),
            matmul_efficiency=_fraction(eff, "matmul"),
            attention_efficiency=_fraction(eff, "attention"),
            memory_bound_efficiency=_fraction(eff, "memory_bound"),
            pcie_efficiency=_fraction(eff, "pcie"),
            host_adam_params_per_s=_pos(eff, "efficiency", "host_adam_params_per_s"),
            deepspeed_adam_params_per_s=(
                _pos(eff, "efficiency", "deepspeed_adam_params_per_s")
                if "deepspeed_adam_params_per_s" in eff else 0.0),
            comm_compute_slowdown=_fraction(eff, "comm_compute_slowdown", allow_zero=True),
            compute_comm_slowdown=_fraction(eff, "compute_comm_slowdown", allow_zero=True),
            kernel_overhead_s=_non_negative(eff, "efficiency", "kernel_overhead_us") * US,
            foreach_kernels=_choice(eff, "efficiency", "foreach_kernels", FOREACH_KERNELS)
            if "foreach_kernels" in eff else "per_tensor",
            launch=launch,
            collective_threads=(_count(host, "host", "collective_threads")
                                if "collective_threads" in host
                                else GLOO_THREADS if launch == "synchronous" else 1),
            collective_overhead_s=_non_negative(host, "host", "collective_overhead_us") * US,
            rank_skew=_non_negative(host, "host", "rank_skew"),
            sync_overhead_s=(_non_negative(host, "host", "sync_overhead_us") * US
                             if "sync_overhead_us" in host else 0.0),
            fsdp_unit_overhead_s=_non_negative(host, "host", "fsdp_unit_overhead_us") * US,
            checkpoint_overhead_s=_checkpoint_overhead(host["checkpoint_overhead_us"]),
            cpu_cores=_count(node, "node", "cpu_cores") if "cpu_cores" in node else 0,
            nvlink_domain_gpus=_domain(node),
            pageable_pcie_bytes_per_s=_pageable(node.get("pageable_pcie_gb_per_s")),
            host_adam_threads=(_count(eff, "efficiency", "host_adam_threads")
                               if "host_adam_threads" in eff else 0),
            host_adam_serial_fraction=(_fraction(eff, "host_adam_serial_fraction",
                                                 allow_zero=True)
                                       if "host_adam_serial_fraction" in eff else 0.0),
            optimizer_tensor_s=_tensor_overhead(host.get("optimizer_tensor_us")),
            fsdp2_block_host=_block_host(host.get("fsdp2_block_host_us")),
            program_overhead_s=_program_overhead(host.get("program_overhead_us")),
            kernels=KernelRates.from_dict(data["kernels"]) if "kernels" in data else None,
            storage=Storage.from_dict(data["storage"]) if "storage" in data else None,
            error_bands=(ErrorBands.from_dict(data["error_bands"]) if "error_bands" in data
                         else None),
        )
        _check_rates(profile)
        return profile

    @classmethod
    def from_yaml(cls, path: Path) -> HardwareProfile:
        """Load hardware_profiles/<name>.yaml (or any path).

        Raises:
            ConfigError: unreadable file, malformed YAML, or a schema violation.
        """
        path = Path(path)
        data = read_yaml(path, field="hardware")
        return cls.from_dict(data, name=path.stem)


MIN_RATE_PER_S = 1.0
"""Smallest achievable rate a profile may give (bytes/s, FLOP/s, parameters/s): each
number on its own may be any positive value, but a product of them that underflows
towards 0 (an efficiency of 1e-300 on a 50 GB/s link) is not a machine, and would give
infinite or undefined times."""


def _check_rates(hw: HardwareProfile) -> None:
    """Every achievable rate the simulator divides by is at least MIN_RATE_PER_S."""
    rates: list[tuple[str, float, float]] = [
        (f"efficiency.{kind}", eff, peak * eff)
        for peak in hw.peak_flop_per_s.values()
        for kind, eff in (("matmul", hw.matmul_efficiency),
                          ("attention", hw.attention_efficiency))]
    rates.append(("efficiency.memory_bound", hw.memory_bound_efficiency,
                  hw.hbm_bandwidth_bytes_per_s * hw.memory_bound_efficiency))
    rates.append(("efficiency.pcie", hw.pcie_efficiency,
                  hw.pcie_bytes_per_s * hw.pcie_efficiency))
    rates.append(("efficiency.host_adam_params_per_s", hw.host_adam_params_per_s,
                  hw.rank_host_adam_params_per_s()))
    if hw.deepspeed_adam_params_per_s:
        rates.append(("efficiency.deepspeed_adam_params_per_s",
                      hw.deepspeed_adam_params_per_s,
                      hw.rank_host_adam_params_per_s("deepspeed")))
    for section, link in (("intra_node", hw.intra_node), ("inter_node", hw.inter_node)):
        for kind, value in link.kind_efficiency.items():
            rates.append((f"{section}.collective_efficiency.{kind}", value,
                          link.achievable_bytes_per_s * value))
    for path, value, rate in rates:
        if not rate >= MIN_RATE_PER_S:
            raise ConfigError(path, value,
                              f"gives an achievable rate of {rate:.3g} per second, below "
                              f"{MIN_RATE_PER_S:g} per second")


def _check_keys(data: Any, section: str) -> None:
    where = section or "hardware"
    if not isinstance(data, dict):
        raise ConfigError(where, data, "must be a mapping")
    optional = OPTIONAL.get(section, ())
    expected = _SCHEMA[section] + optional
    for key in data:
        if key not in expected:
            raise ConfigError(f"{section + '.' if section else ''}{key}", data[key],
                              f"unknown key; expected one of {', '.join(expected)}")
    for key in expected:
        if key not in data and key not in optional:
            raise ConfigError(f"{section + '.' if section else ''}{key}", None,
                              "missing required key")


def _text(d: dict[str, Any], section: str, key: str) -> str:
    """A required non-empty string (names, descriptions and every section's source)."""
    v = d[key]
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{section + '.' if section else ''}{key}", v,
                          "must be a non-empty string")
    return v


def _choice(d: dict[str, Any], section: str, key: str, values: tuple[str, ...]) -> str:
    """One of `values` (the section's key names the field when it is not)."""
    v = d[key]
    if v not in values:
        raise ConfigError(f"{section}.{key}", v, f"must be one of {', '.join(values)}")
    return str(v)


def _count(d: dict[str, Any], section: str, key: str) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"{section}.{key}", v, "must be a positive integer")
    return v


def _pos(d: dict[str, Any], section: str, key: str) -> float:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ConfigError(f"{section}.{key}", v, "must be a positive number")
    return float(v)


def _non_negative(d: dict[str, Any], section: str, key: str) -> float:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ConfigError(f"{section}.{key}", v, "must be a number >= 0")
    return float(v)


def _fraction(d: dict[str, Any], key: str, *, allow_zero: bool = False) -> float:
    v = d[key]
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (
        0 <= v < 1 if allow_zero else 0 < v <= 1)
    if not ok:
        raise ConfigError(f"efficiency.{key}", v, "must be a fraction in (0, 1]" if not
                          allow_zero else "must be a fraction in [0, 1)")
    return float(v)


def _checkpoint_overhead(d: Any) -> dict[str, dict[str, float]]:
    """host.checkpoint_overhead_us: {full, selective} x {forward, backward}, us >= 0."""
    where = "host.checkpoint_overhead_us"
    if not isinstance(d, dict) or sorted(d) != sorted(CHECKPOINT_MODES):
        raise ConfigError(where, d, f"must map exactly {', '.join(CHECKPOINT_MODES)} to "
                                    f"{{{', '.join(PHASES)}}}")
    out: dict[str, dict[str, float]] = {}
    for mode in CHECKPOINT_MODES:
        phases = d[mode]
        if not isinstance(phases, dict) or sorted(phases) != sorted(PHASES):
            raise ConfigError(f"{where}.{mode}", phases,
                              f"must map exactly {', '.join(PHASES)} to numbers")
        out[mode] = {ph: _non_negative(phases, f"{where}.{mode}", ph) * US for ph in PHASES}
    return out


def _domain(node: dict[str, Any]) -> int:
    """node.nvlink_domain_gpus: a positive multiple of gpus_per_node (absent: 0)."""
    if "nvlink_domain_gpus" not in node:
        return 0
    gpus = _count(node, "node", "nvlink_domain_gpus")
    if gpus % node["gpus_per_node"]:
        raise ConfigError("node.nvlink_domain_gpus", gpus,
                          f"must be a multiple of gpus_per_node={node['gpus_per_node']} "
                          "(a domain is whole hosts)")
    return gpus


def _pageable(d: Any) -> dict[str, float]:
    """node.pageable_pcie_gb_per_s: {h2d, d2h} -> GB/s > 0 (absent: empty)."""
    if d is None:
        return {}
    where = "node.pageable_pcie_gb_per_s"
    if not isinstance(d, dict) or sorted(d) != ["d2h", "h2d"]:
        raise ConfigError(where, d, "must map exactly h2d, d2h to GB/s")
    return {k: _pos(d, where, k) * GB for k in ("h2d", "d2h")}


def _block_host(d: Any) -> BlockHost | None:
    """host.fsdp2_block_host_us: {forward: [base, per_rank], backward: [base, per_rank],
    checkpoint: us} (absent: None)."""
    if d is None:
        return None
    where = "host.fsdp2_block_host_us"
    if not isinstance(d, dict) or sorted(d) != ["backward", "checkpoint", "forward"]:
        raise ConfigError(where, d, "must map forward, backward ([base, per_rank] us) and "
                                    "checkpoint (us)")
    per_phase = {}
    for phase in PHASES:
        v = d[phase]
        if not (isinstance(v, list) and len(v) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in v)):
            raise ConfigError(f"{where}.{phase}", v, "must be [base, per_rank] us >= 0")
        per_phase[phase] = (v[0] * US, v[1] * US)
    return BlockHost(per_phase=per_phase,
                     checkpoint_s=_non_negative(d, where, "checkpoint") * US)


def _measured_collectives(d: Any) -> MeasuredCollectives | None:
    """collectives.measured_us: {ranks: N >= 2, <kind>: [[size_bytes, us], ...]} for some
    of COLLECTIVES and OPTIONAL_COLLECTIVES (fp32), and optionally {<dtype>: {<kind>:
    [...]}} for some of REDUCING_COLLECTIVES in another dtype; sizes ascending and > 0,
    times >= 0, two points at least (absent: None)."""
    if d is None:
        return None
    where = "collectives.measured_us"
    other = ("bf16", "fp16")
    kinds = COLLECTIVES + OPTIONAL_COLLECTIVES
    if not isinstance(d, dict) or "ranks" not in d or not set(d) - {"ranks"} <= {
            *kinds, *other}:
        raise ConfigError(where, d, f"must map ranks and some of {', '.join(kinds)} to "
                                    f"[[size_bytes, us], ...] (and a dtype among "
                                    f"{', '.join(other)} to reductions in it)")
    ranks = _count(d, where, "ranks")
    if ranks < 2:
        raise ConfigError(f"{where}.ranks", ranks, "must be >= 2")
    reductions = {}
    for dtype in other:
        if dtype not in d:
            continue
        kinds = d[dtype]
        if not isinstance(kinds, dict) or not kinds or not set(kinds) <= set(
                REDUCING_COLLECTIVES):
            raise ConfigError(f"{where}.{dtype}", kinds,
                              f"must map some of {', '.join(REDUCING_COLLECTIVES)} to "
                              f"[[size_bytes, us], ...]")
        reductions[dtype] = _call_tables(kinds, f"{where}.{dtype}")
    return MeasuredCollectives(ranks=ranks, points=_call_tables(d, where),
                               reductions=reductions)


def _call_tables(d: dict[str, Any], where: str) -> dict[str, tuple[tuple[float, float], ...]]:
    """The [[size_bytes, us], ...] tables among d's collective kinds, in seconds."""
    points = {}
    for kind in COLLECTIVES + OPTIONAL_COLLECTIVES:
        if kind not in d:
            continue
        rows = d[kind]
        ok = isinstance(rows, list) and len(rows) >= 2 and all(
            isinstance(r, list) and len(r) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in r)
            and r[0] > 0 and r[1] >= 0 for r in rows)
        if not ok or any(a[0] >= b[0] for a, b in itertools.pairwise(rows)):
            raise ConfigError(f"{where}.{kind}", rows, "must be [[size_bytes, us], ...]: two "
                                                      "or more, sizes ascending and > 0, "
                                                      "times >= 0")
        points[kind] = tuple((float(size), float(us) * US) for size, us in rows)
    return points


def _program_overhead(d: Any) -> dict[str, dict[str, float]]:
    """host.program_overhead_us: {program: {part: us >= 0}} for programs among
    overhead_keys() (absent: empty), every part of OVERHEAD_PARTS (those of
    OPTIONAL_OVERHEAD_PARTS left out: 0)."""
    if d is None:
        return {}
    where = "host.program_overhead_us"
    keys = overhead_keys()
    if not isinstance(d, dict) or not set(d) <= set(keys):
        raise ConfigError(where, d, f"must map some of {', '.join(keys)} to "
                                    f"{{{', '.join(OVERHEAD_PARTS)}}}")
    out = {}
    for program in keys:
        if program not in d:
            continue
        parts = d[program]
        required = set(OVERHEAD_PARTS) - set(OPTIONAL_OVERHEAD_PARTS)
        if (not isinstance(parts, dict) or not required <= set(parts)
                or not set(parts) <= set(OVERHEAD_PARTS)):
            raise ConfigError(f"{where}.{program}", parts,
                              f"must map {', '.join(sorted(required))} and optionally "
                              f"{', '.join(OPTIONAL_OVERHEAD_PARTS)} to numbers")
        out[program] = {k: _non_negative(parts, f"{where}.{program}", k) * US
                        if k in parts else 0.0 for k in OVERHEAD_PARTS}
    return out


def _tensor_overhead(d: Any) -> dict[str, float]:
    """host.optimizer_tensor_us: {plain, dtensor} -> us >= 0 (absent: zeros)."""
    if d is None:
        return dict.fromkeys(TENSOR_KINDS, 0.0)
    where = "host.optimizer_tensor_us"
    if not isinstance(d, dict) or sorted(d) != sorted(TENSOR_KINDS):
        raise ConfigError(where, d, f"must map exactly {', '.join(TENSOR_KINDS)} to numbers")
    return {k: _non_negative(d, where, k) * US for k in TENSOR_KINDS}


def _link(d: dict[str, Any], section: str) -> Link:
    eff = d["efficiency"]
    if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0 < eff <= 1:
        raise ConfigError(f"{section}.efficiency", eff, "must be a fraction in (0, 1]")
    latency = d["latency_us"]
    if isinstance(latency, dict):
        if "Simple" not in latency or not set(latency) <= set(PROTOCOLS):
            raise ConfigError(f"{section}.latency_us", latency,
                              "must map Simple (and optionally LL, LL128) to microseconds")
        per_protocol = {p: _non_negative(latency, f"{section}.latency_us", p) * US
                        for p in PROTOCOLS if p in latency}
    elif isinstance(latency, bool) or not isinstance(latency, (int, float)) or latency < 0:
        raise ConfigError(f"{section}.latency_us", latency,
                          "must be a number >= 0 (the Simple protocol's) or a mapping")
    else:
        per_protocol = {"Simple": float(latency) * US}
    kinds = d["collective_efficiency"]
    if (not isinstance(kinds, dict) or not set(COLLECTIVES) <= set(kinds)
            or not set(kinds) <= set(COLLECTIVES + OPTIONAL_COLLECTIVES)):
        raise ConfigError(f"{section}.collective_efficiency", kinds,
                          f"must map {', '.join(COLLECTIVES)} (and optionally "
                          f"{', '.join(OPTIONAL_COLLECTIVES)}) to numbers")
    for kind in kinds:
        v = _pos(kinds, f"{section}.collective_efficiency", kind)
        if v * eff > 1.0:
            raise ConfigError(f"{section}.collective_efficiency.{kind}", v,
                              f"times efficiency {eff} exceeds the line rate")
    return Link(name=str(d["name"]),
                bandwidth_bytes_per_s=_pos(d, section, "bandwidth_gb_per_s") * GB,
                mesh_link_bytes_per_s=(_pos(d, section, "mesh_link_gb_per_s") * GB
                                       if "mesh_link_gb_per_s" in d else 0.0),
                latency_s=per_protocol.pop("Simple"), protocol_latency_s=per_protocol,
                efficiency=float(eff),
                kind_efficiency={k: float(kinds.get(k, 1.0))
                                 for k in COLLECTIVES + OPTIONAL_COLLECTIVES})
