"""Rank functions for the runner tests. They live in their own module because spawned
processes import them by name."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from zsim.calibrate.runner import RankContext


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
