"""Closed-form memory per rank: model state by ZeRO stage, and a first peak estimate.

Owns the bytes-per-parameter table of the ZeRO paper and the steady-state peak formula
"sharded state + gathered units + activations + buffers". The simulator's memory ledger
must never report a peak below `estimate_memory(...).steady_state_bytes` (tested).

References:
- Rajbhandari et al. 2020, "ZeRO", Sec. 5 and Fig. 1: with K bytes of optimizer state
  per parameter (12 for mixed-precision Adam: fp32 master, momentum, variance) the model
  states take (4+K)Psi (DDP), 4Psi + K Psi/N (stage 1), 2Psi + (2+K)Psi/N (stage 2) and
  (4+K)Psi/N (stage 3) bytes per device.
- The ZeRO/FSDP card (docs/card.md, "Deep dive"): "FSDP peak ~ sharded state + one or
  two full units + activations".
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.analytic.activations import (
    STATE_ALIASES,
    block_activation_bytes,
    block_backward_working_bytes,
    block_input_casts,
    block_recompute_bytes,
    loss_working_bytes,
    root_saved_tensors,
)
from zsim.spec.model import ModelSpec
from zsim.spec.plan import ADAMW8BIT_BYTES_PER_PARAM, OPTIMIZER_STATE_COPIES, Plan
from zsim.units import dtype_bytes

CATEGORIES: tuple[str, ...] = (
    "params", "grads", "master_params", "optimizer_states", "gathered_params",
    "gathered_grads", "activations", "comm_buffers", "workspace",
)
"""Memory categories, shared by the closed form and the simulator's ledger ("workspace":
library workspaces a step keeps, cuBLAS's)."""


def optimizer_bytes_per_param(plan: Plan) -> float:
    """Optimizer state bytes per parameter (K minus the master copy)."""
    if plan.optimizer == "adamw8bit":
        return ADAMW8BIT_BYTES_PER_PARAM
    return OPTIMIZER_STATE_COPIES[plan.optimizer] * dtype_bytes(plan.optimizer_state_dtype)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelState:
    """Per-rank model-state bytes at rest, by category."""

    params: float
    grads: float
    master_params: float
    optimizer_states: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.master_params + self.optimizer_states

    def as_dict(self) -> dict[str, float]:
        return {"params": self.params, "grads": self.grads,
                "master_params": self.master_params, "optimizer_states": self.optimizer_states}


def model_state_bytes(num_params: int, plan: Plan) -> ModelState:
    """Parameters, gradients, master weights and optimizer states held per rank.

    ZeRO-3/FSDP shards everything over dp_shard (x cp: Plan.dp_shard_cp, FSDP's group
    with context parallelism); ZeRO-2 keeps full compute-dtype params;
    ZeRO-1 also keeps full gradients; DDP shards nothing. Offload moves the optimizer
    states and master copy (and with "params" the parameter shards) to host memory.
    """
    psi = float(num_params)
    # A shard holds ceil(Psi / n) elements: the flat buffer is padded to a multiple of n
    # (FSDP1's FlatParameter, DeepSpeed's ZeRO partitions), so n shards always cover the
    # whole state. FSDP2 pads each parameter's dim 0 instead, which can only add more.
    shard = float(-(-num_params // plan.dp_shard_cp))
    p_bytes, g_bytes = dtype_bytes(plan.param_dtype), dtype_bytes(plan.grad_dtype)
    master_bytes = dtype_bytes(plan.master_dtype) if plan.has_master_copy else 0
    opt_elems = shard if plan.shards_optimizer else psi
    params = (shard if plan.shards_params else psi) * p_bytes
    grads = (shard if plan.shards_grads else psi) * g_bytes
    master = opt_elems * master_bytes
    opt = opt_elems * optimizer_bytes_per_param(plan)
    if plan.offload != "none":
        master, opt = 0.0, 0.0
    if plan.offload == "params":
        params, grads = 0.0, 0.0
    return ModelState(params=params, grads=grads, master_params=master, optimizer_states=opt)


def unit_param_count(model: ModelSpec, plan: Plan) -> int:
    """Parameters of the largest FSDP unit (unit_size blocks, or the root if larger)."""
    return max(plan.unit_size * model.params_per_block, model.root_params)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """A closed-form peak estimate for one rank, bytes by category."""

    by_category: dict[str, float]
    """Bytes live at the estimated peak (end of forward / start of backward)."""

    @property
    def steady_state_bytes(self) -> float:
        """Model state alone: a lower bound on any peak."""
        return sum(self.by_category[c] for c in
                   ("params", "grads", "master_params", "optimizer_states"))

    @property
    def peak_bytes(self) -> float:
        return sum(self.by_category.values())


def estimate_memory(model: ModelSpec, plan: Plan) -> MemoryEstimate:
    """First peak estimate at the start of the last micro-batch's backward, when every
    block's activations are saved and the first backward unit is gathered.

    - gathered params: FSDP holds the unit computing plus `prefetch` units in flight,
      in param dtype; fsdp-no-reshard holds every unit (all gathered after forward).
    - gathered grads: the unit being reduce-scattered plus the one being produced, in
      reduce dtype (FSDP); ddp/zero1/zero2 use one bucket in flight; with gradient
      accumulation, sharded-gradient strategies hold full unsharded gradients.
    - activations: all blocks' saved tensors + root tensors + the largest transient
      (loss backward, or a block's backward working set with its recomputation).
    """
    state = model_state_bytes(model.num_params, plan)
    a = dtype_bytes(plan.param_dtype)
    b, s = plan.micro_batch, plan.seq_len
    unit = unit_param_count(model, plan)
    gathered = grads_in_flight = 0.0
    if plan.shards_params:
        if plan.reshard_after_forward:
            gathered = (1 + plan.prefetch) * unit * a
        else:
            gathered = model.num_params * a
        grads_in_flight = 2 * unit * dtype_bytes(plan.reduce_dtype)
    else:
        grads_in_flight = 2 * float(plan.bucket_bytes)
    if plan.grad_accum > 1 and plan.shards_grads:
        # Gradients accumulate unsharded across micro-batches and are reduced once per
        # step (FSDP2 set_requires_gradient_sync(False), DDP no_sync), as step_comm counts.
        grads_in_flight = float(model.num_params * dtype_bytes(plan.grad_dtype))
    saved = model.num_layers * (
        block_activation_bytes(model, micro_batch=b, seq_len=s, recompute=plan.recompute,
                               act_bytes=a)
        + sum(t.bytes for t in block_input_casts(model, seq_len=s, act_bytes=a,
                                                 casts_inputs=plan.casts_block_inputs)))
    saved += sum(t.bytes for t in root_saved_tensors(model, micro_batch=b, seq_len=s,
                                                      act_bytes=a)
                 if t.name not in STATE_ALIASES)
    transient = max(
        loss_working_bytes(model, micro_batch=b, seq_len=s, act_bytes=a),
        block_backward_working_bytes(model, micro_batch=b, seq_len=s, act_bytes=a)
        + block_recompute_bytes(model, micro_batch=b, seq_len=s, recompute=plan.recompute,
                                act_bytes=a),
    )
    return MemoryEstimate(by_category={
        **state.as_dict(),
        "gathered_params": gathered,
        "gathered_grads": grads_in_flight,
        "activations": float(saved + transient),
        "comm_buffers": 0.0,
    })
