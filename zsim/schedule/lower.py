"""Lowering: (ModelSpec, HardwareProfile, Plan) -> the ops of one optimizer step.

Owns the choice of program (`program`: the module the plan's registry entry names,
zsim.spec.programs.ProgramEntry.lowering; each program's order of kernels and
collectives, dependencies and memory effects live in its module under
zsim.schedule.programs) and what every schedule shares: the model state at rest as the
program holds it (state_at_rest_bytes; zsim.analytic.memory keeps the published closed
form), module buffers, the memory floor, the end-of-step sync, the synchronous host's
chaining, links and FLOP totals. Never simulates and never imports simpy.

Conventions every program follows:
- Ops are emitted in the host thread's order (hooks, the autograd engine, reducers);
  streams and dependencies say what may overlap on an async device. A synchronous host
  (profile host.launch, a CPU rank) runs every kernel itself and blocks in each
  collective issued without async_op: the ops it runs or waits for form one chain in
  host order (zsim.schedule.build.on_synchronous_host), and the host's own costs (hooks
  per unit, each blocking collective call, activation checkpointing's hooks) land on the
  timeline. On any host, kernels are stretched by the profile's rank skew (0 on GPUs).
- Gradients are reduced once per optimizer step, on the last micro-batch, as
  zsim.analytic.comm.step_comm counts.
- Recomputation re-runs a block's forward inside its backward (compute), and the tensors
  it re-materialises live during that backward (memory).
- Offload: reduced gradients go to the host over PCIe (d2h stream) and the optimizer
  steps on the host CPU at the profile's host AdamW rate shared by the node's GPUs;
  copies run on copy engines: they share PCIe, not SMs.
- The plan's grad_dtype is not a storage dtype of the programs modelled here; the
  closed-form table (zsim.analytic.memory) keeps the ZeRO paper's accounting.
"""

from __future__ import annotations

import math
from importlib import import_module

from zsim.analytic.allocations import fitted
from zsim.analytic.collectives import link_bandwidths, nic_share, pairwise_nic_share
from zsim.analytic.compute import step_flops
from zsim.errors import ConfigError
from zsim.schedule.build import Builder, activation_sizes, on_synchronous_host, units
from zsim.schedule.ops import Buffer, Schedule
from zsim.schedule.programs import Program
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.programs import programs


def program(plan: Plan) -> Program:
    """The lowering of the plan's program: the PROGRAM of the module its registry entry
    names (zsim.spec.programs.ProgramEntry.lowering)."""
    prog: Program = import_module(plan.program.lowering).PROGRAM
    return prog


def state_at_rest_bytes(model: ModelSpec, plan: Plan) -> dict[str, float]:
    """Bytes per memory category a rank holds between steps in the plan's program (module
    buffers excluded)."""
    return program(plan).state_at_rest_bytes(rank_model(model, plan), plan)


BLAS_HANDLES = 2
"""cuBLAS handles whose workspaces a training step holds: torch keeps a handle per thread,
and a step runs its matmuls on two, the forward's (and the optimizer's) and autograd's
device thread for the backward, recomputation included."""


def workspace_pieces(hw: HardwareProfile) -> tuple[int, ...]:
    """The library workspaces a rank holds through every step, in bytes: the cuBLAS
    workspace of each of its BLAS_HANDLES handles (none on a profile without them)."""
    return (math.ceil(hw.blas_workspace_bytes),) * BLAS_HANDLES if hw.blas_workspace_bytes else ()


def fixed_bytes(model: ModelSpec, hw: HardwareProfile) -> dict[str, int]:
    """Bytes a rank of `model` (its rank model) holds whatever its program and schedule,
    by category: the module buffers ("params", 0 where none) and the library workspaces
    ("workspace", where the profile has them)."""
    out = {"params": model.buffer_bytes}
    if pieces := workspace_pieces(hw):
        out["workspace"] = sum(pieces)
    return out


def host_state_bytes(model: ModelSpec, plan: Plan) -> float:
    """Bytes a rank of the plan's program keeps in host memory between steps (what
    offload moves there); on a CPU backend they share the memory the device's figures
    count."""
    return program(plan).host_state_bytes(rank_model(model, plan), plan)


