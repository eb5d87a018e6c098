"""Kernel rates read from the kernels of real steps: what `zsim calibrate gpu-phases`
(zsim.validation.gpu_phases) recorded (kernel_classes.csv: device time by kernel class,
with each class's costliest kernels) for runs of tests/data/cases/h200-fsdp2-runs.yaml, and
what those kernels moved.

    zsim calibrate phase-rates --phases DIR --cases PATH

prints three of the profile's figures with the measurements they come from
(tests/golden/test_h200_runs.py checks the committed figures are these):

- `kernels.attention`'s rows of the runs' shapes: per run and profiled step, causal SDPA's
  forward and backward rates in forward FLOPs per second (the attention FLOPs
  zsim.analytic.compute.block_forward_flops counts, per layer), the backward timed with
  the small kernels flash attention's backward runs around its main one (cuDNN's
  compute_dot_do_o, rowsum(dO * O), and convert_dq_to_16bits, the fp32 dQ accumulator
  cast to bf16; the profiler classes them "other"), as the micro-benchmarked rows of the
  table time the whole op; the median per (dtype, seq, head_dim).
- `efficiency.kernel_overhead_us`: the idle time between back-to-back kernels on the
  compute stream (its gaps under 10 us) per kernel launched, pooled over the forward and
  backward phases that kept the device busy (busy_fraction at least DEVICE_BOUND), from
  phases.csv.
- `kernels.memory_gb_per_s.reduce_copy_in`: per run and profiled step, the rate of FSDP2's
  reduce-scatter copy-in (torch.ops.fsdp.chunk_cat casting the unsharded bf16 gradients
  into the flat fp32 reduce buffer: 2 bytes read and 4 written per parameter); the median.

Imports no torch.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import NamedTuple

from zsim.analytic.compute import block_forward_flops
from zsim.errors import ConfigError
from zsim.units import GB
from zsim.validation.published_runs import PublishedRun, load_runs

CHUNK_CAT = "chunk_cat_cuda_kernel<float, c10::BFloat16>"
"""The copy-in kernel of a bf16 model reducing in fp32, as the profiler names it."""

BYTES_PER_PARAM = 2 + 4
"""chunk_cat reads each bf16 gradient and writes it as fp32 (dim-0 padding, at most
world - 1 rows of a tensor, is left out)."""


ATTENTION_MAIN = {"forward": ("fprop", "cutlassF"), "backward": ("bprop", "cutlassB")}
"""Name fragments of the main SDPA kernels of each pass (cuDNN flash; the fp32
memory-efficient kernels)."""

ATTENTION_BACKWARD_AUX = ("compute_dot_do_o", "convert_dq")
"""Name fragments of the small kernels around cuDNN flash attention's backward."""

DEVICE_BOUND = 0.9
"""Busy fraction from which a phase's gaps are the device's own, not waits on the host."""


class AttentionRate(NamedTuple):
    run: str
    step: int
    dtype: str
    seq: int
    head_dim: int
    forward_flop_per_s: float
    backward_flop_per_s: float


class CopyInRate(NamedTuple):
    run: str
    step: int
    seconds: float
    bytes_per_s: float


def kernel_seconds(top_kernels: str, markers: tuple[str, ...]) -> float | None:
    """Summed seconds of the kernels whose names contain any of `markers` in a
    kernel_classes.csv `top_kernels` cell ("name: seconds; name: seconds; ..."); None:
    none of them is among the cell's kernels."""
    found = [float(seconds) for name, _, seconds in
             (entry.rpartition(": ") for entry in top_kernels.split("; "))
             if name and any(m in name for m in markers)]
    return sum(found) if found else None


def _class_cells(phases_dir: Path) -> dict[tuple[str, int, str, str], str]:
    """kernel_classes.csv's top_kernels cells by (run, step, phase, kernel class)."""
    with (phases_dir / "kernel_classes.csv").open(newline="") as f:
        return {(r["run"], int(r["step"]), r["phase"], r["kernel_class"]): r["top_kernels"]
                for r in csv.DictReader(f)}


def _runs(cases: Path) -> dict[str, PublishedRun]:
    return {r.name: r for r in load_runs(cases)}


