"""Whole-timeline tests in SimPy's style: hand-built schedules on round numbers, the
expected (start, end, stream, op) list worked out by hand and asserted in one equality."""

from __future__ import annotations

from dataclasses import replace

from zsim.engine.replay import run
from zsim.schedule.ops import Buffer, Op, Schedule

NVLINK = (("intra_node", 1.0),)


def _schedule(ops: list[Op], *, slowdown: float = 0.0, comm_slowdown: float = 0.0,
              baseline: tuple[Buffer, ...] = (), hbm_bytes: float = 1e12) -> Schedule:
    return Schedule(ops=tuple(ops), baseline=baseline,
                    link_bytes_per_s={"intra_node": 100e9, "inter_node": 10e9},
                    comm_compute_slowdown=slowdown, compute_comm_slowdown=comm_slowdown,
                    hbm_bytes=hbm_bytes, model_flops=1.0,
                    hardware_flops=1.0, tokens_per_rank=1, world_size=2,
                    peak_flop_per_s=1e12, dp_shard=2)


def _ag(index: int, name: str, gb: float, **kw: object) -> Op:
    """An all-gather moving `gb` GB per rank over NVLink (100 GB/s: gb/100 s)."""
    return Op(index=index, name=name, kind="all_gather", stream="all_gather",
              bus_bytes=gb * 1e9, link="intra_node", link_loads=NVLINK, **kw)


def _fwd(index: int, name: str, seconds: float, **kw: object) -> Op:
    return Op(index=index, name=name, kind="forward", stream="compute", compute_s=seconds, **kw)


def _timeline(schedule: Schedule) -> list[tuple[float, float, str, str]]:
    spans = run(schedule).trace.spans
    return [(round(s.start_s, 9), round(s.end_s, 9), s.stream, s.name) for s in spans]


def test_no_prefetch_step_is_the_sum() -> None:
    # AG0 1 s, F0 2 s, AG1 (issued after F0) 1 s, F1 2 s: nothing overlaps, step = 6 s.
    ops = [_ag(0, "ag0", 100), _fwd(1, "f0", 2.0, after=(0,)),
           _ag(2, "ag1", 100, after=(1,)), _fwd(3, "f1", 2.0, after=(2,))]
    assert _timeline(_schedule(ops)) == [
        (0.0, 1.0, "all_gather", "ag0"), (1.0, 3.0, "compute", "f0"),
        (3.0, 4.0, "all_gather", "ag1"), (4.0, 6.0, "compute", "f1")]


def test_prefetch_step_is_the_max() -> None:
    # AG1 is issued when F0 starts: it runs 1-2 under F0 (1-3); F1 3-5. Step = 5 s.
    ops = [_ag(0, "ag0", 100), _fwd(1, "f0", 2.0, after=(0,)),
           _ag(2, "ag1", 100, after_start=(1,)), _fwd(3, "f1", 2.0, after=(2,))]
    out = run(_schedule(ops))
    assert [(round(s.start_s, 9), round(s.end_s, 9), s.name) for s in out.trace.spans] == [
        (0.0, 1.0, "ag0"), (1.0, 3.0, "f0"), (1.0, 2.0, "ag1"), (3.0, 5.0, "f1")]
    # Only the first all-gather is exposed, and it could not have been issued earlier.
    assert [(w.op, w.blocking, w.wait_s) for w in out.trace.waits] == [("f0", "ag0", 1.0)]


def test_prefetch_too_shallow_is_the_reason_when_comm_outlasts_compute() -> None:
    # AG1 takes 3 s under a 2 s F0: F1 waits 1 s (1->3 F0, AG1 1->4), reason: prefetch.
    ops = [_ag(0, "ag0", 100), _fwd(1, "f0", 2.0, after=(0,)),
           _ag(2, "ag1", 300, after_start=(1,)), _fwd(3, "f1", 2.0, after=(2,))]
    waits = run(_schedule(ops)).trace.waits
    assert [(w.op, w.start_s, w.end_s, w.reason) for w in waits] == [
        ("f0", 0.0, 1.0, "critical_path"), ("f1", 3.0, 4.0, "prefetch_too_shallow")]


