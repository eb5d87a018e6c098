"""torch's DistributedDataParallel (ddp) and DDP + ZeroRedundancyOptimizer (zero1,
`--impl torch`) as the backend runs them.

- State: fp32 parameters under torch.autocast (DDP has no compute-dtype parameter mode),
  and the reducer's gradient buckets in the same dtype, allocated at construction with
  the gradients as views into them (gradient_as_bucket_view=True), alive all the time;
  AdamW states, partitioned over the ranks for zero1. The activations are autocast's
  (zsim.analytic.activations, autocast=True).
- Reduction: in buckets of `plan.bucket_bytes` in the parameters' dtype (fp32 under
  autocast: zsim.analytic.comm.ddp_bucket_dtype; plan.reduce_dtype is not read), filled
  with whole tensors in the order their gradients become ready, as the reducer rebuilds
  its buckets after the first step (Reducer::rebuild_buckets ->
  compute_bucket_assignment_by_size): the output projection and final norm after the
  head's backward, each block's in reverse module order, the embedding last. The backend
  passes bucket_cap_mb, so the first bucket's cap is the same (torch's 1 MiB first
  bucket, dist._DEFAULT_FIRST_BUCKET_BYTES, is only for bucket_cap_mb=None). Each bucket
  is all-reduced over the data-parallel group with async_op by the backward op that
  completes it (zero1 too: DDP reduces whole gradients whatever optimizer steps them),
  once per optimizer step (no_sync before the last micro-batch).
- zero1's ZeroRedundancyOptimizer steps on the rank's partition (whole tensors: the mean
  partition is 1/N of the model), then each rank's updated partition goes to every other
  rank: torch broadcasts each parameter from its owner (_sync_params), which zsim, with
  no broadcast kind, stands for by all-gathers of the parameters in their dtype (fp32,
  the module's), in buckets.
- Offloaded plans keep the closed-form state of zsim.analytic.memory on the device
  (ZeRO-Offload): the reduced gradients go to the host (d2h) and the optimizer steps
  there, on the master copy and states the host holds
  (zsim.schedule.programs.offloaded_state_bytes).
- Tensor parallelism (ddp): each rank runs its shard of the model
  (zsim.schedule.lower.rank_model) as parallelize_module leaves it, with the TP
  collectives of zsim.schedule.build.tensor_parallel where activations enter and leave
  its parallel regions (the embedding's output, each block's attention and MLP, the
  output projection's input), and DDP over the data-parallel group of each TP rank
  (zsim.analytic.placement: the "dp_replicate" axis) all-reduces its local gradients.
  With one data-parallel rank there is no DDP (has_reducer): torchtitan, like the TP
  and pipeline backends (zsim.backend.tensor_parallel, pipeline), runs the
  parallelised module bare, so autograd allocates each gradient in its backward and the
  step sets them to None (no buckets, no all-reduce). Pipelines are replayed per rank by
  zsim.schedule.pipeline_work with this module's state.
"""

from __future__ import annotations

import math

from zsim.analytic.comm import ddp_bucket_dtype
from zsim.analytic.memory import model_state_bytes, optimizer_bytes_per_param
from zsim.schedule.build import (
    TP_EMBEDDING_EXIT,
    TP_ENTER,
    Builder,
    Shapes,
    Unit,
    block_backward,
    block_forward,
    device_optimizer,
    gather_logits,
    head_backward,
    head_forward,
    host_optimizer,
    pack_whole_tensors,
    root_split,
    tensor_parallel,
    tp_regions,
)
from zsim.schedule.ops import Buffer
from zsim.schedule.programs import Program
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes


def shard_elems(shapes: Shapes, n: int) -> int:
    """Parameters are not sharded: a rank holds every element."""
    return sum(math.prod(s) for s in shapes)


def _at_rest_bytes(plan: Plan) -> int:
    return dtype_bytes(plan.master_dtype if plan.has_master_copy else plan.param_dtype)


def has_reducer(plan: Plan) -> bool:
    """Whether DistributedDataParallel wraps the model: always without model parallelism
    (the DDP runner wraps even one rank), and with TP or PP only over more than one
    data-parallel rank (with one, the model-parallel rank runs bare: see the module
    docstring)."""
    return plan.model_parallel == 1 or plan.dp_degree > 1


def _persistent_grads(plan: Plan) -> bool:
    """The reducer's buckets (and the gradients, views into them) never come or go
    during a step."""
    return plan.offload == "none" and has_reducer(plan)


