"""How long a training step takes: the one step timer of the backend's measured runs
(zsim.backend.measured_step), the GPU report's runs and host sweep
(zsim.validation.gpu_report, zsim.calibration.gpu_host_sweep), the per-phase profile
(zsim.validation.gpu_phases) and the programs' host-time benchmark
(zsim.calibration.program_overhead).

Owns the timing of zsim.backend.training.train_step: the device is synchronised before
the step starts and after it ends, so step_s is when the device finished the step;
host_issue_s is how long Python took to queue it (without reading the loss back nothing
waits for the device before the end). With `phases`, the device is also synchronised at
the end of every forward and backward, giving the wall time of each phase (summed over
micro-batches) and of the optimizer step. Imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from zsim.backend import training
from zsim.backend.runner import sync_device


def timed_step(prep: training.Prepared, micro: list[tuple[torch.Tensor, torch.Tensor]],
               device: str, *, phases: bool, read_loss: bool = False) -> dict[str, float]:
    """One training step of `prep` on the micro-batches `micro`, timed (see the module
    docstring); `read_loss` reads each micro-batch's loss back as training.train_step
    does.

    Returns:
        Seconds: "step_s" and "host_issue_s"; with `phases` instead "forward_s",
        "backward_s", "optimizer_s" and "step_s"; with `read_loss` also "loss" (the last
        micro-batch's).
    """
    sync_device(device)
    start = time.perf_counter()
    spent = {"forward": 0.0, "backward": 0.0}
    mark = [start]

    @contextmanager
    def phase(name: str) -> Iterator[None]:
        yield
        if phases and name in spent:
            sync_device(device)
            now = time.perf_counter()
            spent[name] += now - mark[0]
            mark[0] = now

    loss = training.train_step(prep, micro, phase=phase, read_loss=read_loss)
    issued = time.perf_counter()
    sync_device(device)
    end = time.perf_counter()
    out = ({"forward_s": spent["forward"], "backward_s": spent["backward"],
            "optimizer_s": end - mark[0], "step_s": end - start} if phases else
           {"host_issue_s": issued - start, "step_s": end - start})
    return out | ({"loss": loss} if read_loss else {})
