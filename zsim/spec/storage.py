"""Storage of a cluster, where checkpoints go: a shared file system and each node's NVMe.

Owns the `storage:` section of a hardware profile (optional in a user's profile, present
in every shipped one) and its conversion to SI units. A checkpoint's bytes leave a rank
through one writer stream (torch.distributed.checkpoint's FileSystemWriter writes with
one thread per rank by default, torch.save with one), a node's streams share its storage
link (client bandwidth), and every node shares the file system (aggregate bandwidth).
Node-local NVMe rates are the node section's (HardwareProfile.nvme_*_bytes_per_s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from zsim.errors import ConfigError
from zsim.units import GB, MS, US, MiB

KEYS: tuple[str, ...] = (
    "name", "aggregate_write_gb_per_s", "aggregate_read_gb_per_s", "client_write_gb_per_s",
    "client_read_gb_per_s", "stream_write_gb_per_s", "stream_buffered_write_gb_per_s",
    "stream_read_gb_per_s",
    "stage_gb_per_s", "file_create_ms", "plan_item_us", "source")
"""Keys of the storage section, all required."""

OPTIONAL_KEYS: tuple[str, ...] = ("fresh_item_mib", "copy_gb_per_s")
"""Keys of the storage section a profile may leave out (their defaults below)."""

FRESH_ITEM_MIB_DEFAULT = 32
"""glibc's malloc serves an allocation at or above its mmap threshold with freshly mapped
pages, which the first write into them faults in; smaller ones reuse freed heap. The
threshold rises with freed chunks up to DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on 64-bit
hosts: a host process with glibc's defaults (a GPU node's trainer) maps every allocation
of 32 MiB and more afresh."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Storage:
    """The shared file system (or object store) checkpoints are written to."""

    name: str
    aggregate_write_bytes_per_s: float
    """What all clients together can write, bytes/s."""
    aggregate_read_bytes_per_s: float
    client_write_bytes_per_s: float
    """What one node can write, all its streams together (its storage NICs), bytes/s."""
    client_read_bytes_per_s: float
    stream_write_bytes_per_s: float
    """What one writer thread gets (one rank's FileSystemWriter thread, or rank 0's
    torch.save of a full state dict), bytes/s."""
    stream_buffered_write_bytes_per_s: float
    """What one thread's torch.save into a file path gets without fsync (DeepSpeed's
    checkpoint engine): the save returns once the bytes are in the client's cache, which
    writes them back later; bytes/s."""
    stream_read_bytes_per_s: float
    stage_bytes_per_s: float
    """One rank's copy of its state into freshly allocated host memory (async_save's
    default stager; on a GPU the pageable device-to-host copy, on a CPU device a clone),
    bytes/s. Staging into cached pinned buffers runs at the pinned PCIe rate instead."""
    copy_bytes_per_s: float
    """One thread's copy within host memory into pages already touched, bytes/s. The read
    stream's rate includes one such copy (DCP copies each item it reads into the state
    dict) and the stage's one (into fresh pages): a whole file torch.load'ed into one dict
    reads at 1/(1/stream_read - 1/copy), a fresh page's first touch costs 1/stage -
    1/copy. Unmeasured (a profile without the key): infinite, each charged whole."""
    file_create_s: float
    """Creating, closing and syncing one file, seconds (metadata server round trips)."""
    fresh_item_bytes: float
    """Host allocations at least this large are fresh pages (FRESH_ITEM_MIB_DEFAULT;
    zsim's CPU backend ranks raise glibc's threshold to 1 GiB): a checkpoint load's
    items that large pay the first touch of fresh pages besides the read, bytes."""
    plan_item_s: float
    """Host time torch.distributed.checkpoint's coordinator spends per item of the global
    save plan (one tensor of one rank: unpickling the gathered local plans, deduplicating,
    building the metadata), seconds. A cached plan (DefaultSavePlanner
    enable_plan_caching) pays it on the first save of each process only (the job's start
    and every restart: the cache is in memory)."""
    source: str

    @classmethod
    def from_dict(cls, data: Any) -> Storage:
        """Build from the profile's `storage:` mapping (rates in GB/s, time in ms).

        Raises:
            ConfigError: a key missing, unknown or not a positive number.
        """
        if not isinstance(data, dict):
            raise ConfigError("storage", data, "must be a mapping")
        for key in data:
            if key not in KEYS + OPTIONAL_KEYS:
                raise ConfigError(f"storage.{key}", data[key], "unknown key; expected one "
                                  f"of {', '.join(KEYS + OPTIONAL_KEYS)}")
        for key in KEYS:
            if key not in data:
                raise ConfigError(f"storage.{key}", None, "missing")
        for key in ("name", "source"):
            if not isinstance(data[key], str) or not data[key].strip():
                raise ConfigError(f"storage.{key}", data[key], "must be text")
        rate = {k: _positive(data, k) for k in KEYS if k.endswith("_gb_per_s")}
        return cls(
            name=data["name"],
            aggregate_write_bytes_per_s=rate["aggregate_write_gb_per_s"] * GB,
            aggregate_read_bytes_per_s=rate["aggregate_read_gb_per_s"] * GB,
            client_write_bytes_per_s=rate["client_write_gb_per_s"] * GB,
            client_read_bytes_per_s=rate["client_read_gb_per_s"] * GB,
            stream_write_bytes_per_s=rate["stream_write_gb_per_s"] * GB,
            stream_buffered_write_bytes_per_s=rate["stream_buffered_write_gb_per_s"] * GB,
            stream_read_bytes_per_s=rate["stream_read_gb_per_s"] * GB,
            stage_bytes_per_s=rate["stage_gb_per_s"] * GB,
            copy_bytes_per_s=(_positive(data, "copy_gb_per_s") * GB if "copy_gb_per_s" in data
                              else math.inf),
            file_create_s=_positive(data, "file_create_ms") * MS,
            fresh_item_bytes=(_positive(data, "fresh_item_mib") if "fresh_item_mib" in data
                              else FRESH_ITEM_MIB_DEFAULT) * MiB,
            plan_item_s=_positive(data, "plan_item_us") * US,
            source=data["source"])


def _positive(data: dict[str, Any], key: str) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"storage.{key}", value, "must be a positive number")
    return float(value)
