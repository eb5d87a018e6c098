"""PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, default settings),
replayed on the sizes and streams of a rank's allocations, for `max_memory_reserved`
(read at pytorch/pytorch 001074d25084fdb87a799823e395a50f5ec044d3; torch 2.11's
allocator behaves the same on the traces below).

Owns the block and segment bookkeeping of `DeviceCachingAllocator`: what cudaMalloc'd
segments the allocator would hold after a sequence of `malloc(size, stream)` and `free`
calls. The rules, as that file states them (function names of the C++ source):

- `round_size`: a request is rounded up to a multiple of kMinBlockSize (512 B), and is
  at least 512 B (roundup_power2_divisions is off by default).
- `get_pool`: rounded sizes up to kSmallSize (1 MiB) go to the small pool, larger ones to
  the large pool; each pool keeps its free blocks ordered by (stream, size, address)
  (`BlockComparatorSize`), so a block freed on one stream is never handed to another
  stream's request.
- `get_free_block`: best fit, the smallest free block of the request's stream and pool
  that holds the rounded size, the lowest address among equals (`lower_bound`).
- `get_allocation_size`: with no such block, a new segment is cudaMalloc'd
  (`alloc_block`): kSmallBuffer (2 MiB) for a small request, kLargeBuffer (20 MiB) for a
  large one under kMinLargeAlloc (10 MiB), else the size rounded up to kRoundLarge
  (2 MiB).
- `should_split`: the block found is split when what remains is at least kMinBlockSize
  (small pool) or more than kSmallSize (large pool); the remainder stays cached, and an
  unsplit block is handed out whole.
- `free_block` / `try_merge_blocks`: a freed block merges with its free neighbours in its
  segment and goes back to its pool.
- `malloc`'s retry: when a new segment would take the reserved bytes past the device's
  capacity (cudaMalloc fails), `release_cached_blocks` returns every cached segment with
  no block in use to the device, and the segment is allocated again (`alloc_block`);
  a replay still past the capacity then is a step the allocator cannot place (the real
  one raises out of memory: fragmentation), its bytes reported as they come.
  `release_available_cached_blocks` never frees anything with max_split_size unlimited.
  No `empty_cache`; expandable_segments off, max_split_size unlimited (the oversize rules
  of `get_free_block` never apply). So the reserved bytes only grow until the capacity is
  reached, and `max_memory_reserved` is their peak.

Blocks live in a virtual address space: each segment gets a fresh range with a gap after
it, so two blocks are neighbours exactly when one ends where the other starts. Each pool's
free blocks are a sorted list of (size, address) keys, searched with bisect. Fed the alloc and
free events of torch.cuda.memory._record_memory_history from real FSDP2 steps on an H200
(torch 2.11), it reproduces their reserved bytes exactly (tests/engine/test_allocator.py
has the rules by hand).

`steady_reserved` replays a training step until the allocator's segments stop growing:
what `max_memory_reserved` reads in a steady-state step, whose allocations the first
steps have already cached. `replay_reserved` runs it, or its compiled twin
(zsim.engine.compiled_allocator) in a process that loaded that (`use_compiled_replay`):
the same bytes, some five times sooner, for a sweep. Imports only the standard library.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

K_MIN_BLOCK_SIZE = 512
"""kMinBlockSize: every request is rounded up to a multiple of this, bytes."""
K_SMALL_SIZE = 1 << 20
"""kSmallSize: the largest request of the small pool, bytes."""
K_SMALL_BUFFER = 2 << 20
"""kSmallBuffer: the segment size of the small pool, bytes."""
K_MIN_LARGE_ALLOC = 10 << 20
"""kMinLargeAlloc: large requests below this share kLargeBuffer segments, bytes."""
K_LARGE_BUFFER = 20 << 20
"""kLargeBuffer: the segment size for large requests below kMinLargeAlloc, bytes."""
K_ROUND_LARGE = 2 << 20
"""kRoundLarge: larger requests get a segment of their size rounded up to this, bytes."""


def round_size(nbytes: int) -> int:
    """The block size a request of `nbytes` is served with (`round_size`)."""
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """The segment cudaMalloc'd for a rounded request of `size` bytes that no cached block
    holds (`get_allocation_size`)."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


ADDRESS_BITS = 64
"""A pool orders its free blocks by the key size << ADDRESS_BITS | address: the order of
(size, address) pairs (`BlockComparatorSize` within one stream) as plain ints, which
bisect compares in C; addresses stay below 2**ADDRESS_BITS."""


