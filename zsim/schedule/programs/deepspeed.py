"""DeepSpeed ZeRO stages 1, 2 and 3 as DeepSpeed 0.19 runs them (impl "deepspeed"), with
the engine's bf16 mode (the module in bf16, DeepSpeedZeroOptimizer / _Stage3 holding fp32
master partitions) and a fused Adam over flat partitions.

Read from deepspeed/runtime/zero/stage_1_and_2.py, stage3.py,
partitioned_param_coordinator.py and partition_parameters.py; the knobs are
zsim.spec.deepspeed.DeepSpeedZero.

Stages 1 and 2 (DeepSpeedZeroOptimizer):
- State: the 16-bit parameters flattened into one buffer, padded to a multiple of
  2 x N elements, on every rank; the rank's fp32 partition of it (master) and its Adam
  moments.
- Backward: each parameter's gradient (param dtype) is copied, as it is produced, into
  the ipg bucket buffer (`reduce_bucket_size` elements, allocated for each backward, two
  with overlap_comm); a bucket that would overflow is reduced first: divided by the
  world size in place, flattened (a copy) and all-reduced
  (use_multi_rank_bucket_allreduce, the default), and each rank copies its
  partition's slice into a contiguous partition buffer (contiguous_gradients). Stage 2
  does this in its gradient hooks on every micro-batch, so mid-block (the block's
  backward op is cut at each such hook), and the copied gradients are freed at once;
  stage 1 keeps the full gradients and reduces them all at the end of the last
  micro-batch's backward. Without overlap_comm (stages 1 and 2 by default) the
  reduction runs on the compute stream: backward waits for it.
- Step: the partition's gradients scanned for inf/NaN and their fp32 norms taken, the
  flag and the norm all-reduced (two blocking scalar calls); the gradients flattened (a
  copy) and cast to fp32, scaled by the clip factor (`gradient_clipping`), Adam updates
  the fp32 partition (offloaded: DeepSpeedCPUAdam on the host, the 16-bit partition
  copied back), which is copied into the rank's slice of the 16-bit buffer, and the
  16-bit parameters are
  all-gathered in one call into the flat buffer (after backward: exposed;
  all_gather_dp_groups ignores `allgather_bucket_size` where torch has
  all_gather_into_tensor), with or without offload.
- With `offload_optimizer` (cpu_offload): no partition buffer on the GPU; each reduced
  bucket's slice of the rank's partition is copied to the host's fp32 gradient partition
  as it comes: at the accumulation boundary its norms and inf/NaN check taken and cast to
  fp32 on the device first (copy_grads_in_partition), before it 16-bit, to be
  accumulated on the host.
Stage 3 (DeepSpeedZeroOptimizer_Stage3):
- State: each parameter partitioned into ceil(numel / N) elements (parameters of at most
  `param_persistence_threshold` elements stay whole on every rank), fp32 master
  partitions and Adam moments, a persistent gradient partition buffer (grad accumulation
  dtype = param dtype) and the ipg bucket buffer (`reduce_bucket_size` elements, kept).
- Parameters are fetched per submodule (each linear, norm and embedding) by the
  coordinator replayed in zsim.schedule.programs.deepspeed_fetch: on demand in its
  pre-hook, prefetched ahead up to `prefetch_bucket_size` elements, released after use
  unless reused within `max_reuse_distance` elements; each fetch is one coalesced
  all-gather whose flat buffer lives until the last of its parameters is released. With
  recomputation a block's parameters are fetched again when its forward is re-run.
- Gradients: each parameter's gradient goes into the bucket as it is produced; a full
  bucket is copied into one flat buffer and divided by the world size in place
  (reduce_scatter_coalesced), reduce-scattered on a side stream (overlap_comm, the
  stage-3 default) and the rank's partition accumulated into the gradient partition
  buffer, on every micro-batch.
- Step: each parameter's gradient partition's norm taken and the norm all-reduced (fp16
  scans the flat partition for inf/NaN and all-reduces the flag first); per sub-group,
  fp32 gradients cast from the partition buffer, scaled by the clip factor, Adam, fp32 ->
  16-bit partitions; then every persistent
  parameter's partition all-gathered again, one call each (_post_step), which at
  thousands of ranks is a latency-bound tail of one ring per norm and bias.
Offload: the step is zsim.schedule.build.host_optimizer; what stays on the device is
state_at_rest_bytes's, what goes to the host host_state_bytes's (each read from the
buffers stage_1_and_2.py and stage3.py allocate on the offload device).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from zsim.analytic.allocations import module_order
from zsim.analytic.compute import Flops
from zsim.analytic.memory import optimizer_bytes_per_param
from zsim.schedule.build import (
    Builder,
    Shapes,
    Unit,
    block_backward,
    block_forward,
    device_optimizer,
    expert_parallel,
    expert_shapes,
    head_backward,
    head_forward,
    host_optimizer,
    root_split,
)
from zsim.schedule.ops import Buffer, Op
from zsim.schedule.programs import Program
from zsim.schedule.programs.deepspeed_fetch import FetchStep, Param, replay
from zsim.spec.deepspeed import ZERO_STAGES, DeepSpeedZero
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes

NCCL_START_ALIGNMENT = 2
"""Stages 1/2 pad the flat 16-bit buffer to a multiple of 2 x N elements (4-byte
aligned all-gather send buffers: nccl_start_alignment_factor)."""


def _zero(plan: Plan) -> DeepSpeedZero:
    """The plan's ZeRO settings (Plan.options of a deepspeed plan)."""
    return plan.options_as(DeepSpeedZero)


def _stage(plan: Plan) -> int:
    return ZERO_STAGES[plan.strategy]


