"""The host sweep of the GPU fit (the hgx-h200 profile's host costs): the host side of
eager training steps, on the fake process group as rank 0 of N. The GPU validation report
runs it (zsim.validation.gpu_report) into host.csv and host_fit.csv.

Owns the sweep and its fit. The nano model (zsim.calibration.nano: its kernels cost
microseconds) at several depths under each config of nano.SWEEP_CONFIGS: the Python issue
of a step without synchronising, the synchronised step, its phases
(zsim.backend.step_timing), and one profiled step for the ATen ops, kernel launches and
device-busy time. The slope over depth is the host cost per block (host_fit); units of 1
and 4 blocks separate the per-unit from the per-parameter cost of FSDP2's hooks. Imports
torch.
"""

from __future__ import annotations

import statistics
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from zsim.backend import programs, training
from zsim.backend.reference_model import Transformer
from zsim.backend.runner import Deadline, RankContext, append_jsonl
from zsim.backend.step_timing import timed_step
from zsim.calibration.nano import nano_model, sweep_plan
from zsim.spec.model import ModelSpec

HOST_FIELDS = ("config", "layers", "unit_size", "param_tensors", "steps", "host_issue_s",
               "step_s", "forward_s", "backward_s", "optimizer_s", "aten_ops", "launches",
               "kernels", "device_busy_s", "note")
"""Columns of host.csv, one row per (config, depth); times are medians per step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostJob:
    """What host_rank runs."""

    depths: tuple[int, ...]
    configs: tuple[str, ...]
    timed: int
    warmup: int
    deadline: Deadline
    log_path: str
    """JSON lines, one per measured row, written as they complete."""


def host_rank(ctx: RankContext, job: HostJob) -> int:
    """Rank function (fake process group): every (config, depth) of the job, shallowest
    depth first for every config (so a budget that runs out leaves fewer depths, not
    fewer configs), each row appended to job.log_path as it completes. Returns the number
    of rows written."""
    written = 0
    for depth in job.depths:
        for config in job.configs:
            if not job.deadline.allows(5.0):
                row: dict[str, Any] = {"config": config, "layers": depth,
                                       "note": "skipped: time budget spent"}
            else:
                try:
                    row = _host_row(ctx, config, depth, job)
                except Exception as e:  # a failed config must not end the sweep
                    row = {"config": config, "layers": depth,
                           "note": f"error: {type(e).__name__}: {e} | "
                                   + traceback.format_exc(limit=-3).replace("\n", " ")}
            append_jsonl(job.log_path, row)
            written += 1
            print(f"host: {config} layers={depth}: {row.get('note') or 'ok'}", flush=True)
    return written


def _host_row(ctx: RankContext, config: str, depth: int, job: HostJob) -> dict[str, Any]:
    spec = nano_model(depth)
    plan = sweep_plan(config, ctx.world_size)
    prep = _plain(spec, ctx.device) if config == "plain" else programs.prepare(
        spec, plan, device=ctx.device, world_size=ctx.world_size)
    micro = training.batches(spec, plan, device=ctx.device, rank=ctx.rank, step=0)
    for _ in range(job.warmup):
        timed_step(prep, micro, ctx.device, phases=False)
    issue = [timed_step(prep, micro, ctx.device, phases=False) for _ in range(job.timed)]
    phased = [timed_step(prep, micro, ctx.device, phases=True) for _ in range(job.timed)]
    try:
        counts: dict[str, Any] = {**profile_counts(prep, micro, ctx.device), "note": ""}
    except Exception as e:  # the timings stand without the op counts
        counts = {"note": f"profile failed: {type(e).__name__}: {e}"}
    row = {"config": config, "layers": depth, "unit_size": plan.unit_size,
           "param_tensors": len(spec.parameter_tensors()), "steps": job.timed,
           **{k: statistics.median(s[k] for s in issue) for k in ("host_issue_s", "step_s")},
           **{k: statistics.median(s[k] for s in phased)
              for k in ("forward_s", "backward_s", "optimizer_s")},
           **counts}
    del prep
    return row


def _plain(spec: ModelSpec, device: str) -> training.Prepared:
    """The unsharded bf16 model with AdamW(foreach): the host cost without any wrapper."""
    torch.manual_seed(0)
    with torch.device(device):
        inner = Transformer(spec)
    inner.init_weights()
    inner = inner.to(torch.bfloat16)
    opt = torch.optim.AdamW(inner.parameters(), lr=1e-4, foreach=True)

    def step() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    units: dict[str, torch.nn.Module] = {f"layers.{i}": b for i, b in enumerate(inner.layers)}
    units["root"] = inner
    return training.Prepared(model=inner, inner=inner, units=units,
                             backward=lambda loss, last: loss.backward(), step=step)


KERNEL_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                   "cuLaunchKernelEx")
"""Names of the host's kernel launch calls in a torch.profiler trace."""


def profile_counts(prep: training.Prepared, micro: list[tuple[torch.Tensor, torch.Tensor]],
                   device: str) -> dict[str, float]:
    """One step under torch.profiler: ATen ops called (nested ones included), kernel
    launches, device kernels and their summed duration (device-busy seconds)."""
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        timed_step(prep, micro, device, phases=False)
    aten = launches = kernels = 0
    busy_us = 0.0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
            busy_us += event.time_range.elapsed_us()
        elif event.name.startswith("aten::"):
            aten += 1
        elif event.name in KERNEL_LAUNCHES:
            launches += 1
    return {"aten_ops": aten, "launches": launches, "kernels": kernels,
            "device_busy_s": busy_us * 1e-6}


HOST_FIT_FIELDS = ("config", "depths", "host_issue_s_per_block", "host_issue_s_base",
                   "step_s_per_block", "aten_ops_per_block", "launches_per_block",
                   "kernels_per_block", "host_s_per_aten_op")
"""Columns of host_fit.csv: least-squares lines over depth of the host sweep."""


def host_fit(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per config with at least two timed depths: the slope per block (and the intercept
    of the host issue time) of each host figure measured at every depth, and the host
    seconds per ATen op added by a block."""
    timed = [r for r in rows if isinstance(r.get("host_issue_s"), float)]
    out = []
    for config in dict.fromkeys(r["config"] for r in timed):
        ok = [r for r in timed if r["config"] == config]
        if len({r["layers"] for r in ok}) < 2:
            continue
        xs = [float(r["layers"]) for r in ok]

        def line(key: str, ok: list[dict[str, Any]] = ok,
                 xs: list[float] = xs) -> tuple[float | str, float | str]:
            ys = [r.get(key) for r in ok]
            if not all(isinstance(y, int | float) for y in ys):
                return "", ""
            fit = statistics.linear_regression(xs, [float(y) for y in ys])
            return fit.slope, fit.intercept

        host, base = line("host_issue_s")
        aten = line("aten_ops")[0]
        out.append({"config": config, "depths": " ".join(str(r["layers"]) for r in ok),
                    "host_issue_s_per_block": host, "host_issue_s_base": base,
                    "step_s_per_block": line("step_s")[0], "aten_ops_per_block": aten,
                    "launches_per_block": line("launches")[0],
                    "kernels_per_block": line("kernels")[0],
                    "host_s_per_aten_op": (host / aten if isinstance(host, float)
                                           and isinstance(aten, float) and aten else "")})
    return out
