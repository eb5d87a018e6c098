"""Lowering: (ModelSpec, HardwareProfile, Plan) -> the ops of one optimizer step.

Owns the order of kernels and collectives each strategy issues, their dependencies and
the memory they allocate and free; durations come from zsim.analytic.compute, collective
sizes and links from zsim.analytic.comm, saved tensors from zsim.analytic.activations;
the model state at rest is the program's (state_at_rest_bytes; zsim.analytic.memory keeps
the published closed form). Never simulates and never imports simpy.

What is modelled: the programs the torch backend (zsim.calibrate.fsdp2) runs.
- fsdp, fsdp-no-reshard, hsdp and zero2 run FSDP2's fully_shard (zero2 as
  reshard_after_forward=False, its closest real equivalent; torch/distributed/fsdp/
  _fully_shard/_fsdp_param.py, _fsdp_collectives.py, _fsdp_param_group.py). With a
  MixedPrecisionPolicy the sharded parameter is the fp32 master copy: at rest a rank holds
  only it and the optimizer states (12 B/param/N for AdamW, not the ZeRO paper's 16/N);
  the all-gather writes the compute-dtype cast of the shard straight into the flat output
  buffer (no separate input copy). Each parameter is sharded on dim 0 and every rank's
  shard padded to the first chunk (fsdp2_shard_elems), so all-gather outputs, gathered
  parameters and reduce-scatter inputs are dp_shard padded shards. Sharded gradients take the sharded parameter's dtype:
  foreach_reduce reduce-scatters in the reduce dtype and, when that differs, casts the
  output; they live from the unit's reduce-scatter until the optimizer step (gradients set
  to None). FSDP2 keeps one reduce-scatter input alive until the next unit's
  post-backward (reduce_scatter_states, cap 1), and clears it at the end of backward.
- ddp and zero1 run DistributedDataParallel(gradient_as_bucket_view=True) with fp32
  parameters under torch.autocast (ZeroRedundancyOptimizer for zero1): at rest params
  4 B + the reducer's gradient buckets 4 B (allocated at construction, the gradients are
  views into them, alive all the time) + optimizer states (sharded over N for zero1). The
  activations are autocast's (zsim.analytic.activations, autocast=True).
- Offloaded plans keep the closed-form state of zsim.analytic.memory (ZeRO-Offload).
- memory_floor_bytes: the least the program holds at once (zsim.simulate reports a plan
  whose floor exceeds HBM from it, without simulating).
The plan's grad_dtype is therefore not a storage dtype of these programs; the closed-form
table (zsim.analytic.memory) keeps the ZeRO paper's accounting.

Order of ops (FSDP2 semantics; DDP's Reducer and DeepSpeed ZeRO-1 for the
unsharded-parameter strategies). Ops are emitted in the host thread's order (FSDP2's
hooks, the autograd engine, DDP's reducer hooks); streams and dependencies say what may
overlap on an async device.
- FSDP units: the root (embeddings, final norm, output; FSDP2's root is not resharded
  after forward, so it is gathered once per micro-batch) and blocks grouped by
  `plan.unit_size`. Each unit's all-gather is preceded on its stream by a copy-in that
  allocates the flat buffer, casts the shard to the compute dtype and copies it in; a
  copy-out op on the compute stream, right before the unit runs, allocates the gathered
  parameters and frees the flat buffer (FSDP2's wait_for_unshard in the unit's pre-hook).
- Forward prefetch: implicit in FSDP2 (p = `plan.prefetch` >= 1): an async host reaches
  unit k's pre-forward, and issues its all-gather, when unit k-1 starts computing;
  p >= 2 adds set_modules_to_forward_prefetch of the next units from each pre-forward;
  p = 0 issues a unit's all-gather after unit k-1 ends. Backward prefetch (explicit):
  each pre-backward (the root's before the head's backward) issues the all-gathers of
  the next p units in backward order. This also bounds the gathered units in flight.
- reshard_after_forward frees the gathered parameters after a unit's forward (fsdp, hsdp)
  or keeps them until after its backward (fsdp-no-reshard).
- Gradients are reduced once per optimizer step, on the last micro-batch (FSDP2 with
  set_requires_gradient_sync(False) and DDP's no_sync accumulate locally before it, as
  zsim.analytic.comm.step_comm counts). FSDP copies each unit's gradients into a flat
  input on the compute stream, reduce-scatters it in the reduce dtype on its own stream
  and casts the output to the gradient shard's dtype there; HSDP then all-reduces the
  shard across replicas on a separate stream. DDP/ZeRO-1 reduce in buckets of
  `plan.bucket_bytes` as gradients become ready in backward (async_op: the host goes on).
- The optimizer steps on the local shard after every reduction, memory-bound (AdamW
  reads and writes master weights and states and reads the gradient); ZeRO-1 then
  all-gathers the updated parameters. Gradients are set to None after the step, so memory
  returns to the model state at rest.
- Recomputation: the block's forward is re-run inside its backward (compute), and the
  tensors it re-materialises live during that backward (memory).
- Offload (ZeRO-Offload / FSDP2 CPUOffloadPolicy): reduced gradient shards are copied to
  the host over PCIe (d2h stream), the optimizer steps on the host CPU at the profile's
  host AdamW rate shared by the node's GPUs; with "optimizer" the updated compute-dtype
  shard is copied back (h2d), with "params" each all-gather is preceded by an h2d copy of
  the unit's shard. Copies run on copy engines: they share PCIe, not SMs.
- A synchronous host (profile host.launch, a CPU rank) runs every kernel itself and
  blocks in each collective issued without async_op: the ops it runs or waits for form
  one chain in host order (_on_synchronous_host), the host's own costs (FSDP2's hooks per
  unit, each blocking collective call, activation checkpointing's hooks and dispatch
  modes per block) land on the timeline. On any host, kernels are
  stretched by the profile's rank skew (0 in the GPU profiles).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from zsim.analytic.activations import (
    STATE_ALIASES,
    block_activation_bytes,
    block_backward_working_bytes,
    block_recompute_bytes,
    loss_working_bytes,
    root_saved_tensors,
)
from zsim.analytic.comm import (
    CommGroup,
    bus_bytes,
    collective_latency_s,
    link_bandwidths,
    link_loads,
    replicate_group,
    shard_group,
)
from zsim.analytic.compute import (
    Flops,
    block_backward_flops,
    block_forward_flops,
    compute_time_s,
    head_forward_flops,
    optimizer_flops,
    recompute_forward_flops,
    step_flops,
)
from zsim.analytic.memory import model_state_bytes, optimizer_bytes_per_param
from zsim.errors import ConfigError
from zsim.schedule.ops import Buffer, Op, Schedule
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class _Unit:
    """One FSDP unit (or, for ddp/zero, one gradient-readiness group)."""

    name: str
    index: int | None
    """Block-unit index, None for the root."""
    params: int
    blocks: int
    tensors: tuple[int, ...]
    """Elements of each parameter tensor of the unit, in module order."""
    shard: int
    """Elements of one rank's shard of the unit (FSDP2: padded per parameter,
    fsdp2_shard_elems); the unit's all-gather output and its gathered parameters hold
    dp_shard times as many."""

    def gathered_elems(self, plan: Plan) -> int:
        """Elements of the unit's all-gather output, and of its unsharded parameters
        (views into per-parameter all-gather outputs in FSDP2): dp_shard padded shards."""
        return self.shard * plan.dp_shard


class _Builder:
    """Accumulates ops in issue order."""

    def __init__(self, model: ModelSpec, hw: HardwareProfile, plan: Plan) -> None:
        self.model, self.hw, self.plan = model, hw, plan
        self.ops: list[Op] = []
        self.dtype = plan.param_dtype
        self.a = dtype_bytes(plan.param_dtype)
        self.shard = shard_group(plan, hw)
        self.repl = replicate_group(plan, hw)
        self.unsharded_grads: dict[str, list[str]] = {}
        """FSDP: per unit, the unsharded gradient buffers its reduce-scatter consumes."""
        self.held_rs_input: str | None = None
        """FSDP: the reduce-scatter input still held for the previous unit."""
        self.acts = activation_sizes(model, plan)
        self.block_fwd, self.block_bwd = _block_flops(self)
        """Work of one block for one micro-batch: forward, and backward including
        recomputation."""

    def add(self, **kw: object) -> int:
        index = len(self.ops)
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
        """A pinned host<->device copy over this GPU's PCIe link (one direction)."""
        return self.add(kind=kind, stream=kind, size_bytes=nbytes, bus_bytes=nbytes,
                        link="pcie", link_loads=((f"pcie_{kind}", 1.0),), **kw)

    def collective(self, *, kind: str, size_bytes: float, group: CommGroup, gname: str,
                   **kw: object) -> int:
        """A collective on its own stream; one issued without async_op that blocks a
        synchronous host starts later by the host's cost of the call."""
        hw = self.hw
        call_s = 0.0 if kw.get("async_op") else self.host(hw.collective_overhead_s)
        return self.add(kind=kind, stream=kind, size_bytes=size_bytes,
                        bus_bytes=bus_bytes(kind, size_bytes, group.ranks),
                        latency_s=collective_latency_s(kind, group, hw) + call_s,
                        link="inter_node" if group.spans_nodes else "intra_node",
                        link_loads=link_loads(kind, group, self.hw),
                        group_ranks=group.ranks,
                        group=gname, **kw)


