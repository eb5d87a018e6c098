"""zsim.engine.allocator's steady-state replay compiled with numba: the same caching
allocator, rule for rule, on arrays, for a sweep's tens of thousands of replays.

`steady_reserved` here takes and returns what zsim.engine.allocator.steady_reserved does
and gives the same reserved bytes (tests/engine/test_compiled_allocator.py checks them
against each other); it is some five times faster. Loading it costs about 0.8 s (numba's
import and its cached machine code; the first load on a machine compiles, some 7 s, and
caches), which a sweep repays in its first hundred plans and one plan never does:
zsim.engine.allocator.use_compiled_replay loads it for the processes that replay many.

The blocks are array rows linked to their segment neighbours (`prev`, `next`), as the
C++ allocator links them, so a freed block merges without a lookup by address. Each pool
(a stream's small or large requests) keeps its free blocks' keys sorted, (size << 32 |
address) in units of kMinBlockSize (every size and address is a multiple of it): the
order (size, address) of zsim.engine.allocator's pools. A replay whose addresses outgrow
those 32 bits (2 TiB of segments) is left to the Python replay.

numba caches the machine code beside the source by default: inside the installed package,
where zsim writes nothing. Unless NUMBA_CACHE_DIR names a place, the cache goes where the
user's caches go, $XDG_CACHE_HOME/zsim/numba (else ~/.cache/zsim/numba); the variable is
set for this process and its children (Ray's workers find the same cache). Imports numba.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from pathlib import Path

import numpy as np
from numba import njit
from numba.core.config import reload_config

from zsim.engine.allocator import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_SIZE,
    Request,
    allocation_size,
    round_size,
)

os.environ.setdefault("NUMBA_CACHE_DIR", str(
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zsim" / "numba"))
reload_config()  # numba reads the variable now, before the functions below ask where to cache

_NO_LIMIT = 1 << 62
"""The capacity of a device without one (an int64 for the compiled code)."""

_UNITS_LIMIT = 1 << 31
"""A key's size and address, in units of kMinBlockSize, stay below this."""

# The size rules of zsim.engine.allocator, compiled as they are written there.
_round_size = njit(cache=True)(round_size)
_allocation_size = njit(cache=True)(allocation_size)


@njit(cache=True, inline="always")
def _key(size: int, addr: int) -> int:
    """A free block's place in its pool: (size, address) as one int."""
    return (size // K_MIN_BLOCK_SIZE) << 32 | (addr // K_MIN_BLOCK_SIZE)


@njit(cache=True, inline="always")
def _lower_bound(keys: np.ndarray, n: int, key: int) -> int:
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, inline="always")
def _pool_insert(pkeys: np.ndarray, pids: np.ndarray, plen: np.ndarray, pool: int,
                 key: int, block: int) -> None:
    n = plen[pool]
    keys = pkeys[pool]
    ids = pids[pool]
    pos = _lower_bound(keys, n, key)
    for t in range(n, pos, -1):
        keys[t] = keys[t - 1]
        ids[t] = ids[t - 1]
    keys[pos] = key
    ids[pos] = block
    plen[pool] = n + 1


@njit(cache=True, inline="always")
def _pool_remove_at(pkeys: np.ndarray, pids: np.ndarray, plen: np.ndarray, pool: int,
                    pos: int) -> None:
    n = plen[pool] - 1
    keys = pkeys[pool]
    ids = pids[pool]
    for t in range(pos, n):
        keys[t] = keys[t + 1]
        ids[t] = ids[t + 1]
    plen[pool] = n


@njit(cache=True, inline="always")
def _pool_remove(pkeys: np.ndarray, pids: np.ndarray, plen: np.ndarray, pool: int,
                 key: int) -> None:
    _pool_remove_at(pkeys, pids, plen, pool, _lower_bound(pkeys[pool], plen[pool], key))


