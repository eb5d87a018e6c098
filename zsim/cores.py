"""The CPU cores this process may run on: what the planner fans plans out over
(zsim.multicore) and what CPU ranks of a calibration share (zsim.calibration.kernel_bench)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores in this process's affinity mask where the OS has one (Linux), else every
    core the OS reports (at least 1)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
