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
