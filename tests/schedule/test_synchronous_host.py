"""A synchronous host (gloo ranks: the CPU runs the kernels itself) chains the ops it runs
or waits for, and a blocking call the ranks reach from model compute pays the profile's
cost of a synchronisation (zsim.schedule.build.on_synchronous_host, synchronising)."""

from __future__ import annotations

import pytest

from zsim.schedule.build import on_synchronous_host, synchronising
from zsim.schedule.ops import Op


def _ops() -> list[Op]:
    """Model compute, then calls and copies between them, as a ZeRO-2 bucket and an FSDP2
    unit issue them."""
    spec = [
        ("block backward", "backward", "compute", 1e9, False),
        ("flatten", "backward", "compute", 0.0, False),           # a copy: no FLOPs
        ("bucket 0", "all_reduce", "all_reduce", 0.0, False),     # after compute: pays
        ("copy out", "backward", "compute", 0.0, False),
        ("bucket 1", "all_reduce", "all_reduce", 0.0, False),     # after a call: free
        ("ddp bucket", "all_reduce", "all_reduce", 0.0, True),    # async: never blocks
        ("next block", "forward", "compute", 2e9, False),
        ("prefetch", "all_gather", "all_gather", 0.0, True),      # async: never pays
        ("all-gather", "all_gather", "all_gather", 0.0, False),   # compute before: pays
        ("grad cast", "backward", "reduce_scatter", 0.0, False),  # not a collective
        ("end", "sync", "compute", 0.0, False),
    ]
    return [Op(index=i, name=name, kind=kind, stream=stream, flops=flops, async_op=async_op,
               latency_s=1e-5)
            for i, (name, kind, stream, flops, async_op) in enumerate(spec)]


def test_a_blocking_call_after_model_compute_synchronises() -> None:
    ops = _ops()
    assert [op.name for op, s in zip(ops, synchronising(ops), strict=True) if s] == [
        "bucket 0", "all-gather"]


def test_the_synchronising_calls_take_the_cost_in_their_latency() -> None:
    """Only the synchronising calls' latency grows, by exactly the cost; the host chain
    (each op issued after the last op the host ran or waited for) is the same with the
    cost or without it."""
    ops = _ops()
    plain, paying = on_synchronous_host(ops), on_synchronous_host(ops, 3e-4)
    extra = {op.name: b.latency_s - op.latency_s
             for op, b in zip(plain, paying, strict=True) if b.latency_s != op.latency_s}
    assert extra == pytest.approx({"bucket 0": 3e-4, "all-gather": 3e-4}, rel=1e-12)
    assert [op.issue_after for op in plain] == [op.issue_after for op in paying]
    # The async calls are not waited for: the op after each is chained to the op before.
    after = {op.name: op.issue_after for op in plain}
    assert after["next block"] == (4,) and after["all-gather"] == (6,)
