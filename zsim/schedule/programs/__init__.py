"""The programs zsim lowers (program: zsim's vocabulary, zsim/__init__.py), one module
each, behind one interface (`Program`): what a rank holds at rest, what it must hold at
once at the least, and the ops of one step in the host's issue order.
zsim.schedule.lower picks the program a plan names (`Plan.impl`: the module its entry
in the program registry, zsim.spec.programs, names; zsim.schedule.lower.program) and adds
what every schedule shares. What a program is rather than does (whether it computes under
autocast, wraps units, composes with TP) is its registry entry's data, not a field here.

| impl      | module      | runs                                                         |
|-----------|-------------|--------------------------------------------------------------|
| torch     | torch_ddp   | DistributedDataParallel (ddp), + ZeroRedundancyOptimizer     |
|           |             | (zero1)                                                      |
| fsdp2     | fsdp2       | fully_shard (fsdp, fsdp-no-reshard, hsdp)                    |
| fsdp1     | fsdp1       | FullyShardedDataParallel (FULL_SHARD, SHARD_GRAD_OP,         |
|           |             | HYBRID_SHARD)                                                |
| deepspeed | deepspeed   | DeepSpeed ZeRO stages 1, 2, 3 (zero1, zero2, zero3)          |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from zsim.analytic.memory import optimizer_bytes_per_param
from zsim.schedule.build import Builder, ShardElems, Unit, optimizer_temporaries
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes


def no_state_pieces(model: ModelSpec, plan: Plan) -> dict[str, tuple[int, ...]]:
    """A program whose state at rest is one tensor per category (flat buffers)."""
    return {}


def host_step_bytes(plan: Plan, elems: float, grad_bytes: int) -> float:
    """Host memory at its most of a torch optimizer that steps `elems` elements on the
    host (torch.optim.AdamW on the offloaded shard): the copy it updates, in the at-rest
    dtype (the fp32 master in mixed precision, else the parameters'), the gradients it
    steps with (`grad_bytes` an element, as the program copies them to the host), the
    optimizer states, and foreach AdamW's working list (exp_avg_sq_sqrt,
    zsim.schedule.build.optimizer_temporaries), live during the step."""
    at_rest = dtype_bytes(plan.master_dtype if plan.has_master_copy else plan.param_dtype)
    work = sum(b.bytes for b in optimizer_temporaries(plan, elems))
    return elems * (at_rest + grad_bytes + optimizer_bytes_per_param(plan)) + work


def offloaded_state_bytes(model: ModelSpec, plan: Plan) -> float:
    """Host bytes of torch's DDP and ZeroRedundancyOptimizer with the optimizer offloaded
    (torch_ddp): host_step_bytes over the elements the rank's optimizer steps (all of
    them, or its 1/N for zero1), with the gradients its buckets copy to the host in the
    plan's grad dtype; 0 without offload."""
    if plan.offload == "none":
        return 0.0
    n = plan.dp_shard if plan.shards_optimizer else 1
    return host_step_bytes(plan, float(-(-model.num_params // n)), dtype_bytes(plan.grad_dtype))


@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    """One training program as the lowering sees it."""

    name: str
    """The Plan.impl value that selects it (its registry entry's name)."""
    shard_elems: ShardElems
    """How it pads one rank's shard of a unit's parameters."""
    state_at_rest_bytes: Callable[[ModelSpec, Plan], dict[str, float]]
    """Bytes per memory category a rank holds between steps (module buffers excluded)."""
    gathered_floor_bytes: Callable[[ModelSpec, Plan], float]
    """Gathered parameters it must hold when the loss's forward starts (part of the
    memory floor: zsim.schedule.lower.memory_floor_bytes)."""
    lower: Callable[[Builder, Unit, list[Unit]], None]
    """Emit one step's ops into the builder, through the optimizer step and what follows
    it, given the root and block units."""
    host_state_bytes: Callable[[ModelSpec, Plan], float] = offloaded_state_bytes
    """Bytes a rank holds in host memory at its most (what offload moves there, its
    staging buffers, and what the host step adds); the device's figures exclude them."""
    state_pieces: Callable[[ModelSpec, Plan], dict[str, tuple[int, ...]]] = no_state_pieces
    """The tensors of each category of the state at rest, as the CUDA caching allocator
    sees them (zsim.schedule.ops.Buffer.pieces); a category missing is one tensor."""

