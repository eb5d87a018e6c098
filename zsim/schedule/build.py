"""The shared machinery of every program's lowering (zsim.schedule.programs): the op
builder, the units a model is split into, the activation bytes and work of one block, the
ops every program issues alike (a block's forward, the output projection and loss, the
optimizer step on the device or on the host), whole-tensor bucketing, and the chaining of
ops on a synchronous host. No program's order of ops lives here. Never simulates and
never imports simpy.

Durations come from zsim.analytic.compute, collective sizes, links and algorithms from
zsim.analytic.collectives (groups from zsim.analytic.comm), saved tensors from
zsim.analytic.activations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from zsim.analytic import allocations
from zsim.analytic.activations import (
    LOSS_PREFIX,
    STATE_ALIASES,
    block_activation_bytes,
    block_backward_working_bytes,
    block_input_casts,
    block_recompute_bytes,
    head_backward_working_bytes,
    loss_forward_working_bytes,
    loss_working_bytes,
    root_saved_tensors,
)
from zsim.analytic.collectives import Algorithm, CommGroup, bus_bytes, choose
from zsim.analytic.comm import replicate_group, shard_group
from zsim.analytic.compute import (
    ADAMW_FOREACH_DEPTHS,
    Flops,
    block_backward_flops,
    block_forward_flops,
    compute_time_s,
    foreach_launches,
    head_backward_flops,
    head_forward_flops,
    optimizer_flops,
    recompute_forward_flops,
    routed_expert_flops,
    with_float8_linears,
)
from zsim.analytic.memory import optimizer_bytes_per_param
from zsim.analytic.placement import place
from zsim.errors import ConfigError
from zsim.schedule.ops import Buffer, Op
from zsim.spec.hardware import HardwareProfile, overhead_programs
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes

Shapes = Sequence[tuple[int, ...]]
ShardElems = Callable[[Shapes, int], int]
"""A program's padding rule: elements of one rank's shard of these parameters on n ranks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """One wrapped unit (FSDP) or gradient-readiness group (DDP, DeepSpeed): the root, or
    `blocks` consecutive transformer blocks."""

    name: str
    index: int | None
    """Block-unit index, None for the root."""
    params: int
    blocks: int
    shapes: tuple[tuple[int, ...], ...]
    """Shape of each parameter tensor of the unit, in module order."""
    shard: int
    """Elements of one rank's shard of the unit, padded as the program pads it."""
    expert_shard: int = 0
    """Of `shard`, the elements of the rank's routed experts under expert parallelism,
    sharded over the expert_shard group (Plan.expert_shard_ranks) where the rest is
    sharded over dp_shard x cp; 0 without EP."""

    @property
    def tensors(self) -> tuple[int, ...]:
        """Elements of each parameter tensor, in module order."""
        return tuple(math.prod(s) for s in self.shapes)

    def gathered_elems(self, plan: Plan) -> int:
        """Elements of the unit's gathered parameters: dp_shard x cp padded shards (the
        routed experts' Plan.expert_shard_ranks of theirs under expert parallelism)."""
        return ((self.shard - self.expert_shard) * plan.dp_shard_cp
                + self.expert_shard * plan.expert_shard_ranks)

    def dense_gathered_elems(self, plan: Plan) -> int:
        """Of gathered_elems, those gathered over dp_shard x cp (all without EP)."""
        return (self.shard - self.expert_shard) * plan.dp_shard_cp


def units(model: ModelSpec, plan: Plan, shard_elems: ShardElems) -> tuple[Unit, list[Unit]]:
    """The root unit and the block units (`plan.unit_size` blocks each) in forward order,
    each unit's shard padded by the program's `shard_elems` over the dp_shard x cp ranks
    that share the state (Plan.dp_shard_cp).

    Raises:
        ConfigError: a unit size larger than the model.
    """
    if plan.unit_size > model.num_layers:
        raise ConfigError("plan.unit_size", plan.unit_size,
                          f"must be <= num_layers={model.num_layers}")
    n = plan.dp_shard_cp
    block = tuple(s for _, s in model.block_tensors())
    block_shard, expert_shard = block_shard_elems(model, n, plan.expert_shard_ranks,
                                                  shard_elems)
    root_shapes = tuple(s for _, s in model.root_tensors())
    root = Unit(name="root", index=None, params=model.root_params, blocks=0,
                shapes=root_shapes, shard=shard_elems(root_shapes, n))
    out = []
    for i, first in enumerate(range(0, model.num_layers, plan.unit_size)):
        blocks = min(plan.unit_size, model.num_layers - first)
        out.append(Unit(name=f"unit {i}", index=i, params=blocks * model.params_per_block,
                        blocks=blocks, shapes=block * blocks, shard=blocks * block_shard,
                        expert_shard=blocks * expert_shard))
    return root, out


def expert_shapes(model: ModelSpec) -> tuple[tuple[int, ...], ...]:
    """Shapes of one block's routed-expert tensors (the rank's share under EP)."""
    return tuple(s for name, s in model.block_tensors() if name.startswith("moe.experts."))


