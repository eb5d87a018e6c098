"""Golden: ring collective time on the toy cluster (100 GB/s, zero latency, efficiency 1).

A ring all_gather or reduce_scatter of S bytes over N ranks sends (N-1)/N * S bytes per
rank, so with alpha = 0 it takes (N-1)/N * S / B; a ring all_reduce is a reduce_scatter
followed by an all_gather and takes twice as long (Patarasuk & Yuan 2009; nccl-tests
doc/PERFORMANCE.md bus-bandwidth factors). Expected times below are worked by hand for
S = 1 GB and B = 100 GB/s: S / B = 10 ms.
"""

from __future__ import annotations

import math

import pytest

from zsim.analytic.collectives import CommGroup, collective_time_s
from zsim.spec.hardware import HardwareProfile

HAND_RING_S = {2: 0.005, 4: 0.0075, 8: 0.00875, 64: 0.00984375}
"""N -> (N-1)/N * 10 ms, seconds."""


@pytest.mark.parametrize("n", sorted(HAND_RING_S))
@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_ring_gather_scatter_time(kind: str, n: int, toy_hw: HardwareProfile) -> None:
    # All ranks on one link tier: the textbook single ring.
    group = CommGroup(ranks=n, ranks_per_node=n)
    assert math.isclose(collective_time_s(kind, 1e9, group, toy_hw), HAND_RING_S[n],
                        rel_tol=1e-12)


@pytest.mark.parametrize("n", sorted(HAND_RING_S))
def test_ring_all_reduce_takes_twice_as_long(n: int, toy_hw: HardwareProfile) -> None:
    group = CommGroup(ranks=n, ranks_per_node=n)
    assert math.isclose(collective_time_s("all_reduce", 1e9, group, toy_hw),
                        2 * HAND_RING_S[n], rel_tol=1e-12)


def test_one_rank_collective_is_free(toy_hw: HardwareProfile) -> None:
    group = CommGroup(ranks=1, ranks_per_node=1)
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        assert collective_time_s(kind, 1e9, group, toy_hw) == 0.0
