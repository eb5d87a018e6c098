"""The programs zsim lowers, one module each, behind one interface (`Program`): what a
rank holds at rest, what it must hold at once at the least, and the ops of one step in
the host's issue order. zsim.schedule.lower picks the program a plan names
(`Plan.impl`, zsim.schedule.lower.PROGRAMS) and adds what every schedule shares.

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

from zsim.analytic.memory import model_state_bytes
from zsim.schedule.build import Builder, ShardElems, Unit
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


def no_state_pieces(model: ModelSpec, plan: Plan) -> dict[str, tuple[int, ...]]:
    """A program whose state at rest is one tensor per category (flat buffers)."""
    return {}


def offloaded_state_bytes(model: ModelSpec, plan: Plan) -> float:
    """Host bytes of an offloading plan by the closed form of zsim.analytic.memory: the
    state that offload moves off the device (0 without offload)."""
    if plan.offload == "none":
        return 0.0
    kept = model_state_bytes(model.num_params, plan).total
    return model_state_bytes(model.num_params, plan.with_(offload="none")).total - kept


@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    """One training program as the lowering sees it."""

    name: str
    """The Plan.impl value that selects it."""
    shard_elems: ShardElems
    """How it pads one rank's shard of a unit's parameters."""
    autocast: Callable[[Plan], bool]
    """Whether it computes under torch.autocast with master-dtype parameters (its
    activations then include autocast's casts)."""
    state_at_rest_bytes: Callable[[ModelSpec, Plan], dict[str, float]]
    """Bytes per memory category a rank holds between steps (module buffers excluded)."""
    gathered_floor_bytes: Callable[[ModelSpec, Plan], float]
    """Gathered parameters it must hold when the loss's forward starts (part of the
    memory floor: zsim.schedule.lower.memory_floor_bytes)."""
    lower: Callable[[Builder, Unit, list[Unit]], None]
    """Emit one step's ops into the builder, through the optimizer step and what follows
    it, given the root and block units."""
    host_state_bytes: Callable[[ModelSpec, Plan], float] = offloaded_state_bytes
    """Bytes a rank keeps in host memory between steps (offloaded state and its
    staging buffers); the device's figures exclude them."""
    state_pieces: Callable[[ModelSpec, Plan], dict[str, tuple[int, ...]]] = no_state_pieces
    """The tensors of each category of the state at rest, as the CUDA caching allocator
    sees them (zsim.schedule.ops.Buffer.pieces); a category missing is one tensor."""
    wraps_units: bool = True
    """Whether the program groups blocks into units (FSDP's fully_shard or FlatParameter
    per `plan.unit_size` blocks). One that does not (DDP, DeepSpeed) is lowered block by
    block, as it runs, whatever unit size and prefetch depth the plan names
    (zsim.schedule.lower.program_plan)."""

