"""Rank functions for the runner tests. They live in their own module because spawned
processes import them by name."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from zsim.backend.runner import RankContext


def all_reduce_rank(ctx: RankContext, payload: Any) -> dict[str, Any]:
    """Sum each rank's (rank + 1) across ranks; report the pid for the clean-up check."""
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    import os

    return {"sum": float(t.item()), "pid": os.getpid()}


def raise_on_rank_one(ctx: RankContext, payload: Any) -> None:
    """Rank 1 raises; rank 0 waits in a collective that can never complete."""
    if ctx.rank == 1:
        raise ValueError("boom from rank one")
    dist.barrier()


def hang(ctx: RankContext, payload: Any) -> None:
    """Never returns on its own."""
    time.sleep(3600)


def refill_faults(ctx: RankContext, numel: int) -> int:
    """Page faults taken by five allocate-fill-free rounds of one large block, after ten
    rounds that let the heap settle (a freed block is too small for the next one's
    alignment slack until two freed neighbours coalesce, so the heap grows a few times)."""
    import resource

    def round_trip() -> None:
        torch.empty(numel).fill_(1.0)

    for _ in range(10):
        round_trip()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        round_trip()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def fsdp_over_dp_shard_cp(ctx: RankContext, payload: Any) -> dict[str, Any]:
    """One AdamW step of the reference model fully_shard-ed over torchtitan's flattened
    dp_shard x cp mesh, and what this rank then holds. `payload`: (ModelSpec, Plan).

    The mesh is (dp_shard, cp), flattened into "dp_shard_cp" as torchtitan's ParallelDims
    does, and zsim.backend.fsdp2.shard applies the plan's units over it. Each rank
    trains on its cp share of its data-parallel rank's sequence (consecutive chunks: the
    load balancer's order does not change what the state holds). torch's
    context_parallel does not run on CPU (see test_cp_state_backend), so attention stays
    inside the share."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from zsim.backend.fsdp2 import shard
    from zsim.backend.reference_model import Transformer

    spec, plan = payload
    mesh = init_device_mesh("cpu", (plan.dp_shard, plan.cp), mesh_dim_names=("dp_shard", "cp"))
    flat = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    torch.manual_seed(0)
    model = Transformer(spec)
    model.init_weights()
    shard(model, plan, flat)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    g = torch.Generator().manual_seed(mesh.get_local_rank("dp_shard"))
    tokens = torch.randint(0, spec.vocab_size, (plan.micro_batch, plan.seq_len + 1), generator=g)
    share = plan.seq_len // plan.cp
    first = mesh.get_local_rank("cp") * share
    loss = model(tokens[:, first:first + share], tokens[:, first + 1:first + share + 1])
    loss.backward()
    params = list(model.parameters())
    grads = [p.grad for p in params]
    out = {
        "loss": float(loss.item()),
        "meshes": sorted({(p.device_mesh.size(), p.placements == (Shard(0),)) for p in params}),
        "grad_meshes": sorted({(g.device_mesh.size(), g.placements == (Shard(0),))
                               for g in grads}),
        # The padded shard FSDP2 allocates (the local tensor is a view into it).
        "param_storage_bytes": sum(p.to_local().untyped_storage().nbytes() for p in params),
        "grad_bytes": sum(g.to_local().numel() * g.element_size() for g in grads),
    }
    optimizer.step()
    out["moment_bytes"] = sum(
        t.to_local().numel() * t.element_size()
        for state in optimizer.state.values() for k, t in state.items()
        if k in ("exp_avg", "exp_avg_sq"))
    return out


OFFLOAD_HOST_BUFFERS = (
    # stage_1_and_2.py with cpu_offload (self.device = "cpu")
    "single_partition_of_fp32_groups", "param_buffer_of_bit16_for_cpu_offload_groups",
    "temp_grad_buffer_for_cpu_offload", "accumulated_grads_in_cpu",
    # stage3.py with offload_optimizer / offload_param
    "fp32_partitioned_groups_flat", "grad_partitions_flat_buffer",
    "param_groups_fp16_flat_cpu_memory",
)
"""The ZeRO optimizer's attributes that DeepSpeed 0.19 allocates on the offload device
(each a tensor, or a list or dict of them)."""


def offload_host_bytes(ctx: RankContext, payload: Any) -> dict[str, int]:
    """One DeepSpeed step of `payload` = (spec, plan) with the optimizer offloaded, then
    the bytes of what its ZeRO optimizer holds on the offload device, by attribute
    (OFFLOAD_HOST_BUFFERS, their tensors' .grad counted with them) and "optimizer.state"
    (DeepSpeedCPUAdam's moments); each storage counted once."""
    from zsim.backend import programs, training

    spec, plan = payload
    prep = programs.prepare(spec, plan, device=ctx.device, world_size=ctx.world_size)
    training.train_step(prep, training.batches(spec, plan, device=ctx.device,
                                               rank=ctx.rank, step=0))
    zero = prep.model.optimizer  # the engine's ZeRO optimizer
    seen: set[int] = set()

    def storage_bytes(tensors: list[torch.Tensor]) -> int:
        total = 0
        for t in tensors:
            for x in (t, t.grad):
                if x is None or x.untyped_storage().data_ptr() in seen:
                    continue
                seen.add(x.untyped_storage().data_ptr())
                total += x.untyped_storage().nbytes()
        return total

    def tensors_of(value: Any) -> list[torch.Tensor]:
        if isinstance(value, torch.Tensor):
            return [value]
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, (list, tuple)):
            return [t for v in value for t in tensors_of(v)]
        return []

    out = {name: storage_bytes(tensors_of(getattr(zero, name, None)))
           for name in OFFLOAD_HOST_BUFFERS}
    out["optimizer.state"] = storage_bytes(
        [t for state in zero.optimizer.state.values() for t in tensors_of(state)])
    return out


def moe_layer_vs_reference(ctx: RankContext, payload: Any) -> dict[str, float]:
    """One MoE layer with expert parallelism and the same layer without (ep 1, every
    expert local, no collective) on this rank's tokens; the largest absolute difference,
    relative to the reference's largest magnitude, of the output, the input's gradient,
    the router's and shared expert's gradients, and this rank's experts' gradients (the
    reference's summed over the EP group, whose tokens they all saw). `payload`:
    (MoeConfig, tokens per rank)."""
    from dataclasses import replace

    from zsim.backend.moe_ep import A2aLog, MoE, ep_mesh

    cfg, tokens = payload
    mesh = ep_mesh(ctx.world_size, cfg.ep)
    ep_rank = mesh.get_local_rank("ep")
    group = mesh["ep"].get_group()
    layers = {}
    for name, c, g in (("ep", cfg, group), ("ref", replace(cfg, ep=1), None)):
        torch.manual_seed(0)
        layer = MoE(c, layer=0, group=g, log=A2aLog())
        with torch.no_grad():
            for n, p in layer.named_parameters():
                if "experts" not in n:
                    p.normal_(0.0, 0.5)
            gen = torch.Generator().manual_seed(7)
            mine = slice(ep_rank * c.local_experts, (ep_rank + 1) * c.local_experts)
            for w in (layer.experts.w1, layer.experts.w2, layer.experts.w3):
                whole = torch.randn((cfg.num_experts, *w.shape[1:]), generator=gen) * 0.5
                w.copy_(whole if g is None else whole[mine])
        layers[name] = layer
    gen = torch.Generator().manual_seed(ctx.rank)
    x0 = torch.randn(1, tokens, cfg.d_model, generator=gen)
    g_out = torch.randn(1, tokens, cfg.d_model, generator=gen)
    outs, xs = {}, {}
    for name, layer in layers.items():
        xs[name] = x0.clone().requires_grad_(True)
        outs[name] = layer(xs[name])
        (outs[name] * g_out).sum().backward()
    ep, ref = layers["ep"], layers["ref"]
    mine = slice(ep_rank * cfg.local_experts, (ep_rank + 1) * cfg.local_experts)

    def rel(got: torch.Tensor, want: torch.Tensor) -> float:
        return float((got - want).abs().max() / want.abs().max())

    expert_diff = 0.0
    for w in ("w1", "w2", "w3"):
        summed = getattr(ref.experts, w).grad.clone()
        dist.all_reduce(summed, group=group)
        expert_diff = max(expert_diff, rel(getattr(ep.experts, w).grad, summed[mine]))
    dense = [rel(a.grad, b.grad) for (n, a), b in
             zip(ep.named_parameters(), ref.parameters(), strict=True) if "experts" not in n]
    return {"output": rel(outs["ep"].detach(), outs["ref"].detach()),
            "input_grad": rel(xs["ep"].grad, xs["ref"].grad),
            "dense_grad": max(dense), "expert_grad": expert_diff}


def moe_model_vs_reference(ctx: RankContext, job: Any) -> dict[str, float]:
    """The MoE decoder under EP and FSDP2 against the same decoder on one process (ep 1,
    no FSDP) trained on every rank's batch (loss: their mean): the largest absolute
    difference of the mean loss and of every gradient, this rank's experts' included."""
    from dataclasses import replace

    from zsim.backend.moe_ep import A2aLog, batch, build_model, ep_mesh, parallelize

    mesh = ep_mesh(ctx.world_size, job.moe.ep)
    ep_rank = mesh.get_local_rank("ep")
    model = build_model(job, group=mesh["ep"].get_group(), ep_rank=ep_rank, log=A2aLog())
    parallelize(model, job, mesh)
    loss = model(*batch(job, ctx.rank, 0))
    loss.backward()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= ctx.world_size
    ref = build_model(replace(job, moe=replace(job.moe, ep=1)), group=None, ep_rank=0,
                      log=A2aLog())
    ref_loss = sum(ref(*batch(job, r, 0)) for r in range(ctx.world_size)) / ctx.world_size
    ref_loss.backward()
    mine = slice(ep_rank * job.moe.local_experts, (ep_rank + 1) * job.moe.local_experts)
    ref_grads = dict(ref.named_parameters())
    worst = 0.0
    for name, p in model.named_parameters():
        got = p.grad.full_tensor()
        want = ref_grads[name].grad
        if ".experts." in name:
            want = want[mine]
        worst = max(worst, float((got - want).abs().max()))
    return {"loss": float((mean_loss - ref_loss).abs()), "grad": worst,
            "grad_norm": float(max(p.grad.abs().max() for p in ref.parameters()))}
