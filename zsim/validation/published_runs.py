"""The published real FSDP2 steps on one H200 (tests/data/cases/h200-fsdp2-runs.yaml)
replayed in the simulator: each run's model and plan, the simulator's figures for what
was measured, and the residuals (predicted / measured - 1) that the H200 targets
(docs/validation.md) and the profiles' error bands (zsim.validation.profile_bands) are
made of.

    zsim validate published-runs --cases PATH [--hardware hgx-h200]

prints the per-run table of errors (percent).

The runs are rank 0 of N on a fake process group, so they have no communication: the
comparable figure is the simulated step less its exposed collective waits (offload
copies are real and stay in). The run's process had the host's 16 cores to itself, so
the profile is taken with that many cores per rank (HardwareProfile.cpu_cores). Imports
no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.yaml_file import read_yaml
from zsim.units import GiB
from zsim.validation.published_cases import step_row

HOST_CORES = 16
"""Cores of the host the runs were measured on (the file's setup.gpu line), all of them
the measured rank's."""

HARNESS: dict[str, Any] = {"loss_in_forward": False, "rope_table_dtype": "fp32"}
"""How the runs' program hands the loss and RoPE's tables over (ModelSpec knobs), read
from their memory, which the setup's text does not pin down:
- The loss is computed outside the model (loss = cross_entropy(logits.float()), as the
  setup writes it and torchtitan does): in every run whose peak is the loss's backward
  (all but three), peak - after_forward is exactly the loss's two fp32 gradients (2 x
  tokens x vocab x 4 B: 1.953 GiB at 8192 tokens), with no block's all-gather beside
  them; zsim.backend's own program on the same GPU, whose model returns its loss, read
  that plus the last block's prefetched all-gather (reports/validation/h200/runs.yaml,
  1p3b_n8: 2.049 GiB = 1.953 + 0.096; 7b_n64: 1.353 = 0.977 + 0.377), FSDP2's root
  pre-backward running on the loss's gradient before the loss's backward.
- The blocks get RoPE's tables as the model's fp32 buffers: after the forward every bf16
  run holds, beyond zsim.backend's program (one shared bf16 copy), one bf16 (s,
  head_dim) cos and sin per block more, independent of the micro-batch and of the world
  size (after_forward - simulated, less the state's residual: 1.3B 24 MiB = 24 blocks x
  2048 x 512 B, 7B 62-63 MiB = 32 x 4096 x 512 B, 13B 155-160 MiB = 40 x 8192 x 512 B,
  micro-batch 1 and 2 alike), and the fp32 run none: FSDP2's MixedPrecisionPolicy casts
  the tables at every block (zsim.analytic.activations.block_input_casts), and casts
  nothing in fp32."""

METRICS: dict[str, str] = {
    "step_time_s": "step_time_s", "forward_time_s": "fwd_time_s",
    "backward_time_s": "bwd_time_s", "optimizer_time_s": "opt_time_s",
    "peak_memory_bytes": "peak_allocated_gib", "reserved_memory_bytes": "peak_reserved_gib",
    "state_memory_bytes": "state_after_step_gib"}
"""Simulator figure -> the run's measured field (memory in GiB there)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    """One measured run: its model, plan and measured figures (SI units)."""

    name: str
    spec: ModelSpec
    plan: Plan
    measured: dict[str, float]
    """By simulator figure (METRICS keys)."""


def load_runs(path: Path) -> list[PublishedRun]:
    """The runs of h200-fsdp2-runs.yaml that completed (status ok), with their plans as
    the file's setup describes them: FSDP2 per block and root, bf16 with fp32 reduction
    (or fp32 with TF32 matmuls), AdamW(foreach), full recomputation of every block,
    CPUOffloadPolicy; and their model as the runs' memory shows the program wrote it
    (HARNESS)."""
    data = read_yaml(path, field="cases")
    runs = []
    for r in data["runs"]:
        m, p, x = r["model"], r["plan"], r["measured"]
        if x.get("status") != "ok":
            continue
        spec = ModelSpec(name=r["name"], num_layers=m["layers"], d_model=m["d_model"],
                         num_heads=m["heads"], num_kv_heads=m["kv_heads"],
                         ffn_hidden=m["ffn_hidden"], vocab_size=m["vocab"],
                         max_seq_len=p["seq"], **HARNESS)
        strategy = ("hsdp" if p["replicate_group"] > 1 else
                    "fsdp" if p["reshard_after_forward"] else "fsdp-no-reshard")
        knobs: dict[str, Any] = {"seq_len": p["seq"], "micro_batch": p["micro_batch"],
                                 "reduce_dtype": "fp32",
                                 "recompute": p["activation_checkpointing"]}
        if p["precision"] == "fp32":  # run with set_float32_matmul_precision("high")
            knobs.update(param_dtype="fp32", grad_dtype="fp32", tf32=True)
        if p["cpu_offload"]:
            knobs["offload"] = "params"
        plan = Plan.for_strategy(strategy, gpus=p["world_size"],
                                 shard_group=p["shard_group"] if strategy == "hsdp" else None,
                                 **knobs)
        measured = {k: float(x[v]) * (GiB if v.endswith("_gib") else 1.0)
                    for k, v in METRICS.items()}
        runs.append(PublishedRun(name=r["name"], spec=spec, plan=plan, measured=measured))
    return runs


def as_measured(hw: HardwareProfile) -> HardwareProfile:
    """The profile with the measured host: one rank on HOST_CORES cores."""
    return replace(hw, cpu_cores=HOST_CORES * hw.gpus_per_node)


def predict(run: PublishedRun, hw: HardwareProfile) -> dict[str, float]:
    """The simulator's figures for the run's measured ones."""
    r = simulate(run.spec, as_measured(hw), run.plan)
    step = r.step_time_without_comm_s
    assert step is not None and r.reserved_memory_bytes is not None, \
        f"{run.name} did not simulate to its end"
    return {"step_time_s": step,
            "forward_time_s": r.phase_time_s["forward"],
            "backward_time_s": r.phase_time_s["backward"],
            "optimizer_time_s": r.phase_time_s.get("optimizer", r.host_busy_s or 0.0),
            "peak_memory_bytes": float(r.peak_memory_bytes),
            "reserved_memory_bytes": float(r.reserved_memory_bytes),
            "state_memory_bytes": float(r.baseline_memory_bytes)}


def residuals(runs: list[PublishedRun], hw: HardwareProfile) -> list[dict[str, Any]]:
    """Per run, a step row (zsim.validation.published_cases.step_row: its name, kind,
    program, world size, micro-batch, no communication) with predicted / measured - 1 per
    metric."""
    out = []
    for run in runs:
        pred = predict(run, hw)
        out.append(step_row(run.name, run.plan,
                            {k: pred[k] / run.measured[k] - 1.0 for k in METRICS},
                            communication=False))
    return out


def residual_table(rows: list[dict[str, Any]]) -> str:
    """The residuals of `rows` (residuals()) in percent, a line per run, then the mean and
    the largest |error| per metric."""
    head = f"{'run':22s} {'kind':10s}" + "".join(f" {k[:-2]:>14s}" for k in METRICS)
    lines = [head]
    for r in rows:
        lines.append(f"{r['run']:22s} {r['kind']:10s}"
                     + "".join(f" {100 * r[k]:+14.1f}" for k in METRICS))
    for name, fn in (("mean |err|", statistics.mean), ("max |err|", max)):
        lines.append(f"{name:33s}" + "".join(
            f" {100 * fn(abs(r[k]) for r in rows):14.1f}" for k in METRICS))
    return "\n".join(lines)