def block_shard_elems(model: ModelSpec, n: int, expert_ranks: int, shard_elems: ShardElems
                      ) -> tuple[int, int]:
    """Elements of one rank's shard of one block on `n` ranks, and of those its routed
    experts' under expert parallelism: the rank's share of them (`model` is its share,
    ModelSpec.ep_share) sharded over the `expert_ranks` ranks that hold the same ones
    (Plan.expert_shard_ranks, torchtitan's efsdp), the rest over all n; (whole shard, 0)
    without EP (`expert_ranks` 0)."""
    whole = shard_elems([s for _, s in model.block_tensors()], n)
    if not expert_ranks:
        return whole, 0
    experts = expert_shapes(model)
    expert = shard_elems(experts, expert_ranks)
    return whole - shard_elems(experts, n) + expert, expert


# ---------------------------------------------------------------------- activations
@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationSizes:
    """Activation bytes of the plan's program for one micro-batch."""

    saved_per_block: int
    """Tensors one block saves for backward."""
    block_transient: int
    """A block's backward working set, with what recomputation re-materialises."""
    root_saved: int
    """Tensors the root (embedding, final norm, output, loss) saves, those that alias the
    model's buffers excluded (they are state)."""
    loss_saved: int
    """Of root_saved, the loss's (its backward frees them)."""
    loss_working: int
    """The loss's working memory, forward or backward, whichever is larger (the floor's)."""
    loss_forward_working: int
    """Working memory of the loss forward beside its saved output."""
    head_backward_working: tuple[int, int]
    """Working memory of the loss's backward, then of the output projection's."""
    input_casts: tuple[int, ...] = ()
    """Copies one block keeps of its inputs, cast at its boundary by the program
    (zsim.analytic.activations.block_input_casts), bytes each; beside saved_per_block."""

    @property
    def held_per_block(self) -> int:
        """What one block keeps from its forward to its backward: its saved tensors and
        its inputs' casts."""
        return self.saved_per_block + sum(self.input_casts)

    def floor_bytes(self, model: ModelSpec) -> int:
        """Live when the loss's forward starts: every block's saved tensors and input
        casts, the root's saved tensors, and the loss's working memory."""
        return model.num_layers * self.held_per_block + self.root_saved + self.loss_working


def activation_sizes(model: ModelSpec, plan: Plan, *, autocast: bool) -> ActivationSizes:
    """Activation bytes (zsim.analytic.activations) for one micro-batch of `plan`;
    `autocast`: the program computes under torch.autocast with master-dtype parameters
    (it then saves casts of weights and inputs too)."""
    kw = dict(micro_batch=plan.micro_batch, seq_len=plan.seq_len,
              act_bytes=dtype_bytes(plan.param_dtype))
    root = [t for t in root_saved_tensors(model, autocast=autocast, **kw)
            if t.name not in STATE_ALIASES]
    return ActivationSizes(
        saved_per_block=block_activation_bytes(model, recompute=plan.recompute,
                                               autocast=autocast, **kw),
        block_transient=block_backward_working_bytes(model, **kw) + block_recompute_bytes(
            model, recompute=plan.recompute, autocast=autocast, **kw),
        root_saved=sum(t.bytes for t in root),
        loss_saved=sum(t.bytes for t in root if t.name.startswith(LOSS_PREFIX)),
        loss_working=loss_working_bytes(model, **kw),
        loss_forward_working=loss_forward_working_bytes(model, **kw),
        head_backward_working=head_backward_working_bytes(model, **kw),
        input_casts=tuple(t.bytes for t in block_input_casts(
            model, seq_len=plan.seq_len, act_bytes=kw["act_bytes"],
            casts_inputs=plan.casts_block_inputs)))


