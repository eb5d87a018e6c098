"""FSDP1 (`FullyShardedDataParallel`) as torch runs it: fsdp (FULL_SHARD), fsdp-no-reshard
(SHARD_GRAD_OP) and hsdp (HYBRID_SHARD), each wrapped unit one FlatParameter.

Read from torch/distributed/fsdp/ (_flat_param.py, _runtime_utils.py, _limiter_utils.py):
- State. A unit's parameters are flattened into one FlatParameter and chunked across the
  shard group; every rank's chunk is padded to the first one's size (_get_shard), so a
  unit's shard is ceil(its elements / N) (`shard_elems`; the 16-byte address alignment of
  use_orig_params=True, at most 7 elements per parameter, is left out). With
  MixedPrecision the shard stays in fp32 (the master copy): at rest a rank holds it and
  AdamW's two fp32 states, 12 B per sharded element.
- Unshard (`_unshard`): on the pre-unshard stream the fp32 shard is cast into a bf16
  shard (_mp_shard), then the unit's padded unsharded FlatParameter is allocated and
  all-gathered into directly (all_gather_into_tensor on the unshard stream: no copy-out,
  unlike FSDP2), and the bf16 shard freed. The compute stream waits for it.
- Reshard: after a unit's forward (FULL_SHARD, HYBRID_SHARD; never the root) and after
  its backward the unsharded FlatParameter is freed; with limit_all_gathers each free
  records an event in the _FreeEventQueue and an unshard, before issuing its all-gather,
  blocks the host on the oldest event once two are queued. That queue is replayed here in
  the host's order of calls (`_Limiter`), across forward and backward.
- Prefetch. Forward: the host runs ahead, so a unit's all-gather is issued as soon as the
  limiter lets it (without the limiter every all-gather is issued at once);
  forward_prefetch issues the next unit's from the current pre-forward.
  Backward: BACKWARD_PRE issues the next unit's (in backward order) all-gather from the
  current pre-backward, BACKWARD_POST from the current post-backward, None from its own
  pre-backward.
- Gradients. Autograd produces each original parameter's gradient (compute dtype), and the
  split of the FlatParameter into views concatenates them into one unsharded flat
  gradient once the unit's backward is done; the post-backward hook then reduce-scatters
  it in the reduce dtype on the post-backward stream (HYBRID_SHARD then all-reduces the
  shard across replicas), casts the reduced shard to the FlatParameter's fp32 and adds
  it to the sharded gradient (_saved_grad_shard), and the unsharded gradient is freed.
  Without no_sync every micro-batch reduces (torch's default; the unsharded gradient is
  not kept across micro-batches). Sharded gradients live until the optimizer step
  (zero_grad(set_to_none=True)).
- Offload is not modelled for FSDP1 (CPUOffload: see zsim.spec.consistency).
"""

from __future__ import annotations

import math
from collections import deque
from functools import partial

from zsim.analytic.compute import Flops
from zsim.analytic.memory import optimizer_bytes_per_param
from zsim.schedule.build import (
    Builder,
    Shapes,
    Unit,
    block_backward,
    block_forward,
    device_optimizer,
    head_backward,
    head_forward,
    units,
)
from zsim.schedule.ops import Buffer
from zsim.schedule.programs import Program
from zsim.spec.fsdp1 import Fsdp1Options
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes

MAX_INFLIGHT_ALL_GATHERS = 2
"""_FreeEventQueue._max_num_inflight_all_gathers ("empirically chosen")."""


