"""The work of each pipeline stage and what each pipeline rank holds: one micro-batch's
forward and backward time per stage, the point-to-point send between stages, the
data-parallel work before and after a rank's pipeline, and each rank's memory by
category. zsim.engine.pipeline_replay replays the stages in a schedule's order
(zsim.schedule.pipeline_order); zsim.simulate assembles the Result. Never simulates.

As torchtitan runs pipeline parallelism with FSDP2 (torchtitan/distributed/
pipeline_parallel.py, parallelize.py):
- A stage holds num_layers / (pp x virtual stages) consecutive blocks; the first stage
  also the token embedding, the last the final norm, output projection and loss.
- Its kernels are those of the plan's program on the rank's TP shard of the model
  (zsim.schedule.build: a block's forward and backward, recomputation included, the
  output projection and loss), and its TP collectives per block (zsim.schedule.build
  TP_ENTER, TP_EXIT) block them, or with async TP overlap them (the excess is
  exposed); the last stage also all-gathers the logits (build.gather_logits).
- FSDP2 inside a stage keeps the parameters gathered across micro-batches
  (reshard_after_forward False with PP, torchtitan's default) and reduces gradients once,
  after the last micro-batch (the stage sets requires_gradient_sync on its last
  backward): a rank all-gathers each unit once per step and reduce-scatters it once.
  Only the first unit's all-gather (before the first forward) and the last unit's
  reduce-scatter (after the last backward), then the optimizer step, are on the rank's
  critical path here; the other units' collectives are taken as hidden behind the
  pipeline's compute (not replayed on shared links).
- Expert parallelism inside a stage: the experts' own gathers and reductions over
  expert_shard, and the blocking all-to-alls per MoE block (zsim.schedule.build
  expert_parallel) added to the stage's forward and backward, each alone on the EP group.
- Activations: each forward keeps its micro-batch's saved tensors until the backward
  (zsim.schedule.pipeline_order.peak_in_flight weighs each stage's micro-batch by them); a
  backward's working set on top.
- A send carries one micro-batch's activations (b x s x d in the residual stream's dtype,
  fp32 under autocast; its sequence shard with SP) over the pipeline hop's link
  (zsim.analytic.placement).
- Receive buffers: a PipelineStage allocates one buffer per micro-batch for what it
  receives (torch/distributed/pipelining/stage.py, _prepare_forward_infra and
  _create_grad_recv_info): the activation from the stage before (all but the first
  stage) and its gradient from the stage after (all but the last), each the size of a
  send in the residual stream's dtype (fp32 under autocast), kept across steps.

With torch DDP (strategy ddp, zsim.schedule.programs.torch_ddp) a stage holds its
parameters whole in the master dtype and computes under autocast (its activations then
include autocast's casts); its gradients, whole and in that dtype, live from its first
backward to the step (set to None after it) and, with more than one data-parallel rank,
sit in DDP's reducer buckets for good and are all-reduced, in that dtype, over the
data-parallel group after the last backward (zsim.backend.pipelining runs the stage bare
with one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zsim.analytic.collectives import bus_bytes, collective_time_s
from zsim.analytic.comm import ddp_bucket_dtype
from zsim.analytic.compute import head_backward_flops, head_forward_flops, optimizer_flops
from zsim.analytic.memory import optimizer_bytes_per_param
from zsim.analytic.placement import pipeline_hop_crosses_nodes, place
from zsim.schedule.build import (
    TP_EMBEDDING_EXIT,
    TP_ENTER,
    TP_EXIT,
    Builder,
    TpBoundary,
    activation_sizes,
    block_shard_elems,
    ep_bytes,
    ep_calls,
    logits_bytes,
    tp_bytes,
    tp_dtype,
    tp_regions,
)
from zsim.schedule.lower import program
from zsim.schedule.pipeline_order import (
    num_stages,
    peak_in_flight,
    rank_actions,
    rank_layers,
    rank_stages,
)
from zsim.schedule.programs import fsdp2, torch_ddp
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineWork:
    """Per-stage times and per-rank extras of one pipeline step."""

    forward_s: list[float]
    """Per stage, one micro-batch's forward."""
    backward_s: list[float]
    """Per stage, one micro-batch's backward (recomputation included)."""
    send_s: float
    """One point-to-point send between neighbouring stages."""
    head_s: list[float]
    """Per rank, work before its first forward (its first unit's all-gather)."""
    tail_s: list[float]
    """Per rank, work after its last backward (last unit's reduce-scatter, the HSDP
    all-reduce, the optimizer step)."""
    memory_bytes: list[dict[str, float]]
    """Per rank, bytes by memory category at its peak."""
    state_bytes: list[float]
    """Per rank, the model state it holds between steps (parameters, optimizer states,
    DDP's gradient buckets), module buffers excluded."""
    in_flight: list[float]
    """Per rank, the most micro-batches (in stages' worth of its layers) it holds."""
    tp_bytes_per_rank: float
    """TP collective bytes (bus) one rank moves per step."""
    all_to_all_s: list[float]
    """Per rank, the time its expert-parallel all-to-alls block its stages in a step."""
    ep_bytes_per_rank: float
    """Expert parallelism's all-to-all bytes (bus) the first rank moves per step."""
    gather_s: float
    """One all-gather of all of a rank's units over the shard group, each running alone
    (what FSDP2 re-gathers per micro-batch without PP, per pass)."""