# ---------------------------------------------------------------------- builder
class Builder:
    """Accumulates one step's ops in the host thread's issue order."""

    def __init__(self, model: ModelSpec, hw: HardwareProfile, plan: Plan, *,
                 acts: ActivationSizes, autocast: bool) -> None:
        self.model, self.hw, self.plan = model, hw, plan
        self.ops: list[Op] = []
        self.dtype = plan.compute_dtype
        self.param_elem_bytes = dtype_bytes(plan.param_dtype)
        """Bytes per element in the plan's param_dtype: the gathered parameters, their
        autograd gradients and the activations."""
        self.stream_dtype = plan.master_dtype if autocast else plan.param_dtype
        """The residual stream's dtype: fp32 (the master dtype) when the program computes
        under autocast, which leaves the embedding, norms and residual adds alone."""
        self.shard = shard_group(plan, hw)
        self.repl = replicate_group(plan, hw)
        placement = place(plan, hw)
        self.tp = placement.group("tp")
        self.cp = placement.group("cp")
        self.ep = placement.group("ep")
        self.expert_shard = placement.group("expert_shard")
        """The ranks that hold the same routed experts and shard their state (torchtitan's
        dp_shard_mod_ep); all of the shard group without expert parallelism."""
        self.waits: list[int] = []
        """TP and CP collectives the next compute-stream op waits for (DTensor's and
        ring attention's collectives return tensors the next kernel reads)."""
        self.acts = acts
        self._algorithms: dict[tuple[str, float, CommGroup, str], Algorithm] = {}
        """The library's choice per (kind, size, group): a model's units repeat."""
        kw = dict(micro_batch=plan.micro_batch, seq_len=plan.seq_len,
                  act_bytes=self.param_elem_bytes)
        fwd = block_forward_flops(model, **kw)
        rerun = recompute_forward_flops(model, recompute=plan.recompute, **kw)
        bwd = block_backward_flops(model, **kw)
        if model.moe is not None and plan.routed_load != 1.0:
            # The busiest rank's grouped GEMMs: routed_load x the mean rows.
            extra = plan.routed_load - 1.0
            tok = dict(micro_batch=plan.micro_batch, seq_len=plan.seq_len,
                       recompute=plan.recompute)
            fwd = fwd + routed_expert_flops(model, phase="forward", **tok).scaled(extra)
            rerun = rerun + routed_expert_flops(model, phase="recompute", **tok).scaled(extra)
            bwd = bwd + routed_expert_flops(model, phase="backward", **tok).scaled(extra)
        if plan.fp8:
            bwd = with_float8_linears(bwd, fwd, phase="backward")
            rerun = with_float8_linears(rerun, rerun, phase="forward")
            fwd = with_float8_linears(fwd, fwd, phase="forward")
        self.block_fwd = fwd
        """Work of one block's forward for one micro-batch."""
        self.block_recompute = rerun
        """Work of one block's forward re-run inside its backward."""
        self.block_bwd_only = bwd
        """Work of one block's backward for one micro-batch, recomputation excluded."""
        self.block_bwd = self.block_bwd_only + self.block_recompute
        """Work of one block's backward for one micro-batch, recomputation included."""
        # Each of the plan's programs by the first of its keys the profile has.
        overhead = []
        for keys in overhead_programs(plan):
            known = [k for k in keys if k in hw.program_overhead_s]
            if known:
                overhead.append(hw.program_overhead_s[known[0]])
        tensors = len(model.block_tensors())
        self.program_host_s = {
            f"{phase}_block": self.host(sum(o[f"{phase}_block"] + tensors * o[f"{phase}_tensor"]
                                            for o in overhead))
            for phase in ("forward", "backward")} | {
            "step": self.host(sum(o["step"] for o in overhead))}
        """The plan's programs' host time beyond the profile's other figures
        (HardwareProfile.program_overhead_s), on the step's timeline: per block per
        micro-batch in forward and in backward (each the program's figure per block and
        its figure per parameter tensor times the block's tensors), and once per step
        (the end of the step, which lower charges it to); 0 on an async host."""

    def add(self, **kw: object) -> int:
        index = len(self.ops)
        if self.waits and kw.get("stream") == "compute":
            kw["after"] = (*kw.get("after", ()), *self.waits)  # type: ignore[misc]
            self.waits = []
        self.ops.append(Op(index=index, **kw))  # type: ignore[arg-type]
        return index

    def compute(self, flops: Flops) -> float:
        """Kernel time of `flops`, stretched by the profile's rank skew: every rank waits
        for the slowest at the next collective."""
        return compute_time_s(flops, self.hw, self.dtype) * (1.0 + self.hw.rank_skew)

    def host(self, seconds: float) -> float:
        """Host-thread time that lands on the step's timeline: all of it when the host
        runs the kernels itself (synchronous launch), none when it queues them on
        device streams and runs ahead (async launch; a host-bound step is not modelled)."""
        return seconds if self.hw.launch == "synchronous" else 0.0

    def copy(self, *, kind: str, nbytes: float, **kw: object) -> int:
        """A host<->device copy over this GPU's PCIe link (one direction). From or to
        pageable host memory (the plan's program does not pin its buffers) it runs at the
        profile's pageable rate: it loads the link as many times as pinned copies outrun
        pageable ones, so concurrent copies still share the link."""
        hw, load = self.hw, 1.0
        pageable = hw.pageable_pcie_bytes_per_s.get(kind)
        if pageable and not self.plan.pinned_host_buffers:
            load = max(1.0, hw.pcie_bytes_per_s * hw.pcie_efficiency / pageable)
        return self.add(kind=kind, stream=kind, size_bytes=nbytes, bus_bytes=nbytes,
                        link="pcie", link_loads=((f"pcie_{kind}", load),), **kw)

    def collective(self, *, kind: str, size_bytes: float, group: CommGroup, gname: str,
                   dtype: str | None = None, **kw: object) -> int:
        """A collective on its own stream, run with the algorithm the profile's library
        picks for its size, group and `dtype` (what a reduction adds in; default the
        plan's reduce_dtype, the gradients'; zsim.analytic.collectives.choose). On a
        synchronous host every call also takes the profile's cost of a call (collective_overhead_s),
        issued with async_op or not: gloo hands each call to its worker thread and back
        whether or not the caller waits at once, and that hand-off is most of the cost
        (calls that stall). One issued without async_op blocks the host through it
        (on_synchronous_host); an async one leaves the host to run on."""
        hw = self.hw
        call_s = self.host(hw.collective_overhead_s)
        dtype = dtype or self.plan.reduce_dtype
        key = (kind, size_bytes, group, dtype)
        algo = self._algorithms.get(key) or self._algorithms.setdefault(
            key, choose(kind, size_bytes, group, hw, dtype))
        stream = kw.pop("stream", kind)
        return self.add(kind=kind, stream=stream, size_bytes=size_bytes,
                        bus_bytes=bus_bytes(kind, size_bytes, group.ranks),
                        latency_s=algo.latency_s + call_s, algorithm=algo.name,
                        link="inter_node" if group.spans_nodes else "intra_node",
                        link_loads=algo.link_loads, group_ranks=group.ranks,
                        group=gname, **kw)

    def block_host_s(self, phase: str, blocks: int) -> float:
        """Host time of `blocks` blocks in one phase beyond their kernels, 0 on an async
        host: "forward", "recompute" (a checkpointed block's forward re-run inside its
        backward; 0 without recomputation) or "backward". Checkpointing's
        (checkpoint_host_s: its forward figure in forward, its backward figure with the
        re-run) and the programs' per block (program_host_s: the forward figure in
        forward and again in the re-run, whose hooks fire again; the backward figure in
        backward)."""
        if phase == "recompute" and self.plan.recompute == "none":
            return 0.0
        checkpoint = (self.checkpoint_host_s("forward" if phase == "forward" else "backward",
                                             blocks) if phase != "backward" else 0.0)
        part = "backward_block" if phase == "backward" else "forward_block"
        return checkpoint + self.program_host_s[part] * blocks

    def checkpoint_host_s(self, phase: str, blocks: int) -> float:
        """Host time of activation checkpointing for `blocks` blocks in one phase
        ("forward" or "backward"), beyond the kernels it re-runs: the profile's
        checkpoint_overhead_s per forward kernel of a block; 0 without recomputation,
        and on an async host."""
        if self.plan.recompute == "none":
            return 0.0
        per_kernel_s = self.host(self.hw.checkpoint_overhead_s[self.plan.recompute][phase])
        if not per_kernel_s:  # GPU profiles: no block work to count
            return 0.0
        return per_kernel_s * self.block_fwd.kernels * blocks


