"""What a measurement ran on: this host (name, architecture, cores, CPU model, memory),
its disk's rates, and the software and GPU of a GPU report (environment). The profile's
provenance (zsim.calibration.profile_writer) and the validation reports' name the machine
with these. Imports torch.
"""

from __future__ import annotations

import mmap
import os
import platform
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from zsim.units import MiB

DISK_TEST_BYTES = 256 * MiB
"""Size of the file disk_rates writes and reads."""


def host_memory_bytes() -> float:
    """This host's memory, bytes (/proc/meminfo, else sysconf)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def cpu_name() -> str:
    """This host's CPU model (/proc/cpuinfo, else platform's)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_description() -> str:
    """This host: name, architecture, cores and CPU model (what tells one host from
    another in a profile's or a batch's provenance)."""
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, {cpu_name()}"


def disk_rates(folder: Path) -> tuple[float, float]:
    """(read, write) bytes/s of a 256 MiB file: written then fsynced, read with O_DIRECT
    (bypassing the page cache) where the file system allows it."""
    folder.mkdir(parents=True, exist_ok=True)
    buf = mmap.mmap(-1, 4 * MiB)  # page-aligned, as O_DIRECT requires
    buf.write(os.urandom(4 * MiB))
    fd, path = tempfile.mkstemp(dir=folder, prefix=".zsim-disk-")
    try:
        start = time.perf_counter()
        for _ in range(DISK_TEST_BYTES // (4 * MiB)):
            os.write(fd, buf)
        os.fsync(fd)
        write_s = time.perf_counter() - start
        os.close(fd)
        flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
        try:
            fd = os.open(path, flags)
        except OSError:
            fd = os.open(path, os.O_RDONLY)
        start = time.perf_counter()
        while os.readv(fd, [buf]) > 0:
            pass
        read_s = time.perf_counter() - start
        os.close(fd)
    finally:
        os.unlink(path)
    return DISK_TEST_BYTES / read_s, DISK_TEST_BYTES / write_s


def environment() -> dict[str, Any]:
    """What a GPU report's measurements ran on: Python, torch, CUDA, the host, the
    packages, the checkout's commit and the GPU."""
    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": str(torch.__version__),
        "cuda_runtime": torch.version.cuda, "host": platform.node(),
        "machine": platform.machine(), "cpus": os.cpu_count(),
        "packages": {p: _version(p) for p in ("numpy", "simpy", "PyYAML", "pandas",
                                              "deepspeed", "zsim")},
        "git_commit": git_commit() or "unknown (not a git checkout)",
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env |= {"gpu": props.name, "gpu_memory_bytes": props.total_memory,
                "gpu_capability": f"{props.major}.{props.minor}",
                "gpu_count": torch.cuda.device_count(),
                "cudnn": torch.backends.cudnn.version(),
                "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    else:
        env["gpu"] = "none (CPU run)"
    return env


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_commit() -> str | None:
    """The checkout's commit, read from .git without running git (zsim starts no
    programs), in a worktree too (.git a file naming its git folder); None where the
    tree is a copy without .git."""
    git = Path(__file__).resolve().parents[2] / ".git"
    try:
        if git.is_file():  # a worktree: "gitdir: <its folder under the main .git>"
            git = Path(git.read_text().strip().removeprefix("gitdir: "))
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head.removeprefix("ref: ")
        common = git / (git / "commondir").read_text().strip() if (
            git / "commondir").is_file() else git
        for folder in (git, common):
            if (folder / ref).is_file():
                return (folder / ref).read_text().strip()
        for line in (common / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return None
