"""The model of PyTorch's CUDA caching allocator (zsim.engine.allocator) rule by rule, each
expected figure worked out by hand from c10/cuda/CUDACachingAllocator.cpp (round_size,
get_allocation_size, get_pool, get_free_block, should_split, free_block), and the
reserved bytes it gives the 16 published FSDP2 steps on an H200
(tests/data/cases/h200-fsdp2-runs.yaml, measured peak_reserved_gib).

Fed the alloc/free events torch.cuda.memory._record_memory_history recorded in those 16
programs (rerun on an H200, torch 2.11), the model gives their reserved bytes exactly;
the traces are not kept here. What zsim predicts differs from the measured figures by what
its schedule does not say about the program (see test_published_runs_target)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from zsim.engine.allocator import (
    CachingAllocator,
    Request,
    allocation_size,
    round_size,
    steady_reserved,
)
from zsim.engine.resources import MemoryPool
from zsim.simulate import simulate
from zsim.spec.registry import resolve_hardware
from zsim.validation.published_runs import PublishedRun, as_measured, load_runs

KiB, MiB = 1 << 10, 1 << 20


# ------------------------------------------------------------------ size rules
def test_round_size() -> None:
    # round_size: below kMinBlockSize (512) -> 512, else the next multiple of 512.
    assert round_size(0) == 512
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(MiB + 1) == MiB + 512


def test_allocation_size() -> None:
    # get_allocation_size: <= kSmallSize (1 MiB) -> kSmallBuffer (2 MiB); < kMinLargeAlloc
    # (10 MiB) -> kLargeBuffer (20 MiB); else rounded up to kRoundLarge (2 MiB).
    assert allocation_size(512) == 2 * MiB
    assert allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == 20 * MiB
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(11 * MiB) == 12 * MiB


# ------------------------------------------------------------------ pools and splitting
def test_small_requests_share_a_2_mib_segment() -> None:
    # 600 KiB rounds to 614,400 B (a multiple of 512): small pool, a 2 MiB segment; the
    # remainder 2,097,152 - 614,400 = 1,482,752 >= 512 is split off (small pool rule) and
    # serves the second request.
    a = CachingAllocator()
    a.malloc(600 * KiB, "s")
    a.malloc(600 * KiB, "s")
    assert (a.reserved_bytes, a.segments, a.allocated_bytes) == (2 * MiB, 1, 1_228_800)


def test_a_mid_size_request_takes_a_20_mib_segment_shared_by_the_next() -> None:
    # 2 MiB (> 1 MiB, < 10 MiB) -> a kLargeBuffer segment of 20 MiB, 18 MiB left (> 1 MiB:
    # split); 8 MiB fits the 18 MiB block, 10 MiB left (split again).
    a = CachingAllocator()
    a.malloc(2 * MiB, "s")
    a.malloc(8 * MiB, "s")
    assert (a.reserved_bytes, a.segments, a.allocated_bytes) == (20 * MiB, 1, 10 * MiB)


def test_large_remainder_of_1_mib_or_less_is_not_split() -> None:
    # 12 MiB -> a 12 MiB segment. Freed, it serves 5 MiB (7 MiB left > 1 MiB: split) with
    # no new segment. Both freed merge back to 12 MiB, which serves 11.5 MiB whole: the
    # 0.5 MiB left is not > kSmallSize, so the block is handed out unsplit (12 MiB).
    a = CachingAllocator()
    a.free(a.malloc(12 * MiB, "s"))
    a.free(a.malloc(5 * MiB, "s"))
    a.malloc(11 * MiB + 512 * KiB, "s")
    assert (a.reserved_bytes, a.segments, a.allocated_bytes) == (12 * MiB, 1, 12 * MiB)


def test_small_and_large_pools_are_separate() -> None:
    # A free 12 MiB large block does not serve a 100 KiB request: small pool, 2 MiB segment.
    a = CachingAllocator()
    a.free(a.malloc(12 * MiB, "s"))
    a.malloc(100 * KiB, "s")
    assert (a.reserved_bytes, a.segments) == (14 * MiB, 2)


def test_blocks_are_not_shared_across_streams() -> None:
    # 4 MiB on stream a: a 20 MiB segment; freed, it is cached for stream a only: 4 MiB on
    # stream b cudaMallocs another 20 MiB; stream a's next 4 MiB reuses its own.
    a = CachingAllocator()
    a.free(a.malloc(4 * MiB, "a"))
    a.malloc(4 * MiB, "b")
    a.malloc(4 * MiB, "a")
    assert (a.reserved_bytes, a.segments) == (40 * MiB, 2)


def test_best_fit_takes_the_smallest_block_that_holds_the_request() -> None:
    # Free blocks of 12 and 24 MiB (two segments): 11 MiB takes the 12 MiB one (1 MiB left,
    # not split), so the 24 MiB block stays whole and serves 23 MiB with no new segment.
    a = CachingAllocator()
    first, second = a.malloc(12 * MiB, "s"), a.malloc(24 * MiB, "s")
    a.free(first)
    a.free(second)
    a.malloc(11 * MiB, "s")
    a.malloc(23 * MiB, "s")
    assert (a.reserved_bytes, a.segments) == (36 * MiB, 2)


def test_freed_neighbours_coalesce() -> None:
    # In one 20 MiB segment: 6 MiB at offset 0 (14 MiB left, split), 6 MiB at 6 MiB (8 MiB
    # left, split). Freeing both merges 6 + 6 + 8 back into one 20 MiB block, which then
    # serves 19 MiB (1 MiB left, not split) with no new segment.
    a = CachingAllocator()
    x, y = a.malloc(6 * MiB, "s"), a.malloc(6 * MiB, "s")
    a.free(x)
    a.free(y)
    a.malloc(19 * MiB, "s")
    assert (a.reserved_bytes, a.segments, a.allocated_bytes) == (20 * MiB, 1, 20 * MiB)


def test_pieces_free_their_transients() -> None:
    # Buffer.pieces (4 MiB, 6 MiB, ~0): the 4 MiB transient is freed inside the buffer, the
    # 6 MiB tensor stays; one 20 MiB segment serves both.
    a = CachingAllocator()
    handles = a.allocate(10 * MiB, (4 * MiB, 6 * MiB, ~0), "s")
    assert len(handles) == 1 and a.allocated_bytes == 6 * MiB and a.segments == 1
    a.release(handles)
    assert a.allocated_bytes == 0


def test_past_the_capacity_unused_segments_go_back_and_cudamalloc_is_retried() -> None:
    # 30 MiB of device: a freed 12 MiB segment stays cached; 20 MiB more would pass the
    # capacity, so the cached segment is released first: 20 MiB held, the peak 20 MiB.
    a = CachingAllocator(capacity_bytes=30 * MiB)
    a.free(a.malloc(12 * MiB, "s"))
    a.malloc(20 * MiB, "s")
    assert (a.reserved_bytes, a.peak_reserved_bytes, a.segments) == (20 * MiB, 20 * MiB, 2)
    # Unlimited, both stay: 32 MiB.
    b = CachingAllocator()
    b.free(b.malloc(12 * MiB, "s"))
    b.malloc(20 * MiB, "s")
    assert b.reserved_bytes == 32 * MiB


def test_a_segment_with_a_block_in_use_is_not_released() -> None:
    # 4 MiB takes a 20 MiB kLargeBuffer segment (16 MiB left free in it); 18 MiB then needs
    # a segment of its own, past the 30 MiB capacity, and nothing can be released: 38 MiB,
    # a step the real allocator cannot place (out of memory with 16 MiB cached).
    a = CachingAllocator(capacity_bytes=30 * MiB)
    a.malloc(4 * MiB, "s")
    a.malloc(18 * MiB, "s")
    assert (a.reserved_bytes, a.peak_reserved_bytes) == (38 * MiB, 38 * MiB)


def test_steady_reserved_is_the_last_steps_peak_under_a_capacity() -> None:
    # State: w, 8 MiB in a 20 MiB kLargeBuffer segment (12 MiB left). Step: a (16 MiB, a
    # segment of its own), freed; b (24 MiB): no cached block holds it, a new segment.
    # Unlimited: 20 + 16 + 24 = 60 MiB, and step 2 reuses them. On 50 MiB, b's segment
    # would pass it: a's cached 16 MiB segment goes back first (20 + 24 = 44 MiB); in
    # step 2 a takes part of b's free 24 MiB block and b all of it: no new segment, its
    # peak 44 MiB.
    step: list[Request | str] = [Request("a", 16 * MiB, (), "s"), "a",
                                 Request("b", 24 * MiB, (), "s"), "b"]
    state = [Request("w", 8 * MiB, (), "s")]
    assert steady_reserved(state, step, created_in_first_step={}) == 60 * MiB
    assert steady_reserved(state, step, created_in_first_step={},
                           capacity_bytes=50 * MiB) == 44 * MiB


# ------------------------------------------------------------------ steady state
def _step() -> list[Request | str]:
    """A step: a 30 MiB activation made and freed, then a 4 MiB optimizer temporary."""
    return [Request("act", 30 * MiB, (), "s"), "act", Request("tmp", 4 * MiB, (), "s"), "tmp"]


def test_states_made_by_the_first_step_land_in_its_freed_activations() -> None:
    # Step 1: act -> a 30 MiB segment, freed; the 8 MiB state then splits that free block
    # (22 MiB left) and tmp comes out of the 22 MiB. Step 2: act finds no 30 MiB block
    # (the state sits in the first segment) -> a second 30 MiB segment. Step 3 adds none.
    lazy = steady_reserved([], _step(), created_in_first_step={
        2: [Request("state", 8 * MiB, (), "s")]})
    assert lazy == 60 * MiB
    # Made before the first step, the state takes a 20 MiB kLargeBuffer segment, whose
    # 12 MiB left serves tmp: 20 + 30 MiB.
    eager = steady_reserved([Request("state", 8 * MiB, (), "s")], _step(),
                            created_in_first_step={})
    assert eager == 50 * MiB


def test_memory_pool_creates_optimizer_states_in_the_first_step() -> None:
    pool = MemoryPool(capacity_bytes=1e12)
    pool.alloc("state/optimizer_states", "optimizer_states", 8 * MiB, pool="baseline",
               time_s=0.0, where="model state")
    pool.alloc("act", "activations", 30 * MiB, pool="compute", time_s=1.0, where="fwd")
    pool.free("act", time_s=2.0)
    pool.alloc("tmp", "optimizer_states", 4 * MiB, pool="compute", time_s=3.0, where="opt")
    pool.free("tmp", time_s=4.0)
    assert pool.reserved_bytes == 60 * MiB  # as the lazy case above
    assert pool.reserved_bytes >= pool.peak_bytes


# ------------------------------------------------------------------ published runs
@pytest.fixture(scope="module")
def runs(cases_dir: Path) -> list[PublishedRun]:
    path = cases_dir / "h200-fsdp2-runs.yaml"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    found = load_runs(path)
    assert len(found) == 16  # 17 runs, one out of memory
    return found


@pytest.fixture(scope="module")
def errors(runs: list[PublishedRun]) -> dict[str, float]:
    """Predicted / measured - 1 of peak reserved, by run (hgx-h200, the measured host)."""
    hw = as_measured(resolve_hardware("hgx-h200"))
    out = {}
    for run in runs:
        predicted = simulate(run.spec, hw, run.plan).reserved_memory_bytes
        out[run.name] = predicted / run.measured["reserved_memory_bytes"] - 1.0
    print("\nrun                    reserved error %")
    for name, e in out.items():
        print(f"{name:22s} {100 * e:+7.1f}")
    return out


def test_guard_published_runs(errors: dict[str, float]) -> None:
    """Today's level (mean |err| 3.1%, max 8.2% at 13b_n128_mb2_ac, with the cuBLAS
    workspaces; 3.2% and 8.5% without them; the sum of per-stream
    peaks it replaced: mean 10.6%, max 28.1%; without the per-tensor pieces: mean 4.6%,
    max 21.3%); a regression fails."""
    magnitudes = [abs(e) for e in errors.values()]
    assert statistics.mean(magnitudes) < 0.035 and max(magnitudes) < 0.09


@pytest.mark.xfail(strict=True, reason=(
    "H200 target not reached. Even with pieces: 1p3b runs miss one 1000 MiB logits "
    "segment in the second step (-4% to -5%); the four full-recomputation runs' measured "
    "reserved is 3-8% above a rerun of the same program (7b_n64_ac, 13b_n128_mb*_ac, "
    "which the model matches within 0.4%)"))
def test_published_runs_target(errors: dict[str, float]) -> None:
    assert max(abs(e) for e in errors.values()) <= 0.03