# ---------------------------------------------------------------------- tensor parallel
@dataclass(frozen=True, slots=True, kw_only=True)
class TpBoundary:
    """Where activations enter or leave a TP region: its collectives by (sequence
    parallel, pass), and what they carry."""

    calls: dict[tuple[bool, str], tuple[str, ...]]
    stream: bool
    """They carry the residual stream or its gradient (in Builder.stream_dtype: the
    master dtype under autocast, where the stream stays fp32), not a low-precision
    matmul's output or its gradient (the plan's param dtype)."""


TP_ENTER = TpBoundary(calls={(False, "forward"): (), (True, "forward"): ("all_gather",),
                             (False, "backward"): ("all_reduce",),
                             (True, "backward"): ("reduce_scatter",)}, stream=True)
"""Where activations enter a TP region (the input of a ColwiseParallel linear): none
forward and an all-reduce of the input gradient backward (Megatron-LM's f operator,
Shoeybi et al. 2019, Fig. 3); with sequence parallelism an all-gather forward and a
reduce-scatter backward (Korthikanti et al. 2022, Fig. 5, g-bar). The input is the
residual stream's norm, so under autocast its gradient is reduced in fp32 (DTensor
reduces a partial gradient where the input became a DTensor, before autocast's cast)."""
TP_EXIT = TpBoundary(calls={(False, "forward"): ("all_reduce",),
                            (True, "forward"): ("reduce_scatter",),
                            (False, "backward"): (), (True, "backward"): ("all_gather",)},
                     stream=False)
"""Where activations leave a TP region (the output of a RowwiseParallel linear): Megatron's
g operator, or with SP a reduce-scatter forward and an all-gather backward; the matmul's
output, low precision under autocast too."""
TP_EMBEDDING_EXIT = TpBoundary(calls=TP_EXIT.calls, stream=True)
"""The RowwiseParallel embedding's output: a lookup in the table's dtype (the master dtype
under autocast, which leaves embeddings alone), the residual stream's start."""


def tp_regions(model: ModelSpec) -> int:
    """TP regions per block, each entered and left through TpBoundary collectives: the
    attention and the MLP; no MLP region where the MoE's input stays sequence-sharded
    (MoeSpec.input_sequence_sharded: its router and routed experts work on the rank's
    shard and its output is that shard); with shared experts their TP MLP is one."""
    return 1 if model.moe is not None and model.moe.input_sequence_sharded else 2


def tensor_parallel(b: Builder, *, after: int, phase: str, regions: int, name: str,
                    mb: int, unit: int | None = None,
                    boundaries: tuple[TpBoundary, ...] = (TP_ENTER, TP_EXIT)) -> None:
    """The TP collectives of `regions` parallel regions (one attention or one MLP each:
    two per block) in `phase`, each region's `boundaries` (entry and exit by default)
    on the TP group's link, each of tp_bytes. They run on the "tp" stream after op
    `after`, the block's kernels, and the next compute kernel waits for the last: in
    the blocking case their time adds to the block's, as when
    each runs between the matmuls it sits between. Async TP (torch's micro-pipelined
    fused all-gather-matmul and matmul-reduce-scatter) starts them with the block's
    kernels, so they overlap them. Nothing with tp = 1."""
    p = b.plan
    if p.tp == 1:
        return
    deps = {"after_start": (after,)} if p.async_tp else {"after": (after,)}
    calls = [(kind, tp_bytes(b, boundary), tp_dtype(b, boundary))
             for boundary in boundaries for kind in boundary.calls[(p.sp, phase)]]
    last = None
    for _ in range(regions):
        for kind, size, dtype in calls:
            last = b.collective(kind=kind, size_bytes=size, group=b.tp, gname="tp",
                                dtype=dtype, stream="tp",
                                name=f"{name} TP {kind} {phase} (mb {mb})",
                                unit=unit, microbatch=mb, **deps)
    if last is not None:
        b.waits.append(last)


