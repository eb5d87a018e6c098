"""What this machine's file system does for the access pattern of a checkpoint save and
load (zsim.backend.checkpoint_run): torch.distributed.checkpoint's FileSystemWriter
writes one file per rank and thread, sequentially, then fsyncs and closes it; the
coordinator writes one small metadata file, fsync'd; a load reads the files back.

`measure_storage` writes `files` files of `file_bytes` each (split over `threads` writer
threads as FileSystemWriter's thread_count splits a rank's items), each written in 16 MiB
chunks and fsync'd before close; then reads them back whole; then creates, writes one
byte to, fsyncs and closes `small_files` tiny files, for the per-file cost. Each figure is
the median of `repeats` rounds; every round writes fresh files and removes them after.

Reads right after writes come from the page cache (the fsync'd pages stay cached), as a
DCP load right after a save does here: read_bytes_per_s is a memory-copy figure, not the
disk's. cold_read_bytes_per_s reads after posix_fadvise(POSIX_FADV_DONTNEED) on the
fsync'd (clean) pages, which asks the kernel to drop them; some file systems (tmpfs,
overlay upper layers on tmpfs) keep them anyway, so it is a best-effort figure, and
equals a cached read where the advice is ignored.

`measure_streams` times what one checkpoint writer or reader thread does with a
checkpoint's items, the serialization included: items torch.save'd one after another
into one file, then fsync (FileSystemWriter's _write_item: each a zip archive whose
records are CRC-32'd as they are copied), torch.save of one tensor to a path without fsync
(DeepSpeed's checkpoint engine), torch.load of each item from its slice of the file and a
copy into an existing tensor (FileSystemReader's read_data, into the model's state), a
copy into freshly mapped memory (async_save's default stager's new tensors), and a copy
into memory already touched (what the load's rate and the stage's include besides the
read and the first touch of fresh pages). The items are
smaller than glibc's default mmap threshold (zsim.spec.storage.FRESH_ITEM_MIB_DEFAULT),
so the load reuses freed heap: the cost of a larger item's fresh pages is the stage's
less the copy, which the checkpoint model adds itself. Only it imports torch.
"""

from __future__ import annotations

import mmap
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from zsim.units import MiB

CHUNK_BYTES = 16 * MiB
"""Bytes per write() call (torch.save writes a tensor's storage in one call; large
tensors are tens of MiB)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageFigures:
    """This machine's file system for checkpoint-like writes and reads (medians)."""

    write_bytes_per_s: float
    """All files' bytes over the round's wall time, fsync included."""
    read_bytes_per_s: float
    """Reading the files back right after the writes (page cache: see the module)."""
    cold_read_bytes_per_s: float
    """Reading them after asking the kernel to drop their pages (best effort)."""
    file_create_s: float
    """Create + write one byte + fsync + close of one tiny file."""
    fsync: bool
    file_bytes: int
    files: int
    threads: int
    repeats: int
    write_s: float
    """Median wall time of one round's writes, seconds."""
    read_s: float
    """Median wall time of one round's cached reads, seconds."""
    directory: str