def memory_floor_bytes(model: ModelSpec, plan: Plan,
                       hw: HardwareProfile) -> dict[str, float]:
    """Bytes the plan's program holds at once at the least, by category: what is live
    when the loss's forward of the first micro-batch starts. That is its model state at
    rest, what every rank holds (fixed_bytes: module buffers, `hw`'s workspaces), the
    tensors every block and the root saved, the loss's working memory, and the gathered
    parameters the program keeps then (FSDP2: the root, and every unit without
    resharding). The simulated peak is never below their sum (tested), so a plan whose
    floor exceeds HBM cannot fit, whatever the schedule around it. Under TP and CP, of the
    rank's shard and share."""
    prog = program(plan)
    model, plan = rank_model(model, plan), rank_plan(plan)
    floor = dict(prog.state_at_rest_bytes(model, plan))
    for category, nbytes in fixed_bytes(model, hw).items():
        floor[category] = floor.get(category, 0.0) + nbytes
    gathered = prog.gathered_floor_bytes(model, plan)
    if gathered:
        floor["gathered_params"] = gathered
    acts = activation_sizes(model, plan, autocast=plan.runs_autocast)
    floor["activations"] = float(acts.floor_bytes(model))
    return floor


def saved_activation_bytes(model: ModelSpec, plan: Plan) -> int:
    """Bytes autograd keeps from one micro-batch's forward until its backward on one
    rank, under the plan's recomputation policy: every block's saved tensors and the
    root's (embedding, final norm, output projection, loss; those that alias module
    buffers excluded), of the rank's TP shard and CP share; with a pipeline, a stage's
    blocks and the root's tensors (the last stage's, which holds the loss). What a
    micro-batch adds, not what is live at the peak (that is the Result's
    memory_at_peak)."""
    local, lp = rank_model(model, plan), rank_plan(plan)
    acts = activation_sizes(local, lp, autocast=lp.runs_autocast)
    return local.num_layers // plan.pp * acts.saved_per_block + acts.root_saved


def check_modelled(plan: Plan) -> None:
    """Refuse a plan the simulator does not model yet: context parallelism other than
    with FSDP2 (torchtitan shards the state over dp_shard x cp with fully_shard whenever
    cp > 1, and refuses DDP on a mesh of more than one axis: parallelize.py) or with a
    pipeline, and tensor or pipeline parallelism with a program
    other than FSDP2 and torch DDP (torch's parallelize_module and pipelining compose
    with fully_shard on a 2-D or 3-D mesh, and run under DDP over the data-parallel
    ranks, or bare with one; ZeroRedundancyOptimizer, FSDP1 and DeepSpeed with them are
    not modelled), and offload with a pipeline (its per-rank replay,
    zsim.schedule.pipeline_work, keeps every stage's state on the GPU).

    Raises:
        ConfigError: naming the first such axis.
    """
    if plan.cp > 1 and plan.pp > 1:
        raise ConfigError("plan.cp", plan.cp,
                          "context parallelism with a pipeline is not modelled yet")
    if plan.pp > 1 and plan.offload != "none":
        raise ConfigError("plan.offload", plan.offload,
                          "offload with a pipeline (pp > 1) is not modelled yet")
    if plan.cp > 1 and plan.strategy == "ddp":
        raise ConfigError("plan.cp", plan.cp, "torchtitan runs CP under FSDP2, its state "
                          "sharded over dp_shard x cp (its DDP takes a 1-D mesh only): DDP "
                          "with CP is HSDP over (dp_replicate, cp), --strategy hsdp "
                          "--shard-group 1")
    if plan.cp > 1 and not plan.program.context_parallel:
        able = " and ".join(f"{e.title} ({', '.join(e.strategies)})" for e in programs()
                            if e.context_parallel)
        raise ConfigError("plan.cp", plan.cp, f"context parallelism is modelled with {able}, "
                          "which shards the state over dp_shard x cp as torchtitan does, "
                          f"not with {plan.impl}")
    for f in ("tp", "pp"):
        if getattr(plan, f) > 1 and plan.strategy not in plan.program.model_parallel:
            able = " and ".join(f"{e.title} ({', '.join(e.model_parallel)})"
                                for e in programs() if e.model_parallel)
            raise ConfigError(f"plan.{f}", getattr(plan, f),
                              f"tensor and pipeline parallelism are modelled with {able}, "
                              f"not with {plan.strategy} run by {plan.impl}")


def rank_model(model: ModelSpec, plan: Plan) -> ModelSpec:
    """The part of the model one rank holds and computes: its tensor-parallel shard
    (ModelSpec.tp_shard), its expert-parallel share of the experts (ModelSpec.ep_share),
    computing its context-parallel share (ModelSpec.cp_share); the model itself without
    TP, EP and CP."""
    return model.tp_shard(plan.tp, sequence_parallel=plan.sp,
                          expert_parallel=plan.ep > 1).ep_share(plan.ep).cp_share(
        plan.cp)