def tp_dtype(b: Builder, boundary: TpBoundary) -> str:
    """The dtype a TP boundary's collectives move (TpBoundary.stream)."""
    return b.stream_dtype if boundary.stream else b.plan.param_dtype


def tp_bytes(b: Builder, boundary: TpBoundary) -> int:
    """Bytes of each of a TP boundary's collectives: one micro-batch's whole activation
    (micro_batch x seq_len x d_model, as nccl-tests sizes it) in tp_dtype."""
    p = b.plan
    return p.micro_batch * p.seq_len * b.model.d_model * dtype_bytes(tp_dtype(b, boundary))


def logits_bytes(b: Builder) -> int:
    """One micro-batch's whole logits in the compute dtype (over ModelSpec.loss_vocab, the
    whole vocabulary under TP): what the output projection's all-gather produces."""
    p = b.plan
    return p.micro_batch * p.seq_len * b.model.loss_vocab * b.param_elem_bytes


def gather_logits(b: Builder, *, after: int, mb: int) -> None:
    """The output projection's ColwiseParallel with a replicated output (no loss
    parallelism): each rank's vocabulary shard of the logits all-gathered for the loss
    (logits_bytes) on the "tp" stream after the head's forward; the next compute kernel
    waits for it. Its backward slices the gradient back to the shard, no call. Nothing
    with tp = 1."""
    if b.plan.tp == 1:
        return
    b.waits.append(b.collective(kind="all_gather", size_bytes=logits_bytes(b), group=b.tp,
                                gname="tp", stream="tp",
                                name=f"output TP logits all_gather forward (mb {mb})",
                                microbatch=mb, after=(after,)))


def context_parallel(b: Builder, *, after: int, phase: str, blocks: int, name: str,
                     mb: int, unit: int | None = None) -> None:
    """Ring attention's K/V exchange for `blocks` blocks in `phase`, as torch's
    context_parallel runs it (_templated_ring_attention with its default all-gather
    rotater): forward, each block's local K and V all-gathered over the CP group;
    backward, gathered again and their gradients reduce-scattered back. Started with the
    block's kernels (the exchange is issued before the attention and overlaps it; here
    it may overlap the whole block) on the "cp" stream; the next kernel waits for it.
    Sizes: the whole sequence's K and V of the rank's kv heads (nccl-tests' all_gather
    output). Nothing with cp = 1."""
    p, m = b.plan, b.model
    if m.context_parallel == 1:
        return
    size = p.micro_batch * p.seq_len * m.context_parallel * 2 * m.kv_dim * b.param_elem_bytes
    kinds = ("all_gather",) if phase == "forward" else ("all_gather", "reduce_scatter")
    last = None
    for _ in range(blocks):
        for kind in kinds:
            last = b.collective(kind=kind, size_bytes=size, group=b.cp, gname="cp",
                                dtype=p.param_dtype, stream="cp",
                                name=f"{name} CP K/V {kind} {phase} (mb {mb})",
                                unit=unit, microbatch=mb, after_start=(after,))
    if last is not None:
        b.waits.append(last)


def expert_parallel(b: Builder, *, after: int, phase: str, blocks: int, name: str,
                    mb: int, unit: int | None = None) -> None:
    """Expert parallelism's all-to-alls for `blocks` MoE blocks in `phase`, as
    torchtitan's ExpertParallel runs them (all_to_all_single, blocking: the experts wait
    for their tokens and the block's output for theirs): forward a dispatch and a
    combine per block; backward the two again for their gradients, and two more in a
    fully recomputed block's re-run (selective recomputation saves their outputs:
    torchtitan's op SAC list holds all_to_all_single). On the "ep" stream after op
    `after`, the block's kernels; the next compute kernel waits for the last, so their
    time adds to the block's. Size: what one rank sends per call, its tokens x top_k x
    d_model in the compute dtype, times Plan.routed_load for the busiest rank (its
    capacity padding, or the imbalance it receives). Nothing without EP."""
    p = b.plan
    if p.ep == 1 or b.model.moe is None:
        return
    size, calls = ep_bytes(b), ep_calls(p, phase)
    last = None
    for _ in range(blocks):
        for call in calls:
            last = b.collective(kind="all_to_all", size_bytes=size, group=b.ep, gname="ep",
                                dtype=p.param_dtype, stream="ep",
                                name=f"{name} EP all-to-all {call} {phase} (mb {mb})",
                                unit=unit, microbatch=mb, after=(after,))
    if last is not None:
        b.waits.append(last)


def ep_bytes(b: Builder) -> float:
    """What one rank sends in each of expert parallelism's all-to-alls: its micro-batch's
    tokens (its sequence shard under TP, MoeSpec.token_shard) x top_k x d_model in the
    compute dtype, times Plan.routed_load (the busiest rank's share)."""
    p, m = b.plan, b.model
    assert m.moe is not None
    return (p.micro_batch * p.seq_len // m.moe.token_shard * m.moe.top_k * m.d_model
            * b.param_elem_bytes * p.routed_load)