def measure_storage(directory: str | Path, *, file_bytes: int = 64 * MiB, files: int = 8,
                    threads: int = 1, fsync: bool = True, repeats: int = 3,
                    small_files: int = 32) -> StorageFigures:
    """Measure write, read and per-file costs in `directory` (created if missing).

    Raises:
        ValueError: a non-positive size or count, or more threads than files.
    """
    if min(file_bytes, files, threads, repeats, small_files) < 1 or threads > files:
        raise ValueError("file_bytes, files, threads, repeats and small_files must be "
                         "positive, and threads <= files")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    block = memoryview(os.urandom(min(file_bytes, CHUNK_BYTES)))
    writes, reads, colds, creates = [], [], [], []
    for r in range(repeats):
        paths = [root / f"storage_bench_{r}_{i}.bin" for i in range(files)]
        try:
            writes.append(_timed_threads(paths, threads,
                                         lambda p: _write(p, file_bytes, block, fsync)))
            reads.append(_timed_threads(paths, threads, _read))
            for p in paths:
                _drop_cache(p)
            colds.append(_timed_threads(paths, threads, _read))
        finally:
            for p in paths:
                p.unlink(missing_ok=True)
        small = [root / f"storage_bench_small_{r}_{i}" for i in range(small_files)]
        try:
            t0 = time.perf_counter()
            for p in small:
                _write(p, 1, block, fsync)
            creates.append((time.perf_counter() - t0) / small_files)
        finally:
            for p in small:
                p.unlink(missing_ok=True)
    total = file_bytes * files
    write_s, read_s = statistics.median(writes), statistics.median(reads)
    return StorageFigures(
        write_bytes_per_s=total / write_s, read_bytes_per_s=total / read_s,
        cold_read_bytes_per_s=total / statistics.median(colds),
        file_create_s=statistics.median(creates), fsync=fsync, file_bytes=file_bytes,
        files=files, threads=threads, repeats=repeats, write_s=write_s, read_s=read_s,
        directory=str(root))


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamFigures:
    """One thread's checkpoint stream rates (medians), bytes/s."""

    save_bytes_per_s: float
    """torch.save of each item into one file, then fsync."""
    buffered_save_bytes_per_s: float
    """torch.save of one tensor to a file path, no fsync (DeepSpeed's checkpoint engine)."""
    load_bytes_per_s: float
    """torch.load of each item from its slice of the file, copied into an existing
    tensor."""
    stage_bytes_per_s: float
    """Copy the tensor into freshly mapped memory (first-touch page faults)."""
    copy_bytes_per_s: float
    """Copy the tensor into memory already touched."""
    tensor_bytes: int
    item_bytes: int
    repeats: int