def test_concurrent_transfers_share_the_link() -> None:
    # A: 100 GB from t=0; B: 100 GB issued at t=0.5 (after a 0.5 s kernel) on another
    # stream. 0-0.5 A alone (50 GB); then 50 GB/s each: A ends at 1.5; B has 50 GB left
    # alone at 100 GB/s: ends at 2.0.
    ops = [_ag(0, "A", 100), _fwd(1, "k", 0.5),
           Op(index=2, name="B", kind="reduce_scatter", stream="reduce_scatter",
              bus_bytes=100e9, link="intra_node", link_loads=NVLINK, after=(1,))]
    out = run(_schedule(ops))
    assert [(round(s.start_s, 9), round(s.end_s, 9), s.name, s.link_shared)
            for s in out.trace.spans] == [
        (0.0, 1.5, "A", True), (0.0, 0.5, "k", False), (0.5, 2.0, "B", True)]


def test_weighted_loads_take_the_tighter_link() -> None:
    # 80 GB over NVLink (weight 1/2: 200 GB/s) and the NIC (weight 1/8: 80 GB/s) -> 1 s.
    op = Op(index=0, name="ring", kind="all_gather", stream="all_gather", bus_bytes=80e9,
            link="inter_node", link_loads=(("intra_node", 0.5), ("inter_node", 0.125)))
    assert _timeline(_schedule([op])) == [(0.0, 1.0, "all_gather", "ring")]


def test_latency_is_not_shared() -> None:
    # 0.25 s latency, then 100 GB at 100 GB/s.
    op = _ag(0, "ag", 100, latency_s=0.25)
    assert _timeline(_schedule([op])) == [(0.0, 1.25, "all_gather", "ag")]


def test_compute_slows_while_a_collective_runs() -> None:
    # Slowdown 0.5: a 2 s kernel under a 1 s all-gather does 0.5 s of work in the first
    # second, then the remaining 1.5 s at full rate: it ends at 2.5 s.
    ops = [_ag(0, "ag", 100), _fwd(1, "k", 2.0)]
    assert _timeline(_schedule(ops, slowdown=0.5)) == [
        (0.0, 1.0, "all_gather", "ag"), (0.0, 2.5, "compute", "k")]


def test_collectives_and_compute_slow_each_other() -> None:
    # Both slowdowns 0.5 (a CPU whose cores the collective's threads share): a 1 s
    # all-gather and a 2 s kernel both run at half rate while together. After 2 s the
    # all-gather is done (1 s of work at 0.5) and the kernel has done 1 s of its 2 s;
    # the kernel's last 1 s runs alone: it ends at 3 s.
    ops = [_ag(0, "ag", 100), _fwd(1, "k", 2.0)]
    assert _timeline(_schedule(ops, slowdown=0.5, comm_slowdown=0.5)) == [
        (0.0, 2.0, "all_gather", "ag"), (0.0, 3.0, "compute", "k")]


def test_same_time_ties_follow_issue_order() -> None:
    # Two zero-length kernels and two equal collectives all start at 0: spans come out in
    # (start, rank, index) order and the two transfers end together.
    ops = [_ag(0, "x", 100), _fwd(1, "a", 0.0),
           Op(index=2, name="y", kind="reduce_scatter", stream="reduce_scatter",
              bus_bytes=100e9, link="intra_node", link_loads=NVLINK),
           _fwd(3, "b", 0.0)]
    assert _timeline(_schedule(ops)) == [
        (0.0, 2.0, "all_gather", "x"), (0.0, 0.0, "compute", "a"),
        (0.0, 2.0, "reduce_scatter", "y"), (0.0, 0.0, "compute", "b")]


