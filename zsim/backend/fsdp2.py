"""Apply a zsim Plan to the reference model with the real PyTorch APIs, and run its step.

Owns the Plan -> torch mapping (the table in zsim.spec.plan, made executable):

| strategy        | what runs here                                                          |
|-----------------|-------------------------------------------------------------------------|
| ddp             | DistributedDataParallel(bucket_cap_mb=plan.bucket_bytes, gradients as   |
|                 | bucket views), fp32 params, autocast to param_dtype (DDP has no stable  |
|                 | bf16-parameter mode; autocast caches bf16 weight copies per forward)    |
| zero1           | the same DDP + ZeroRedundancyOptimizer(AdamW): optimizer state sharded  |
| zero2           | fully_shard(reshard_after_forward=False): the closest real equivalent;  |
|                 | unlike DeepSpeed ZeRO-2, parameters are also sharded at rest            |
| fsdp            | fully_shard(reshard_after_forward=True) per unit                        |
| fsdp-no-reshard | fully_shard(reshard_after_forward=False) per unit                       |
| hsdp            | fully_shard on a 2-D DeviceMesh (dp_replicate, dp_shard)                |

Units are groups of `unit_size` consecutive blocks, each one fully_shard call (a list of
modules, one parameter group); the root (embeddings, final norm, output) is a last unit,
not resharded after forward (torchtitan: FSDP would regather it at once for backward).
MixedPrecisionPolicy comes from the plan's param and reduce dtypes; offload !=
"none" adds CPUOffloadPolicy. Activation checkpointing wraps each block before sharding
(torchtitan's order): "full" with torch.utils.checkpoint (non-reentrant), "selective"
with an op-level policy that saves matmul and attention outputs and recomputes the rest
(torchtitan's op-SAC policy: every second matmul is recomputed too). Prefetch beyond
FSDP2's implicit one unit is set explicitly with set_modules_to_forward_prefetch /
set_modules_to_backward_prefetch. The optimizer
is AdamW(foreach=True), gradients set to None after the step. Imports torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from zsim.backend.reference_model import Transformer
from zsim.backend.training import Prepared
from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import MiB

TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""zsim dtype names -> torch dtypes (int8 is not a training dtype here)."""

LEARNING_RATE = 1e-4
"""AdamW learning rate; any small value, the step's cost does not depend on it."""

_SAC_SAVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}
"""Ops whose outputs selective recomputation keeps (torchtitan _op_sac_save_list);
everything else in a block is recomputed."""


def check_plan(plan: Plan, world_size: int, spec: ModelSpec) -> None:
    """What this backend can run.

    Raises:
        ConfigError: tp or pp > 1, a world size that differs from the plan's, or a unit
            size that does not divide the layers.
    """
    if plan.tp != 1 or plan.pp != 1:
        raise ConfigError("plan.tp" if plan.tp != 1 else "plan.pp",
                          plan.tp if plan.tp != 1 else plan.pp,
                          "the torch backend runs data parallelism only")
    if plan.world_size != world_size:
        raise ConfigError("plan.world_size", plan.world_size,
                          f"must equal the number of processes ({world_size})")
    if spec.num_layers % plan.unit_size:
        raise ConfigError("plan.unit_size", plan.unit_size,
                          f"must divide num_layers={spec.num_layers}")
    if plan.optimizer != "adamw":
        raise ConfigError("plan.optimizer", plan.optimizer, "the torch backend runs adamw")


def prepare(spec: ModelSpec, plan: Plan, *, device: str, world_size: int) -> Prepared:
    """Build the model on `device` and apply `plan` (see the module table).

    Raises:
        ConfigError: see check_plan.
    """
    check_plan(plan, world_size, spec)
    torch.manual_seed(0)
    if plan.strategy in ("ddp", "zero1"):
        with torch.device(device):
            inner = Transformer(spec)
        inner.init_weights()
        apply_recompute(inner, plan)
        # Gradients as views into the buckets: one fp32 gradient copy, not two.
        model: nn.Module = DistributedDataParallel(
            inner, bucket_cap_mb=plan.bucket_bytes / MiB, gradient_as_bucket_view=True)
        params = list(model.parameters())
        if plan.strategy == "zero1":
            optimizer: torch.optim.Optimizer = ZeroRedundancyOptimizer(
                params, optimizer_class=torch.optim.AdamW, lr=LEARNING_RATE, foreach=True)
        else:
            optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE, foreach=True)
        dtype = TORCH_DTYPES[plan.param_dtype]
        return Prepared(model=model, inner=inner, units=units_of(inner),
                        backward=backward_loss, step=stepper(optimizer), sync=syncer(model),
                        autocast_dtype=None if dtype == torch.float32 else dtype)
    with torch.device("meta"):
        inner = Transformer(spec)
    apply_recompute(inner, plan)
    _shard(inner, plan, device)
    # CPUOffloadPolicy wants its shards materialised on the host (FSDP2 moves each
    # gathered unit to the device itself); everything else lives on the device.
    materialise(inner, "cpu" if plan.offload == "params" else device)
    if plan.offload == "params":
        # Module buffers (the RoPE tables) are no FSDP state: they go to the device.
        for module in inner.modules():
            for name, buf in list(module.named_buffers(recurse=False)):
                setattr(module, name, buf.to(device))
    optimizer = torch.optim.AdamW(inner.parameters(), lr=LEARNING_RATE, foreach=True)
    return Prepared(model=inner, inner=inner, units=units_of(inner), backward=backward_loss,
                    step=stepper(optimizer), sync=syncer(inner))