def attention_rates(phases_dir: Path, cases: Path) -> list[AttentionRate]:
    """SDPA's forward and backward rates in every profiled step of the runs."""
    runs = _runs(cases)
    cells = _class_cells(phases_dir)
    out = []
    for name, step in sorted({(r, s) for r, s, _, _ in cells}):
        spec, plan = runs[name].spec, runs[name].plan
        flops = spec.num_layers * block_forward_flops(
            spec, micro_batch=plan.micro_batch, seq_len=plan.seq_len, act_bytes=2).attention
        fwd = kernel_seconds(cells[name, step, "forward", "attention"],
                             ATTENTION_MAIN["forward"])
        bwd = kernel_seconds(cells[name, step, "backward", "attention"],
                             ATTENTION_MAIN["backward"])
        assert fwd and bwd, f"{name} step {step}: no SDPA kernel among the top ones"
        bwd += kernel_seconds(cells.get((name, step, "backward", "other"), ""),
                              ATTENTION_BACKWARD_AUX) or 0.0
        out.append(AttentionRate(name, step, plan.compute_dtype, plan.seq_len,
                                 spec.head_dim, flops / fwd, flops / bwd))
    return out


def attention_rows(rates: list[AttentionRate]) -> dict[str, list[list[float]]]:
    """The profile's rows, [seq, head_dim, forward, backward] in TFLOP/s (0.1), by dtype:
    the median over the steps of each (dtype, seq, head_dim)."""
    groups: dict[tuple[str, int, int], list[AttentionRate]] = {}
    for r in rates:
        groups.setdefault((r.dtype, r.seq, r.head_dim), []).append(r)
    out: dict[str, list[list[float]]] = {}
    for (dtype, seq, hd), rs in sorted(groups.items()):
        out.setdefault(dtype, []).append([
            seq, hd, round(statistics.median(r.forward_flop_per_s for r in rs) / 1e12, 1),
            round(statistics.median(r.backward_flop_per_s for r in rs) / 1e12, 1)])
    return out


def kernel_gap_s(phases_dir: Path) -> float:
    """Idle seconds per kernel launched on the compute stream: the gaps under 10 us
    (compute_idle_s less compute_idle_over_10us_s) over the launches, pooled over the
    device-bound forward and backward phases of phases.csv."""
    idle = launches = 0.0
    with (phases_dir / "phases.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            if row["phase"] in ("forward", "backward") and \
                    float(row["busy_fraction"]) >= DEVICE_BOUND:
                idle += float(row["compute_idle_s"]) - float(row["compute_idle_over_10us_s"])
                launches += float(row["launches"])
    return idle / launches


def reduce_copy_in_rates(phases_dir: Path, cases: Path) -> list[CopyInRate]:
    """The copy-in's rate in every profiled backward of the runs that cast bf16 gradients
    into an fp32 reduce buffer."""
    runs = _runs(cases)
    out = []
    for (name, step, phase, cls), cell in _class_cells(phases_dir).items():
        seconds = (kernel_seconds(cell, (CHUNK_CAT,))
                   if phase == "backward" and cls == "copies" else None)
        if seconds is not None:
            out.append(CopyInRate(name, step, seconds,
                                  runs[name].spec.num_params * BYTES_PER_PARAM / seconds))
    return out


def rates_text(phases_dir: Path, cases: Path) -> str:
    """The three figures with the measurements they come from (see the module docstring),
    as lines of text.

    Raises:
        ConfigError: `phases_dir` lacks kernel_classes.csv or phases.csv, or `cases` is not
            a readable runs file.
    """
    for name in ("kernel_classes.csv", "phases.csv"):
        if not (phases_dir / name).is_file():
            raise ConfigError("phases", str(phases_dir),
                              f"has no {name} (the output of zsim calibrate gpu-phases)")
    attention = attention_rates(phases_dir, cases)
    lines = [f"{'run':16s} {'step':>4s} {'dtype':>5s} {'seq':>5s} {'hd':>4s} "
             f"{'fwd TFLOP/s':>11s} {'bwd TFLOP/s':>11s}"]
    lines += [f"{a.run:16s} {a.step:4d} {a.dtype:>5s} {a.seq:5d} {a.head_dim:4d} "
              f"{a.forward_flop_per_s / 1e12:11.1f} {a.backward_flop_per_s / 1e12:11.1f}"
              for a in attention]
    lines += [f"kernels.attention.{dtype} rows: {rows}"
              for dtype, rows in attention_rows(attention).items()]
    lines += ["", f"kernel_overhead_us {kernel_gap_s(phases_dir) * 1e6:.1f} (compute-stream "
                  f"gaps under 10 us per launch, device-bound forward and backward phases)"]
    rates = reduce_copy_in_rates(phases_dir, cases)
    lines += ["", f"{'run':16s} {'step':>4s} {'seconds':>10s} {'GB/s':>8s}"]
    lines += [f"{r.run:16s} {r.step:4d} {r.seconds:10.6f} {r.bytes_per_s / GB:8.0f}"
              for r in rates]
    median = statistics.median(r.bytes_per_s for r in rates) / GB
    lines.append(f"median reduce_copy_in {median:.0f} GB/s over {len(rates)} backwards")
    return "\n".join(lines)
