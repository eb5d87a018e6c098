"""The host time of the nano model's blocks (zsim.calibration.nano: its kernels cost almost
nothing): unsharded, checkpointed, and under FSDP2 alone and with its collectives, every
rank at once so that they share the cores as in a real job. zsim.calibration.host_costs
turns the per-block times into the profile's host figures. Imports torch.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from zsim.backend.fsdp2 import TORCH_DTYPES, apply_recompute, shard
from zsim.backend.reference_model import Transformer
from zsim.backend.runner import RankContext, sync_device
from zsim.calibration.bench_figures import BLOCK_STEPS
from zsim.calibration.nano import NANO_TOKENS, nano_model, nano_plan
from zsim.calibration.timing import median_call_s


def block_step_s(ctx: RankContext, layers: tuple[int, int]) -> dict[str, float]:
    """Time per extra block of the nano model (median of 25 steps at each of two depths;
    see RankBench.block_step_s), every rank at once so they share the cores as in a real
    job. The FSDP2 runs apply fsdp and fsdp-no-reshard plans (their default mixed
    precision) with the backend's own mapping, zsim.backend.fsdp2.shard; the
    checkpointed runs wrap each block as the backend does
    (zsim.backend.fsdp2.apply_recompute)."""
    device_type = ctx.device.split(":")[0]
    local, _ = dist.new_subgroups(group_size=1)
    meshes = {"fsdp_local": DeviceMesh.from_group(local, device_type),
              "fsdp": DeviceMesh.from_group(dist.group.WORLD, device_type)}
    plans = {s: nano_plan(s, ctx.world_size) for s in ("fsdp", "fsdp-no-reshard")}
    g = torch.Generator().manual_seed(ctx.rank)
    tokens, labels = (torch.randint(0, 64, NANO_TOKENS, generator=g).to(ctx.device)
                      for _ in range(2))

    def step_s(num_layers: int, how: str) -> float:
        torch.manual_seed(0)
        with torch.device(ctx.device):
            model = Transformer(nano_model(num_layers))
        model.init_weights()
        kind = how.removesuffix("_forward")
        if kind in ("plain", "full", "selective"):
            model = model.to(TORCH_DTYPES[plans["fsdp"].param_dtype])
            if kind != "plain":
                apply_recompute(model, replace(plans["fsdp"], recompute=kind))
        else:
            shard(model, plans["fsdp-no-reshard" if kind == "fsdp_no_reshard" else "fsdp"],
                  meshes["fsdp_local" if kind == "fsdp_local" else "fsdp"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step() -> None:
            loss = model(tokens, labels)
            if how.endswith("_forward"):
                return
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync_device(ctx.device)

        dist.barrier()
        return median_call_s(step, 25, warmup=5)

    lo, hi = layers
    return {how: (step_s(hi, how) - step_s(lo, how)) / (hi - lo) for how in BLOCK_STEPS}