def fsdp2_shard_elems(shapes: Iterable[tuple[int, ...]], n: int) -> int:
    """Elements of one rank's shard of these parameters in FSDP2 on `n` ranks: each
    parameter is chunked on dim 0 (torch.chunk: ceil(dim0 / n) rows in the first chunk)
    and every rank's shard is padded to the first chunk's size
    (_fully_shard/_fsdp_param.py, _init_sharded_param). At most n - 1 rows of padding per
    parameter; once n exceeds a parameter's rows, every rank holds a whole row of it."""
    return sum(-(-shape[0] // n) * math.prod(shape[1:]) for shape in shapes)


def fsdp2_state_shard_elems(model: ModelSpec, n: int) -> int:
    """Elements of one rank's shard of the whole model in FSDP2 on `n` ranks."""
    return (fsdp2_shard_elems((s for _, s in model.root_tensors()), n)
            + model.num_layers * fsdp2_shard_elems((s for _, s in model.block_tensors()), n))


def _units(model: ModelSpec, plan: Plan) -> tuple[_Unit, list[_Unit]]:
    """The root unit and the block units in forward order."""
    if plan.unit_size > model.num_layers:
        raise ConfigError("plan.unit_size", plan.unit_size,
                          f"must be <= num_layers={model.num_layers}")
    n = plan.dp_shard
    block = [s for _, s in model.block_tensors()]
    block_shard = fsdp2_shard_elems(block, n)
    root_shapes = [s for _, s in model.root_tensors()]
    root = _Unit(name="root", index=None, params=model.root_params, blocks=0,
                 tensors=tuple(math.prod(s) for s in root_shapes),
                 shard=fsdp2_shard_elems(root_shapes, n))
    out = []
    for i, first in enumerate(range(0, model.num_layers, plan.unit_size)):
        blocks = min(plan.unit_size, model.num_layers - first)
        out.append(_Unit(name=f"unit {i}", index=i, params=blocks * model.params_per_block,
                         blocks=blocks, tensors=tuple(math.prod(s) for s in block) * blocks,
                         shard=blocks * block_shard))
    return root, out


def lower(model: ModelSpec, hw: HardwareProfile, plan: Plan) -> Schedule:
    """Build the schedule of one optimizer step of a representative rank.

    Raises:
        ConfigError: a plan the simulator does not model (tp or pp, parameter offload
            without sharded parameters), or a unit size larger than the model.
    """
    for f in ("tp", "pp"):
        if getattr(plan, f) != 1:
            raise ConfigError(f"plan.{f}", getattr(plan, f),
                              "the simulator models data parallelism only (tp = pp = 1)")
    if plan.offload == "params" and not plan.shards_params:
        raise ConfigError("plan.offload", plan.offload,
                          "parameter offload needs sharded parameters "
                          "(fsdp, fsdp-no-reshard, hsdp)")
    if plan.strategy == "zero2":
        # The backend's zero2: fully_shard(reshard_after_forward=False), the same program.
        plan = plan.with_(strategy="fsdp-no-reshard")
    b = _Builder(model, hw, plan)
    root, units = _units(model, plan)
    baseline = tuple(Buffer(name=f"state/{c}", category=c, bytes=math.ceil(v))
                     for c, v in state_at_rest_bytes(model, plan).items() if v > 0)
    if model.buffer_bytes:
        # Module buffers (RoPE tables) live with the parameters, replicated on every rank.
        baseline += (Buffer(name="state/buffers", category="params", bytes=model.buffer_bytes),)
    grad_buffers: list[str] = []
    last_reduce: list[int] = []
    if plan.shards_params:
        _lower_fsdp(b, units, root, grad_buffers, last_reduce)
    else:
        _lower_replicated(b, units, root, grad_buffers, last_reduce)
    opt = _optimizer(b, last_reduce, grad_buffers)
    if plan.strategy == "zero1":
        _param_all_gather(b, opt)
    last_per_stream: dict[str, int] = {}
    for op in b.ops:
        last_per_stream[op.stream] = op.index
    b.add(name="end of step", kind="sync", stream="compute",
          after=tuple(i for s, i in last_per_stream.items() if s != "compute"))
    model_flops, _ = step_flops(model, micro_batch=plan.micro_batch, seq_len=plan.seq_len,
                                grad_accum=plan.grad_accum, recompute=plan.recompute)
    ops = tuple(b.ops) if hw.launch == "async" else _on_synchronous_host(b.ops)
    return Schedule(
        ops=ops, baseline=baseline, launch=hw.launch,
        link_bytes_per_s={**link_bandwidths(hw),
                          "pcie_h2d": hw.pcie_bytes_per_s * hw.pcie_efficiency,
                          "pcie_d2h": hw.pcie_bytes_per_s * hw.pcie_efficiency},
        comm_compute_slowdown=hw.comm_compute_slowdown,
        compute_comm_slowdown=hw.compute_comm_slowdown, hbm_bytes=hw.hbm_bytes,
        model_flops=model_flops, hardware_flops=sum(op.flops for op in b.ops),
        tokens_per_rank=plan.micro_batch * plan.seq_len * plan.grad_accum,
        world_size=plan.world_size, peak_flop_per_s=hw.peak(plan.param_dtype),
        dp_shard=plan.dp_shard,
        notes=("gradients reduced once per step, on the last micro-batch",))


def _on_synchronous_host(ops: list[Op]) -> tuple[Op, ...]:
    """The ops as a host that runs its kernels itself issues them: in issue order, each
    op only once the host has finished every earlier op it ran or waited for (kernels,
    copies, the host optimizer step, collectives issued without async_op); an async
    collective (DDP's buckets) returns a Work at once and overlaps what follows. The
    issue points of an async host (after_start: run-ahead) do not exist here."""
    out: list[Op] = []
    last: int | None = None
    for op in ops:
        out.append(replace(op, after_start=(), issue_after=() if last is None else (last,)))
        if not op.async_op:
            last = op.index
    return tuple(out)


# ---------------------------------------------------------------------- program state
def runs_autocast(plan: Plan) -> bool:
    """Whether the plan's program computes under torch.autocast: ddp and zero1 keep their
    parameters in the master dtype (DDP has no compute-dtype parameter mode) and autocast
    the forward to param_dtype; the FSDP2 strategies cast parameters at the all-gather."""
    return plan.strategy in ("ddp", "zero1") and plan.has_master_copy


def _persistent_grads(plan: Plan) -> bool:
    """DDP's reducer allocates its gradient buckets at construction and the gradients are
    views into them (gradient_as_bucket_view): they never come or go during a step."""
    return plan.strategy in ("ddp", "zero1") and plan.offload == "none"


def state_at_rest_bytes(model: ModelSpec, plan: Plan) -> dict[str, float]:
    """Bytes per category a rank holds between steps in the program the plan runs (see the
    module docstring), from first principles; offloaded plans keep the closed form of
    zsim.analytic.memory.model_state_bytes. zero2 is the FSDP2 program of fsdp-no-reshard.

    - FSDP2 strategies: the sharded parameters in the at-rest dtype (fp32 master when the
      compute dtype is lower: category master_params, else params) and the sharded
      optimizer states, both padded per parameter (fsdp2_state_shard_elems); no gradients
      (set to None after the step).
    - ddp / zero1: every parameter and its gradient bucket in the at-rest dtype, and the
      optimizer states, sharded for zero1.

    Returns:
        {category: bytes} over zsim.analytic.memory.CATEGORIES' state categories.
    """
    if plan.strategy == "zero2":
        plan = plan.with_(strategy="fsdp-no-reshard")
    num_params = model.num_params
    if plan.offload != "none":
        closed = model_state_bytes(num_params, plan).as_dict()
        return {c: v for c, v in closed.items() if c != "grads"}
    shard = float(_local_state_elems(model, plan))
    w = _at_rest_bytes(plan)
    params_cat = "master_params" if plan.has_master_copy else "params"
    opt_elems = shard if plan.shards_optimizer else float(num_params)
    out = {params_cat: (shard if plan.shards_params else float(num_params)) * w,
           "optimizer_states": opt_elems * optimizer_bytes_per_param(plan)}
    if _persistent_grads(plan):
        out["grads"] = float(num_params) * w
    return out


def _local_state_elems(model: ModelSpec, plan: Plan) -> int:
    """Elements of the state a rank's optimizer steps on: FSDP2's padded shard; DDP's
    whole model; ZeroRedundancyOptimizer's 1/N (it partitions whole tensors, so this is
    the mean partition)."""
    if plan.shards_params:
        return fsdp2_state_shard_elems(model, plan.dp_shard)
    if plan.shards_optimizer:
        return -(-model.num_params // plan.dp_shard)
    return model.num_params


def _grad_bytes(plan: Plan) -> int:
    """Bytes per element of the gradients the optimizer reads: the at-rest dtype (FSDP2's
    sharded grads take the sharded parameter's dtype; DDP's buckets the parameter's),
    except offloaded plans, which keep the closed form's grad dtype."""
    return _at_rest_bytes(plan) if plan.offload == "none" else dtype_bytes(plan.grad_dtype)


# ---------------------------------------------------------------------- shared pieces
@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationSizes:
    """Activation bytes of the plan's program for one micro-batch."""

    saved_per_block: int
    """Tensors one block saves for backward."""
    block_transient: int
    """A block's backward working set, with what recomputation re-materialises."""
    root_saved: int
    """Tensors the root (embedding, final norm, output) saves, those that alias the
    model's buffers excluded (they are state)."""
    loss_working: int
    """Working memory of the output projection and loss."""


def activation_sizes(model: ModelSpec, plan: Plan) -> ActivationSizes:
    """The program's activation bytes (zsim.analytic.activations, autocast's for ddp and
    zero1) for one micro-batch of `plan`."""
    kw = dict(micro_batch=plan.micro_batch, seq_len=plan.seq_len,
              act_bytes=dtype_bytes(plan.param_dtype))
    ac = runs_autocast(plan)
    return ActivationSizes(
        saved_per_block=block_activation_bytes(model, recompute=plan.recompute, autocast=ac,
                                               **kw),
        block_transient=block_backward_working_bytes(model, **kw) + block_recompute_bytes(
            model, recompute=plan.recompute, autocast=ac, **kw),
        root_saved=sum(t.bytes for t in root_saved_tensors(model, autocast=ac, **kw)
                       if t.name not in STATE_ALIASES),
        loss_working=loss_working_bytes(model, **kw))


def memory_floor_bytes(model: ModelSpec, plan: Plan) -> dict[str, float]:
    """Bytes the plan's program holds at once at the least, by category: what is live
    when the loss's forward of the first micro-batch starts. That is its model state at
    rest (module buffers included), the tensors every block and the root saved, the
    loss's working memory and, for the FSDP2 strategies, the gathered root (FSDP2 does
    not reshard it until the end of backward) and, without resharding after forward,
    every gathered unit. The simulated peak is never below their sum (tested), so a plan
    whose floor exceeds HBM cannot fit, whatever the schedule around it."""
    floor = dict(state_at_rest_bytes(model, plan))
    floor["params"] = floor.get("params", 0.0) + model.buffer_bytes
    program = plan.with_(strategy="fsdp-no-reshard") if plan.strategy == "zero2" else plan
    if program.shards_params:
        root, units = _units(model, program)
        gathered = [root] if program.reshard_after_forward else [root, *units]
        floor["gathered_params"] = float(sum(u.gathered_elems(program) for u in gathered)
                                         * dtype_bytes(plan.param_dtype))
    acts = activation_sizes(model, plan)
    floor["activations"] = float(model.num_layers * acts.saved_per_block + acts.root_saved
                                 + acts.loss_working)
    return floor


def _block_flops(b: _Builder) -> tuple[Flops, Flops]:
    """(forward, backward incl. recomputation) FLOPs of one block for one micro-batch."""
    m, p = b.model, b.plan
    kw = dict(micro_batch=p.micro_batch, seq_len=p.seq_len, act_bytes=b.a)
    fwd = block_forward_flops(m, **kw)
    bwd = block_backward_flops(m, **kw) + recompute_forward_flops(m, recompute=p.recompute, **kw)
    return fwd, bwd


def _checkpoint_host_s(b: _Builder, phase: str, blocks: int) -> float:
    """Host time of activation checkpointing for `blocks` blocks in one phase ("forward"
    or "backward"), beyond the kernels it re-runs: the profile's checkpoint_overhead_s
    per forward kernel of a block; 0 without recomputation, and on an async host."""
    if b.plan.recompute == "none":
        return 0.0
    per_kernel_s = b.host(b.hw.checkpoint_overhead_s[b.plan.recompute][phase])
    if not per_kernel_s:  # GPU profiles: no block work to count
        return 0.0
    return per_kernel_s * b.block_fwd.kernels * blocks


def _forward(b: _Builder, mb: int, units: list[_Unit], *, gather: bool, reshard: bool,
             gathered: dict[int, str], first: int) -> list[int]:
    """Block forwards of micro-batch mb, in the host's order; with `gather`, each unit's
    pre-forward as FSDP2 runs it: all-gather (unless prefetched), copy-out, explicit
    prefetch of the next units. Returns the forward op index of each unit."""
    p = b.plan
    saved = b.acts.saved_per_block
    fwd_flops = b.block_fwd
    fwd: list[int] = []
    issued: dict[int, int] = {}
    for k, u in enumerate(units):
        after: tuple[int, ...] = ()
        if gather:
            if k not in issued:
                # Implicit prefetch: an async host reaches unit k's pre-forward while
                # unit k-1 (the embedding for k = 0) is still running on the device.
                prev = fwd[k - 1] if k else first
                issue = (dict(after_start=(prev,)) if p.prefetch >= 1
                         else dict(issue_after=(prev,)))
                issued[k] = _all_gather(b, u, mb, gathered, phase="forward", **issue)
            copy = _copy_out(b, u, mb, gathered, phase="forward", gather=issued[k],
                             hooks=True)
            if p.prefetch >= 2:  # explicit: set_modules_to_forward_prefetch
                for j in range(k + 1, min(k + p.prefetch, len(units) - 1) + 1):
                    if j not in issued:
                        issued[j] = _all_gather(b, units[j], mb, gathered, phase="forward",
                                                issue_after=(copy,))
            after = (copy,)
        flops = fwd_flops.scaled(u.blocks)
        fwd.append(b.add(
            name=f"{u.name} forward (mb {mb})", kind="forward", stream="compute", unit=u.index,
            microbatch=mb, after=after, flops=flops.total,
            compute_s=b.compute(flops) + _checkpoint_host_s(b, "forward", u.blocks),
            allocs=(Buffer(name=f"mb{mb}/{u.name}/saved", category="activations",
                           bytes=saved * u.blocks),),
            frees=(gathered[k],) if gather and reshard else ()))
    return fwd


def _all_gather(b: _Builder, u: _Unit, mb: int, gathered: dict[int, str], *, phase: str,
                **deps: tuple[int, ...]) -> int:
    """One unit's all-gather as FSDP2 runs it (_fsdp_collectives.py foreach_all_gather):
    a copy-in on the all-gather's side (FSDP2's all_gather_copy_in stream) allocates the
    flat output, casts each shard to the compute dtype (fsdp_param.all_gather_inputs,
    when the shard is the master copy) and copies it into its slice (_foreach_copy_),
    then the collective. Returns the all-gather op; `deps` place the copy-in's issue."""
    p = b.plan
    key = -1 if u.index is None else u.index
    size = u.gathered_elems(p) * b.a
    name = f"mb{mb}/{u.name}/gathered/{phase}"
    gathered[key] = name
    frees: tuple[str, ...] = ()
    if p.offload == "params":
        # FSDP2 CPUOffloadPolicy: the shard (in its at-rest dtype) is copied to the GPU
        # before the all-gather, on the same issue point, and dropped after it.
        shard = f"{name}/shard_from_host"
        nbytes = u.shard * _at_rest_bytes(p)
        h2d = b.copy(kind="h2d", nbytes=nbytes, name=f"{u.name} shard to GPU {phase} (mb {mb})",
                     unit=u.index, microbatch=mb,
                     allocs=(Buffer(name=shard, category="comm_buffers", bytes=nbytes),),
                     **deps)
        deps = {"after": (h2d,)}
        frees += (shard,)
    shard_elems = u.shard
    cast = _at_rest_bytes(p) + b.a if p.has_master_copy else 0
    copy_in = Flops(matmul=0.0, attention=0.0, memory_bytes=shard_elems * (cast + 2 * b.a),
                    kernels=2 if cast else 1)
    first = b.add(name=f"{u.name} copy-in {phase} (mb {mb})", kind=phase, stream="all_gather",
                  unit=u.index, microbatch=mb, compute_s=b.compute(copy_in),
                  allocs=(Buffer(name=f"{name}/flat", category="comm_buffers", bytes=size),),
                  **deps)
    return b.collective(
        kind="all_gather", size_bytes=size, group=b.shard, gname="shard",
        name=f"{u.name} all-gather {phase} (mb {mb})", unit=u.index, microbatch=mb,
        after=(first,), frees=frees)


def _copy_out(b: _Builder, u: _Unit, mb: int, gathered: dict[int, str], *, phase: str,
              gather: int, hooks: bool = False) -> int:
    """The unit's wait_for_unshard in its pre-forward/pre-backward, on the compute
    stream: allocates the unsharded parameters, copies them out of the flat all-gather
    output (split_with_sizes_copy: its memory traffic) and drops the flat buffer. With
    `hooks`, it also carries FSDP2's host time for the unit in this micro-batch (the
    profile's fsdp_unit_overhead_s, on the timeline only on a synchronous host)."""
    name = gathered[-1 if u.index is None else u.index]
    size = u.gathered_elems(b.plan) * b.a
    copy = Flops(matmul=0.0, attention=0.0, memory_bytes=2.0 * size, kernels=1)
    host_s = b.host(b.hw.fsdp_unit_overhead_s) if hooks else 0.0
    return b.add(name=f"{u.name} copy-out {phase} (mb {mb})", kind=phase, stream="compute",
                 unit=u.index, microbatch=mb, after=(gather,),
                 compute_s=b.compute(copy) + host_s,
                 allocs=(Buffer(name=name, category="gathered_params", bytes=size),),
                 frees=(f"{name}/flat",))


def _at_rest_bytes(plan: Plan) -> int:
    """Bytes per parameter of the sharded copy the optimizer updates (fp32 master in
    FSDP2's mixed precision, else the param dtype)."""
    return dtype_bytes(plan.master_dtype if plan.has_master_copy else plan.param_dtype)


def _grads_to_host(b: _Builder, after: int, grad: str, nbytes: int, grad_buffers: list[str],
                   *, name: str) -> int:
    """Offload: copy a reduced gradient shard to the host for the CPU optimizer step.
    With parameter offload it leaves the GPU right away; with optimizer offload the GPU
    keeps it until the step, as zsim.analytic.memory counts it."""
    keep = b.plan.offload == "optimizer"
    if not keep:
        grad_buffers.remove(grad)
    return b.copy(kind="d2h", nbytes=nbytes, name=name, microbatch=b.plan.grad_accum - 1,
                  after=(after,), frees=() if keep else (grad,))


def _head_forward(b: _Builder, mb: int, *, after: tuple[int, ...]) -> int:
    """Output projection + loss forward of micro-batch mb."""
    root_saved, loss_work = b.acts.root_saved, b.acts.loss_working
    head = _head_flops(b)
    return b.add(name=f"output+loss forward (mb {mb})", kind="forward", stream="compute",
                 microbatch=mb, after=after, compute_s=b.compute(head), flops=head.total,
                 allocs=(Buffer(name=f"mb{mb}/root/saved", category="activations",
                                bytes=root_saved),
                         Buffer(name=f"mb{mb}/loss/fwd", category="activations",
                                bytes=loss_work)),
                 frees=(f"mb{mb}/loss/fwd",))


def _head_backward(b: _Builder, mb: int, *, grad_alloc: tuple[Buffer, ...]) -> int:
    """Output projection + loss backward of micro-batch mb (twice the forward's work)."""
    loss_work = b.acts.loss_working
    bwd_flops = _head_flops(b).scaled(2.0)
    return b.add(name=f"output+loss backward (mb {mb})", kind="backward", stream="compute",
                 microbatch=mb, compute_s=b.compute(bwd_flops), flops=bwd_flops.total,
                 allocs=(Buffer(name=f"mb{mb}/loss/bwd", category="activations",
                                bytes=loss_work), *grad_alloc),
                 frees=(f"mb{mb}/loss/bwd", f"mb{mb}/root/saved"))


def _head_flops(b: _Builder) -> Flops:
    return head_forward_flops(b.model, micro_batch=b.plan.micro_batch, seq_len=b.plan.seq_len,
                              act_bytes=b.a)


# ---------------------------------------------------------------------- FSDP / HSDP
def _lower_fsdp(b: _Builder, units: list[_Unit], root: _Unit, grad_buffers: list[str],
                last_reduce: list[int]) -> None:
    p = b.plan
    reshard = p.reshard_after_forward
    transient = b.acts.block_transient
    bwd_flops = b.block_bwd
    g_bytes = _grad_bytes(p)
    r_bytes = dtype_bytes(p.reduce_dtype)
    acc_bytes = _unsharded_grad_bytes(p)
    prev_last_bwd: int | None = None
    for mb in range(p.grad_accum):
        last_mb = mb == p.grad_accum - 1
        gathered: dict[int, str] = {}
        root_ag = _all_gather(b, root, mb, gathered, phase="forward",
                              after_start=() if prev_last_bwd is None else (prev_last_bwd,))
        root_copy = _copy_out(b, root, mb, gathered, phase="forward", gather=root_ag,
                              hooks=True)
        emb = b.add(name=f"embedding forward (mb {mb})", kind="forward", stream="compute",
                    microbatch=mb, after=(root_copy,))
        fwd = _forward(b, mb, units, gather=True, reshard=reshard, gathered=gathered, first=emb)

        def grad_alloc(u: _Unit, params: int, part: str = "", mb: int = mb
                       ) -> tuple[Buffer, ...]:
            """Autograd allocates each parameter's unsharded gradient when its backward
            runs: a block unit's in its backward, the root's output projection and final
            norm in the head's backward, its token embedding at the very end."""
            if mb > 0 or params == 0:
                return ()  # accumulating into the buffers of micro-batch 0
            name = f"{u.name}/unsharded_grad{part}"
            b.unsharded_grads.setdefault(u.name, []).append(name)
            return (Buffer(name=name, category="gathered_grads", bytes=params * acc_bytes),)

        emb_grad = 0 if b.model.tied_embeddings else b.model.embedding_params
        head_f = _head_forward(b, mb, after=(fwd[-1],))
        issued: dict[int, int] = {}
        if reshard:
            _backward_prefetch(b, units, mb, gathered, issued, below=len(units), after=head_f)
        head_b = _head_backward(b, mb, grad_alloc=grad_alloc(root, root.params - emb_grad))
        bwd: dict[int, int] = {}
        for k in reversed(range(len(units))):
            u = units[k]
            after: tuple[int, ...] = ()
            if reshard:
                if k not in issued:  # no prefetch: gathered at the unit's own pre-backward
                    issued[k] = _all_gather(
                        b, u, mb, gathered, phase="backward",
                        issue_after=(bwd[k + 1] if k + 1 < len(units) else head_b,))
                copy = _copy_out(b, u, mb, gathered, phase="backward", gather=issued[k])
                _backward_prefetch(b, units, mb, gathered, issued, below=k, after=copy)
                after = (copy,)
            flops = bwd_flops.scaled(u.blocks)
            work = f"mb{mb}/{u.name}/backward_working"
            bwd[k] = b.add(
                name=f"{u.name} backward (mb {mb})", kind="backward", stream="compute",
                unit=u.index, microbatch=mb, after=after,
                compute_s=b.compute(flops) + _checkpoint_host_s(b, "backward", u.blocks),
                flops=flops.total,
                allocs=(Buffer(name=work, category="activations", bytes=transient),
                        *grad_alloc(u, u.params)),
                frees=(work, f"mb{mb}/{u.name}/saved", gathered[k]))
            if last_mb:
                last_reduce.extend(_fsdp_reduce(b, u, bwd[k], g_bytes, r_bytes,
                                                grad_buffers, final=False))
        emb_b = b.add(name=f"embedding backward (mb {mb})", kind="backward", stream="compute",
                      microbatch=mb, allocs=grad_alloc(root, emb_grad, "/embedding"),
                      frees=(gathered[-1],))
        if last_mb:
            last_reduce.extend(_fsdp_reduce(b, root, emb_b, g_bytes, r_bytes, grad_buffers,
                                            final=True))
        prev_last_bwd = emb_b


def _unsharded_grad_bytes(plan: Plan) -> int:
    """Bytes per element of a unit's unsharded gradient in FSDP2: the compute dtype, or
    the reduce dtype when micro-batches accumulate into it."""
    return dtype_bytes(plan.param_dtype if plan.grad_accum == 1 else plan.reduce_dtype)


def _backward_prefetch(b: _Builder, units: list[_Unit], mb: int, gathered: dict[int, str],
                       issued: dict[int, int], *, below: int, after: int) -> None:
    """Backward prefetch from the pre-backward hook that just ran (the root's, before the
    head's backward, when `below` is the unit count; else unit `below`'s, after its
    copy-out `after`): the all-gathers of the next `plan.prefetch` units in backward
    order not issued yet, recorded in `issued`."""
    for j in range(below - 1, max(below - 1 - b.plan.prefetch, -1), -1):
        if j not in issued:
            issued[j] = _all_gather(b, units[j], mb, gathered, phase="backward",
                                    issue_after=(after,))


def _fsdp_reduce(b: _Builder, u: _Unit, after: int, g_bytes: int, r_bytes: int,
                 grad_buffers: list[str], *, final: bool) -> list[int]:
    """Reduce-scatter of one unit's gradients (+ HSDP all-reduce of the shard), as
    FSDP2's foreach_reduce: on the compute stream, the copy-in (chunk_cat) reads the
    unsharded gradients into the flat input (reduce dtype), which frees them; then the
    collective on its stream; then, on the same stream, the output (reduce dtype) is cast
    to the sharded gradient's dtype when they differ. The input stays alive until the
    next unit's reduce-scatter (FSDP2's reduce_scatter_states, one buffer: released in
    the next post-backward, before its copy-in) or, for the last unit, the end of
    backward. `final`: this is the last reduce-scatter of the step (the root)."""
    p = b.plan
    last_mb = p.grad_accum - 1
    shard_grad = f"{u.name}/grad_shard"
    grad_buffers.append(shard_grad)
    shard_elems = u.shard
    rs_in_bytes = u.gathered_elems(p) * r_bytes
    rs_in = f"{u.name}/reduce_scatter_input"
    held = b.held_rs_input
    b.held_rs_input = None if final else rs_in
    copy_in = Flops(matmul=0.0, attention=0.0,
                    memory_bytes=u.params * _unsharded_grad_bytes(p) + rs_in_bytes,
                    kernels=1)
    first = b.add(name=f"{u.name} reduce-scatter copy-in", kind="backward", stream="compute",
                  unit=u.index, microbatch=last_mb, after=(after,),
                  compute_s=b.compute(copy_in), frees_at_start=(held,) if held else (),
                  allocs=(Buffer(name=rs_in, category="comm_buffers",
                                 bytes=rs_in_bytes),),
                  frees=tuple(b.unsharded_grads.pop(u.name, ())))
    allocs = []
    rs_out = f"{u.name}/reduce_scatter_output"
    if r_bytes != g_bytes:
        allocs.append(Buffer(name=rs_out, category="comm_buffers", bytes=shard_elems * r_bytes))
    allocs.append(Buffer(name=shard_grad, category="grads", bytes=shard_elems * g_bytes))
    last = b.collective(
        kind="reduce_scatter", size_bytes=rs_in_bytes, group=b.shard, gname="shard",
        name=f"{u.name} reduce-scatter", unit=u.index, microbatch=last_mb, after=(first,),
        allocs=tuple(allocs), frees=(rs_in,) if final else ())
    if r_bytes != g_bytes:
        cast = Flops(matmul=0.0, attention=0.0, memory_bytes=shard_elems * (r_bytes + g_bytes),
                     kernels=1)
        last = b.add(name=f"{u.name} grad cast", kind="backward", stream="reduce_scatter",
                     unit=u.index, microbatch=last_mb, after=(last,),
                     compute_s=b.compute(cast), frees=(rs_out,))
    if p.dp_replicate > 1:
        last = b.collective(kind="all_reduce", size_bytes=shard_elems * r_bytes, group=b.repl,
                            gname="replicate", name=f"{u.name} all-reduce (replicas)",
                            unit=u.index, microbatch=last_mb, after=(last,))
    if p.offload != "none":
        last = _grads_to_host(b, last, shard_grad, shard_elems * g_bytes, grad_buffers,
                              name=f"{u.name} grad shard to host")
    return [last]


# ---------------------------------------------------------------------- DDP / ZeRO-1
def _lower_replicated(b: _Builder, units: list[_Unit], root: _Unit, grad_buffers: list[str],
                      last_reduce: list[int]) -> None:
    p = b.plan
    transient = b.acts.block_transient
    bwd_flops = b.block_bwd
    persistent = _persistent_grads(p)
    for mb in range(p.grad_accum):
        last_mb = mb == p.grad_accum - 1

        def grad_alloc(u: _Unit, mb: int = mb) -> tuple[Buffer, ...]:
            if mb > 0 or persistent:
                return ()  # the reducer's buckets are part of the state at rest
            name = f"{u.name}/full_grad"
            grad_buffers.append(name)
            return (Buffer(name=name, category="grads", bytes=u.params * _grad_bytes(p)),)

        emb = b.add(name=f"embedding forward (mb {mb})", kind="forward", stream="compute",
                    microbatch=mb)
        fwd = _forward(b, mb, units, gather=False, reshard=False, gathered={}, first=emb)
        _head_forward(b, mb, after=(fwd[-1],))
        _head_backward(b, mb, grad_alloc=grad_alloc(root))
        buckets = _Buckets(b) if last_mb else None
        for k in reversed(range(len(units))):
            u = units[k]
            flops = bwd_flops.scaled(u.blocks)
            work = f"mb{mb}/{u.name}/backward_working"
            op = b.add(name=f"{u.name} backward (mb {mb})", kind="backward", stream="compute",
                       unit=u.index, microbatch=mb,
                       compute_s=b.compute(flops) + _checkpoint_host_s(b, "backward", u.blocks),
                       flops=flops.total,
                       allocs=(Buffer(name=work, category="activations", bytes=transient),
                               *grad_alloc(u)),
                       frees=(work, f"mb{mb}/{u.name}/saved"))
            if buckets is not None:
                buckets.ready(u, op)
        emb_b = b.add(name=f"embedding backward (mb {mb})", kind="backward", stream="compute",
                      microbatch=mb)
        if buckets is not None:
            buckets.ready(root, emb_b)
            last_reduce.extend(buckets.finish(emb_b))


class _Buckets:
    """Bucketed gradient reduction in readiness order (DDP Reducer / DeepSpeed reduce
    buckets): a bucket's collective is issued, with async_op, by the backward op that
    completes it, right after that op in the host's order. Buckets hold whole tensors
    (_pack_whole_tensors), so there are never more buckets than parameter tensors."""

    def __init__(self, b: _Builder) -> None:
        p = b.plan
        self.b = b
        self.per_bucket = max(1, p.bucket_bytes // dtype_bytes(p.reduce_dtype))
        self.pending = 0
        self.issued: list[int] = []

    def ready(self, u: _Unit, op: int) -> None:
        """The gradients of `u` are complete once `op` has run (DDP fills its buckets in
        reverse module order)."""
        *full, self.pending = _pack_whole_tensors(reversed(u.tensors), self.per_bucket,
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
        b, p = self.b, self.b.plan
        r_bytes = dtype_bytes(p.reduce_dtype)
        bucket = len(self.issued)
        ddp = p.strategy == "ddp"
        kw = dict(name=f"bucket {bucket} {'all-reduce' if ddp else 'reduce-scatter'}",
                  unit=bucket, microbatch=p.grad_accum - 1, after=(after,), async_op=True)
        if ddp:
            op = b.collective(kind="all_reduce", size_bytes=elems * r_bytes,
                              group=b.repl, gname="replicate", **kw)
        else:
            op = b.collective(kind="reduce_scatter", size_bytes=elems * r_bytes,
                              group=b.shard, gname="shard", **kw)
        if p.offload == "optimizer":
            local = elems if ddp else math.ceil(elems / p.dp_shard)
            op = b.copy(kind="d2h", nbytes=local * _grad_bytes(p), unit=bucket,
                        name=f"bucket {bucket} grads to host",
                        microbatch=p.grad_accum - 1, after=(op,))
        self.issued.append(op)


# ---------------------------------------------------------------------- optimizer
def _optimizer(b: _Builder, last_reduce: list[int], grad_buffers: list[str]) -> int:
    """AdamW/SGD on the local shard: memory-bound, reads and writes the master weights
    (or the params without a master copy) and the optimizer states, reads the gradient,
    and writes the compute-dtype params when a master copy exists; traffic and kernels
    counted by zsim.analytic.compute.optimizer_flops."""
    p = b.plan
    local: float = _local_state_elems(b.model, p)
    if p.offload != "none":
        local = b.model.num_params / (p.dp_shard if p.shards_optimizer else 1)
        return _host_optimizer(b, last_reduce, grad_buffers, local_params=local)
    master = dtype_bytes(p.master_dtype) if p.has_master_copy else b.a
    # ZeroRedundancyOptimizer partitions whole tensors; sharded params split every tensor.
    tensors = len(b.model.parameter_tensors())
    if p.shards_optimizer and not p.shards_params:
        tensors = math.ceil(tensors / p.dp_shard)
    seconds = b.compute(optimizer_flops(
        local, optimizer=p.optimizer, tensors=tensors, master_bytes=master,
        state_bytes_per_param=optimizer_bytes_per_param(p), grad_bytes=dtype_bytes(p.grad_dtype),
        param_copy_bytes=b.a if p.has_master_copy else 0))
    temp = _optimizer_temporaries(p, local)
    return b.add(name="optimizer step", kind="optimizer", stream="compute",
                 microbatch=p.grad_accum - 1, after=tuple(last_reduce), compute_s=seconds,
                 allocs=temp, frees=tuple(grad_buffers) + tuple(t.name for t in temp))


def _optimizer_temporaries(plan: Plan, local_params: float) -> tuple[Buffer, ...]:
    """Working memory of the foreach optimizer step: torch.optim's _multi_tensor_adam
    builds one new list, exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sq) (the size of the
    second moment), and updates everything else in place; foreach SGD works in place."""
    if plan.optimizer != "adamw":
        return ()
    return (Buffer(name="optimizer/exp_avg_sq_sqrt", category="optimizer_states",
                   bytes=math.ceil(local_params) * dtype_bytes(plan.optimizer_state_dtype)),)


def _host_optimizer(b: _Builder, last_reduce: list[int], grad_buffers: list[str], *,
                    local_params: float) -> int:
    """Offloaded step (ZeRO-Offload, Ren et al. 2021, Sec. 4): CPU AdamW on the local shard
    at the node's host rate shared by its GPUs; with optimizer offload the updated
    compute-dtype shard is copied back to the GPU (parameter offload keeps it on the host
    until the next all-gather copies it in)."""
    p, hw = b.plan, b.hw
    per_gpu_params_per_s = hw.host_adam_params_per_s / hw.gpus_per_node
    step = b.add(name="optimizer step (host)", kind="optimizer", stream="host",
                 microbatch=p.grad_accum - 1, after=tuple(last_reduce),
                 compute_s=local_params / per_gpu_params_per_s, frees=tuple(grad_buffers))
    if p.offload != "optimizer":
        return step
    return b.copy(kind="h2d", nbytes=math.ceil(local_params) * b.a, name="params to GPU",
                  microbatch=p.grad_accum - 1, after=(step,))


def _param_all_gather(b: _Builder, opt: int) -> None:
    """ZeRO-1/2: all-gather the updated compute-dtype parameters, in buckets of whole
    tensors."""
    p, m = b.plan, b.model
    numels = [math.prod(s) for _, s in m.root_tensors()]
    numels += [math.prod(s) for _, s in m.block_tensors()] * m.num_layers
    per = max(1, p.bucket_bytes // b.a)
    *full, last = _pack_whole_tensors(numels, per)
    for i, elems in enumerate([*full, last] if last else full):
        b.collective(kind="all_gather", size_bytes=elems * b.a, group=b.shard,
                     gname="shard", name=f"param all-gather bucket {i}", unit=i,
                     microbatch=p.grad_accum - 1, after=(opt,))


def _pack_whole_tensors(numels: Iterable[int], cap: int, *, pending: int = 0) -> list[int]:
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