def test_memory_ledger_peak_and_oom_location() -> None:
    # Baseline 10 B; f0 allocates 50 (peak 60), frees it at its end; f1 allocates 95:
    # 105 > 100 -> OOM at f1; after f1 frees, back to the baseline.
    base = (Buffer(name="state", category="params", bytes=10),)
    ops = [_fwd(0, "f0", 1.0, allocs=(Buffer(name="a", category="activations", bytes=50),),
                frees=("a",)),
           _fwd(1, "f1", 1.0, allocs=(Buffer(name="b", category="activations", bytes=95),),
                frees=("b",))]
    mem = run(_schedule(ops, baseline=base, hbm_bytes=100)).memory
    assert mem.curve == [(0.0, 10), (0.0, 60), (1.0, 10), (1.0, 105), (2.0, 10)]
    assert (mem.peak_bytes, mem.peak_where, mem.peak_by_category) == (
        105, "f1", {"params": 10, "activations": 95})
    assert mem.oom is not None and (mem.oom.where, mem.oom.time_s) == ("f1", 1.0)


def _call(index: int, name: str, latency_s: float, *, kind: str = "all_gather",
          **kw: object) -> Op:
    """A collective call of the shard group that costs its latency only (no bytes)."""
    return Op(index=index, name=name, kind=kind, stream=kind, latency_s=latency_s,
              group="shard", async_op=True, **kw)


def test_gloo_threads_run_a_burst_of_calls_two_at_a_time() -> None:
    # Four 1 s calls queued at once on one stream. One thread (a GPU's stream): 0-1, 1-2,
    # 2-3, 3-4. Two (gloo's): two at a time, 0-1 and 1-2. A 3 s call first holds one
    # thread 0-3 while the other takes the next calls in issue order: b 0-1, c 1-2, d 2-3.
    burst = [_call(i, n, 1.0) for i, n in enumerate("abcd")]
    assert [t[:2] for t in _timeline(_schedule(burst))] == [
        (0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0)]
    gloo = replace(_schedule(burst), collective_threads=2)
    assert sorted(_timeline(gloo), key=lambda t: t[3]) == [
        (0.0, 1.0, "all_gather", "a"), (0.0, 1.0, "all_gather", "b"),
        (1.0, 2.0, "all_gather", "c"), (1.0, 2.0, "all_gather", "d")]
    long_first = [_call(0, "a", 3.0), *burst[1:]]
    assert sorted(_timeline(replace(_schedule(long_first), collective_threads=2)),
                  key=lambda t: t[3]) == [
        (0.0, 3.0, "all_gather", "a"), (0.0, 1.0, "all_gather", "b"),
        (1.0, 2.0, "all_gather", "c"), (2.0, 3.0, "all_gather", "d")]


def test_gloo_threads_are_shared_by_the_group_s_streams() -> None:
    # Two all-gathers and two reduce-scatters of one group, all issued at 0, 1 s each,
    # on two threads: the group runs two at a time whatever their streams, the earliest
    # issued first (ag0, ag1 at 0-1; rs2, rs3 at 1-2); two groups have two threads each.
    ops = [_call(0, "ag0", 1.0), _call(1, "ag1", 1.0),
           _call(2, "rs2", 1.0, kind="reduce_scatter"),
           _call(3, "rs3", 1.0, kind="reduce_scatter")]
    one_group = replace(_schedule(ops), collective_threads=2)
    assert sorted(_timeline(one_group), key=lambda t: t[3]) == [
        (0.0, 1.0, "all_gather", "ag0"), (0.0, 1.0, "all_gather", "ag1"),
        (1.0, 2.0, "reduce_scatter", "rs2"), (1.0, 2.0, "reduce_scatter", "rs3")]
    two_groups = [*ops[:2], *(op._replace(group="replicate") for op in ops[2:])]
    assert max(t[1] for t in _timeline(replace(_schedule(two_groups),
                                               collective_threads=2))) == 1.0