def shard_elems(shapes: Shapes, n: int) -> int:
    """Elements of one rank's chunk of a FlatParameter holding these parameters: the flat
    tensor chunked n ways, every chunk padded to the first (ceil)."""
    return -(-sum(math.prod(s) for s in shapes) // n)


def _master_bytes(plan: Plan) -> int:
    """Bytes per element of the sharded FlatParameter (fp32 under MixedPrecision)."""
    return dtype_bytes(plan.master_dtype if plan.has_master_copy else plan.param_dtype)


def state_at_rest_bytes(model: ModelSpec, plan: Plan) -> dict[str, float]:
    """The sharded FlatParameters (fp32 master under MixedPrecision) and AdamW's states
    over them; no gradients (set to None after the step)."""
    root, blocks = units(model, plan, shard_elems)
    shard = float(root.shard + sum(u.shard for u in blocks))
    params_cat = "master_params" if plan.has_master_copy else "params"
    return {params_cat: shard * _master_bytes(plan),
            "optimizer_states": shard * optimizer_bytes_per_param(plan)}


def gathered_floor_bytes(model: ModelSpec, plan: Plan) -> float:
    """The gathered root (never resharded after forward) and, with SHARD_GRAD_OP, every
    gathered unit."""
    root, blocks = units(model, plan, shard_elems)
    gathered = [root] if plan.reshard_after_forward else [root, *blocks]
    return float(sum(u.gathered_elems(plan) for u in gathered) * dtype_bytes(plan.param_dtype))


class _Limiter:
    """FSDP1's _FreeEventQueue: the op whose end records each free, oldest first."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.queue: deque[int] = deque()

    def enqueue(self, op: int) -> None:
        """A reshard that freed the unsharded parameters, recorded after `op`."""
        if self.on:
            self.queue.append(op)

    def wait(self) -> tuple[int, ...]:
        """dequeue_if_needed before an all-gather: the op the host waits for, if any."""
        if len(self.queue) >= MAX_INFLIGHT_ALL_GATHERS:
            return (self.queue.popleft(),)
        return ()


class _Step:
    """One FSDP1 step being lowered, in the host's order of calls. The host is taken to
    run ahead of the device (an async CUDA host): it only ever waits in the limiter.
    All-gathers and reduce-scatters of the shard group share one NCCL stream, so they run
    in issue order (FSDP1's BackwardPrefetch note: "any collectives, even if issued from
    different streams, contend for the same per-device NCCL stream")."""

    def __init__(self, b: Builder) -> None:
        self.builder = b
        self.plan = b.plan
        self.fsdp1 = b.plan.options_as(Fsdp1Options)
        self.limiter = _Limiter(self.fsdp1.limit_all_gathers)
        self.nccl: tuple[int, ...] = ()
        """The last collective issued on the shard group (its NCCL stream's order)."""
        self.gathered: dict[str, str] = {}
        """Per unit name, its live unsharded FlatParameter buffer."""
        self.ag: dict[str, int] = {}
        """Per unit name, the all-gather that filled it."""
        self.param_grads: dict[str, list[str]] = {}
        """Per unit name, the per-parameter gradients its flat gradient will gather."""
        self.grad_shards: dict[str, str] = {}
        """Per unit name, its sharded fp32 gradient (from its first reduction on)."""
        self.last_reduce: list[int] = []

    def lower(self, root: Unit, blocks: list[Unit]) -> None:
        b, p, fsdp1 = self.builder, self.plan, self.fsdp1
        emb_params = 0 if b.model.tied_embeddings else b.model.embedding_params
        for mb in range(p.grad_accum):
            # ---- forward: the root's pre-forward, then each unit's
            self.unshard(root, mb, "forward")
            if fsdp1.forward_prefetch:
                self.unshard(blocks[0], mb, "forward")
            prev = b.add(name=f"embedding forward (mb {mb})", kind="forward",
                         stream="compute", microbatch=mb, after=(self.ag[root.name],))
            for k, u in enumerate(blocks):
                self.unshard(u, mb, "forward")
                if fsdp1.forward_prefetch and k + 1 < len(blocks):
                    self.unshard(blocks[k + 1], mb, "forward")
                reshard = p.reshard_after_forward
                prev = block_forward(b, u, mb, after=(prev, self.ag[u.name]),
                                     frees=(self.gathered.pop(u.name),) if reshard else ())
                if reshard:
                    self.limiter.enqueue(prev)
            head_f = head_forward(b, mb, after=(prev,))
            # ---- backward: the root's pre-backward (on its output's gradient: the
            # loss's as the backward starts, or the logits' after the loss's backward)
            # may prefetch the last unit
            prev = head_backward(
                b, mb, after=(head_f,), grads=self.grads(root, mb, root.params - emb_params),
                forward=head_f,
                root_pre_backward=partial(self.unshard, blocks[-1], mb, "backward")
                if fsdp1.backward_prefetch == "pre" else None)
            for k in reversed(range(len(blocks))):
                u = blocks[k]
                self.unshard(u, mb, "backward")
                if fsdp1.backward_prefetch == "pre" and k > 0:
                    self.unshard(blocks[k - 1], mb, "backward")
                bwd = block_backward(b, u, mb, after=(prev, self.ag[u.name]),
                                     grads=self.grads(u, mb, u.params))
                prev = self.flat_grad(u, mb, bwd)
                if fsdp1.backward_prefetch == "post" and k > 0:
                    self.unshard(blocks[k - 1], mb, "backward")
                self.reduce(u, mb, prev)
            emb_b = b.add(name=f"embedding backward (mb {mb})", kind="backward",
                          stream="compute", microbatch=mb, after=(prev,),
                          allocs=self.grads(root, mb, emb_params, part="/embedding"))
            self.reduce(root, mb, self.flat_grad(root, mb, emb_b))
        self.optimizer()

    # ------------------------------------------------------------------ unshard
    def unshard(self, u: Unit, mb: int, phase: str, *, after: int | None = None) -> None:
        """`_unshard` of unit u unless it is gathered (prefetched, not resharded, or the
        root before its post-backward): the cast of the fp32 shard to a compute-dtype
        shard (pre-unshard stream), the limiter's wait, then the all-gather into the
        newly allocated padded FlatParameter, which frees the cast shard; issued once op
        `after` has finished (the hook that unshards runs there) when given."""
        if u.name in self.gathered:
            return
        b, p = self.builder, self.plan
        name = f"mb{mb}/{u.name}/gathered/{phase}"
        self.gathered[u.name] = name
        size = u.gathered_elems(p) * b.param_elem_bytes
        wait = self.limiter.wait() + (() if after is None else (after,))
        after: tuple[int, ...] = self.nccl
        frees: tuple[str, ...] = ()
        if p.has_master_copy:
            mp_shard = f"{name}/mp_shard"
            cast = Flops(matmul=0.0, attention=0.0,
                         memory_bytes=u.shard * (_master_bytes(p) + b.param_elem_bytes), kernels=1)
            after += (b.add(name=f"{u.name} cast to {p.param_dtype} {phase} (mb {mb})",
                            kind=phase, stream="all_gather", unit=u.index, microbatch=mb,
                            compute_s=b.compute(cast), issue_after=wait,
                            allocs=(Buffer(name=mp_shard, category="comm_buffers",
                                           bytes=u.shard * b.param_elem_bytes),)),)
            frees = (mp_shard,)
        op = b.collective(
            kind="all_gather", size_bytes=size, group=b.shard, gname="shard",
            name=f"{u.name} all-gather {phase} (mb {mb})", unit=u.index, microbatch=mb,
            after=after, issue_after=wait,
            allocs=(Buffer(name=name, category="gathered_params", bytes=size),), frees=frees)
        self.ag[u.name] = op
        self.nccl = (op,)

    # ------------------------------------------------------------------ gradients
    def grads(self, u: Unit, mb: int, params: int, part: str = "") -> tuple[Buffer, ...]:
        """Autograd's per-parameter gradients (compute dtype) of `params` elements of u,
        held until the FlatParameter's split backward concatenates them."""
        if params == 0:
            return ()
        name = f"mb{mb}/{u.name}/param_grads{part}"
        self.param_grads.setdefault(u.name, []).append(name)
        return (Buffer(name=name, category="gathered_grads",
                       bytes=params * self.builder.param_elem_bytes),)

    def flat_grad(self, u: Unit, mb: int, after: int) -> int:
        """The split backward's concatenation of u's gradients into its unsharded flat
        gradient, then the post-backward hook's reshard: frees the gradients it read and
        the unsharded parameters, records the limiter's event. Carries FSDP's host time
        for the unit in this micro-batch."""
        b = self.builder
        size = u.gathered_elems(self.plan) * b.param_elem_bytes
        copy = Flops(matmul=0.0, attention=0.0, memory_bytes=2.0 * size, kernels=1)
        op = b.add(name=f"{u.name} flat gradient (mb {mb})", kind="backward",
                   stream="compute", unit=u.index, microbatch=mb, after=(after,),
                   compute_s=b.compute(copy) + b.host(b.hw.fsdp_unit_overhead_s),
                   allocs=(Buffer(name=f"mb{mb}/{u.name}/unsharded_grad",
                                  category="gathered_grads", bytes=size),),
                   frees=(*self.param_grads.pop(u.name, ()), self.gathered.pop(u.name)))
        self.limiter.enqueue(op)
        return op

    def reduce(self, u: Unit, mb: int, flat: int) -> None:
        """The post-backward reduction: reduce-scatter of the flat gradient (reduce dtype)
        on the shard group's NCCL stream, which frees it; HSDP's all-reduce of the shard
        across replicas; the cast of the reduced shard to fp32, added to the sharded
        gradient (allocated by the first micro-batch)."""
        b, p = self.builder, self.plan
        r_bytes, g_bytes = dtype_bytes(p.reduce_dtype), _master_bytes(p)
        reduced = f"mb{mb}/{u.name}/reduced_shard"
        last = b.collective(
            kind="reduce_scatter", size_bytes=u.gathered_elems(p) * r_bytes, group=b.shard,
            gname="shard", name=f"{u.name} reduce-scatter (mb {mb})", unit=u.index,
            microbatch=mb, after=(flat, *self.nccl),
            allocs=(Buffer(name=reduced, category="comm_buffers", bytes=u.shard * r_bytes),),
            frees=(f"mb{mb}/{u.name}/unsharded_grad",))
        self.nccl = (last,)
        if p.dp_replicate > 1:
            last = b.collective(kind="all_reduce", size_bytes=u.shard * r_bytes, group=b.repl,
                                gname="replicate", name=f"{u.name} all-reduce (replicas)",
                                unit=u.index, microbatch=mb, after=(last,))
        first = u.name not in self.grad_shards
        shard_grad = self.grad_shards.setdefault(u.name, f"{u.name}/grad_shard")
        # cast: read the reduced shard, write fp32; accumulate: read both, write one
        traffic = u.shard * (r_bytes + g_bytes + (0 if first else 3 * g_bytes))
        self.last_reduce.append(b.add(
            name=f"{u.name} grad to {p.master_dtype} (mb {mb})", kind="backward",
            stream="reduce_scatter", unit=u.index, microbatch=mb, after=(last,),
            compute_s=b.compute(Flops(matmul=0.0, attention=0.0, memory_bytes=traffic,
                                      kernels=1 if first else 2)),
            allocs=(Buffer(name=shard_grad, category="grads", bytes=u.shard * g_bytes),)
            if first else (), frees=(reduced,)))

    def optimizer(self) -> None:
        """AdamW (foreach) over the FlatParameters' fp32 shards; gradients set to None."""
        b, p = self.builder, self.plan
        root, blocks = units(b.model, p, shard_elems)
        device_optimizer(b, after=tuple(self.last_reduce),
                         frees=tuple(self.grad_shards.values()),
                         local_params=root.shard + sum(u.shard for u in blocks),
                         tensors=1 + len(blocks), master_bytes=_master_bytes(p),
                         grad_bytes=_master_bytes(p))


def _lower(b: Builder, root: Unit, blocks: list[Unit]) -> None:
    _Step(b).lower(root, blocks)


PROGRAM = Program(name="fsdp1", shard_elems=shard_elems,
                  state_at_rest_bytes=state_at_rest_bytes,
                  gathered_floor_bytes=gathered_floor_bytes, lower=_lower)
