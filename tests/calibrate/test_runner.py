"""The process runner: results in rank order, a raising rank reported with its error, a
hung job timed out, and no process left behind in any case."""

from __future__ import annotations

import multiprocessing
import time

import pytest

pytest.importorskip("torch")

from _ranks import all_reduce_rank, hang, raise_on_rank_one

from zsim.calibrate.runner import RankFailed, run_ranks

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
    start = time.monotonic()
    with pytest.raises(RankFailed, match="timed out after 15 s"):
        run_ranks(hang, None, nproc=2, timeout_s=15)
    assert time.monotonic() - start < 40
    assert multiprocessing.active_children() == []