def ep_calls(plan: Plan, phase: str) -> tuple[str, ...]:
    """Expert parallelism's all-to-alls per MoE block in `phase` (expert_parallel)."""
    calls = {"forward": ("dispatch", "combine"),
             "backward": ("combine grad", "dispatch grad")}[phase]
    if phase == "backward" and plan.recompute == "full":
        calls = ("dispatch", "combine", *calls)
    return calls


# ---------------------------------------------------------------------- shared ops
def block_forward(b: Builder, u: Unit, mb: int, *, after: tuple[int, ...] = (),
                  frees: tuple[str, ...] = (), host_s: float = 0.0) -> int:
    """The forward of unit `u`'s blocks for micro-batch mb: allocates what they keep for
    backward (`mb<mb>/<unit>/saved`: each block's input casts, then its saved tensors).
    On an async host it lasts at least `host_s`, the host's time to issue it (the
    program's own figure: the device waits for the host)."""
    flops = b.block_fwd.scaled(u.blocks)
    return b.add(
        name=f"{u.name} forward (mb {mb})", kind="forward", stream="compute", unit=u.index,
        microbatch=mb, after=after, flops=flops.total,
        compute_s=max(b.compute(flops) + b.block_host_s("forward", u.blocks), host_s),
        allocs=(Buffer(name=f"mb{mb}/{u.name}/saved", category="activations",
                       bytes=b.acts.held_per_block * u.blocks,
                       pieces=allocations.block_saved_pieces(
                           b.model, b.plan, saved_per_block=b.acts.saved_per_block,
                           blocks=u.blocks, input_casts=b.acts.input_casts)),),
        frees=frees)


def block_backward(b: Builder, u: Unit, mb: int, *, after: tuple[int, ...] = (),
                   grads: tuple[Buffer, ...] = (), frees: tuple[str, ...] = (),
                   host_s: float = 0.0) -> int:
    """The backward of unit `u`'s blocks for micro-batch mb (recomputation included):
    a working set for its duration, `grads` allocated, the saved tensors freed; at least
    `host_s` long (see block_forward)."""
    flops = b.block_bwd.scaled(u.blocks)
    work = f"mb{mb}/{u.name}/backward_working"
    transient = allocations.backward_transient_bytes(
        b.model, b.plan, saved_per_block=b.acts.saved_per_block, blocks=u.blocks,
        grad_bytes_per_param=sum(g.bytes for g in grads) / u.params if u.params else 0.0)
    return b.add(
        name=f"{u.name} backward (mb {mb})", kind="backward", stream="compute",
        unit=u.index, microbatch=mb, after=after,
        compute_s=max(b.compute(flops) + b.block_host_s("recompute", u.blocks)
                  + b.block_host_s("backward", u.blocks), host_s),
        flops=flops.total,
        allocs=(Buffer(name=work, category="activations",
                       bytes=b.acts.block_transient if transient is None else transient,
                       pieces=allocations.block_backward_pieces(
                           b.model, b.plan, saved_per_block=b.acts.saved_per_block,
                           blocks=u.blocks)),
                *grads),
        frees=(work, f"mb{mb}/{u.name}/saved", *frees))


def head_forward(b: Builder, mb: int, *, after: tuple[int, ...],
                 frees: tuple[str, ...] = (), root_post_forward: tuple[str, ...] = ()
                 ) -> int:
    """Output projection + loss forward of micro-batch mb; `frees` are freed at its end,
    `root_post_forward` (what FSDP's root post-forward frees) there too when the model
    computes its loss in its forward (ModelSpec.loss_in_forward), else at its start: the
    root's forward ends with the logits, before the step's loss."""
    head = _head_flops(b)
    acts, loss_saved = b.acts, b.acts.loss_saved
    inside = b.model.loss_in_forward
    return b.add(name=f"output+loss forward (mb {mb})", kind="forward", stream="compute",
                 microbatch=mb, after=after, compute_s=b.compute(head), flops=head.total,
                 frees_at_start=() if inside else root_post_forward,
                 allocs=(Buffer(name=f"mb{mb}/loss/fwd", category="activations",
                                bytes=acts.loss_forward_working,
                                pieces=allocations.loss_forward_pieces(
                                    b.model, b.plan, saved_per_block=acts.saved_per_block)),
                         Buffer(name=f"mb{mb}/root/saved", category="activations",
                                bytes=acts.root_saved - loss_saved,
                                pieces=allocations.root_saved_pieces(
                                    b.model, b.plan, root_saved=acts.root_saved - loss_saved,
                                    loss=False)),
                         Buffer(name=f"mb{mb}/loss/saved", category="activations",
                                bytes=loss_saved,
                                pieces=allocations.root_saved_pieces(
                                    b.model, b.plan, root_saved=loss_saved, loss=True))),
                 frees=(f"mb{mb}/loss/fwd", *frees, *(root_post_forward if inside else ())))


