"""Apply a zsim Plan with DeepSpeed's ZeRO (impl "deepspeed"): the reference model wrapped
by deepspeed.initialize with the ds_config the plan implies, and its step.

The config: train_micro_batch_size_per_gpu and gradient_accumulation_steps from the plan,
bf16 (or fp16) from its param dtype, an AdamW optimizer (DeepSpeed's fused Adam; its CPU
Adam when the optimizer is offloaded), zero_optimization with the plan's stage and every
knob of zsim.spec.deepspeed.DeepSpeedZero, offload_optimizer / offload_param when the
plan offloads. Recomputation wraps each block with torch.utils.checkpoint before
initialize (zsim.backend.fsdp2.apply_recompute), which ZeRO-3's hooks see through.
DeepSpeed runs on the CPU accelerator with gloo here (DS_ACCELERATOR=cpu), on CUDA with
NCCL elsewhere; it joins the process group zsim.backend.runner set up. Imports torch;
imports deepspeed when a plan is prepared.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from zsim.backend.fsdp2 import LEARNING_RATE, apply_recompute
from zsim.backend.reference_model import Transformer
from zsim.backend.training import Prepared
from zsim.errors import ConfigError
from zsim.spec.deepspeed import ZERO_STAGES, DeepSpeedZero
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


def check_plan(plan: Plan, world_size: int, spec: ModelSpec) -> None:
    """What this backend runs with DeepSpeed.

    Raises:
        ConfigError: tp or pp > 1, a world size that differs from the plan's, an optimizer
            other than adamw, or parameter offload below stage 3.
    """
    if plan.tp != 1 or plan.pp != 1:
        raise ConfigError("plan.tp" if plan.tp != 1 else "plan.pp",
                          plan.tp if plan.tp != 1 else plan.pp,
                          "the DeepSpeed backend runs data parallelism only")
    if plan.world_size != world_size:
        raise ConfigError("plan.world_size", plan.world_size,
                          f"must equal the number of processes ({world_size})")
    if plan.optimizer != "adamw":
        raise ConfigError("plan.optimizer", plan.optimizer, "the DeepSpeed backend runs adamw")
    if plan.offload == "params" and plan.strategy != "zero3":
        raise ConfigError("plan.offload", plan.offload, "DeepSpeed offloads parameters only "
                          "with ZeRO stage 3")


def ds_config(plan: Plan) -> dict[str, Any]:
    """The DeepSpeed config that runs `plan`."""
    stage = ZERO_STAGES[plan.strategy]
    ds = plan.options_as(DeepSpeedZero)
    zero: dict[str, Any] = {
        "stage": stage,
        "reduce_bucket_size": ds.reduce_bucket_size,
        "allgather_bucket_size": ds.allgather_bucket_size,
        "overlap_comm": ds.overlaps(stage),
        "contiguous_gradients": ds.contiguous_gradients,
    }
    if stage == 3:
        zero |= {"stage3_prefetch_bucket_size": ds.prefetch_bucket_size,
                 "stage3_param_persistence_threshold": ds.param_persistence_threshold,
                 "stage3_max_live_parameters": ds.max_live_parameters,
                 "stage3_max_reuse_distance": ds.max_reuse_distance}
    device = ds.offload_device if ds.offload_device != "none" else "cpu"
    if plan.offload in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": device}
    if plan.offload == "params":
        zero["offload_param"] = {"device": device}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": LEARNING_RATE}},
        "gradient_clipping": ds.gradient_clipping,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if plan.param_dtype == "bf16":
        config["bf16"] = {"enabled": True, "check_grad_overflow": ds.check_grad_overflow}
    elif plan.param_dtype == "fp16":
        config["fp16"] = {"enabled": True}
    return config


def prepare(spec: ModelSpec, plan: Plan, *, device: str, world_size: int) -> Prepared:
    """Build the model on `device` and hand it to deepspeed.initialize.

    Raises:
        ConfigError: see check_plan.
    """
    check_plan(plan, world_size, spec)
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device.startswith("cuda") else "cpu")
    rank = dist.get_rank()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(dist.get_world_size()),
                      LOCAL_RANK=str(rank if not device.startswith("cuda")
                                     else torch.cuda.current_device()))
    import deepspeed

    deepspeed.utils.logger.setLevel(logging.WARNING)
    torch.manual_seed(0)
    with torch.device(device):
        inner = Transformer(spec)
    inner.init_weights()
    apply_recompute(inner, plan)
    engine, _, _, _ = deepspeed.initialize(model=inner, model_parameters=inner.parameters(),
                                           config=ds_config(plan), dist_init_required=False)

    def backward(loss: torch.Tensor, last: bool) -> None:
        engine.backward(loss)
        if not last:
            engine.step()  # a micro-step: DeepSpeed updates only at the boundary

    units: dict[str, torch.nn.Module] = {f"layers.{i}": blk for i, blk in enumerate(inner.layers)}
    units["root"] = inner
    return Prepared(model=engine, inner=inner, units=units, backward=backward,
                    step=engine.step)