def _flat_groups(model: ModelSpec, plan: Plan) -> tuple[tuple[int, int], ...]:
    """Stages 1/2: each parameter group's flat 16-bit buffer, (elements padded to 2 x its
    ranks, the ranks it is partitioned over): the model over dp_shard; under expert
    parallelism (DeepSpeed-MoE) the rank's routed experts are a group of their own,
    partitioned over the expert-data-parallel ranks, dp_shard / ep
    (_configure_moe_settings: partition_count of an MoE group)."""
    n = plan.dp_shard
    experts = _expert_elems(model) if plan.ep > 1 else 0
    groups = [(model.num_params - experts, n)]
    if experts:
        groups.append((experts, n // plan.ep))
    return tuple((-(-elems // (NCCL_START_ALIGNMENT * r)) * NCCL_START_ALIGNMENT * r, r)
                 for elems, r in groups)


def _flat_elems(model: ModelSpec, plan: Plan) -> int:
    """Stages 1/2: elements of the flat 16-bit buffers (_flat_groups)."""
    return sum(elems for elems, _ in _flat_groups(model, plan))


def _expert_elems(model: ModelSpec) -> int:
    """Elements of the rank's routed experts over every block (its EP share's)."""
    return model.num_layers * sum(math.prod(s) for s in expert_shapes(model))


def _expert_flags(model: ModelSpec, blocks: int) -> tuple[bool, ...]:
    """Which of `blocks` blocks' tensors (module order) are routed experts."""
    return tuple(n.startswith("moe.experts.") for n, _ in model.block_tensors()) * blocks


def _persistent(numel: int, plan: Plan) -> bool:
    return numel <= _zero(plan).param_persistence_threshold


def shard_elems(shapes: Shapes, n: int) -> int:
    """Stage 3: ceil(numel / N) elements of each parameter (partition_numel)."""
    return sum(-(-math.prod(s) // n) for s in shapes)


def _partition_elems(model: ModelSpec, plan: Plan) -> int:
    """Elements of the rank's partition of the model: the fp32 master and moment size."""
    if _stage(plan) == 3:
        return _stage3_elems(model, plan.dp_shard, _zero(plan).param_persistence_threshold)[0]
    return sum(elems // r for elems, r in _flat_groups(model, plan))


@lru_cache(maxsize=64)
def _stage3_elems(model: ModelSpec, n: int, persistence_threshold: int) -> tuple[int, int, int]:
    """Stage 3 on n ranks: (elements of the rank's partition of the model, elements of
    its 16-bit parameters on the device: each parameter's partition, persistent ones
    whole, elements of the persistent parameters). A walk over every parameter, asked
    for several times per plan (memory floor, lowering, the planner's row), so worked
    out once per model and degree."""
    part = params = persistent = 0
    for _, shape in model.parameter_tensors():
        numel = math.prod(shape)
        shard = shard_elems([shape], n)
        part += shard
        params += numel if numel <= persistence_threshold else shard
        persistent += numel if numel <= persistence_threshold else 0
    return part, params, persistent


def _sub_groups(model: ModelSpec, plan: Plan) -> list[int]:
    """Elements of each sub-group the ZeRO-3 optimizer steps on, as stage3.py's
    _create_fp16_sub_groups forms them: whole parameter partitions in order, a group
    closed once it holds sub_group_size elements (so never more groups than parameters);
    one group when the partition is no larger than sub_group_size."""
    groups: list[int] = []
    elems = 0
    for _, shape in model.parameter_tensors():
        elems += shard_elems([shape], plan.dp_shard)
        if elems >= _zero(plan).sub_group_size:
            groups.append(elems)
            elems = 0
    return [*groups, elems] if elems or not groups else groups


def _largest_param(model: ModelSpec) -> int:
    """Elements of the model's largest parameter tensor."""
    return max(math.prod(shape) for _, shape in model.parameter_tensors())


def host_state_bytes(model: ModelSpec, plan: Plan) -> float:
    """Host memory of ZeRO-Offload between steps, as DeepSpeed 0.19 allocates it on the
    offload device (`self.device` = cpu with offload_optimizer). Every stage: the fp32
    master partition, its fp32 gradient (stages 1/2: the partition's .grad, allocated at
    init; stage 3: one per sub-group, initialize_optimizer_states) and
    DeepSpeedCPUAdam's moments (fp32, created at the first step). Stages 1/2
    (stage_1_and_2.py) add a 16-bit copy of the partition that the updated parameters
    go back through (param_buffer_of_bit16_for_cpu_offload_groups), the host staging
    buffer of the largest parameter's gradient (temp_grad_buffer_for_cpu_offload) and,
    with gradient accumulation, a 16-bit buffer per parameter of the partition, whole
    (accumulated_grads_in_cpu: _accumulated_grads_elems). Stage 3 (stage3.py) adds the
    gradient partition buffer (grad_partitions_flat_buffer, in the gradient
    accumulation dtype: the parameters', DeepSpeed's default) and, with offload_param,
    the 16-bit partitions themselves (param_groups_fp16_flat_cpu_memory). That is
    18 bytes per parameter per rank (stage 3 with offload_param 20) where DeepSpeed's
    estimators (estimate_zero2/3_model_states_mem_needs) count 16 (18): they predate
    the 16-bit buffers and leave out the staging buffers."""
    if plan.offload == "none":
        return 0.0
    a, m = dtype_bytes(plan.param_dtype), _master_bytes(plan)
    part = float(_partition_elems(model, plan))
    held = part * (m + m + optimizer_bytes_per_param(plan)) + part * a
    if _stage(plan) == 3:
        return held + (part * a if plan.offload == "params" else 0.0)
    return (held + float(_largest_param(model)) * a
            + float(_accumulated_grads_elems(model, plan)) * a)


def _accumulated_grads_elems(model: ModelSpec, plan: Plan) -> int:
    """Stages 1/2 with the optimizer offloaded and gradient accumulation: elements of
    the host buffers that hold each parameter's accumulated gradient between
    micro-batches (async_accumulate_grad_in_cpu_via_gpu: one of the parameter's whole
    size for every parameter of the rank's partition, get_partition_info's
    params_in_partition, kept from the first step on), on the rank that holds the most.
    None without accumulation (a lone backward skips them)."""
    if plan.grad_accum == 1:
        return 0
    part = _flat_elems(model, plan) // plan.dp_shard
    # A rank holds every parameter it overlaps. A parameter's first and last ranks may
    # hold others too; a rank strictly between them holds only it.
    held: dict[int, int] = {}
    most = start = 0
    for shape in module_order(model):
        numel = math.prod(shape)
        first, last = start // part, (start + numel - 1) // part
        for rank in {first, last}:
            held[rank] = held.get(rank, 0) + numel
        if last - first > 1:
            most = max(most, numel)
        start += numel
    return max(most, *held.values())


def _master_bytes(plan: Plan) -> int:
    return dtype_bytes(plan.master_dtype if plan.has_master_copy else plan.param_dtype)


def state_at_rest_bytes(model: ModelSpec, plan: Plan) -> dict[str, float]:
    """Stages 1/2: the flat 16-bit parameters, and the fp32 partition and its moments
    (offloaded: the flat parameters and the gradient staging buffer, see host_state_bytes).
    Stage 3: the 16-bit partitions (persistent parameters whole), the fp32 partitions and
    moments, the gradient partition buffer and the ipg bucket buffer; offloaded, the
    16-bit partitions (offload_param: only the persistent parameters, whole) and the ipg
    bucket buffer (the rest is host state, see host_state_bytes)."""
    a = dtype_bytes(plan.param_dtype)
    if plan.offload == "optimizer" and _stage(plan) < 3:
        # stage_1_and_2.py with cpu_offload: the flat 16-bit parameters stay, and one
        # device staging buffer of the largest parameter's size for its gradient
        # (temp_grad_buffer_for_gpu_offload); the rest is host state.
        return {"params": float(_flat_elems(model, plan)) * a,
                "comm_buffers": float(_largest_param(model)) * a}
    part = float(_partition_elems(model, plan))
    out: dict[str, float] = {}
    if plan.offload == "none":
        out["optimizer_states"] = part * optimizer_bytes_per_param(plan)
        if plan.has_master_copy:
            out["master_params"] = part * _master_bytes(plan)
    if _stage(plan) < 3:
        out["params"] = float(_flat_elems(model, plan)) * a
        return out
    _, params, persistent = _stage3_elems(model, plan.dp_shard,
                                          _zero(plan).param_persistence_threshold)
    # stage3.py: with offload_optimizer the gradient partitions live on self.device (the
    # host); the ipg bucket stays on the accelerator (_setup_for_real_optimizer). With
    # offload_param the partitions are in host memory and only persistent parameters,
    # gathered whole, stay.
    out["params"] = float(persistent if plan.offload == "params" else params) * a
    if plan.offload == "none":
        out["grads"] = part * a
    if _zero(plan).contiguous_gradients:
        out["comm_buffers"] = float(_zero(plan).reduce_bucket_size) * a
    return out


def gathered_floor_bytes(model: ModelSpec, plan: Plan) -> float:
    """Nothing gathered is certain to be live at the loss's forward: stage 3 releases
    what it fetched unless reused soon (the replay decides)."""
    return 0.0


# ---------------------------------------------------------------------- stages 1 and 2
class _Stage1And2Step:
    """One step of ZeRO stage 1 or 2 (DeepSpeedZeroOptimizer, stage_1_and_2.py)."""

    def __init__(self, b: Builder) -> None:
        self.builder = b
        p = b.plan
        self.stage = _stage(p)
        self.overlap = _zero(p).overlaps(self.stage)
        self.part = _partition_elems(b.model, p)
        self.buckets = 0
        self.bucket_elems = 0
        self.bucket_expert_elems = 0
        """Of bucket_elems, routed experts' (expert parallelism): reduced over their own
        expert-data-parallel group."""
        self.bucket_grads: list[str] = []
        """Stage 1: the gradients in the open bucket, freed when it is reduced."""
        self.last_reduce: int | None = None
        self.partition_grads = "grads_in_partition"
        self.have_partition = False
        self.held: list[tuple[tuple[int, ...], str | None, tuple[bool, ...]]] = []
        """Stage 1: the gradients held until the last micro-batch's reduction."""
        self.boundary = True
        """The backward being lowered is the last micro-batch's."""

    def lower(self, root: Unit, blocks: list[Unit]) -> None:
        b, p = self.builder, self.builder.plan
        head_numels, emb_numels = root_split(b.model)
        epilogues: list[int] = []
        for mb in range(p.grad_accum):
            self.boundary = mb == p.grad_accum - 1
            reduces = self.stage == 2 or self.boundary
            emb = b.add(name=f"embedding forward (mb {mb})", kind="forward", stream="compute",
                        microbatch=mb)
            fwd = []
            for u in blocks:
                fwd.append(block_forward(b, u, mb))
                expert_parallel(b, after=fwd[-1], phase="forward", blocks=u.blocks,
                                name=u.name, mb=mb, unit=u.index)
            head_forward(b, mb, after=(fwd[-1] if fwd else emb,))
            buckets = self.bucket_buffers(mb) if reduces else ()
            grads = self.grads(head_numels, mb, "head")
            op = head_backward(b, mb, grads=(*grads, *buckets))
            self.ready(head_numels, grads, op)
            for u in reversed(blocks):
                self.unit_backward(u, mb)
            grads = self.grads(emb_numels, mb, "embedding")
            op = b.add(name=f"embedding backward (mb {mb})", kind="backward", stream="compute",
                       microbatch=mb, after=self.waits(), allocs=grads)
            self.ready(emb_numels, grads, op)
            if reduces:
                if self.stage == 1:  # reduce_gradients at the end of the last backward
                    for numels, name, experts in self.held:
                        self.bucket_add(numels, name, op, experts)
                self.flush(op)
            epilogues.append(b.add(
                name=f"backward epilogue (mb {mb})", kind="backward", stream="compute",
                microbatch=mb, after=(self.last_reduce,) if self.last_reduce is not None else (),
                frees=tuple(x.name for x in buckets)))
        self.optimizer(tuple(epilogues))

    def unit_backward(self, u: Unit, mb: int) -> None:
        """Unit u's backward and its gradients' hooks. Stage 2 reduces a bucket in the
        hook of the gradient that overflows it, while the block's backward runs: the op
        is cut there, each piece the matmul share of the submodules whose gradients
        exist by then (the shares stage 3's calls take), so that the reduction follows
        the compute that produced its gradients; the first piece allocates what the
        whole op does, the last frees it. Stage 1 holds the gradients (ready)."""
        b = self.builder
        grads = self.grads(u.tensors, mb, u.name)
        op = block_backward(b, u, mb, after=self.waits(), grads=grads)
        if self.stage == 1:
            self.ready(u.tensors, grads, op, _expert_flags(b.model, u.blocks))
            expert_parallel(b, after=op, phase="backward", blocks=u.blocks, name=u.name,
                            mb=mb, unit=u.index)
            return
        whole, done = b.ops[op], 0.0
        for numel, produced, expert in _backward_order(b.model, u.blocks):
            if self.bucket_elems and self.bucket_elems + numel > _zero(b.plan).reduce_bucket_size:
                share = produced - done
                b.ops[op] = b.ops[op]._replace(compute_s=whole.compute_s * share,
                                               flops=whole.flops * share, frees=())
                self.flush(op)
                op = b.add(name=f"{whole.name} after bucket {self.buckets - 1}",
                           kind="backward", stream="compute", unit=u.index, microbatch=mb,
                           after=self.waits(), compute_s=whole.compute_s * (1.0 - produced),
                           flops=whole.flops * (1.0 - produced), frees=whole.frees)
                done = produced
            self.bucket_elems += numel
            self.bucket_expert_elems += numel if expert else 0
        if grads:  # copied into the bucket by the hooks: the gradients go
            b.ops[op] = _with_frees(b.ops[op], grads[0].name)
        expert_parallel(b, after=op, phase="backward", blocks=u.blocks, name=u.name, mb=mb,
                        unit=u.index)

    def waits(self) -> tuple[int, ...]:
        """Without overlap_comm the reduction ran on the compute stream: what follows
        waits for it."""
        return (self.last_reduce,) if self.last_reduce is not None and not self.overlap else ()

    def grads(self, numels: tuple[int, ...], mb: int, part: str) -> tuple[Buffer, ...]:
        """The autograd gradients a backward op allocates (param dtype): each micro-batch
        for stage 2 (they move into the bucket); stage 1 accumulates into the first
        micro-batch's."""
        if not sum(numels) or (self.stage == 1 and mb > 0):
            return ()
        return (Buffer(name=f"mb{mb}/{part}/grad", category="gathered_grads",
                       bytes=sum(numels) * self.builder.param_elem_bytes),)

    def ready(self, numels: tuple[int, ...], grads: tuple[Buffer, ...], op: int,
              experts: tuple[bool, ...] = ()) -> None:
        """`op` produced gradients of these sizes (module order; `experts` flags the
        routed experts' among them)."""
        name = grads[0].name if grads else None
        if self.stage == 1:
            if name is not None:
                self.held.append((numels, name, experts))
            return
        self.bucket_add(numels, None, op, experts)
        if name is not None:  # copied into the bucket by the hook: the gradient goes
            self.builder.ops[op] = _with_frees(self.builder.ops[op], name)

    def bucket_add(self, numels: tuple[int, ...], grad: str | None, op: int,
                   experts: tuple[bool, ...] = ()) -> None:
        """Gradients join the bucket in reverse module order; a bucket that would
        overflow is reduced first. `experts` flags the routed experts' (none: no flags)."""
        flags = experts or (False,) * len(numels)
        for numel, expert in zip(reversed(numels), reversed(flags), strict=True):
            if (self.bucket_elems
                    and self.bucket_elems + numel > _zero(self.builder.plan).reduce_bucket_size):
                self.flush(op)
            self.bucket_elems += numel
            self.bucket_expert_elems += numel if expert else 0
        if grad is not None:
            self.bucket_grads.append(grad)

    def bucket_buffers(self, mb: int) -> tuple[Buffer, ...]:
        """The ipg bucket buffer(s): allocated by the first gradient hook of a backward
        that reduces (setup_buckets), released at its end."""
        p = self.builder.plan
        if not _zero(p).contiguous_gradients:
            return ()
        return tuple(Buffer(name=f"mb{mb}/ipg_bucket/{i}", category="comm_buffers",
                            bytes=_zero(p).reduce_bucket_size * self.builder.param_elem_bytes)
                     for i in range(2 if self.overlap else 1))

    def flush(self, after: int) -> None:
        """One bucket: divided by the world size and flattened (_divide_and_flatten) and
        all-reduced, the rank's
        slice copied into the partition buffer (allocated by the first bucket), or with
        optimizer offload to the host's gradient partition: at the accumulation boundary
        copy_grads_in_partition takes each of the slice's gradients' norm and checks it
        for inf/NaN on the device as step() does without offload (_checks), casts it to
        fp32 and copies that to the host (its share of the partition's tensors, by
        elements); before the boundary the 16-bit slice goes to the host to be
        accumulated there."""
        elements = self.bucket_elems
        if not elements:
            return
        b, p = self.builder, self.builder.plan
        r = dtype_bytes(p.reduce_dtype)
        stream = "all_reduce" if self.overlap else "compute"
        allocs = []
        offload = p.offload == "optimizer"
        if not self.have_partition and _zero(p).contiguous_gradients and not offload:
            allocs.append(Buffer(name=self.partition_grads, category="grads",
                                 bytes=self.part * b.param_elem_bytes))
            self.have_partition = True
        i = self.buckets
        self.buckets += 1
        flat = f"bucket {i}/flat"
        copy = _divide_and_flatten(elements, b.param_elem_bytes, r)
        first = b.add(name=f"bucket {i} flatten", kind="backward", stream=stream, unit=i,
                      microbatch=p.grad_accum - 1, after=(after,), compute_s=b.compute(copy),
                      frees_at_start=tuple(self.bucket_grads),
                      allocs=(*allocs, Buffer(name=flat, category="comm_buffers",
                                              bytes=elements * r)))
        # dist.all_reduce without async_op (allreduce_bucket): overlap_comm overlaps it
        # through the reduction stream, so a synchronous host blocks in it either way.
        # Under expert parallelism the routed experts' slices go in a second all-reduce
        # over their expert-data-parallel group (average_tensor's buckets by group).
        dense, experts = elements - self.bucket_expert_elems, self.bucket_expert_elems
        coll = first
        for part, group, gname, what in ((dense, b.shard, "shard", ""),
                                         (experts, b.expert_shard, "expert_shard",
                                          " (experts)")):
            if part:
                coll = b.collective(kind="all_reduce", size_bytes=part * r, group=group,
                                    gname=gname, name=f"bucket {i} all-reduce{what}",
                                    unit=i, microbatch=p.grad_accum - 1, after=(coll,))
        if offload and not self.boundary:
            self.last_reduce = b.copy(kind="d2h",
                                      nbytes=math.ceil(elements / p.dp_shard) * b.param_elem_bytes,
                                      name=f"bucket {i} partition to host", unit=i,
                                      microbatch=p.grad_accum - 1, after=(coll,), frees=(flat,))
        elif offload:
            elems, m = math.ceil(elements / p.dp_shard), _master_bytes(p)
            tensors = _partition_tensors(b.model, p.dp_shard) * elements / b.model.num_params
            work = (_norm_scan(elems, tensors, b.param_elem_bytes)
                    + _pass(elems * (b.param_elem_bytes + m), tensors))
            if _zero(p).scans_for_overflow(self.stage, p.param_dtype):
                work = work + _overflow_scan(elems, tensors, b.param_elem_bytes)
            prep = b.add(name=f"bucket {i} norms and fp32 cast", kind="backward",
                         stream=stream, unit=i, microbatch=p.grad_accum - 1, after=(coll,),
                         compute_s=b.compute(work))
            self.last_reduce = b.copy(kind="d2h", nbytes=elems * m,
                                      name=f"bucket {i} partition to host", unit=i,
                                      microbatch=p.grad_accum - 1, after=(prep,), frees=(flat,))
        else:
            scatter = Flops(matmul=0.0, attention=0.0,
                            memory_bytes=elements / p.dp_shard * (r + b.param_elem_bytes),
                            kernels=1)
            self.last_reduce = b.add(name=f"bucket {i} copy to partition", kind="backward",
                                     stream=stream, unit=i, microbatch=p.grad_accum - 1,
                                     after=(coll,), compute_s=b.compute(scatter),
                                     frees=(flat,))
        self.bucket_elems = self.bucket_expert_elems = 0
        self.bucket_grads = []

    def optimizer(self, after: tuple[int, ...]) -> None:
        """step() (stage_1_and_2.py): the gradients of the partition checked for inf/NaN
        and their norm taken, each all-reduced (_checks); the partition's gradients
        flattened into one 16-bit tensor (a copy, live until the cast), cast to fp32,
        scaled by the clip factor (_scale), FusedAdam on the flat fp32 partition, the
        16-bit partition written (or DeepSpeedCPUAdam on the host, the 16-bit partition
        copied back); then the all-gather of the updated 16-bit parameters into the flat
        buffer, on the compute stream: all_gather_dp_groups makes one
        all_gather_into_tensor per parameter group (one here) wherever torch has it
        (every torch DeepSpeed 0.19 supports), so allgather_bucket_size is not used
        (deepspeed/runtime/utils.py)."""
        b, p = self.builder, self.builder.plan
        frees = (self.partition_grads,) if self.have_partition else ()
        # With the optimizer offloaded the norms were taken as the gradients went to the
        # host (complete_grad_norm_calculation_for_cpu_offload) and the overflow flag
        # kept then (local_overflow): only the all-reduces remain.
        elems, tensors = ((self.part, _partition_tensors(b.model, p.dp_shard))
                          if p.offload == "none" else (0, 0))
        after = _checks(b, after, norm=_norm_scan(elems, tensors, b.param_elem_bytes), norm_bytes=4,
                        overflow=(_overflow_scan(elems, tensors, b.param_elem_bytes)
                                  if _zero(p).scans_for_overflow(self.stage, p.param_dtype)
                                  else None))
        if p.offload != "none":
            # the step on the host, the updated 16-bit partition copied back: the
            # all-gather below runs all the same (step(): all_gather_dp_groups after
            # either branch)
            prev = host_optimizer(b, after=after, frees=frees,
                                  local_params=b.model.num_params / p.dp_shard,
                                  program="deepspeed")
        else:
            m = _master_bytes(p)
            fp32_grad = Buffer(name="fp32 grad partition", category="grads",
                               bytes=self.part * m)
            flat = Buffer(name="flat grad partition", category="grads",
                          bytes=self.part * b.param_elem_bytes)
            flatten = b.add(name="flatten gradients", kind="optimizer", stream="compute",
                            microbatch=p.grad_accum - 1, after=after, allocs=(flat,),
                            compute_s=b.compute(_pass(self.part * 2 * b.param_elem_bytes, 1)))
            first = b.add(name="fp32 gradients", kind="optimizer", stream="compute",
                          microbatch=p.grad_accum - 1, after=(flatten,),
                          compute_s=b.compute(_pass(self.part * (b.param_elem_bytes + m), 1)),
                          allocs=(fp32_grad,), frees=(*frees, flat.name))
            if _zero(p).gradient_clipping > 0 or p.param_dtype == "fp16":
                first = _scale(b, first, self.part * m)
            prev = device_optimizer(b, after=(first,), frees=(fp32_grad.name,),
                                    local_params=self.part, tensors=1, master_bytes=m,
                                    grad_bytes=m, fused=True, unscales=False)
        # One all_gather_into_tensor per parameter group: the experts' over theirs.
        for (elems, _), group, gname, what in zip(
                _flat_groups(b.model, p), (b.shard, b.expert_shard),
                ("shard", "expert_shard"), ("", " (experts)"), strict=False):
            prev = b.collective(kind="all_gather", size_bytes=elems * b.param_elem_bytes,
                                group=group, gname=gname, name=f"param all-gather{what}",
                                unit=0, microbatch=p.grad_accum - 1, after=(prev,))


def _pass(nbytes: float, kernels: float) -> Flops:
    """Memory-bound work of DeepSpeed's step: `nbytes` read + written by `kernels`
    kernels (scans, casts and copies of the gradient partition, at the flat rate)."""
    return Flops(matmul=0.0, attention=0.0, memory_bytes=nbytes, kernels=kernels)


def _divide_and_flatten(elements: float, a: int, r: int) -> Flops:
    """A gradient bucket on its way to its collective, every stage: copied into one flat
    buffer in the reduce dtype (a + r bytes an element) and divided by the world size in
    place (stages 1/2: average_tensor's div_ of the ipg bucket; stage 3:
    reduce_scatter_coalesced's of the flat buffer: 2 r bytes), one kernel each."""
    return _pass(elements * (a + r + 2 * r), 2)


def _overflow_scan(elems: float, tensors: float, a: int) -> Flops:
    """Stages 1/2's inf/NaN check of `elems` a-byte gradient elements in `tensors`
    tensors (utils.has_inf_or_nan: amax and amin, 2 reads of each element; then two
    isfinite, and, not and the count's add: 7 kernels a tensor)."""
    return _pass(elems * 2 * a, 7 * tensors)


def _norm_scan(elems: float, tensors: float, a: int) -> Flops:
    """get_grad_norm_direct over `elems` a-byte gradient elements in `tensors` tensors:
    each cast to fp32 (read, written) and its norm taken (read again), 2 kernels a
    tensor."""
    return _pass(elems * (a + 4 + 4), 2 * tensors)


def _checks(b: Builder, after: tuple[int, ...], *, overflow: Flops | None, norm: Flops,
            norm_bytes: int) -> tuple[int, ...]:
    """The step's checks of the rank's gradients, each a scan on the compute stream
    (none where it moves no bytes: with the optimizer offloaded it was taken on the way
    to the host) and a blocking all-reduce of its scalar over the shard group (no 16-bit
    arithmetic): `overflow` (None: no check), then the 1-byte flag; the `norm` scan and
    the per-tensor norms combined (stack, pow, sum: 3 kernels), then the
    `norm_bytes`-byte sum. Returns what the step then waits for."""
    checks = []
    if overflow is not None:
        checks.append(("overflow check", overflow, 1))
    checks.append(("gradient norm", norm + _pass(0.0, 3), norm_bytes))
    for name, scan, size in checks:
        if scan.memory_bytes:
            after = (b.add(name=name, kind="optimizer", stream="compute",
                           microbatch=b.plan.grad_accum - 1, after=after,
                           compute_s=b.compute(scan)),)
        after = (b.collective(kind="all_reduce", size_bytes=size, group=b.shard,
                              gname="shard", dtype="fp32", name=f"{name} all-reduce", unit=0,
                              microbatch=b.plan.grad_accum - 1, after=after),)
    return after


def _scale(b: Builder, after: int, nbytes: float, name: str = "clip gradients") -> int:
    """unscale_and_clip_grads: the clip factor from the norm (a handful of scalar
    kernels) and the fp32 gradients (`nbytes`) multiplied by it in place."""
    return b.add(name=name, kind="optimizer", stream="compute",
                 microbatch=b.plan.grad_accum - 1, after=(after,),
                 compute_s=b.compute(_pass(2 * nbytes, 5)))


@lru_cache(maxsize=64)
def _partition_tensors(model: ModelSpec, n: int) -> int:
    """Stages 1/2: parameter tensors with elements in a rank's partition of the flat
    buffer (params_in_partition), on average over the ranks: each tensor is in one
    partition, and a boundary between partitions that falls inside a tensor puts it in
    two, so at most (tensors + n - 1) / n."""
    return math.ceil((len(model.parameter_tensors()) + n - 1) / n)


def _with_frees(op: Op, name: str) -> Op:
    """`op` releasing `name` when it ends, too."""
    return op._replace(frees=(*op.frees, name))


# ---------------------------------------------------------------------- stage 3
def _submodules(model: ModelSpec) -> tuple[list[tuple[str, list[tuple[int, ...]]]], ...]:
    """(embedding, block, head) submodules in call order, each (name, parameter shapes):
    what DeepSpeed hooks and fetches one at a time (modules with direct parameters). A
    block's are its tensors (ModelSpec.block_tensors) grouped by the module that holds
    them (the name without its last part: attention.wq, moe.experts)."""
    d = model.d_model
    emb: list[tuple[str, list[tuple[int, ...]]]] = [("tok_embeddings", [(model.vocab_size, d)])]
    if model.learned_pos_emb:
        emb.append(("pos_embeddings", [(model.max_seq_len, d)]))
    block: list[tuple[str, list[tuple[int, ...]]]] = []
    for name, shape in model.block_tensors():
        module = name.rsplit(".", 1)[0]
        if block and block[-1][0] == module:
            block[-1][1].append(shape)
        else:
            block.append((module, [shape]))
    head: list[tuple[str, list[tuple[int, ...]]]] = [
        ("norm", [(d,), *([(d,)] if model.norm == "layernorm" and model.bias else [])])]
    head.append(("output", [(model.vocab_size, d)]) if not model.tied_embeddings
                else ("output", []))
    return emb, block, head


class _Stage3Step:
    """One step of ZeRO stage 3 (DeepSpeedZeroOptimizer_Stage3, stage3.py): per-submodule
    fetches as the coordinator replays them."""

    def __init__(self, b: Builder) -> None:
        self.builder = b
        self.dp_shard = b.plan.dp_shard
        """Ranks each parameter is partitioned over."""
        self.params: dict[str, Param] = {}
        self.owner: dict[str, str] = {}
        """Parameter -> the live gathered buffer holding it."""
        self.holders: dict[str, set[str]] = {}
        """Gathered buffer -> its parameters not released yet."""
        self.gathers: dict[str, int] = {}
        """Parameter -> the all-gather op that brought it."""
        self.fetches = 0
        self.grads_made: set[str] = set()
        self.shares: dict[tuple[str, float], tuple[float, float]] = {}
        """(phase, share of a block) -> its FLOPs and kernel time (block_share)."""

    # ------------------------------------------------------------------ trace
    def trace(self, blocks: list[Unit]) -> list[_Call]:
        """The step's submodule calls in order: forward, then backward (a block's forward
        re-run before its backward under recomputation)."""
        m, p = self.builder.model, self.builder.plan
        emb, block, head = _submodules(m)
        share = _block_shares(m, block)

        def names(prefix: str, sub: tuple[str, list[tuple[int, ...]]]) -> tuple[str, ...]:
            mod, shapes = sub
            out = []
            for i, shape in enumerate(shapes):
                name = f"{prefix}{mod}.{'weight' if i == 0 else 'bias'}"
                numel = math.prod(shape)
                self.params[name] = Param(name=name, numel=numel,
                                          persistent=_persistent(numel, p))
                out.append(name)
            if mod == "output" and m.tied_embeddings:
                out.append("tok_embeddings.weight")
            return tuple(out)

        emb_calls = [_Call(name=s[0], params=names("", s)) for s in emb]
        calls = list(emb_calls)
        per_unit = []
        for u in blocks:
            subs = [_Call(name=f"layers.{layer}.{s[0]}", params=names(f"layers.{layer}.", s),
                          unit=u, share=share[s[0]])
                    for layer in range((u.index or 0) * p.unit_size,
                                       (u.index or 0) * p.unit_size + u.blocks)
                    for s in block]
            per_unit.append(subs)
            calls += [c.in_phase("forward", first=i == 0) for i, c in enumerate(subs)]
        head_calls = [_Call(name=s[0], params=names("", s)) for s in head]
        calls += head_calls
        calls += [c.in_phase("backward") for c in reversed(head_calls)]
        for subs in reversed(per_unit):
            if p.recompute != "none":
                calls += [c.in_phase("recompute", first=i == 0)
                          for i, c in enumerate(subs)]
            back = list(reversed(subs))
            calls += [c.in_phase("backward", first=i == 0, last=i == len(back) - 1)
                      for i, c in enumerate(back)]
        calls += [c.in_phase("backward") for c in reversed(emb_calls)]
        return calls

    # ------------------------------------------------------------------ fetches
    def fetch(self, step: FetchStep, *, prev: int | None, mb: int) -> None:
        """The pre-hook's gathers: the on-demand one, issued when the host reaches the
        hook (once the previous call's kernels are launched), and the prefetch, issued
        once the host has waited for the on-demand gather."""
        hook = {} if prev is None else {"after_start": (prev,)}
        on_demand = None
        if step.on_demand:
            on_demand = self.gather(step.on_demand, mb=mb, prefetch=False, **hook)
        if step.prefetch:
            deps = {"issue_after": (on_demand,)} if on_demand is not None else hook
            self.gather(step.prefetch, mb=mb, prefetch=True, **deps)

    def gather(self, names: tuple[str, ...], *, mb: int, prefetch: bool,
               **deps: tuple[int, ...]) -> int:
        """One coalesced all-gather of these parameters' partitions into a flat buffer
        (each parameter a view into it)."""
        b = self.builder
        i = self.fetches
        self.fetches += 1
        buf = f"mb{mb}/fetch {i}"
        numel = sum(-(-self.params[n].numel // self.dp_shard) * self.dp_shard for n in names)
        self.holders[buf] = set(names)
        for n in names:
            self.owner[n] = buf
        kind = "prefetch" if prefetch else "fetch"
        # all_gather_into_tensor with async_op=True (_allgather_params_coalesced): the
        # coordinator waits on the handle when a submodule needs the parameters, at once
        # for an on-demand fetch (the next op's dependency), later for a prefetch.
        op = b.collective(kind="all_gather", size_bytes=numel * b.param_elem_bytes, group=b.shard,
                          gname="shard", microbatch=mb, name=f"{kind} {i} ({len(names)} params)",
                          allocs=(Buffer(name=buf, category="gathered_params",
                                         bytes=numel * b.param_elem_bytes),), async_op=True, **deps)
        for n in names:
            self.gathers[n] = op
        return op

    def released(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """Gathered buffers freed once these parameters are released (a flat buffer goes
        with the last of its parameters)."""
        out = []
        for n in names:
            buf = self.owner.pop(n, None)
            if buf is None:
                continue
            self.holders[buf].discard(n)
            if not self.holders[buf]:
                out.append(buf)
                del self.holders[buf]
        return tuple(out)

    # ------------------------------------------------------------------ step
    def lower(self, root: Unit, blocks: list[Unit]) -> None:
        b, p = self.builder, self.builder.plan
        calls = self.trace(blocks)
        steps = replay([c.params for c in calls], self.params,
                       prefetch_bucket=_zero(p).prefetch_bucket_size,
                       max_live=_zero(p).max_live_parameters, max_reuse=_zero(p).max_reuse_distance)
        ends: list[int] = []
        for mb in range(p.grad_accum):
            self.owner, self.holders, self.grads_made = {}, {}, set()
            bucket = _Stage3Bucket(b, mb)
            prev: int | None = None
            for call, step in zip(calls, steps, strict=True):
                self.fetch(step, prev=prev, mb=mb)
                waits = tuple(dict.fromkeys(self.gathers[n] for n in call.params
                                            if not self.params[n].persistent))
                prev = self.compute(call, mb, waits, self.released(step.release))
                if call.phase == "backward":
                    bucket.add([n for n in call.params if n != "tok_embeddings.weight"
                                 or call.name == "tok_embeddings"], self.params, prev)
            # release_and_reset_all at the end of backward; then the reduce stream.
            left = tuple(self.holders)
            ends.append(bucket.finish(b.add(
                name=f"release all (mb {mb})", kind="backward", stream="compute",
                microbatch=mb, after=(prev,) if prev is not None else (), frees=left)))
        self.optimizer(tuple(ends))

    def compute(self, call: _Call, mb: int, waits: tuple[int, ...],
                frees: tuple[str, ...]) -> int:
        """The kernels of one submodule call: its share of its block's forward,
        recomputation or backward, or the root's embedding, norm, output and loss."""
        b = self.builder
        u, phase = call.unit, call.phase
        kind = "forward" if phase == "forward" else "backward"
        grads = self.grad(call, mb) if phase == "backward" else ()
        grad_frees = tuple(g.name for g in grads)  # copied into the bucket by its hook
        if u is None:
            if call.name == "output" and phase == "forward":
                return head_forward(b, mb, after=waits, frees=frees)
            if call.name == "output":
                return head_backward(b, mb, after=waits, grads=grads, frees=frees + grad_frees)
            return b.add(name=f"{call.name} {phase} (mb {mb})", kind=kind, stream="compute",
                         microbatch=mb, after=waits, allocs=grads, frees=frees + grad_frees)
        flops, kernel_s = self.block_share(phase, call.share)
        allocs: list[Buffer] = list(grads)
        unit_frees: list[str] = []
        saved, working = f"mb{mb}/{u.name}/saved", f"mb{mb}/{u.name}/backward_working"
        if phase == "forward" and call.first:
            allocs.append(Buffer(name=saved, category="activations",
                                 bytes=b.acts.saved_per_block * u.blocks))
        # The block's backward working set lives from its first backward kernel (or its
        # recomputation) to its last.
        if call.first and phase == ("recompute" if b.plan.recompute != "none" else "backward"):
            allocs.append(Buffer(name=working, category="activations",
                                 bytes=b.acts.block_transient))
        if phase == "backward" and call.last:
            unit_frees += [saved, working]
        return b.add(name=f"{call.name} {phase} (mb {mb})", kind=kind, stream="compute",
                     unit=u.index, microbatch=mb, after=waits, flops=flops,
                     compute_s=kernel_s + (b.block_host_s(phase, u.blocks)
                                           if call.first else 0.0),
                     allocs=tuple(allocs), frees=frees + grad_frees + tuple(unit_frees))

    def block_share(self, phase: str, share: float) -> tuple[float, float]:
        """FLOPs and kernel time of `share` of one block's work in `phase` (forward,
        recompute or backward): every block has the same submodule shares, so each is
        worked out once per step."""
        key = (phase, share)
        found = self.shares.get(key)
        if found is None:
            b = self.builder
            work = {"forward": b.block_fwd, "recompute": b.block_recompute,
                    "backward": b.block_bwd_only}[phase].scaled(share)
            found = self.shares[key] = (work.total, b.compute(work))
        return found

    def grad(self, call: _Call, mb: int) -> tuple[Buffer, ...]:
        """The gradient autograd allocates for the call's parameters (a tied weight's
        once: its two uses accumulate into one)."""
        names = [n for n in call.params if n not in self.grads_made]
        self.grads_made.update(names)
        numel = sum(self.params[n].numel for n in names)
        if not numel:
            return ()
        return (Buffer(name=f"mb{mb}/grad/{call.name}", category="gathered_grads",
                       bytes=numel * self.builder.param_elem_bytes),)

    def optimizer(self, after: tuple[int, ...]) -> None:
        """The gradient norm all-reduced (and fp16's overflow flag); per sub-group
        (_sub_groups), one after the other: fp32 gradients cast from the partition
        buffer, scaled by the clip factor, FusedAdam on the flat fp32 partition, copied
        back to 16 bits, the fp32 gradients released (offloaded: DeepSpeedCPUAdam on the
        host); then each persistent parameter gathered again."""
        b, p = self.builder, self.builder.plan
        # stage3.py step(): under fp16 _overflow_check_and_loss_scale_update scans the flat
        # gradient partition (isinf(...).any() and isnan(...).any(): each reads it and
        # writes and reads a byte mask) and all-reduces the flag; _get_norm_groups takes
        # each parameter's gradient partition's norm as stages 1/2 do, a float64 sum.
        # Offloaded, the norms come from the host's copies: only the all-reduces remain.
        elems, tensors = ((_partition_elems(b.model, p), len(b.model.parameter_tensors()))
                          if p.offload == "none" else (0, 0))
        prev = _checks(b, after, norm=_norm_scan(elems, tensors, b.param_elem_bytes), norm_bytes=8,
                       overflow=(_pass(elems * 2 * (b.param_elem_bytes + 2), 8)
                                 if _zero(p).scans_for_overflow(3, p.param_dtype) else None))
        if p.offload != "none":
            prev = (host_optimizer(b, after=prev, frees=(),
                                   local_params=b.model.num_params / p.dp_shard,
                                   program="deepspeed"),)
        else:
            m = _master_bytes(p)
            for i, elems in enumerate(_sub_groups(b.model, p)):
                grad = Buffer(name=f"fp32 grad sub-group {i}", category="grads",
                              bytes=elems * m)
                cast = Flops(matmul=0.0, attention=0.0,
                             memory_bytes=elems * (b.param_elem_bytes + m), kernels=1)
                first = b.add(name="fp32 gradients" if i == 0 else f"fp32 gradients {i}",
                              kind="optimizer", stream="compute", microbatch=p.grad_accum - 1,
                              after=prev, compute_s=b.compute(cast), allocs=(grad,))
                # unscale_and_clip_grads scales every sub-group, clipping or not.
                first = _scale(b, first, elems * m,
                               "clip gradients" if i == 0 else f"clip gradients {i}")
                prev = (device_optimizer(b, after=(first,), frees=(grad.name,),
                                         local_params=elems, tensors=1, master_bytes=m,
                                         grad_bytes=m, fused=True, unscales=False),)
        # _post_step: every persistent parameter's updated partition gathered again, one
        # all_gather_into_tensor each (_allgather_params_coalesced launches them all, then
        # waits), so a model with many small norms and biases pays one call per tensor.
        for name, param in self.params.items():
            if param.persistent:
                b.collective(kind="all_gather", size_bytes=param.numel * b.param_elem_bytes,
                             group=b.shard, gname="shard", name=f"persistent {name} all-gather",
                             microbatch=p.grad_accum - 1, after=prev, async_op=True)


class _Call(NamedTuple):
    """One submodule call of the stage-3 trace (a NamedTuple: the lowering makes one per
    call of every phase)."""

    name: str
    params: tuple[str, ...]
    unit: Unit | None = None
    """The block unit it belongs to (None for the root's submodules)."""
    share: float = 0.0
    """Its share of one block's work."""
    phase: str = "forward"
    """forward, recompute or backward."""
    first: bool = False
    """The unit's first call of this phase."""
    last: bool = False
    """The unit's last backward call."""

    def in_phase(self, phase: str, *, first: bool = False, last: bool = False) -> _Call:
        """The same submodule called in `phase` (what _replace gives for a call of the
        plain trace, without its walk over the fields)."""
        return _Call(name=self.name, params=self.params, unit=self.unit, share=self.share,
                     phase=phase, first=first, last=last)


class _Stage3Bucket:
    """Stage 3's ipg bucket (the persistent buffer): each gradient is copied in by its
    hook; a bucket that would overflow is reduce-scattered first, on the reduce-scatter
    stream, and the rank's partition accumulated into the gradient partition buffer."""

    def __init__(self, b: Builder, mb: int) -> None:
        self.builder, self.mb = b, mb
        self.elements = 0
        self.count = 0
        self.last: int | None = None

    def add(self, names: list[str], params: dict[str, Param], op: int) -> None:
        numel = sum(params[n].numel for n in names)
        if not numel:
            return
        if self.elements and self.elements + numel > _zero(self.builder.plan).reduce_bucket_size:
            self.flush(op)
        self.elements += numel

    def flush(self, after: int) -> None:
        b, p = self.builder, self.builder.plan
        r = dtype_bytes(p.reduce_dtype)
        i = self.count
        self.count += 1
        # reduce_scatter_coalesced: the partitions cat'ed into one flat buffer, divided
        # by the world size in place.
        copy = _divide_and_flatten(self.elements, b.param_elem_bytes, r)
        first = b.add(name=f"bucket {i} copy-in (mb {self.mb})", kind="backward",
                      stream="reduce_scatter", microbatch=self.mb, after=(after,),
                      compute_s=b.compute(copy))
        # reduce_scatter_coalesced calls reduce_scatter_fn with async_op=False: the
        # reduction stream overlaps it on a GPU; a synchronous host blocks in it.
        coll = b.collective(kind="reduce_scatter", size_bytes=self.elements * r,
                            group=b.shard, gname="shard", microbatch=self.mb,
                            name=f"bucket {i} reduce-scatter (mb {self.mb})", after=(first,))
        acc = Flops(matmul=0.0, attention=0.0,
                    memory_bytes=self.elements / p.dp_shard * (r + 2 * b.param_elem_bytes),
                    kernels=1)
        self.last = b.add(name=f"bucket {i} accumulate (mb {self.mb})", kind="backward",
                          stream="reduce_scatter", microbatch=self.mb, after=(coll,),
                          compute_s=b.compute(acc))
        self.elements = 0

    def finish(self, after: int) -> int:
        """The epilogue: flush the last bucket; the step waits for the reduce stream."""
        if self.elements:
            self.flush(after)
        return self.last if self.last is not None else after


def _block_shares(model: ModelSpec, block: list[tuple[str, list[tuple[int, ...]]]]
                  ) -> dict[str, float]:
    """Each submodule call's share of its block's work, by its matmul's share of the
    block's matmul FLOPs (norms run inside the neighbouring calls: share 0)."""
    sizes = {name: math.prod(shapes[0]) if len(shapes[0]) == 2 else 0
             for name, shapes in block}
    total = sum(sizes.values())
    return {name: size / total for name, size in sizes.items()}


@lru_cache(maxsize=64)
def _backward_order(model: ModelSpec, blocks: int) -> tuple[tuple[int, float, bool], ...]:
    """The parameter tensors of `blocks` blocks in the order their gradients appear in
    backward (submodules last to first, a submodule's tensors together), each as
    (elements, share of the blocks' backward work done once it exists: the matmul shares
    of _block_shares, summed over its submodule and those after it, whether it is a
    routed expert's)."""
    block = _submodules(model)[1]
    shares = _block_shares(model, block)
    out, done = [], 0.0
    for _ in range(blocks):
        for name, shapes in reversed(block):
            done += shares[name]
            out += [(math.prod(shape), done, name == "moe.experts")
                    for shape in reversed(shapes)]
    # As fractions of the whole, the last exactly 1: no sliver of work after it. Every
    # block backward of a plan asks: worked out once per model and unit size.
    return tuple((numel, share / done, expert) for numel, share, expert in out)


def _lower(b: Builder, root: Unit, blocks: list[Unit]) -> None:
    if _stage(b.plan) == 3:
        _Stage3Step(b).lower(root, blocks)
    else:
        _Stage1And2Step(b).lower(root, blocks)


PROGRAM = Program(name="deepspeed", shard_elems=shard_elems,
                  state_at_rest_bytes=state_at_rest_bytes,
                  gathered_floor_bytes=gathered_floor_bytes, lower=_lower,
                  host_state_bytes=host_state_bytes)