def _local_state_elems(model: ModelSpec, plan: Plan) -> int:
    """Parameters the rank's optimizer steps on: all of them (ddp), or the mean
    ZeroRedundancyOptimizer partition (zero1)."""
    return -(-model.num_params // plan.dp_shard) if plan.shards_optimizer else model.num_params


def state_at_rest_bytes(model: ModelSpec, plan: Plan) -> dict[str, float]:
    """Every parameter and its gradient bucket in the at-rest dtype, and the optimizer
    states, partitioned for zero1."""
    if plan.offload != "none":
        closed = model_state_bytes(model.num_params, plan).as_dict()
        return {c: v for c, v in closed.items() if c != "grads"}
    w = _at_rest_bytes(plan)
    params_cat = "master_params" if plan.has_master_copy else "params"
    out = {params_cat: float(model.num_params) * w,
           "optimizer_states": _local_state_elems(model, plan) * optimizer_bytes_per_param(plan)}
    if _persistent_grads(plan):
        out["grads"] = float(model.num_params) * w
    return out


def _grad_bytes(plan: Plan) -> int:
    """Bytes per element of the gradients: the parameters' (DDP's buckets), except
    offloaded plans, which keep the closed form's grad dtype."""
    return _at_rest_bytes(plan) if plan.offload == "none" else dtype_bytes(plan.grad_dtype)


class _Buckets:
    """Bucketed gradient reduction in readiness order: a bucket's all-reduce is issued,
    with async_op, by the backward op that completes it, right after that op in the
    host's order. Buckets hold whole tensors (pack_whole_tensors) in the bucket dtype
    (ddp_bucket_dtype), so there are never more buckets than parameter tensors."""

    def __init__(self, b: Builder) -> None:
        p = b.plan
        self.builder = b
        self.dtype = ddp_bucket_dtype(p)
        self.per_bucket = max(1, p.bucket_bytes // dtype_bytes(self.dtype))
        self.pending = 0
        self.issued: list[int] = []

    def ready(self, numels: tuple[int, ...], op: int) -> None:
        """The gradients of these tensors (module order) are complete once `op` has run:
        they join the buckets last to first, as backward produces them."""
        *full, self.pending = pack_whole_tensors(reversed(numels), self.per_bucket,
                                                 pending=self.pending)
        for elems in full:
            self._flush(elems, op)

    def finish(self, last: int) -> list[int]:
        """Flush the partial last bucket (after `last`); returns each bucket's final op."""
        if self.pending:
            self._flush(self.pending, last)
            self.pending = 0
        return self.issued

    def _flush(self, elems: int, after: int) -> None:
        b, p = self.builder, self.builder.plan
        bucket = len(self.issued)
        ddp = p.strategy == "ddp"
        # DDP's process group: every data-parallel rank (dp_replicate for ddp, dp_shard
        # for zero1, the other degree 1).
        group, gname = (b.repl, "replicate") if ddp else (b.shard, "shard")
        op = b.collective(kind="all_reduce", size_bytes=elems * dtype_bytes(self.dtype),
                          group=group, gname=gname, dtype=self.dtype,
                          name=f"bucket {bucket} all-reduce", unit=bucket,
                          microbatch=p.grad_accum - 1, after=(after,), async_op=True)
        if p.offload == "optimizer":
            local = elems if ddp else math.ceil(elems / p.dp_shard)
            op = b.copy(kind="d2h", nbytes=local * _grad_bytes(p), unit=bucket,
                        name=f"bucket {bucket} grads to host",
                        microbatch=p.grad_accum - 1, after=(op,))
        self.issued.append(op)


def _lower(b: Builder, root: Unit, blocks: list[Unit]) -> None:
    p = b.plan
    persistent = _persistent_grads(p)
    grad_buffers: list[str] = []
    last_reduce: list[int] = []
    for mb in range(p.grad_accum):
        last_mb = mb == p.grad_accum - 1

        def grad_alloc(u: Unit, mb: int = mb) -> tuple[Buffer, ...]:
            if mb > 0 or persistent:
                return ()  # the reducer's buckets are part of the state at rest
            name = f"{u.name}/full_grad"
            grad_buffers.append(name)
            return (Buffer(name=name, category="grads", bytes=u.params * _grad_bytes(p)),)

        emb = b.add(name=f"embedding forward (mb {mb})", kind="forward", stream="compute",
                    microbatch=mb)
        # RowwiseParallel embedding: its output leaves a TP region (nothing with tp 1).
        tensor_parallel(b, after=emb, phase="forward", regions=1,
                        boundaries=(TP_EMBEDDING_EXIT,), name="embedding", mb=mb)
        fwd = []
        for u in blocks:
            fwd.append(block_forward(b, u, mb))
            tensor_parallel(b, after=fwd[-1], phase="forward",
                            regions=tp_regions(b.model) * u.blocks,
                            name=u.name, mb=mb, unit=u.index)
        # ColwiseParallel output projection: its input enters one.
        tensor_parallel(b, after=fwd[-1] if fwd else emb, phase="forward", regions=1,
                        boundaries=(TP_ENTER,), name="output", mb=mb)
        head_f = head_forward(b, mb, after=(fwd[-1] if fwd else emb,))
        gather_logits(b, after=head_f, mb=mb)
        head_b = head_backward(b, mb, grads=grad_alloc(root))
        buckets = _Buckets(b) if last_mb and has_reducer(p) else None
        head_numels, emb_numels = root_split(b.model)
        if buckets is not None:
            buckets.ready(head_numels, head_b)
        tensor_parallel(b, after=head_b, phase="backward", regions=1, boundaries=(TP_ENTER,),
                        name="output", mb=mb)
        op = head_b
        for u in reversed(blocks):
            op = block_backward(b, u, mb, grads=grad_alloc(u))
            if p.recompute == "full":  # the re-run forward's collectives
                tensor_parallel(b, after=op, phase="forward",
                                regions=tp_regions(b.model) * u.blocks,
                                name=f"{u.name} recompute", mb=mb, unit=u.index)
            tensor_parallel(b, after=op, phase="backward", regions=tp_regions(b.model) * u.blocks,
                            name=u.name, mb=mb, unit=u.index)
            if buckets is not None:
                buckets.ready(u.tensors, op)
        tensor_parallel(b, after=op, phase="backward", regions=1,
                        boundaries=(TP_EMBEDDING_EXIT,), name="embedding", mb=mb)
        emb_b = b.add(name=f"embedding backward (mb {mb})", kind="backward", stream="compute",
                      microbatch=mb)
        if buckets is not None:
            buckets.ready(emb_numels, emb_b)
            last_reduce.extend(buckets.finish(emb_b))
    after, frees = tuple(last_reduce), tuple(grad_buffers)
    if p.offload != "none":
        opt = host_optimizer(b, after=after, frees=frees,
                             local_params=b.model.num_params / p.dp_shard)
    else:
        tensors = len(b.model.parameter_tensors())
        # ZeroRedundancyOptimizer partitions whole tensors.
        opt = device_optimizer(
            b, after=after, frees=frees, local_params=_local_state_elems(b.model, p),
            tensors=math.ceil(tensors / p.dp_shard) if p.shards_optimizer else tensors,
            master_bytes=_at_rest_bytes(p), grad_bytes=dtype_bytes(p.grad_dtype),
            dtensor=p.tp > 1)
    if p.strategy == "zero1":
        _param_all_gather(b, opt)


def _param_all_gather(b: Builder, opt: int) -> None:
    """zero1: every rank's updated partition sent to the others, in the module's
    parameter dtype (ZeroRedundancyOptimizer._sync_params broadcasts each parameter from
    its owner), stood for by all-gathers of the parameters in buckets of whole tensors."""
    p, m = b.plan, b.model
    dtype = p.master_dtype  # the module's parameters (ddp_bucket_dtype's reading)
    w = dtype_bytes(dtype)
    numels = [math.prod(s) for _, s in m.root_tensors()]
    numels += [math.prod(s) for _, s in m.block_tensors()] * m.num_layers
    per = max(1, p.bucket_bytes // w)
    *full, last = pack_whole_tensors(numels, per)
    for i, elems in enumerate([*full, last] if last else full):
        b.collective(kind="all_gather", size_bytes=elems * w, group=b.shard,
                     gname="shard", dtype=dtype, name=f"param all-gather bucket {i}", unit=i,
                     microbatch=p.grad_accum - 1, after=(opt,))


PROGRAM = Program(name="torch", shard_elems=shard_elems,
                  state_at_rest_bytes=state_at_rest_bytes,
                  gathered_floor_bytes=lambda model, plan: 0.0, lower=_lower)