@njit(cache=True, inline="always")
def _take_row(spare: np.ndarray, nspare: int, nrows: int) -> tuple[int, int, int]:
    """A block row: the last one merged away, else a new one; (row, nspare, nrows)."""
    if nspare > 0:
        return spare[nspare - 1], nspare - 1, nrows
    return nrows, nspare, nrows + 1


@njit(cache=True)
def _free(block: int, addr: np.ndarray, size: np.ndarray, pool_of: np.ndarray,
          prev: np.ndarray, nxt: np.ndarray, is_free: np.ndarray, spare: np.ndarray,
          nspare: int, pkeys: np.ndarray, pids: np.ndarray, plen: np.ndarray) -> int:
    """Return `block` to its pool merged with its free neighbours (free_block,
    try_merge_blocks); the rows merged away go to `spare`. Returns the spare count."""
    pool = pool_of[block]
    # The two merges mirror each other, written out: one helper for both (with the
    # neighbour's side as a branch) made the bench's sweep 8-10% slower.
    p = prev[block]
    if p != -1 and is_free[p]:
        _pool_remove(pkeys, pids, plen, pool, _key(size[p], addr[p]))
        addr[block] = addr[p]
        size[block] += size[p]
        pp = prev[p]
        prev[block] = pp
        if pp != -1:
            nxt[pp] = block
        spare[nspare] = p
        nspare += 1
    n = nxt[block]
    if n != -1 and is_free[n]:
        _pool_remove(pkeys, pids, plen, pool, _key(size[n], addr[n]))
        size[block] += size[n]
        nn = nxt[n]
        nxt[block] = nn
        if nn != -1:
            prev[nn] = block
        spare[nspare] = n
        nspare += 1
    is_free[block] = True
    _pool_insert(pkeys, pids, plen, pool, _key(size[block], addr[block]), block)
    return nspare


@njit(cache=True)
def _release_cached_blocks(size: np.ndarray, prev: np.ndarray, nxt: np.ndarray,
                           spare: np.ndarray, nspare: int, pkeys: np.ndarray,
                           pids: np.ndarray, plen: np.ndarray) -> tuple[int, int]:
    """Drop from every pool the free blocks that span their whole segment (no
    neighbours), their rows to `spare` (zsim.engine.allocator's
    release_cached_blocks). Returns (bytes released, the spare count)."""
    released = 0
    for pool in range(plen.size):
        kept = 0
        for t in range(plen[pool]):
            block = pids[pool, t]
            if prev[block] == -1 and nxt[block] == -1:
                released += size[block]
                spare[nspare] = block
                nspare += 1
            else:
                pkeys[pool, kept] = pkeys[pool, t]
                pids[pool, kept] = block
                kept += 1
        plen[pool] = kept
    return released, nspare


