"""FSDP2 (`fully_shard`) as torch runs it: fsdp, fsdp-no-reshard, hsdp, and zero2 as
reshard_after_forward=False (its closest torch equivalent).

Read from torch/distributed/fsdp/_fully_shard/ (_fsdp_param.py, _fsdp_collectives.py,
_fsdp_param_group.py):
- State. With a MixedPrecisionPolicy the sharded parameter is the fp32 master copy: at
  rest a rank holds only it and the optimizer states (12 B/param/N for AdamW, not the ZeRO
  paper's 16/N). Each parameter is sharded on dim 0 and every rank's shard padded to the
  first chunk (`shard_elems`), so all-gather outputs, gathered parameters and
  reduce-scatter inputs are dp_shard padded shards. With context parallelism the mesh is
  torchtitan's flattened dp_shard_cp: every "dp_shard" here is its dp_shard x cp ranks
  (Plan.dp_shard_cp), the cp ranks' gradients reduce-scattered with the others.
- Units: the root (embeddings, final norm, output; not resharded after forward, so
  gathered once per micro-batch) and blocks grouped by `plan.unit_size`. Each unit's
  all-gather is preceded on its stream by a copy-in that allocates the flat buffer, casts
  the shard to the compute dtype and copies it in; a copy-out op on the compute stream,
  right before the unit runs, allocates the gathered parameters (wait_for_unshard in
  the unit's pre-hook) and frees the flat buffer, in forward the previous unit's
  (AllGatherState defers a forward flat buffer's free to the next copy-out; the
  forward's end frees the last). Each parameter is its own tensor, as the allocator
  sees them (zsim.analytic.allocations).
- Forward prefetch is implicit (p = `plan.prefetch` >= 1): an async host reaches unit k's
  pre-forward, and issues its all-gather, when unit k-1 starts computing; p >= 2 adds
  set_modules_to_forward_prefetch of the next units from each pre-forward; p = 0 issues a
  unit's all-gather after unit k-1 ends. Backward prefetch is explicit: each
  pre-backward (the root's on its output's gradient: before the head's backward when the
  model outputs its loss, after the loss's when it outputs the logits,
  ModelSpec.loss_in_forward) issues the all-gathers of the next p units in backward
  order. reshard_after_forward frees the gathered parameters after a
  unit's forward (fsdp, hsdp) or keeps them until after its backward.
- Gradients are reduced once per optimizer step, on the last micro-batch
  (set_requires_gradient_sync(False) before it), or with plan.grad_sync "every" after
  each micro-batch's backward, the reduced shard added into the sharded gradient (the
  accumulation in foreach_reduce_scatter's post-processing). foreach_reduce copies a unit's
  gradients into a flat input on the compute stream, reduce-scatters it in the reduce
  dtype on its own stream and casts the output to the sharded gradient's dtype there;
  HSDP then all-reduces the shard across replicas. Sharded gradients live until the
  optimizer step (gradients set to None). One reduce-scatter input stays alive until the
  next unit's post-backward (reduce_scatter_states, cap 1).
- Offload (CPUOffloadPolicy): reduced gradient shards go to the host (d2h), the
  optimizer steps there; with "params" each all-gather is preceded by an h2d copy of the
  unit's shard. What the host holds is host_state_bytes's.
"""

from __future__ import annotations

import math
from functools import partial

from zsim.analytic.allocations import (
    all_gather_pieces,
    fitted,
    gathered_pieces,
    gradient_pieces,
    module_order,
    shard_rows,
    sharded_pieces,
)
from zsim.analytic.compute import Flops
from zsim.analytic.memory import model_state_bytes, optimizer_bytes_per_param
from zsim.schedule.build import (
    TP_EMBEDDING_EXIT,
    TP_ENTER,
    Builder,
    Shapes,
    Unit,
    block_backward,
    block_forward,
    block_shard_elems,
    context_parallel,
    device_optimizer,
    expert_parallel,
    gather_logits,
    head_backward,
    head_forward,
    host_optimizer,
    tensor_parallel,
    tp_regions,
    units,
)
from zsim.schedule.ops import Buffer
from zsim.schedule.programs import Program, host_step_bytes
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes


def shard_elems(shapes: Shapes, n: int) -> int:
    """Elements of one rank's shard of these parameters on `n` ranks: each parameter is
    chunked on dim 0 (torch.chunk: ceil(dim0 / n) rows in the first chunk) and every
    rank's shard is padded to the first chunk's size (_fsdp_param.py,
    _init_sharded_param). At most n - 1 rows of padding per parameter; once n exceeds a
    parameter's rows, every rank holds a whole row of it."""
    return sum(-(-shape[0] // n) * math.prod(shape[1:]) for shape in shapes)


def state_shard_elems(model: ModelSpec, n: int, expert_ranks: int = 0) -> int:
    """Elements of one rank's shard of the whole model on `n` ranks, its routed experts
    under expert parallelism over the `expert_ranks` that share them
    (zsim.schedule.build.block_shard_elems)."""
    return (shard_elems([s for _, s in model.root_tensors()], n)
            + model.num_layers * block_shard_elems(model, n, expert_ranks, shard_elems)[0])


def _at_rest_bytes(plan: Plan) -> int:
    """Bytes per parameter of the sharded copy the optimizer updates (fp32 master in
    mixed precision, else the param dtype)."""
    return dtype_bytes(plan.master_dtype if plan.has_master_copy else plan.param_dtype)


def state_at_rest_bytes(model: ModelSpec, plan: Plan) -> dict[str, float]:
    """The sharded parameters in the at-rest dtype (fp32 master when the compute dtype is
    lower: category master_params, else params) and the sharded optimizer states, both
    padded per parameter; no gradients (set to None after the step). Offloaded plans keep
    the closed form of zsim.analytic.memory (ZeRO-Offload)."""
    if plan.offload != "none":
        closed = model_state_bytes(model.num_params, _reshard_view(plan)).as_dict()
        return {c: v for c, v in closed.items() if c != "grads"}
    shard = float(state_shard_elems(model, plan.dp_shard_cp, plan.expert_shard_ranks))
    params_cat = "master_params" if plan.has_master_copy else "params"
    return {params_cat: shard * _at_rest_bytes(plan),
            "optimizer_states": shard * optimizer_bytes_per_param(plan)}


def state_pieces(model: ModelSpec, plan: Plan) -> dict[str, tuple[int, ...]]:
    """The tensors of the state at rest: one padded shard per parameter (the DTensor's
    local data), and torch.optim's states one tensor each per parameter (exp_avg,
    exp_avg_sq), in module order; offloaded plans hold theirs on the host."""
    state_bytes = dtype_bytes(plan.optimizer_state_dtype)
    copies = optimizer_bytes_per_param(plan) / state_bytes
    if plan.offload != "none" or copies != int(copies):
        return {}
    shapes, n = tuple(module_order(model)), plan.dp_shard_cp
    if plan.ep > 1:  # the experts' shards are of their own group: one tensor each
        return {}
    return {"master_params" if plan.has_master_copy else "params":
            sharded_pieces(shapes, n, _at_rest_bytes(plan)),
            "optimizer_states": sharded_pieces(shapes, n, state_bytes, int(copies))}


def _reshard_view(plan: Plan) -> Plan:
    """zero2 runs as fully_shard(reshard_after_forward=False): the plan of that name."""
    return plan.with_(strategy="fsdp-no-reshard") if plan.strategy == "zero2" else plan


def gathered_floor_bytes(model: ModelSpec, plan: Plan) -> float:
    """The gathered root (not resharded until the end of backward) and, without
    resharding after forward, every gathered unit."""
    plan = _reshard_view(plan)
    root, blocks = units(model, plan, shard_elems)
    gathered = [root] if plan.reshard_after_forward else [root, *blocks]
    return float(sum(gathered_bytes(model, plan, u) for u in gathered))


def gathered_bytes(model: ModelSpec, plan: Plan, u: Unit) -> int:
    """Bytes of a unit's gathered parameters (all-gather output, unsharded parameters):
    the compute dtype, except a block unit's linear weights under fp8, which torchao's
    enable_fsdp_float8_all_gather gathers at 1 byte each (the norms stay bf16; the root,
    with the output projection, is not fp8)."""
    elems, a = u.gathered_elems(plan), dtype_bytes(plan.param_dtype)
    if not plan.fp8 or u.index is None:
        return elems * a
    linear = sum(k * n for _, k, n in model.block_matmuls()) / model.params_per_block
    return math.ceil(elems * (linear + (1.0 - linear) * a))


def _grad_bytes(plan: Plan) -> int:
    """Bytes per element of the sharded gradients the optimizer reads: the sharded
    parameter's dtype (foreach_reduce casts the reduce-scatter output to it, and with
    CPUOffloadPolicy copies that to the host), except with only the optimizer offloaded,
    which keeps the closed form's grad dtype."""
    return dtype_bytes(plan.grad_dtype) if plan.offload == "optimizer" else _at_rest_bytes(plan)


def host_state_bytes(model: ModelSpec, plan: Plan) -> float:
    """Host memory of an offloaded plan at its most: the host step's (host_step_bytes)
    over the rank's padded shard. With "params" (CPUOffloadPolicy, _fsdp_param.py) the
    sharded parameters themselves live on the host (the fp32 master in mixed
    precision), their gradients arrive there in the same dtype and AdamW's states are
    made beside them; with "optimizer" the master and the states are on the host and
    the gradients arrive in the grad dtype, the compute-dtype shard staying on the
    GPU."""
    if plan.offload == "none":
        return 0.0
    local = state_shard_elems(model, plan.dp_shard, plan.expert_shard_ranks)
    return host_step_bytes(plan, float(local), _grad_bytes(plan))


def _unsharded_grad_dtype(plan: Plan) -> str:
    """The dtype of a unit's unsharded gradient: the compute dtype, or the reduce dtype
    when micro-batches accumulate into it."""
    return plan.reduce_dtype if plan.accumulates_unsharded_grads else plan.param_dtype


def _unsharded_grad_bytes(plan: Plan) -> int:
    """Bytes per element of a unit's unsharded gradient."""
    return dtype_bytes(_unsharded_grad_dtype(plan))


def block_host_s(hw: HardwareProfile, plan: Plan, phase: str) -> float:
    """Host time to issue one block in `phase` on an async host (the profile's
    fsdp2_block_host: a checkpointed block adds its extra in forward, and its backward
    issues the forward again); 0 on a synchronous host or without the figures."""
    host = hw.fsdp2_block_host
    if hw.launch != "async" or host is None:
        return 0.0
    forward = host.issue_s("forward", plan.dp_shard_cp)
    checkpointed = plan.recompute != "none"
    if phase == "forward":
        return forward + (host.checkpoint_s if checkpointed else 0.0)
    return host.issue_s("backward", plan.dp_shard_cp) + (forward if checkpointed else 0.0)


class _Step:
    """One FSDP2 step being lowered: the builder and what FSDP2 keeps between hooks."""

    def __init__(self, b: Builder) -> None:
        self.builder = b
        self.plan = _reshard_view(b.plan)
        """The plan as FSDP2 runs it (zero2 as fsdp-no-reshard)."""
        self.unsharded_grads: dict[str, list[str]] = {}
        """Per unit, the unsharded gradient buffers its reduce-scatter consumes."""
        self.held_rs_input: str | None = None
        """The reduce-scatter input still held for the previous unit."""
        self.held_all_gather: str | None = None
        """The flat output of the last forward all-gather, held until the next forward
        copy-out or the end of the forward (FSDP2's AllGatherState)."""
        self.grad_shards: list[str] = []
        """Sharded gradients the optimizer step reads and frees."""
        self.last_reduce: list[int] = []
        """The last op of each unit's reduction."""

    # ------------------------------------------------------------------ step
    def lower(self, root: Unit, blocks: list[Unit]) -> None:
        b, p = self.builder, self.plan
        reshard = p.reshard_after_forward
        acc_bytes = _unsharded_grad_bytes(p)
        prev_last_bwd: int | None = None
        every = p.grad_sync == "every"
        for mb in range(p.grad_accum):
            reduces = every or mb == p.grad_accum - 1
            gathered: dict[int, str] = {}
            root_ag = self.all_gather(
                root, mb, gathered, phase="forward",
                after_start=() if prev_last_bwd is None else (prev_last_bwd,))
            root_copy = self.copy_out(root, mb, gathered, phase="forward", gather=root_ag,
                                      hooks=True)
            emb = b.add(name=f"embedding forward (mb {mb})", kind="forward",
                        stream="compute", microbatch=mb, after=(root_copy,))
            # RowwiseParallel embedding: its output leaves a TP region.
            tensor_parallel(b, after=emb, phase="forward", regions=1,
                            boundaries=(TP_EMBEDDING_EXIT,),
                            name="embedding", mb=mb)
            fwd = self.forward(mb, blocks, gathered, first=emb)
            # ColwiseParallel output projection: its input enters one.
            tensor_parallel(b, after=fwd[-1], phase="forward", regions=1,
                            boundaries=(TP_ENTER,), name="output", mb=mb)

            def grad_alloc(u: Unit, params: int, part: str = "", mb: int = mb
                           ) -> tuple[Buffer, ...]:
                """Autograd allocates each parameter's unsharded gradient when its
                backward runs: a block unit's in its backward, the root's output
                projection and final norm in the head's backward, its token embedding at
                the very end."""
                if (mb > 0 and not every) or params == 0:
                    return ()  # accumulating into the buffers of micro-batch 0
                name = f"mb{mb}/{u.name}/unsharded_grad{part}"
                self.unsharded_grads.setdefault(u.name, []).append(name)
                shapes = u.shapes if u.index is not None else tuple(
                    s for n, s in b.model.root_tensors()
                    if n.endswith("embeddings.weight") == bool(part))
                return (Buffer(name=name, category="gathered_grads", bytes=params * acc_bytes,
                               pieces=fitted(gradient_pieces(shapes, acc_bytes),
                                             params * acc_bytes)),)

            emb_grad = 0 if b.model.tied_embeddings else b.model.embedding_params
            head_f = head_forward(b, mb, after=(fwd[-1],),
                                  root_post_forward=self.release_all_gather())
            gather_logits(b, after=head_f, mb=mb)
            issued: dict[int, int] = {}
            # The root's pre-backward hook (on its output's gradient: the loss's as the
            # backward starts, or the logits' after the loss's backward) prefetches the
            # last units.
            head_b = head_backward(
                b, mb, grads=grad_alloc(root, root.params - emb_grad), forward=head_f,
                root_pre_backward=partial(self.backward_prefetch, blocks, mb, gathered,
                                          issued, below=len(blocks))
                if reshard else None)
            tensor_parallel(b, after=head_b, phase="backward", regions=1,
                            boundaries=(TP_ENTER,), name="output", mb=mb)
            bwd: dict[int, int] = {}
            for k in reversed(range(len(blocks))):
                u = blocks[k]
                after: tuple[int, ...] = ()
                if reshard:
                    if k not in issued:  # no prefetch: gathered at its own pre-backward
                        issued[k] = self.all_gather(
                            u, mb, gathered, phase="backward",
                            issue_after=(bwd[k + 1] if k + 1 < len(blocks) else head_b,))
                    copy = self.copy_out(u, mb, gathered, phase="backward", gather=issued[k])
                    self.backward_prefetch(blocks, mb, gathered, issued, below=k, after=copy)
                    after = (copy,)
                bwd[k] = block_backward(b, u, mb, after=after, grads=grad_alloc(u, u.params),
                                        frees=(gathered[k],),
                                        host_s=self.block_host_s("backward", u))
                context_parallel(b, after=bwd[k], phase="backward", blocks=u.blocks,
                                 name=u.name, mb=mb, unit=u.index)
                expert_parallel(b, after=bwd[k], phase="backward", blocks=u.blocks,
                                name=u.name, mb=mb, unit=u.index)
                if p.recompute == "full":  # the re-run forward's collectives
                    tensor_parallel(b, after=bwd[k], phase="forward",
                                    regions=tp_regions(b.model) * u.blocks,
                                    name=f"{u.name} recompute", mb=mb, unit=u.index)
                tensor_parallel(b, after=bwd[k], phase="backward",
                                regions=tp_regions(b.model) * u.blocks,
                                name=u.name, mb=mb, unit=u.index)
                if reduces:
                    self.reduce(u, bwd[k], mb, final=False)
            tensor_parallel(b, after=bwd[0], phase="backward", regions=1,
                            boundaries=(TP_EMBEDDING_EXIT,), name="embedding", mb=mb)
            emb_b = b.add(name=f"embedding backward (mb {mb})", kind="backward",
                          stream="compute", microbatch=mb,
                          allocs=grad_alloc(root, emb_grad, "/embedding"),
                          frees=(gathered[-1],))
            if reduces:
                self.reduce(root, emb_b, mb, final=True)
            prev_last_bwd = emb_b
        self.optimizer()

    def forward(self, mb: int, blocks: list[Unit], gathered: dict[int, str], *,
                first: int) -> list[int]:
        """Block forwards of micro-batch mb with each unit's pre-forward as FSDP2 runs it:
        all-gather (unless prefetched), copy-out, explicit prefetch of the next units.
        Returns the forward op index of each unit."""
        b, p = self.builder, self.plan
        fwd: list[int] = []
        issued: dict[int, int] = {}
        for k, u in enumerate(blocks):
            if k not in issued:
                # Implicit prefetch: an async host reaches unit k's pre-forward while
                # unit k-1 (the embedding for k = 0) is still running on the device.
                prev = fwd[k - 1] if k else first
                issue = (dict(after_start=(prev,)) if p.prefetch >= 1
                         else dict(issue_after=(prev,)))
                issued[k] = self.all_gather(u, mb, gathered, phase="forward", **issue)
            copy = self.copy_out(u, mb, gathered, phase="forward", gather=issued[k],
                                 hooks=True)
            if p.prefetch >= 2:  # explicit: set_modules_to_forward_prefetch
                for j in range(k + 1, min(k + p.prefetch, len(blocks) - 1) + 1):
                    if j not in issued:
                        issued[j] = self.all_gather(blocks[j], mb, gathered,
                                                    phase="forward", issue_after=(copy,))
            fwd.append(block_forward(b, u, mb, after=(copy,),
                                     frees=(gathered[k],) if p.reshard_after_forward else (),
                                     host_s=self.block_host_s("forward", u)))
            context_parallel(b, after=fwd[-1], phase="forward", blocks=u.blocks, name=u.name,
                             mb=mb, unit=u.index)
            expert_parallel(b, after=fwd[-1], phase="forward", blocks=u.blocks, name=u.name,
                            mb=mb, unit=u.index)
            tensor_parallel(b, after=fwd[-1], phase="forward",
                            regions=tp_regions(b.model) * u.blocks,
                            name=u.name, mb=mb, unit=u.index)
        return fwd

    def block_host_s(self, phase: str, u: Unit) -> float:
        """Host time to issue unit `u`'s blocks in `phase` (block_host_s)."""
        return block_host_s(self.builder.hw, self.plan, phase) * u.blocks

    # ------------------------------------------------------------------ gathers
    def all_gather(self, u: Unit, mb: int, gathered: dict[int, str], *, phase: str,
                   **deps: tuple[int, ...]) -> int:
        """One unit's all-gather as foreach_all_gather runs it: a copy-in on the
        all-gather's side (the all_gather_copy_in stream) allocates the flat output,
        casts each shard to the compute dtype (when the shard is the master copy) and
        copies it into its slice, then the collective. Returns the all-gather op; `deps`
        place the copy-in's issue."""
        b, p = self.builder, self.plan
        key = -1 if u.index is None else u.index
        size = gathered_bytes(b.model, p, u)
        name = f"mb{mb}/{u.name}/gathered/{phase}"
        gathered[key] = name
        frees: tuple[str, ...] = ()
        if p.offload == "params":
            # CPUOffloadPolicy: the shard (in its at-rest dtype) is copied to the GPU
            # before the all-gather, on the same issue point, and dropped after it.
            shard = f"{name}/shard_from_host"
            nbytes = u.shard * _at_rest_bytes(p)
            h2d = b.copy(kind="h2d", nbytes=nbytes,
                         name=f"{u.name} shard to GPU {phase} (mb {mb})", unit=u.index,
                         microbatch=mb,
                         allocs=(Buffer(name=shard, category="comm_buffers", bytes=nbytes,
                                        pieces=fitted(sharded_pieces(
                                            u.shapes, p.dp_shard_cp, _at_rest_bytes(p)), nbytes)),),
                         **deps)
            deps = {"after": (h2d,)}
            frees += (shard,)
        cast = _at_rest_bytes(p) + b.param_elem_bytes if p.has_master_copy else 0
        copy_in = Flops(matmul=0.0, attention=0.0,
                        memory_bytes=u.shard * (cast + 2 * b.param_elem_bytes),
                        kernels=2 if cast else 1)
        first = b.add(name=f"{u.name} copy-in {phase} (mb {mb})", kind=phase,
                      stream="all_gather", unit=u.index, microbatch=mb,
                      compute_s=b.compute(copy_in),
                      allocs=(Buffer(name=f"{name}/flat", category="comm_buffers",
                                     bytes=size, pieces=all_gather_pieces(
                                         u.shard * b.param_elem_bytes if p.has_master_copy
                                         and p.offload == "none" else 0, size)),),
                      **deps)
        if not u.expert_shard:
            return b.collective(
                kind="all_gather", size_bytes=size, group=b.shard, gname="shard",
                name=f"{u.name} all-gather {phase} (mb {mb})", unit=u.index, microbatch=mb,
                after=(first,), frees=frees)
        # Expert parallelism: the routed experts are their own fully_shard, gathered over
        # the ranks holding the same experts right after the dense part.
        dense = u.dense_gathered_elems(p) * b.param_elem_bytes
        first = b.collective(
            kind="all_gather", size_bytes=dense, group=b.shard, gname="shard",
            name=f"{u.name} all-gather {phase} (mb {mb})", unit=u.index, microbatch=mb,
            after=(first,))
        return b.collective(
            kind="all_gather", size_bytes=size - dense, group=b.expert_shard,
            gname="expert_shard", name=f"{u.name} experts all-gather {phase} (mb {mb})",
            unit=u.index, microbatch=mb, after=(first,), frees=frees)

    def copy_out(self, u: Unit, mb: int, gathered: dict[int, str], *, phase: str,
                 gather: int, hooks: bool = False) -> int:
        """The unit's wait_for_unshard in its pre-forward/pre-backward, on the compute
        stream: allocates the unsharded parameters, copies them out of the flat
        all-gather output (split_with_sizes_copy: its memory traffic) and drops the flat
        buffer. With `hooks`, it also carries FSDP2's host time for the unit in this
        micro-batch (the profile's fsdp_unit_overhead_s, on the timeline only on a
        synchronous host)."""
        b = self.builder
        name = gathered[-1 if u.index is None else u.index]
        size = gathered_bytes(b.model, self.plan, u)
        copy = Flops(matmul=0.0, attention=0.0, memory_bytes=2.0 * size, kernels=1)
        host_s = b.host(b.hw.fsdp_unit_overhead_s) if hooks else 0.0
        return b.add(name=f"{u.name} copy-out {phase} (mb {mb})", kind=phase,
                     stream="compute", unit=u.index, microbatch=mb, after=(gather,),
                     compute_s=b.compute(copy) + host_s,
                     allocs=(Buffer(name=name, category="gathered_params", bytes=size,
                                    pieces=fitted(gathered_pieces(u.shapes,
                                                                  self.plan.dp_shard_cp,
                                                                  b.param_elem_bytes),
                                                  size)),),
                     frees=(self.release_all_gather(hold=f"{name}/flat")
                            if phase == "forward" else (f"{name}/flat",)))

    def release_all_gather(self, hold: str | None = None) -> tuple[str, ...]:
        """The held forward all-gather output, released; `hold` is held in its place.
        In forward, wait_for_unshard defers freeing a unit's flat all-gather output to
        overlap its copy-out with the next all-gather (AllGatherState): the next forward
        copy-out frees it once it has allocated its own unsharded parameters, and the
        end of the forward frees the last one."""
        held, self.held_all_gather = self.held_all_gather, hold
        return (held,) if held else ()

    def backward_prefetch(self, blocks: list[Unit], mb: int, gathered: dict[int, str],
                          issued: dict[int, int], *, below: int, after: int) -> None:
        """Backward prefetch from the pre-backward hook that just ran (the root's, after
        the op `after` zsim.schedule.build.head_backward names, when `below` is the unit
        count; else unit `below`'s, after its copy-out `after`): the all-gathers of the
        next `plan.prefetch` units in backward order not issued yet, recorded in
        `issued`."""
        for j in range(below - 1, max(below - 1 - self.plan.prefetch, -1), -1):
            if j not in issued:
                issued[j] = self.all_gather(blocks[j], mb, gathered, phase="backward",
                                            issue_after=(after,))

    # ------------------------------------------------------------------ reduction
    def reduce(self, u: Unit, after: int, mb: int, *, final: bool) -> None:
        """Reduce-scatter of one unit's gradients (+ HSDP all-reduce of the shard), as
        foreach_reduce: on the compute stream, the copy-in (chunk_cat) reads the unsharded
        gradients into the flat input (reduce dtype), which frees them; then the
        collective on its stream; then, on the same stream, the output (reduce dtype) is
        cast to the sharded gradient's dtype when they differ. The input stays alive
        until the next unit's reduce-scatter (reduce_scatter_states, one buffer: released
        in the next post-backward, before its copy-in) or, for the last unit, the end of
        backward. `final`: this is the last reduce-scatter of micro-batch `mb`'s backward
        (the root). A later micro-batch's reduced shard (plan.grad_sync "every") is added
        into the sharded gradient the first one made, then freed."""
        b, p = self.builder, self.plan
        g_bytes, r_bytes = _grad_bytes(p), dtype_bytes(p.reduce_dtype)
        shard_grad = f"{u.name}/grad_shard"
        accumulate = shard_grad in self.grad_shards
        if accumulate:
            shard_grad = f"mb{mb}/{shard_grad}"
        else:
            self.grad_shards.append(shard_grad)
        rs_in_bytes = u.gathered_elems(p) * r_bytes
        rs_in = f"mb{mb}/{u.name}/reduce_scatter_input"
        held = self.held_rs_input
        self.held_rs_input = None if final else rs_in
        copy_bytes = u.params * _unsharded_grad_bytes(p) + rs_in_bytes
        # chunk_cat casting to the reduce dtype runs at its own measured rate; a copy
        # without a cast at the flat one.
        casts = _unsharded_grad_dtype(p) != p.reduce_dtype
        copy_in = Flops(matmul=0.0, attention=0.0, memory_bytes=copy_bytes, kernels=1,
                        traffic=(("reduce_copy_in", "backward", copy_bytes),) if casts else ())
        first = b.add(name=f"{u.name} reduce-scatter copy-in", kind="backward",
                      stream="compute", unit=u.index, microbatch=mb, after=(after,),
                      compute_s=b.compute(copy_in), frees_at_start=(held,) if held else (),
                      allocs=(Buffer(name=rs_in, category="comm_buffers", bytes=rs_in_bytes),),
                      frees=tuple(self.unsharded_grads.pop(u.name, ())))
        allocs = []
        rs_out = f"mb{mb}/{u.name}/reduce_scatter_output"
        if r_bytes != g_bytes:
            allocs.append(Buffer(name=rs_out, category="comm_buffers",
                                 bytes=u.shard * r_bytes))
        allocs.append(Buffer(name=shard_grad, category="grads", bytes=u.shard * g_bytes))
        dense = u.dense_gathered_elems(p) * r_bytes
        last = b.collective(
            kind="reduce_scatter", size_bytes=dense, group=b.shard, gname="shard",
            name=f"{u.name} reduce-scatter", unit=u.index, microbatch=mb, after=(first,),
            allocs=tuple(allocs), frees=(rs_in,) if final and dense == rs_in_bytes else ())
        if dense != rs_in_bytes:  # expert parallelism: the experts' own reduce-scatter
            last = b.collective(
                kind="reduce_scatter", size_bytes=rs_in_bytes - dense, group=b.expert_shard,
                gname="expert_shard", name=f"{u.name} experts reduce-scatter",
                unit=u.index, microbatch=mb, after=(last,), frees=(rs_in,) if final else ())
        if r_bytes != g_bytes:
            cast = Flops(matmul=0.0, attention=0.0,
                         memory_bytes=u.shard * (r_bytes + g_bytes), kernels=1)
            last = b.add(name=f"{u.name} grad cast", kind="backward", stream="reduce_scatter",
                         unit=u.index, microbatch=mb, after=(last,),
                         compute_s=b.compute(cast), frees=(rs_out,))
        if p.dp_replicate > 1:
            last = b.collective(kind="all_reduce", size_bytes=u.shard * r_bytes, group=b.repl,
                                gname="replicate", name=f"{u.name} all-reduce (replicas)",
                                unit=u.index, microbatch=mb, after=(last,))
        if accumulate:  # sharded_param.grad += the new shard (read both, write one)
            add = Flops(matmul=0.0, attention=0.0, memory_bytes=3 * u.shard * g_bytes,
                        kernels=1)
            last = b.add(name=f"{u.name} grad accumulate (mb {mb})", kind="backward",
                         stream="reduce_scatter", unit=u.index, microbatch=mb, after=(last,),
                         compute_s=b.compute(add), frees=(shard_grad,))
        if p.offload != "none":
            last = self.grads_to_host(last, shard_grad, u.shard * g_bytes,
                                      name=f"{u.name} grad shard to host")
        self.last_reduce.append(last)

    def grads_to_host(self, after: int, grad: str, nbytes: int, *, name: str) -> int:
        """Offload: copy a reduced gradient shard to the host for the CPU optimizer
        step. With parameter offload it leaves the GPU right away; with optimizer offload
        the GPU keeps it until the step, as zsim.analytic.memory counts it."""
        b = self.builder
        keep = self.plan.offload == "optimizer"
        if not keep:
            self.grad_shards.remove(grad)
        return b.copy(kind="d2h", nbytes=nbytes, name=name, microbatch=self.plan.grad_accum - 1,
                      after=(after,), frees=() if keep else (grad,))

    def optimizer(self) -> None:
        """AdamW on the local (padded) shards, each parameter a DTensor; on the host when
        offloaded."""
        b, p = self.builder, self.plan
        after, frees = tuple(self.last_reduce), tuple(self.grad_shards)
        tensors = len(b.model.parameter_tensors())
        if p.offload != "none":
            host_optimizer(b, after=after, frees=frees,
                           local_params=b.model.num_params / p.dp_shard_cp, tensors=tensors,
                           dtensor=True)
            return
        device_optimizer(b, after=after, frees=frees,
                         local_params=state_shard_elems(b.model, p.dp_shard_cp,
                                                        p.expert_shard_ranks),
                         tensors=tensors, master_bytes=_at_rest_bytes(p),
                         grad_bytes=_grad_bytes(p), dtensor=True,
                         tensor_elems=tuple(shard_rows(s, p.dp_shard_cp)
                                            for s in module_order(b.model)))


def _lower(b: Builder, root: Unit, blocks: list[Unit]) -> None:
    _Step(b).lower(root, blocks)


PROGRAM = Program(name="fsdp2", shard_elems=shard_elems,
                  state_at_rest_bytes=state_at_rest_bytes, state_pieces=state_pieces,
                  gathered_floor_bytes=gathered_floor_bytes, lower=_lower,
                  host_state_bytes=host_state_bytes)