def rank_plan(plan: Plan) -> Plan:
    """The plan as one rank runs it: with context parallelism, its 1/cp of each
    sequence (torch's context_parallel shards the inputs on the sequence)."""
    return plan if plan.cp == 1 else plan.with_(seq_len=plan.seq_len // plan.cp)


def program_plan(plan: Plan) -> Plan:
    """The plan as its program reads it. A program that wraps no units (DDP, DeepSpeed's
    ZeRO: ProgramEntry.wraps_units) runs block by block whatever unit size the plan names, and
    has no units to prefetch ahead (DeepSpeed prefetches by its own bucket size), so its
    unit size and prefetch depth are the defaults, 1: plans that differ only there lower
    to one schedule."""
    if plan.program.wraps_units:
        return plan
    return plan.with_(unit_size=1, prefetch=1)


def lower(model: ModelSpec, hw: HardwareProfile, plan: Plan) -> Schedule:
    """Build the schedule of one optimizer step of a representative rank.

    Raises:
        ConfigError: a plan the simulator does not model (check_modelled, parameter
            offload without sharded parameters), or a unit size larger than the model.
    """
    check_modelled(plan)
    if plan.pp > 1:
        raise ConfigError("plan.pp", plan.pp, "a pipeline step is replayed by "
                          "zsim.engine.pipeline_replay (zsim.simulate), not lowered as one "
                          "rank's ops")
    model, whole = rank_model(model, plan), plan
    plan = rank_plan(plan)
    if plan.offload == "params" and not plan.shards_params:
        raise ConfigError("plan.offload", plan.offload,
                          "parameter offload needs sharded parameters "
                          "(fsdp, fsdp-no-reshard, hsdp)")
    prog = program(plan)
    if plan.unit_size <= model.num_layers:  # (units() refuses more)
        plan = program_plan(plan)
    autocast = plan.runs_autocast
    b = Builder(model, hw, plan, acts=activation_sizes(model, plan, autocast=autocast),
                autocast=autocast)
    root, blocks = units(model, plan, prog.shard_elems)
    pieces = prog.state_pieces(model, plan)
    baseline = tuple(Buffer(name=f"state/{c}", category=c, bytes=math.ceil(v),
                            pieces=fitted(pieces.get(c, ()), math.ceil(v)))
                     for c, v in prog.state_at_rest_bytes(model, plan).items() if v > 0)
    if model.buffer_bytes:
        # Module buffers (RoPE tables, cos and sin) live with the parameters, replicated
        # on every rank.
        half = model.buffer_bytes // 2
        baseline += (Buffer(name="state/buffers", category="params", bytes=model.buffer_bytes,
                            pieces=(half, model.buffer_bytes - half)),)
    if pieces := workspace_pieces(hw):
        baseline += (Buffer(name="state/blas_workspaces", category="workspace",
                            bytes=sum(pieces), pieces=pieces),)
    prog.lower(b, root, blocks)
    last_per_stream: dict[str, int] = {}
    for op in b.ops:
        last_per_stream[op.stream] = op.index
    # The programs' host work outside the blocks (Builder.program_host_s) closes the step.
    b.add(name="end of step", kind="sync", stream="compute",
          compute_s=b.program_host_s["step"],
          after=tuple(i for s, i in last_per_stream.items() if s != "compute"))
    model_flops, _ = step_flops(model, micro_batch=plan.micro_batch, seq_len=plan.seq_len,
                                grad_accum=plan.grad_accum, recompute=plan.recompute)
    ops = (tuple(b.ops) if hw.launch == "async"
           else on_synchronous_host(b.ops, hw.sync_overhead_s))
    return Schedule(
        ops=ops, baseline=baseline, launch=hw.launch, collective_threads=hw.collective_threads,
        link_bytes_per_s={**link_bandwidths(hw),
                          "pcie_h2d": hw.pcie_bytes_per_s * hw.pcie_efficiency,
                          "pcie_d2h": hw.pcie_bytes_per_s * hw.pcie_efficiency},
        comm_compute_slowdown=hw.comm_compute_slowdown,
        compute_comm_slowdown=hw.compute_comm_slowdown, hbm_bytes=hw.hbm_bytes,
        model_flops=model_flops, hardware_flops=sum(op.flops for op in b.ops),
        # The ranks of one data-parallel rank's model-parallel group share its tokens.
        tokens_per_rank=whole.micro_batch * whole.seq_len * whole.grad_accum
        / whole.model_parallel,
        world_size=plan.world_size, peak_flop_per_s=hw.peak(plan.compute_dtype),
        dp_shard=plan.dp_shard_cp,
        notes=("gradients reduced once per step, on the last micro-batch",),
        nic_share={name: share for name, share in (
            ("shard", nic_share(b.shard)), ("replicate", nic_share(b.repl)),
            ("tp", nic_share(b.tp)), ("cp", nic_share(b.cp)),
            ("ep", pairwise_nic_share(b.ep)), ("expert_shard", nic_share(b.expert_shard)))
                   if share > 0})