@njit(cache=True)
def _replay(pieces: np.ndarray, req_start: np.ndarray, req_stream: np.ndarray,
            req_key: np.ndarray, nkeys: int, state: np.ndarray, events: np.ndarray,
            created_at: np.ndarray, created_ptr: np.ndarray, created: np.ndarray,
            nstreams: int, max_steps: int, capacity: int) -> int:
    """zsim.engine.allocator.steady_reserved on arrays. Request r's pieces are
    pieces[req_start[r]:req_start[r + 1]] (bytes; ~i frees its i-th tensor), on stream
    req_stream[r], for buffer key req_key[r]. `state`: the requests allocated first;
    `events`: the step (r >= 0 allocates request r, ~k frees key k's buffer); the
    requests created[created_ptr[j]:created_ptr[j + 1]] are made right before event
    created_at[j] of the first step; `capacity`: the bytes cudaMalloc hands out. Returns
    the last step's peak reserved bytes, or -1 when the addresses outgrow the keys."""
    nreq = req_key.size
    # The tensors each request leaves allocated (offsets into live_handles), and the most
    # any request of a key leaves (offsets into kept_handles).
    req_off = np.zeros(nreq + 1, np.int64)
    key_off = np.zeros(nkeys + 1, np.int64)
    allocs = 0  # pieces that allocate, over every request
    allocs_step = 0  # and over the step's
    longest = 1
    for r in range(nreq):
        frees = 0
        for j in range(req_start[r], req_start[r + 1]):
            frees += pieces[j] < 0
        count = req_start[r + 1] - req_start[r]
        longest = max(longest, count)
        allocs += count - frees
        left = count - 2 * frees
        req_off[r + 1] = req_off[r] + left
        key_off[req_key[r] + 1] = max(key_off[req_key[r] + 1], left)
    for k in range(nkeys):
        key_off[k + 1] += key_off[k]
    for e in events:
        if e >= 0:
            for j in range(req_start[e], req_start[e + 1]):
                allocs_step += pieces[j] >= 0
    # Every allocation adds at most two rows (a segment and a split-off remainder).
    rows = 2 * (allocs + (max_steps - 1) * allocs_step) + 2
    addr = np.empty(rows, np.int64)
    size = np.empty(rows, np.int64)
    pool_of = np.empty(rows, np.int64)
    prev = np.empty(rows, np.int64)
    nxt = np.empty(rows, np.int64)
    is_free = np.zeros(rows, np.bool_)
    spare = np.empty(rows, np.int64)
    nspare = 0
    nrows = 0
    pkeys = np.empty((2 * nstreams, rows), np.int64)
    pids = np.empty((2 * nstreams, rows), np.int64)
    plen = np.zeros(2 * nstreams, np.int64)
    next_addr = 0
    reserved = 0
    peak = 0
    segments = 0
    live_handles = np.empty(max(1, req_off[nreq]), np.int64)
    kept_handles = np.empty(max(1, key_off[nkeys]), np.int64)
    kept_req = np.full(nkeys, -1, np.int64)
    live_req = np.full(nkeys, -1, np.int64)
    handles = np.empty(longest, np.int64)
    for phase in range(max_steps + 1):  # 0: the state; n + 1: step n
        segments_before = segments
        peak = reserved
        ci = 0
        for i in range(state.size if phase == 0 else events.size):
            lo = hi = 0
            if phase == 1 and ci < created_at.size and created_at[ci] == i:
                lo, hi = created_ptr[ci], created_ptr[ci + 1]
                ci += 1
            for w in range(lo, hi + 1):
                to_kept = True
                if w < hi:
                    r = created[w]
                elif phase == 0:
                    r = state[i]
                else:
                    e = events[i]
                    if e < 0:  # free key ~e's buffer: this step's, else the one kept
                        k = ~e
                        r = live_req[k]
                        if r >= 0:
                            live_req[k] = -1
                            src, base = live_handles, req_off[r]
                        else:
                            r = kept_req[k]
                            kept_req[k] = -1
                            src, base = kept_handles, key_off[k]
                        for j in range(req_off[r + 1] - req_off[r]):
                            nspare = _free(src[base + j], addr, size, pool_of, prev, nxt,
                                           is_free, spare, nspare, pkeys, pids, plen)
                        continue
                    r = e
                    to_kept = False
                # Request r: round_size, get_pool, get_free_block or alloc_block,
                # should_split, for each piece; ~i pieces free the i-th.
                stream = req_stream[r]
                nh = 0
                for j in range(req_start[r], req_start[r + 1]):
                    n = pieces[j]
                    if n < 0:
                        block = handles[~n]
                        handles[~n] = -1
                        handles[nh] = -1
                        nh += 1
                        nspare = _free(block, addr, size, pool_of, prev, nxt, is_free,
                                       spare, nspare, pkeys, pids, plen)
                        continue
                    want = _round_size(n)
                    small = want <= K_SMALL_SIZE
                    pool = 2 * stream + (0 if small else 1)
                    pos = _lower_bound(pkeys[pool], plen[pool], _key(want, 0))
                    if pos < plen[pool]:
                        block = pids[pool, pos]
                        _pool_remove_at(pkeys, pids, plen, pool, pos)
                        is_free[block] = False
                    else:
                        segment = _allocation_size(want)
                        if reserved + segment > capacity:  # cudaMalloc failed: retry after
                            released, nspare = _release_cached_blocks(
                                size, prev, nxt, spare, nspare, pkeys, pids, plen)
                            reserved -= released
                        block, nspare, nrows = _take_row(spare, nspare, nrows)
                        addr[block] = next_addr
                        size[block] = segment
                        pool_of[block] = pool
                        prev[block] = -1
                        nxt[block] = -1
                        is_free[block] = False
                        next_addr += segment + K_MIN_BLOCK_SIZE  # a gap: no neighbour
                        if (next_addr // K_MIN_BLOCK_SIZE >= _UNITS_LIMIT
                                or segment // K_MIN_BLOCK_SIZE >= _UNITS_LIMIT):
                            return -1
                        reserved += segment
                        peak = max(peak, reserved)
                        segments += 1
                    remaining = size[block] - want
                    if (remaining >= K_MIN_BLOCK_SIZE) if small else (remaining > K_SMALL_SIZE):
                        rest, nspare, nrows = _take_row(spare, nspare, nrows)
                        addr[rest] = addr[block] + want
                        size[rest] = remaining
                        pool_of[rest] = pool
                        prev[rest] = block
                        after = nxt[block]
                        nxt[rest] = after
                        if after != -1:
                            prev[after] = rest
                        nxt[block] = rest
                        size[block] = want
                        is_free[rest] = True
                        _pool_insert(pkeys, pids, plen, pool, _key(remaining, addr[rest]), rest)
                    handles[nh] = block
                    nh += 1
                k = req_key[r]
                if to_kept:
                    kept_req[k] = r
                    dst, base = kept_handles, key_off[k]
                else:
                    live_req[k] = r
                    dst, base = live_handles, req_off[r]
                for j in range(nh):
                    if handles[j] >= 0:
                        dst[base] = handles[j]
                        base += 1
        if phase > 0:  # what the step leaves allocated, the next step finds so
            for k in range(nkeys):
                r = live_req[k]
                if r >= 0:
                    for j in range(req_off[r + 1] - req_off[r]):
                        kept_handles[key_off[k] + j] = live_handles[req_off[r] + j]
                    kept_req[k] = r
                    live_req[k] = -1
            if phase > 1 and segments == segments_before:
                break
    return peak


def steady_reserved(state: Sequence[Request], step: Sequence[Request | str], *,
                    created_in_first_step: dict[int, Sequence[Request]],
                    max_steps: int = 4, capacity_bytes: float = float("inf")) -> int | None:
    """zsim.engine.allocator.steady_reserved's reserved bytes, compiled; None when the
    addresses outgrow the compiled keys (replay in Python)."""
    streams: dict[Hashable, int] = {}
    keys: dict[str, int] = {}
    pieces: list[int] = []
    req_start: list[int] = []
    req_stream: list[int] = []
    req_key: list[int] = []

    def add(r: Request) -> int:
        req_start.append(len(pieces))
        pieces.extend(r.pieces or (r.nbytes,))
        req_stream.append(streams.setdefault(r.stream, len(streams)))
        req_key.append(keys.setdefault(r.key, len(keys)))
        return len(req_key) - 1

    state_ids = [add(r) for r in state]
    at = sorted(created_in_first_step)
    created: list[int] = []
    created_ptr = [0]
    for i in at:
        created.extend(add(r) for r in created_in_first_step[i])
        created_ptr.append(len(created))
    events = [~keys[e] if isinstance(e, str) else add(e) for e in step]
    req_start.append(len(pieces))

    def ints(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    reserved = _replay(ints(pieces), ints(req_start), ints(req_stream), ints(req_key),
                       len(keys), ints(state_ids), ints(events), ints(at),
                       ints(created_ptr), ints(created), max(1, len(streams)), max_steps,
                       int(min(capacity_bytes, _NO_LIMIT)))
    return None if reserved < 0 else int(reserved)
