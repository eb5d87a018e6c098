"""Apply a zsim Plan with FSDP1 (impl "fsdp1"): the reference model wrapped by
torch.distributed.fsdp.FullyShardedDataParallel, one FlatParameter per block and one for
the root (embeddings, final norm, output), and its step.

The wrapping: auto_wrap_policy on the block class (unit size 1), sharding strategy from
the plan's (fsdp: FULL_SHARD, fsdp-no-reshard: SHARD_GRAD_OP, hsdp: HYBRID_SHARD over a
(replicate, shard) mesh), MixedPrecision from its param and reduce dtypes,
backward_prefetch, forward_prefetch and limit_all_gathers from zsim.spec.fsdp1,
use_orig_params=False (torch's default). Every micro-batch reduces (no no_sync), as the
model of zsim.schedule.programs.fsdp1 assumes. Recomputation wraps each block first
(zsim.backend.fsdp2.apply_recompute); the block is then its checkpoint wrapper. AdamW
(foreach) on the FlatParameters, gradients set to None after the step. Imports torch.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    BackwardPrefetch,
    FullyShardedDataParallel,
    MixedPrecision,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

from zsim.backend.fsdp2 import LEARNING_RATE, TORCH_DTYPES, apply_recompute
from zsim.backend.reference_model import Transformer
from zsim.backend.training import Prepared
from zsim.errors import ConfigError
from zsim.spec.fsdp1 import Fsdp1Options
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

SHARDING = {"fsdp": ShardingStrategy.FULL_SHARD,
            "fsdp-no-reshard": ShardingStrategy.SHARD_GRAD_OP,
            "hsdp": ShardingStrategy.HYBRID_SHARD}
PREFETCH = {"pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST,
            "none": None}


def check_plan(plan: Plan, world_size: int, spec: ModelSpec) -> None:
    """What this backend runs with FSDP1.

    Raises:
        ConfigError: tp or pp > 1, a world size that differs from the plan's, a unit of
            more than one block, or an optimizer other than adamw.
    """
    if plan.tp != 1 or plan.pp != 1:
        raise ConfigError("plan.tp" if plan.tp != 1 else "plan.pp",
                          plan.tp if plan.tp != 1 else plan.pp,
                          "the FSDP1 backend runs data parallelism only")
    if plan.world_size != world_size:
        raise ConfigError("plan.world_size", plan.world_size,
                          f"must equal the number of processes ({world_size})")
    if plan.unit_size != 1:
        raise ConfigError("plan.unit_size", plan.unit_size,
                          "the FSDP1 backend wraps each block (unit size 1)")
    if plan.optimizer != "adamw":
        raise ConfigError("plan.optimizer", plan.optimizer, "the FSDP1 backend runs adamw")


def prepare(spec: ModelSpec, plan: Plan, *, device: str, world_size: int) -> Prepared:
    """Build the model on `device` and wrap it with FullyShardedDataParallel.

    Raises:
        ConfigError: see check_plan.
    """
    check_plan(plan, world_size, spec)
    torch.manual_seed(0)
    with torch.device(device):
        inner = Transformer(spec)
    inner.init_weights()
    apply_recompute(inner, plan)
    blocks = {id(b) for b in inner.layers}
    device_type = device.split(":")[0]
    mesh = (init_device_mesh(device_type, (plan.dp_replicate, plan.dp_shard),
                             mesh_dim_names=("dp_replicate", "dp_shard"))
            if plan.strategy == "hsdp" else None)
    opt = plan.options_as(Fsdp1Options)
    model = FullyShardedDataParallel(
        inner,
        auto_wrap_policy=functools.partial(lambda_auto_wrap_policy,
                                           lambda_fn=lambda m: id(m) in blocks),
        sharding_strategy=SHARDING[plan.strategy], device_mesh=mesh,
        mixed_precision=MixedPrecision(param_dtype=TORCH_DTYPES[plan.param_dtype],
                                       reduce_dtype=TORCH_DTYPES[plan.reduce_dtype]),
        backward_prefetch=PREFETCH[opt.backward_prefetch],
        forward_prefetch=opt.forward_prefetch, limit_all_gathers=opt.limit_all_gathers,
        device_id=torch.device(device), use_orig_params=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, foreach=True)

    def step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # The blocks are now FSDP instances (auto-wrapping replaced them in place).
    units: dict[str, nn.Module] = {f"layers.{i}": b for i, b in enumerate(inner.layers)}
    units["root"] = inner
    return Prepared(model=model, inner=inner, units=units,
                    backward=lambda loss, last: loss.backward(), step=step)