def head_backward(b: Builder, mb: int, *, after: tuple[int, ...] = (),
                  grads: tuple[Buffer, ...] = (), frees: tuple[str, ...] = (),
                  root_pre_backward: Callable[..., object] | None = None,
                  forward: int | None = None) -> int:
    """Loss backward, then output projection backward, of micro-batch mb (together twice
    the forward's work); returns the second. A hook on the root module's output (FSDP's
    root pre-backward) runs when that output's gradient exists: `root_pre_backward(
    after=op)` adds its ops, issued after op. A model that computes its loss in its
    forward (ModelSpec.loss_in_forward: zsim.backend.reference_model, as Hugging Face models
    given labels do) outputs the loss, whose gradient exists first: the hook runs as the
    backward starts, after the head's `forward` op. One that outputs the logits
    (torchtitan, whose step computes the loss) gets their gradient from the loss's
    backward: the hook runs after it, before the output projection's backward."""
    loss_flops, output_flops = head_backward_flops(
        b.model, micro_batch=b.plan.micro_batch, seq_len=b.plan.seq_len,
        act_bytes=b.param_elem_bytes)
    acts, kw = b.acts, dict(saved_per_block=b.acts.saved_per_block)
    loss_bytes, output_bytes = acts.head_backward_working
    if root_pre_backward is not None and b.model.loss_in_forward:
        assert forward is not None, "the hook follows the head's forward"
        root_pre_backward(after=forward)
    loss = b.add(name=f"loss backward (mb {mb})", kind="backward", stream="compute",
                 microbatch=mb, after=after, compute_s=b.compute(loss_flops),
                 flops=loss_flops.total,
                 allocs=(Buffer(name=f"mb{mb}/loss/bwd", category="activations",
                                bytes=loss_bytes,
                                pieces=allocations.loss_backward_pieces(b.model, b.plan, **kw)),),
                 frees=(f"mb{mb}/loss/bwd", f"mb{mb}/loss/saved"))
    if root_pre_backward is not None and not b.model.loss_in_forward:
        root_pre_backward(after=loss)
    return b.add(name=f"output backward (mb {mb})", kind="backward", stream="compute",
                 microbatch=mb, after=(loss,), compute_s=b.compute(output_flops),
                 flops=output_flops.total,
                 allocs=(Buffer(name=f"mb{mb}/output/bwd", category="activations",
                                bytes=output_bytes,
                                pieces=allocations.output_backward_pieces(
                                    b.model, b.plan, **kw)),
                         *grads),
                 frees=(f"mb{mb}/output/bwd", f"mb{mb}/root/saved", *frees))


def _head_flops(b: Builder) -> Flops:
    return head_forward_flops(b.model, micro_batch=b.plan.micro_batch, seq_len=b.plan.seq_len,
                              act_bytes=b.param_elem_bytes)


def device_optimizer(b: Builder, *, after: tuple[int, ...], frees: tuple[str, ...],
                     local_params: float, tensors: int, master_bytes: int,
                     grad_bytes: int, dtensor: bool = False,
                     tensor_elems: tuple[int, ...] = (), fused: bool = False,
                     unscales: bool = True) -> int:
    """AdamW/SGD on the device over `local_params` parameters in `tensors` tensors:
    memory-bound, reads and writes the master weights (or the params without a master
    copy) and the optimizer states, reads the `grad_bytes`-wide gradient, and writes the
    compute-dtype params when a master copy exists (traffic and kernels counted by
    zsim.analytic.compute.optimizer_flops); frees `frees` when done. On an async host the
    host issues it op by op (`optimizer_host_s`, nothing else queued ahead of it) while
    the device runs the ops already issued: a two-stage pipeline over the optimizer's
    foreach ops, max(host, device) + min(host, device) / ops. `tensor_elems`: the
    elements of each parameter tensor the optimizer steps, when it holds one state
    tensor per parameter (the pieces of its working memory). `fused`: DeepSpeed's
    FusedAdam, one pass and one op with no working memory (optimizer_flops).
    `unscales`: fp16 gradients are unscaled and checked here (loss_scaling_flops); False
    where the program does it in ops of its own (DeepSpeed's step)."""
    p = b.plan
    seconds = b.compute(optimizer_flops(
        local_params, optimizer=p.optimizer, tensors=tensors, master_bytes=master_bytes,
        state_bytes_per_param=optimizer_bytes_per_param(p), grad_bytes=grad_bytes,
        param_copy_bytes=b.param_elem_bytes if p.has_master_copy else 0,
        foreach=b.hw.foreach_kernels, fused=fused)
        + (loss_scaling_flops(p, local_params, tensors=tensors, grad_bytes=grad_bytes,
                              foreach=b.hw.foreach_kernels) if unscales
           else Flops(matmul=0.0, attention=0.0)))
    if b.hw.launch == "async":
        host = optimizer_host_s(b.hw, tensors, dtensor=dtensor)
        ops = len(ADAMW_FOREACH_DEPTHS) if p.optimizer == "adamw" and not fused else 1
        seconds = max(seconds, host) + min(seconds, host) / ops
    temp = () if fused else optimizer_temporaries(p, local_params, tensor_elems)
    return b.add(name="optimizer step", kind="optimizer", stream="compute",
                 microbatch=p.grad_accum - 1, after=after, compute_s=seconds,
                 allocs=temp, frees=frees + tuple(t.name for t in temp))


def loss_scaling_flops(plan: Plan, local_params: float, *, tensors: int,
                       grad_bytes: int, foreach: str = "per_tensor") -> Flops:
    """fp16's dynamic loss scaling before the step: the scaler unscales the gradients and
    checks them for inf/NaN in one foreach pass (torch.amp's
    _amp_foreach_non_finite_check_and_unscale_, DeepSpeed's overflow check folded into
    its unscale): each gradient element read and written once. It keeps no extra copy.
    None for other precisions."""
    if plan.param_dtype != "fp16":
        return Flops(matmul=0.0, attention=0.0)
    return Flops(matmul=0.0, attention=0.0, memory_bytes=2.0 * local_params * grad_bytes,
                 kernels=float(foreach_launches(local_params, tensors, 1, foreach)))


