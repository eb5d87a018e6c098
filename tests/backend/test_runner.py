"""The process runner: results in rank order, a raising rank reported with its error, a
hung job timed out, no process left behind in any case, and host memory cached across
allocations."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

pytest.importorskip("torch")

from _ranks import all_reduce_rank, hang, raise_on_rank_one, refill_faults

from zsim.backend.runner import HOST_MALLOC_ENV, RankFailed, run_ranks

pytestmark = pytest.mark.slow


def test_two_ranks_all_reduce_on_a_free_port() -> None:
    out = run_ranks(all_reduce_rank, None, nproc=2, timeout_s=60)
    assert [o["sum"] for o in out] == [3.0, 3.0]  # 1 + 2 on both ranks
    assert multiprocessing.active_children() == []


def test_raising_rank_is_reported_and_nothing_is_left_running() -> None:
    with pytest.raises(RankFailed) as info:
        run_ranks(raise_on_rank_one, None, nproc=2, timeout_s=60)
    assert info.value.rank == 1
    assert "boom from rank one" in str(info.value)
    assert multiprocessing.active_children() == []


def test_hung_job_times_out_and_is_killed() -> None:
    # Past the deadline the ranks are killed, hanging or still starting up alike.
    start = time.monotonic()
    with pytest.raises(RankFailed, match="timed out after 5 s"):
        run_ranks(hang, None, nproc=2, timeout_s=5)
    assert time.monotonic() - start < 30
    assert multiprocessing.active_children() == []


def test_ranks_reuse_freed_host_memory_without_page_faults() -> None:
    # A 64 MiB block is 16,384 pages of 4 KiB. glibc's defaults mmap a block that large
    # afresh on every allocation, so each of the five rounds faults in all of its pages
    # (>= 81,920 faults); with the ranks' caching settings the block is reused.
    numel = (64 << 20) // 4
    pages_per_round = (64 << 20) // 4096
    faults = run_ranks(refill_faults, numel, nproc=2, timeout_s=60)
    assert all(f < pages_per_round for f in faults), faults
    assert not any(k in os.environ for k in HOST_MALLOC_ENV)  # the parent's is untouched
