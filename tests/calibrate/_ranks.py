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


def refill_faults(ctx: RankContext, numel: int) -> int:
    """Page faults taken by five allocate-fill-free rounds of one large block, after ten
    rounds that let the heap settle (a freed block is too small for the next one's
    alignment slack until two freed neighbours coalesce, so the heap grows a few times)."""
    import resource

    def round_trip() -> None:
        torch.empty(numel).fill_(1.0)

    for _ in range(10):
        round_trip()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        round_trip()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