def measure_streams(directory: str | Path, *, tensor_bytes: int = 256 * MiB,
                    item_bytes: int = 16 * MiB, repeats: int = 3) -> StreamFigures:
    """Time the save, load, buffered save and fresh copy of `tensor_bytes` of fp32 in
    `directory` (module docstring), saved and loaded as items of `item_bytes`, each
    figure the median of `repeats`.

    Raises:
        ValueError: a size under 4 bytes, an item larger than the tensor, or repeats
            below 1.
    """

    import torch
    from torch.distributed.checkpoint.utils import _create_file_view

    if item_bytes < 4 or tensor_bytes < item_bytes or repeats < 1:
        raise ValueError("need 4 <= item_bytes <= tensor_bytes and repeats >= 1")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    t = torch.rand(tensor_bytes // 4)
    # Own storages: torch.save of a view would write the whole tensor's storage.
    items = [c.clone() for c in t.split(item_bytes // 4)]
    dests = [torch.zeros_like(i) for i in items]  # touched: the model's existing state
    touched = torch.zeros_like(t)
    path = root / "storage_bench_stream.distcp"
    saves, buffered, loads, stages, copies = [], [], [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a backend rank runs (zsim.backend.runner)
    try:
        for _ in range(repeats):
            offsets = []
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                for item in items:
                    start = f.tell()
                    torch.save(item, f)
                    offsets.append((start, f.tell() - start))
                f.flush()
                os.fsync(f.fileno())
            saves.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with open(path, "rb") as f:  # as FileSystemReader.read_data
                for (start, length), dest in zip(offsets, dests, strict=True):
                    view = _create_file_view(f, start, length)
                    dest.copy_(torch.load(view, map_location="cpu", weights_only=True))
            loads.append(time.perf_counter() - t0)
            path.unlink()
            t0 = time.perf_counter()
            torch.save(t, path)
            buffered.append(time.perf_counter() - t0)
            path.unlink()
            # Fresh pages whatever the process's malloc settings: an anonymous mapping.
            with mmap.mmap(-1, t.numel() * 4) as fresh:
                staged = torch.frombuffer(fresh, dtype=torch.float32)
                t0 = time.perf_counter()
                staged.copy_(t)
                stages.append(time.perf_counter() - t0)
                del staged
            t0 = time.perf_counter()
            touched.copy_(t)
            copies.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
        path.unlink(missing_ok=True)
    n = t.numel() * 4
    return StreamFigures(save_bytes_per_s=n / statistics.median(saves),
                         buffered_save_bytes_per_s=n / statistics.median(buffered),
                         load_bytes_per_s=n / statistics.median(loads),
                         stage_bytes_per_s=n / statistics.median(stages),
                         copy_bytes_per_s=n / statistics.median(copies), tensor_bytes=n,
                         item_bytes=items[0].numel() * 4, repeats=repeats)


def slowest_streams(figures: list[StreamFigures]) -> StreamFigures:
    """Each rate the slowest of `figures` gives (streams measured in every rank at once:
    a checkpoint's time is its slowest rank's)."""
    if not figures:
        raise ValueError("no stream figures")
    return StreamFigures(
        save_bytes_per_s=min(f.save_bytes_per_s for f in figures),
        buffered_save_bytes_per_s=min(f.buffered_save_bytes_per_s for f in figures),
        load_bytes_per_s=min(f.load_bytes_per_s for f in figures),
        stage_bytes_per_s=min(f.stage_bytes_per_s for f in figures),
        copy_bytes_per_s=min(f.copy_bytes_per_s for f in figures),
        tensor_bytes=figures[0].tensor_bytes, item_bytes=figures[0].item_bytes,
        repeats=figures[0].repeats)


def storage_section(disk: StorageFigures, streams: StreamFigures, *, plan_item_us: float,
                    fresh_item_mib: float, name: str, source: str) -> dict[str, object]:
    """The `storage:` section of a profile for this host (zsim.spec.storage): one disk
    behind every rank, so a node's and the aggregate rate are the disk's (measured with
    as many writer threads as ranks), a stream's the serializing thread's;
    `fresh_item_mib` the ranks' malloc threshold."""
    gb = 1e9
    return {
        "name": name,
        "aggregate_write_gb_per_s": round(disk.write_bytes_per_s / gb, 3),
        "aggregate_read_gb_per_s": round(disk.read_bytes_per_s / gb, 3),
        "client_write_gb_per_s": round(disk.write_bytes_per_s / gb, 3),
        "client_read_gb_per_s": round(disk.read_bytes_per_s / gb, 3),
        "stream_write_gb_per_s": round(streams.save_bytes_per_s / gb, 3),
        "stream_buffered_write_gb_per_s": round(streams.buffered_save_bytes_per_s / gb, 3),
        "stream_read_gb_per_s": round(streams.load_bytes_per_s / gb, 3),
        "stage_gb_per_s": round(streams.stage_bytes_per_s / gb, 3),
        "copy_gb_per_s": round(streams.copy_bytes_per_s / gb, 3),
        "file_create_ms": round(disk.file_create_s * 1e3, 3),
        "fresh_item_mib": fresh_item_mib,
        "plan_item_us": plan_item_us,
        "source": source,
    }


def _timed_threads(paths: list[Path], threads: int, fn: Callable[[Path], None]) -> float:
    """Wall time of fn(path) over all paths, the paths dealt round-robin to `threads`
    threads (the caller's thread is one of them, as in FileSystemWriter)."""
    shares = [paths[i::threads] for i in range(threads)]
    errors: list[BaseException] = []

    def work(share: list[Path]) -> None:
        try:
            for p in share:
                fn(p)
        except BaseException as e:  # re-raised in the caller
            errors.append(e)

    t0 = time.perf_counter()
    others = [threading.Thread(target=work, args=(s,)) for s in shares[1:]]
    for t in others:
        t.start()
    work(shares[0])
    for t in others:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed


def _write(path: Path, nbytes: int, block: memoryview, fsync: bool) -> None:
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def _read(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(CHUNK_BYTES):
            pass


def _drop_cache(path: Path) -> None:
    """Ask the kernel to drop the file's (clean) cached pages; a no-op where unsupported."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
