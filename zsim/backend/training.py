"""One training step of a prepared program, whatever the library: the data, the forward,
backward and optimizer calls.

Owns `Prepared` (a model with a plan applied: the module to call, how to back-propagate
and step, what to synchronise), which every program module builds (zsim.backend.programs
chooses the module), the data of a step, and the step itself. Imports torch; imports no
program module.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A model with a plan applied, ready to train."""

    model: nn.Module
    """What the step calls: the wrapped model (FSDP module, DDP wrapper, DeepSpeed
    engine, or plain), called as model(tokens, labels) -> loss."""
    inner: nn.Module
    """The Transformer inside the wrapper (a pipeline rank's: its stage's module)."""
    units: dict[str, nn.Module]
    """Timing scopes, in forward order: "layers.<i>" per block, then "root"."""
    backward: Callable[[torch.Tensor, bool], None]
    """Back-propagate one micro-batch's loss (the bool: it is the step's last)."""
    step: Callable[[], None]
    """The optimizer step (gradients released after it)."""
    sync: Callable[[bool], AbstractContextManager[Any]] = field(
        default=lambda last: nullcontext())
    """Context around a micro-batch's forward and backward that turns gradient
    synchronisation on for the last one only (FSDP2 and DDP)."""
    autocast_dtype: torch.dtype | None = None
    """Dtype for torch.autocast around forward (DDP/ZeRO-1 mixed precision), else None."""


def data_rank(plan: Plan, rank: int) -> int:
    """The data-parallel rank of global rank `rank`: ranks are laid out as torchtitan's
    mesh (pp, dp, tp), outermost first, and every rank of one TP group or pipeline sees
    the same data."""
    return (rank // plan.tp) % plan.dp_degree


def batches(spec: ModelSpec, plan: Plan, *, device: str, rank: int,
            step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The micro-batches of one step for one data-parallel rank (see data_rank): random
    tokens and labels, seeded by (rank, step) so data-parallel ranks see different data."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    out = []
    for _ in range(plan.grad_accum):
        tokens = torch.randint(0, spec.vocab_size, (plan.micro_batch, plan.seq_len + 1),
                               generator=g)
        # Own, contiguous storages, what a data loader hands over (with one sequence the
        # slices are contiguous already, and .contiguous() would share one storage).
        out.append((tokens[:, :-1].clone(memory_format=torch.contiguous_format).to(device),
                    tokens[:, 1:].clone(memory_format=torch.contiguous_format).to(device)))
    if plan.pp > 1:
        # A pipeline schedule takes the step's batch whole and splits it (torchtitan).
        return [(torch.cat([t for t, _ in out]), torch.cat([lab for _, lab in out]))]
    return out


def forward_backward(prep: Prepared, tokens: torch.Tensor, labels: torch.Tensor, *,
                     last: bool, after_forward: Callable[[], None] | None = None) -> float:
    """One micro-batch: forward, then `after_forward()` if given, then backward.

    Returns:
        The loss value.
    """
    device_type = tokens.device.type
    cast = (torch.autocast(device_type, dtype=prep.autocast_dtype)
            if prep.autocast_dtype is not None else nullcontext())
    with prep.sync(last):
        with cast:
            loss = prep.model(tokens, labels)
        if after_forward is not None:
            after_forward()
        prep.backward(loss, last)
    return float(loss.detach())


def train_step(prep: Prepared, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """One optimizer step over all micro-batches; returns the last loss."""
    loss = 0.0
    for i, (tokens, labels) in enumerate(micro_batches):
        loss = forward_backward(prep, tokens, labels, last=i == len(micro_batches) - 1)
    prep.step()
    return loss


def barrier() -> None:
    """Align ranks before a timed region (no-op when not distributed)."""
    if dist.is_initialized():
        dist.barrier()