class CachingAllocator:
    """The segments and blocks of one device's caching allocator.

    `malloc` returns a handle (the block's address) that `free` takes back. A stream is
    any hashable; requests on different streams never share a cached block.
    """

    __slots__ = ("_free", "_free_by_end", "_live", "_next_address", "_pools", "_segments",
                 "allocated_bytes", "capacity_bytes", "peak_reserved_bytes", "reserved_bytes",
                 "segments")

    def __init__(self, capacity_bytes: float = float("inf")) -> None:
        self._pools: dict[Hashable, tuple[list[int], list[int]]] = {}
        """stream -> its (small, large) pools, each its free blocks' keys (size <<
        ADDRESS_BITS | address), sorted."""
        self._free: dict[int, int] = {}
        """Free block address -> its size (a block merges only with blocks of its own
        segment, so of its own pool)."""
        self._free_by_end: dict[int, int] = {}
        """Free block end address -> its start, to merge with a block freed after it."""
        self._live: dict[int, tuple[int, list[int]]] = {}
        """Allocated block address -> (size, the pool it returns to)."""
        self._segments: dict[int, int] = {}
        """Segment start address -> its size, for the segments held."""
        self._next_address = 0
        self.capacity_bytes = capacity_bytes
        """What cudaMalloc can hand out in all (the device's usable memory)."""
        self.reserved_bytes = 0
        """Bytes in cudaMalloc'd segments held (`reserved_bytes` of the allocator's
        stats)."""
        self.peak_reserved_bytes = 0
        """The most `reserved_bytes` held since the last `reset_peak`
        (`max_memory_reserved`)."""
        self.allocated_bytes = 0
        """Bytes in allocated blocks (rounded sizes, `allocated_bytes`)."""
        self.segments = 0
        """Segments cudaMalloc'd."""

    def reset_peak(self) -> None:
        """Start `peak_reserved_bytes` over from what is held now
        (torch.cuda.reset_peak_memory_stats)."""
        self.peak_reserved_bytes = self.reserved_bytes

    def release_cached_blocks(self) -> None:
        """Return every segment with no block in use to the device
        (`release_cached_blocks`: a free block that spans its whole segment)."""
        free, free_by_end, segments = self._free, self._free_by_end, self._segments
        mask = (1 << ADDRESS_BITS) - 1
        for pools in self._pools.values():
            for pool in pools:
                kept = []
                for key in pool:
                    address, size = key & mask, key >> ADDRESS_BITS
                    if segments.get(address) == size:
                        del free[address], free_by_end[address + size], segments[address]
                        self.reserved_bytes -= size
                    else:
                        kept.append(key)
                pool[:] = kept

    def malloc(self, nbytes: int, stream: Hashable) -> int:
        """Serve a request of `nbytes` on `stream`; returns the block's handle."""
        return self.allocate(nbytes, (), stream)[0]

    def free(self, handle: int) -> None:
        """Return an allocated block to its pool, merged with its free neighbours."""
        address = handle
        size, pool = self._live.pop(address)
        self.allocated_bytes -= size
        free, free_by_end = self._free, self._free_by_end
        before = free_by_end.pop(address, None)
        if before is not None:  # merge with the free block ending here
            before_size = free.pop(before)
            del pool[bisect_left(pool, before_size << ADDRESS_BITS | before)]
            address, size = before, size + before_size
        end = address + size
        after_size = free.pop(end, None)
        if after_size is not None:  # merge with the free block starting at its end
            del pool[bisect_left(pool, after_size << ADDRESS_BITS | end)]
            del free_by_end[end + after_size]
            size += after_size
        insort(pool, size << ADDRESS_BITS | address)
        free[address] = size
        free_by_end[address + size] = address

    def allocate(self, nbytes: int, pieces: tuple[int, ...], stream: Hashable) -> list[int]:
        """Run one buffer's pieces (zsim.schedule.ops.Buffer.pieces: n >= 0 allocates,
        ~i frees entry i's tensor; none: one tensor of `nbytes`) on `stream`; returns the
        handles of the tensors left allocated."""
        # The request path (round_size, get_pool, get_free_block or alloc_block,
        # should_split) inline, with the stream's pools looked up once per buffer: the
        # replay serves some 10^4 requests a plan (zsim sweep's hottest loop).
        pools = self._pools.get(stream)
        if pools is None:
            pools = self._pools[stream] = ([], [])
        small_pool, large_pool = pools
        free_blocks, free_by_end, live = self._free, self._free_by_end, self._live
        release = self.free
        mask = (1 << ADDRESS_BITS) - 1
        handles: list[int] = []  # -1: freed by the script (addresses are >= 0)
        allocated = 0
        for n in pieces or (nbytes,):
            if n < 0:
                release(handles[~n])
                handles[~n] = -1
                handles.append(-1)
                continue
            size = (K_MIN_BLOCK_SIZE if n < K_MIN_BLOCK_SIZE
                    else -(-n // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)
            small = size <= K_SMALL_SIZE
            pool = small_pool if small else large_pool
            i = bisect_left(pool, size << ADDRESS_BITS)
            if i < len(pool):
                key = pool.pop(i)
                block_size, address = key >> ADDRESS_BITS, key & mask
                del free_blocks[address]
                del free_by_end[address + block_size]
            else:
                block_size = allocation_size(size)
                if self.reserved_bytes + block_size > self.capacity_bytes:
                    self.release_cached_blocks()  # cudaMalloc failed: retry after
                address = self._next_address
                self._next_address += block_size + K_MIN_BLOCK_SIZE  # a gap: no neighbour
                assert self._next_address <= mask, "address space of the model exhausted"
                self._segments[address] = block_size
                self.reserved_bytes += block_size
                self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
                self.segments += 1
            remaining = block_size - size
            if remaining >= K_MIN_BLOCK_SIZE if small else remaining > K_SMALL_SIZE:
                rest = address + size
                insort(pool, remaining << ADDRESS_BITS | rest)
                free_blocks[rest] = remaining
                free_by_end[rest + remaining] = rest
                block_size = size
            live[address] = (block_size, pool)
            allocated += block_size
            handles.append(address)
        self.allocated_bytes += allocated
        return [h for h in handles if h >= 0]

    def release(self, handles: list[int]) -> None:
        """Free the tensors `allocate` left allocated."""
        for h in handles:
            self.free(h)


class Request(NamedTuple):
    """One buffer's allocation as the allocator replays it (a NamedTuple: the ledger makes
    one per allocation of every plan)."""

    key: str
    """The buffer's name, which its free refers to."""
    nbytes: int
    pieces: tuple[int, ...]
    stream: Hashable


def steady_reserved(state: Sequence[Request], step: Sequence[Request | str], *,
                    created_in_first_step: dict[int, Sequence[Request]],
                    max_steps: int = 4, capacity_bytes: float = float("inf")) -> int:
    """`max_memory_reserved` of a steady-state step: `state` allocated first (what exists
    before the first step), then the step's events (a Request allocates, a str frees
    the buffer of that key) replayed until a whole step cudaMallocs no new segment, at
    most `max_steps` times; the peak reserved bytes of the last step replayed, on a
    device that hands out `capacity_bytes`. `created_in_first_step` maps an event index
    to buffers the first step creates right before that event and keeps (torch.optim
    creates its states in its first step()); later steps find them allocated, and
    whatever else a step leaves allocated."""
    alloc = CachingAllocator(capacity_bytes)
    kept: dict[str, list[int]] = {}
    for r in state:
        kept[r.key] = alloc.allocate(r.nbytes, r.pieces, r.stream)
    for n in range(max_steps):
        segments = alloc.segments
        alloc.reset_peak()
        live: dict[str, list[int]] = {}
        for i, e in enumerate(step):
            if n == 0 and i in created_in_first_step:
                for r in created_in_first_step[i]:
                    kept[r.key] = alloc.allocate(r.nbytes, r.pieces, r.stream)
            if isinstance(e, str):
                alloc.release(live.pop(e) if e in live else kept.pop(e))
            else:
                live[e.key] = alloc.allocate(e.nbytes, e.pieces, e.stream)
        kept.update(live)  # what the step leaves allocated, the next step finds so
        if n > 0 and alloc.segments == segments:
            break
    return alloc.peak_reserved_bytes


_compiled: Callable[..., int | None] | None = None
"""zsim.engine.compiled_allocator.steady_reserved once use_compiled_replay loaded it."""


def use_compiled_replay() -> None:
    """Make `replay_reserved` run the compiled replay (zsim.engine.compiled_allocator) in
    this process from now on: the same reserved bytes, some five times sooner, after
    about 0.8 s to load it (the first load on a machine compiles and caches it, some
    7 s). For a process that replays many plans (zsim sweep and zsim report, whose forked
    workers inherit it loaded); one plan is sooner in Python."""
    global _compiled
    if _compiled is None:
        from zsim.engine.compiled_allocator import steady_reserved as compiled
        compiled([], [], created_in_first_step={})  # compiled or loaded now, not per worker
        _compiled = compiled


def replay_reserved(state: Sequence[Request], step: Sequence[Request | str], *,
                    created_in_first_step: dict[int, Sequence[Request]],
                    capacity_bytes: float = float("inf")) -> int:
    """`steady_reserved`, by the compiled replay where this process loaded it
    (`use_compiled_replay`) and its addresses fit, else in Python."""
    if _compiled is not None:
        reserved = _compiled(state, step, created_in_first_step=created_in_first_step,
                             capacity_bytes=capacity_bytes)
        if reserved is not None:
            return reserved
    return steady_reserved(state, step, created_in_first_step=created_in_first_step,
                           capacity_bytes=capacity_bytes)
