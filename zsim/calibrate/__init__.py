"""Calibration backend: runs zsim plans on real torch.distributed (FSDP2, DDP, ZeRO) and
compares them with the simulator. Importing this package does not import torch (an
optional extra of zsim); calling its functions does.

Modules: model (the reference Llama), fsdp2 (Plan -> fully_shard / DDP / ZeRO), runner
(N processes), measure (instruments), step (one plan's measured run), microbench, fit,
profile (`calibrate`), validate (`validate` and the report), gpu_report and gpu_bench (the
GPU validation report and its measurements), gpu_phases (where a real GPU step's time
goes, by phase and kernel class), published_runs (the published H200 runs replayed in the
simulator; no torch), published_cases (published.yaml's steps and nccl-tests sweeps
replayed; no torch), bands (every shipped profile's error bands from its evidence; no
torch), deepspeed_zero and fsdp1 (the other libraries' programs),
tensor_parallel (torch's TP, alone or under FSDP2 on a 2-D mesh), pipeline
(torch.distributed.pipelining), training (the library-neutral training step)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["calibrate"]


def calibrate(backend: str, nproc: int, out: Path) -> Path:
    """Benchmark `nproc` ranks on `backend` ("gloo" or "nccl") and write a hardware
    profile YAML to `out`; see zsim.calibrate.profile.calibrate."""
    from zsim.calibrate.profile import calibrate as run

    return run(backend, nproc, Path(out))