def materialise(inner: Transformer, device: str) -> None:
    """Allocate a model built on the meta device (and sharded there) on `device`, and
    initialise its weights, DTensor shards included."""
    inner.to_empty(device=device)
    with warnings.catch_warnings():
        # DTensor warns that its RNG is untested on CPU meshes; init needs no exact stream.
        warnings.filterwarnings("ignore", message="DTensor random operators")
        inner.init_weights()


def backward_loss(loss: torch.Tensor, last: bool) -> None:
    """Back-propagate one micro-batch's loss (`last` unused: autograd alone)."""
    loss.backward()


def stepper(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """AdamW on the local shards; gradients set to None."""
    def step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def syncer(model: nn.Module) -> Callable[[bool], AbstractContextManager[Any]]:
    """Gradient synchronisation only on the last micro-batch (FSDP2's
    set_requires_gradient_sync, DDP's no_sync)."""
    @contextmanager
    def sync(last: bool) -> Iterator[None]:
        if isinstance(model, FSDPModule):
            model.set_requires_gradient_sync(last)
            yield
        elif isinstance(model, DistributedDataParallel) and not last:
            with model.no_sync():
                yield
        else:
            yield

    return sync


def units_of(inner: Transformer) -> dict[str, nn.Module]:
    """Timing scopes of the model: "layers.<i>" per block, then "root"."""
    units: dict[str, nn.Module] = {f"layers.{i}": b for i, b in enumerate(inner.layers)}
    units["root"] = inner
    return units


def apply_recompute(inner: Transformer, plan: Plan) -> None:
    """Wrap each block for the plan's recomputation: torch.utils.checkpoint of the whole
    block ("full") or with the op-level SAC policy ("selective"); nothing for "none"."""
    if plan.recompute == "none":
        return
    for i, block in enumerate(inner.layers):
        if plan.recompute == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
            wrapped._zsim_checkpointed = True  # read by measure.record_saved_tensors
        else:
            policy = SacPolicy()
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False,
                                         context_fn=policy.contexts)
            wrapped._zsim_sac_policy = policy  # read by measure.record_saved_tensors
        inner.layers[i] = wrapped


class SacPolicy:
    """Selective recomputation as torchtitan's op-level SAC: keep the outputs of _SAC_SAVE
    ops except every second matmul (counted separately in forward and in recomputation),
    recompute the rest. `on_save`, when set, is called with each output kept in a forward,
    so the kept bytes can be measured: SAC stores them in its own cache, where
    saved_tensors_hooks do not see them."""

    def __init__(self) -> None:
        self.on_save: Callable[[torch.Tensor, str], None] | None = None

    def contexts(self) -> tuple[Any, Any]:
        """Fresh forward/recompute contexts for one checkpointed call (fresh mm counts)."""
        mm_count = {False: 0, True: 0}

        def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            if op == torch.ops.aten.mm.default:
                mm_count[ctx.is_recompute] += 1
                if mm_count[ctx.is_recompute] % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
            if op not in _SAC_SAVE:
                return CheckpointPolicy.PREFER_RECOMPUTE
            if self.on_save is not None and not ctx.is_recompute:
                # torch < 2.12 passes no op_output: the kept bytes then go unmeasured.
                kept = getattr(ctx, "op_output", None)
                out = kept if isinstance(kept, tuple) else (kept,)
                for t in out:
                    if isinstance(t, torch.Tensor):
                        self.on_save(t, str(op))
            return CheckpointPolicy.MUST_SAVE

        return create_selective_checkpoint_contexts(policy)


def _shard(inner: Transformer, plan: Plan, device: str) -> None:
    device_type = device.split(":")[0]
    if plan.strategy == "hsdp":
        mesh = init_device_mesh(device_type, (plan.dp_replicate, plan.dp_shard),
                                mesh_dim_names=("dp_replicate", "dp_shard"))
    else:
        mesh = init_device_mesh(device_type, (plan.dp_shard,), mesh_dim_names=("dp_shard",))
    shard(inner, plan, mesh)


def shard(inner: Transformer, plan: Plan, mesh: DeviceMesh) -> None:
    """fully_shard `inner` over `mesh` as `plan` says (units, reshard after forward,
    mixed precision, offload, prefetch); the root is a last unit, not resharded."""
    device_type = mesh.device_type
    mp_policy = MixedPrecisionPolicy(param_dtype=TORCH_DTYPES[plan.param_dtype],
                                     reduce_dtype=TORCH_DTYPES[plan.reduce_dtype])
    offload: OffloadPolicy = (CPUOffloadPolicy(pin_memory=device_type == "cuda")
                              if plan.offload != "none" else OffloadPolicy())
    layers = list(inner.layers)
    units: list[FSDPModule] = []
    for start in range(0, len(layers), plan.unit_size):
        group = layers[start:start + plan.unit_size]
        target: nn.Module | list[nn.Module] = group[0] if len(group) == 1 else group
        out = fully_shard(target, mesh=mesh, reshard_after_forward=plan.reshard_after_forward,
                          mp_policy=mp_policy, offload_policy=offload)
        units.append(out[0] if isinstance(out, list) else out)
    root = fully_shard(inner, mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy,
                       offload_policy=offload)
    if plan.prefetch > 1:
        # FSDP2 prefetches one unit implicitly; deeper prefetch is explicit.
        for i, unit in enumerate(units):
            unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + plan.prefetch])
            unit.set_modules_to_backward_prefetch(units[max(0, i - plan.prefetch):i][::-1])
    del root