def _tp_time_s(b: Builder, phase: str, boundaries: tuple[TpBoundary, ...],
               regions: int) -> float:
    """Time of the TP collectives of `regions` regions in `phase`, each running alone, in
    the size and dtype each boundary carries (zsim.schedule.build.tp_bytes, tp_dtype)."""
    p = b.plan
    if p.tp == 1:
        return 0.0
    return regions * sum(
        collective_time_s(kind, tp_bytes(b, boundary), b.tp, b.hw, tp_dtype(b, boundary))
        for boundary in boundaries for kind in boundary.calls[(p.sp, phase)])


def pipeline_work(model: ModelSpec, hw: HardwareProfile, plan: Plan) -> PipelineWork:
    """The work of every stage and rank of `plan` (pp > 1) on the rank's TP shard
    `model` (zsim.schedule.lower.rank_model)."""
    p = plan
    autocast = p.runs_autocast
    acts = activation_sizes(model, p, autocast=autocast)
    fsdp = p.program.comm == "fsdp"
    shard_elems = program(p).shard_elems
    b = Builder(model, hw, p, acts=acts, autocast=autocast)
    n_stages = num_stages(p)
    layers = model.num_layers // n_stages
    both = (TP_ENTER, TP_EXIT)
    block_f, block_b = b.compute(b.block_fwd), b.compute(b.block_bwd)
    if p.impl == "fsdp2":  # the device waits for a host slower than the block's kernels
        block_f = max(block_f, fsdp2.block_host_s(hw, p, "forward"))
        block_b = max(block_b, fsdp2.block_host_s(hw, p, "backward"))
    regions = tp_regions(model)
    tp_f = _tp_time_s(b, "forward", both, regions)
    tp_b = _tp_time_s(b, "backward", both, regions) + (tp_f if p.recompute == "full" else 0.0)
    if p.async_tp:  # overlapped with the block's kernels: only the excess shows
        tp_f, tp_b = max(0.0, tp_f - block_f), max(0.0, tp_b - block_b)
    # Expert parallelism's blocking all-to-alls (zsim.schedule.build.expert_parallel).
    a2a_calls, a2a_s, a2a_bus = 0, 0.0, 0.0
    if p.ep > 1 and model.moe is not None:
        a2a_calls = len(ep_calls(p, "forward")) + len(ep_calls(p, "backward"))
        a2a_s = collective_time_s("all_to_all", ep_bytes(b), b.ep, hw, p.param_dtype)
        a2a_bus = bus_bytes("all_to_all", ep_bytes(b), p.ep)
        tp_f += len(ep_calls(p, "forward")) * a2a_s
        tp_b += len(ep_calls(p, "backward")) * a2a_s
    kw = dict(micro_batch=p.micro_batch, seq_len=p.seq_len, act_bytes=b.param_elem_bytes)
    head_f = b.compute(head_forward_flops(model, **kw))
    head_b = sum(b.compute(part) for part in head_backward_flops(model, **kw))
    # The output projection's logits all-gathered for the loss (build.gather_logits).
    gather_s = (collective_time_s("all_gather", logits_bytes(b), b.tp, hw) if p.tp > 1
                else 0.0)
    forward, backward = [], []
    for s in range(n_stages):
        f = layers * (block_f + tp_f)
        bw = layers * (block_b + tp_b)
        if s == 0:
            f += _tp_time_s(b, "forward", (TP_EMBEDDING_EXIT,), 1)
            bw += _tp_time_s(b, "backward", (TP_EMBEDDING_EXIT,), 1)
        if s == n_stages - 1:
            f += head_f + _tp_time_s(b, "forward", (TP_ENTER,), 1) + gather_s
            bw += head_b + _tp_time_s(b, "backward", (TP_ENTER,), 1)
        forward.append(f)
        backward.append(bw)
    # The residual stream, fp32 under autocast (zsim.analytic.activations).
    send_bytes = (p.micro_batch * p.seq_len * model.d_model * dtype_bytes(b.stream_dtype)
                  / (p.tp if p.sp else 1))
    link = hw.inter_node if pipeline_hop_crosses_nodes(p, hw) else hw.intra_node
    send_s = link.latency_s + send_bytes / link.achievable_bytes_per_s
    placement = place(p, hw)
    # FSDP's group: dp_shard x cp ranks (Plan.dp_shard_cp; a plan without PP is the
    # planner's one-stage pipeline, and may have CP).
    shard, repl = placement.group("dp_shard_cp"), placement.group("dp_replicate")
    block_shapes = [s for _, s in model.block_tensors()]
    block_params = sum(math.prod(s) for s in block_shapes)
    block_shard, expert_shard = block_shard_elems(model, p.dp_shard_cp, p.expert_shard_ranks,
                                                  shard_elems)
    unit_shard = p.unit_size * block_shard
    # Under expert parallelism the routed experts are gathered and reduced over their
    # own group (expert_shard: Plan.expert_shard_ranks), after the dense part.
    block_gathered = ((block_shard - expert_shard) * p.dp_shard_cp
                      + expert_shard * p.expert_shard_ranks)
    dense_gathered = p.unit_size * (block_shard - expert_shard) * p.dp_shard_cp
    expert_gathered = p.unit_size * block_gathered - dense_gathered
    experts = placement.group("expert_shard")
    a, r = b.param_elem_bytes, dtype_bytes(p.reduce_dtype)
    at_rest = dtype_bytes(p.master_dtype if p.has_master_copy else p.param_dtype)
    first_ag = (collective_time_s("all_gather", dense_gathered * a, shard, hw)
                + collective_time_s("all_gather", expert_gathered * a, experts, hw)
                if fsdp else 0.0)
    last_rs = (collective_time_s("reduce_scatter", dense_gathered * r, shard, hw,
                                 p.reduce_dtype)
               + collective_time_s("reduce_scatter", expert_gathered * r, experts, hw,
                                   p.reduce_dtype)
               + collective_time_s("all_reduce", unit_shard * r, repl, hw, p.reduce_dtype))
    head_s, tail_s, memory, in_flight, state, all_to_all = [], [], [], [], [], []
    tp_bus = 0.0
    for rank in range(p.pp):
        stages = rank_stages(p, rank)
        here = rank_layers(p, model.num_layers, rank)
        roots = [s for name, s in model.root_tensors()
                 if (0 in stages and "embeddings" in name)
                 or (n_stages - 1 in stages and "embeddings" not in name)]
        tensors = here * len(block_shapes) + len(roots)
        all_to_all.append(here * p.grad_accum * a2a_calls * a2a_s)
        local = shard_elems(roots, p.dp_shard_cp) + here * block_shard
        params = here * block_params + sum(math.prod(s) for s in roots)
        # Foreach AdamW over the rank's shard (zsim.analytic.compute.optimizer_flops).
        opt = b.compute(optimizer_flops(
            local, optimizer=p.optimizer, tensors=tensors, master_bytes=at_rest,
            state_bytes_per_param=optimizer_bytes_per_param(p), grad_bytes=at_rest,
            param_copy_bytes=a if p.has_master_copy else 0, foreach=hw.foreach_kernels))
        head_s.append(first_ag)
        if not fsdp:  # DDP: one all-reduce of the stage's gradients, in its buckets' dtype
            bucket = ddp_bucket_dtype(p)
            last_rs = (collective_time_s("all_reduce", params * dtype_bytes(bucket), repl, hw,
                                         bucket)
                       if torch_ddp.has_reducer(p) else 0.0)
        tail_s.append(last_rs + opt)
        saved = {s: layers * acts.held_per_block
                 + (acts.root_saved if s == n_stages - 1 else 0) for s in stages}
        actions = rank_actions(p, rank)
        held = peak_in_flight(actions, weight=lambda s, saved=saved: saved[s])
        in_flight.append(peak_in_flight(actions) / len(stages))
        mem = {
            "master_params" if p.has_master_copy else "params": float(local * at_rest),
            "optimizer_states": local * optimizer_bytes_per_param(p),
        }
        recv = sum(int(s > 0) + int(s < n_stages - 1) for s in stages)
        if recv:
            mem["comm_buffers"] = recv * p.grad_accum * send_bytes
        state.append(sum(mem.values()))
        if fsdp:
            mem["gathered_params"] = float(
                ((local - here * block_shard) * p.dp_shard_cp + here * block_gathered) * a)
            mem["gathered_grads"] = float(params * (a if p.grad_accum == 1 else r))
        else:
            mem["grads"] = float(params * at_rest)
            if torch_ddp.has_reducer(p):
                state[-1] += mem["grads"]
        mem["activations"] = (held + acts.block_transient
                              + (acts.loss_working if n_stages - 1 in stages else 0))
        memory.append(mem)
    if p.tp > 1:
        calls = regions * rank_layers(p, model.num_layers, 0) * p.grad_accum
        tp_bus = calls * sum(bus_bytes(k, tp_bytes(b, bd), p.tp)
                             for phase in ("forward", "backward") for bd in both
                             for k in bd.calls[(p.sp, phase)])
    units = max(1, rank_layers(p, model.num_layers, 0) // p.unit_size)
    return PipelineWork(forward_s=forward, backward_s=backward, send_s=send_s, head_s=head_s,
                        tail_s=tail_s, memory_bytes=memory, state_bytes=state,
                        in_flight=in_flight, tp_bytes_per_rank=tp_bus,
                        all_to_all_s=all_to_all,
                        ep_bytes_per_rank=(rank_layers(p, model.num_layers, 0) * p.grad_accum
                                           * a2a_calls * a2a_bus),
                        gather_s=units * first_ag)
