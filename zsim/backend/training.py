"""One training step of a prepared program, whatever the library: the data, the forward,
backward and optimizer calls.

Owns `Prepared` (a model with a plan applied: the module to call, how to back-propagate
and step, what to synchronise), which every program module builds (zsim.backend.programs
chooses the module), the data of a step, and the step itself. Imports torch; imports no
program module.
"""

from __future__ import annotations

import math
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


Phase = Callable[[str], AbstractContextManager[Any]]
"""What a step runs each of its phases in: called with "forward" and then "backward" for
every micro-batch, then "optimizer"; the context spans the phase's calls (the step's
timers and profiler ranges hook in here: zsim.backend.step_timing)."""


def no_phase(name: str) -> AbstractContextManager[None]:
    """The Phase of a plain step: nothing around any phase."""
    return nullcontext()


def forward_backward(prep: Prepared, tokens: torch.Tensor, labels: torch.Tensor, *,
                     last: bool, phase: Phase = no_phase) -> torch.Tensor:
    """One micro-batch: the forward (under autocast to prep.autocast_dtype when set), then
    the backward, each inside `phase(name)`.

    Returns:
        The loss, on the device (its graph already back-propagated; reading it waits for
        the device).
    """
    cast = (torch.autocast(tokens.device.type, dtype=prep.autocast_dtype)
            if prep.autocast_dtype is not None else nullcontext())
    with prep.sync(last):
        with phase("forward"), cast:
            loss = prep.model(tokens, labels)
        with phase("backward"):
            prep.backward(loss, last)
    return loss


def train_step(prep: Prepared, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], *,
               phase: Phase = no_phase, read_loss: bool = True) -> float:
    """One optimizer step over all micro-batches, each phase inside `phase(name)`. With
    `read_loss` each micro-batch's loss is read back once its backward is issued, as a
    training loop that logs its loss does (the host waits for the device there); without
    it nothing in the step waits for the device. A micro-batch's loss is released before
    the next one's forward.

    Returns:
        The last micro-batch's loss, or NaN without `read_loss`.
    """
    loss = math.nan
    for i, (tokens, labels) in enumerate(micro_batches):
        out = forward_backward(prep, tokens, labels, last=i == len(micro_batches) - 1,
                               phase=phase)
        if read_loss:
            loss = float(out.detach())
        del out
    with phase("optimizer"):
        prep.step()
    return loss


def barrier() -> None:
    """Align ranks before a timed region (no-op when not distributed)."""
    if dist.is_initialized():
        dist.barrier()