def optimizer_host_s(hw: HardwareProfile, tensors: int, *, dtensor: bool) -> float:
    """Host time of an optimizer step over `tensors` parameter tensors, plain or DTensors
    (the profile's optimizer_tensor_s)."""
    return tensors * hw.optimizer_tensor_s["dtensor" if dtensor else "plain"]


def optimizer_temporaries(plan: Plan, local_params: float,
                          tensor_elems: tuple[int, ...] = ()) -> tuple[Buffer, ...]:
    """Working memory of the foreach optimizer step: torch.optim's _multi_tensor_adam
    builds one new list, exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sq) (the size of the
    second moment, one tensor per parameter of `tensor_elems` when given), and updates
    everything else in place; foreach SGD works in place."""
    if plan.optimizer != "adamw":
        return ()
    elems, state = math.ceil(local_params), dtype_bytes(plan.optimizer_state_dtype)
    pieces = tuple(e * state for e in tensor_elems) if sum(tensor_elems) == elems else ()
    return (Buffer(name="optimizer/exp_avg_sq_sqrt", category="optimizer_states",
                   bytes=elems * state, pieces=pieces),)


def host_optimizer(b: Builder, *, after: tuple[int, ...], frees: tuple[str, ...],
                   local_params: float, tensors: int = 0, dtensor: bool = False,
                   program: str = "torch") -> int:
    """Offloaded step (ZeRO-Offload, Ren et al. 2021, Sec. 4): CPU AdamW on the local shard
    at one rank's host rate of the `program`'s optimizer
    (HardwareProfile.rank_host_adam_params_per_s: torch's AdamW, or DeepSpeedCPUAdam; its
    share of the node's cores), plus the host's per-tensor cost of the step over `tensors`
    parameter tensors; with optimizer offload the updated compute-dtype shard is copied
    back to the GPU (parameter offload keeps it on the host until the next all-gather
    copies it in)."""
    p, hw = b.plan, b.hw
    seconds = (local_params / hw.rank_host_adam_params_per_s(program)
               + optimizer_host_s(hw, tensors, dtensor=dtensor))
    step = b.add(name="optimizer step (host)", kind="optimizer", stream="host",
                 microbatch=p.grad_accum - 1, after=after, compute_s=seconds, frees=frees)
    if p.offload != "optimizer":
        return step
    return b.copy(kind="h2d", nbytes=math.ceil(local_params) * b.param_elem_bytes,
                  name="params to GPU", microbatch=p.grad_accum - 1, after=(step,))


def root_split(model: ModelSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Elements of the root's parameters whose gradients the head's backward produces
    (final norm, output) and those the embedding's backward produces, in module order."""
    head, emb = [], []
    for name, shape in model.root_tensors():
        (head if name.startswith(("norm.", "output.")) else emb).append(math.prod(shape))
    return tuple(head), tuple(emb)


def pack_whole_tensors(numels: Iterable[int], cap: int, *, pending: int = 0) -> list[int]:
    """Buckets of whole tensors, as DDP's _compute_bucket_assignment_by_size fills them:
    each tensor joins the open bucket, which closes once it holds `cap` elements or more.
    Returns the closed buckets' sizes followed by what the open bucket holds (starting
    from `pending`), in elements."""
    out = []
    for numel in numels:
        pending += numel
        if pending >= cap:
            out.append(pending)
            pending = 0
    return [*out, pending]


def on_synchronous_host(ops: list[Op], sync_s: float = 0.0) -> tuple[Op, ...]:
    """The ops as a host that runs its kernels itself issues them: in issue order, each
    op only once the host has finished every earlier op it ran or waited for (kernels,
    copies, the host optimizer step, collectives issued without async_op); an async
    collective (DDP's buckets) returns a Work at once and overlaps what follows. The
    issue points of an async host (after_start: run-ahead) do not exist here. A blocking
    collective the ranks reach from model compute (synchronising) also takes `sync_s`
    (HardwareProfile.sync_overhead_s) in its latency."""
    out: list[Op] = []
    last: int | None = None
    for op, syncs in zip(ops, synchronising(ops), strict=True):
        if syncs and sync_s:
            op = op._replace(latency_s=op.latency_s + sync_s)
        out.append(op._replace(after_start=(), issue_after=() if last is None else (last,)))
        if not op.async_op:
            last = op.index
    return tuple(out)


def synchronising(ops: Sequence[Op]) -> list[bool]:
    """Per op in issue order, whether it is a blocking collective (issued without
    async_op) with model compute (a compute-stream op with FLOPs: a block, the output
    projection and loss) issued since the host's previous blocking collective. The ranks
    reach such a call apart, each after its own stretch of compute; a call straight
    after another (a bucket after a bucket, with only copies between) finds them
    together."""
    out = []
    computed = False
    for op in ops:
        blocking = op.is_collective and not op.async_op
        out.append(blocking and computed)
        if blocking:
            computed = False
        elif op.stream == "compute" and op.flops > 0:
            computed = True
    return out
