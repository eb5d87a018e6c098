"""The simulator against 16 real FSDP2 steps on one H200 (tests/data/cases/h200-fsdp2-runs.yaml,
rank 0 of N on a fake process group: no communication) and the H200 targets
(zsim.validation.published_runs; the error bands the residuals give hgx-h200 are checked in
tests/golden/test_error_bands.py). The targets (docs/validation.md): step time within 3% on
average and 6% at worst, peak allocated 0.5% and 1.5%, peak reserved 3% at worst.

Targets not reached yet are strict xfails (they fail the suite once they pass,
so the marker must go); guards at today's level fail on a regression."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from zsim.analytic.compute import optimizer_flops
from zsim.spec.registry import PROFILES_DIR, resolve_hardware
from zsim.units import GB
from zsim.validation.phase_rates import (
    attention_rates,
    attention_rows,
    kernel_gap_s,
    kernel_seconds,
    reduce_copy_in_rates,
)
from zsim.validation.published_runs import load_runs, residuals

PHASES = Path(__file__).resolve().parents[2] / "reports" / "validation" / "h200" / "phases"
"""zsim calibrate gpu-phases's measurements of the published runs (a lent H200)."""


@pytest.fixture(scope="module")
def rows(cases_dir: Path) -> list[dict[str, Any]]:
    runs = load_runs(cases_dir / "h200-fsdp2-runs.yaml")
    assert len(runs) == 16  # 17 runs, one out of memory
    return residuals(runs, resolve_hardware("hgx-h200"))


def _stats(rows: list[dict[str, Any]], metric: str) -> tuple[float, float]:
    errors = [abs(r[metric]) for r in rows]
    return statistics.mean(errors), max(errors)


def test_committed_attention_rates_are_the_steps_kernels(cases_dir: Path) -> None:
    """hgx-h200's attention rows at the runs' shapes (head_dim 128, seq 2048-8192) are
    what zsim calibrate phase-rates reads from the profiled steps: the whole SDPA
    op, its backward with the small kernels around the main one."""
    rows = attention_rows(attention_rates(PHASES, cases_dir / "h200-fsdp2-runs.yaml"))
    committed = yaml.safe_load((PROFILES_DIR / "hgx-h200.yaml").read_text())["kernels"]
    assert set(rows) == {"bf16", "tf32"}
    for dtype, measured in rows.items():
        for row in measured:
            assert row in committed["attention"][dtype], (dtype, row)
    # The small kernels count: without them the 2048 backward read 180 TFLOP/s.
    assert next(r for r in rows["bf16"] if r[0] == 2048)[3] < 160


def test_committed_reduce_copy_in_rate_is_the_steps_median(cases_dir: Path) -> None:
    rates = reduce_copy_in_rates(PHASES, cases_dir / "h200-fsdp2-runs.yaml")
    assert len(rates) == 11  # the bf16 backwards profiled: 1.3B, 7B and 13B
    committed = yaml.safe_load((PROFILES_DIR / "hgx-h200.yaml").read_text())[
        "kernels"]["memory_gb_per_s"]["reduce_copy_in"]
    median = round(statistics.median(r.bytes_per_s for r in rates) / GB)
    assert committed == {"forward": median, "backward": median}
    # A cast runs at about half the d2d copy's rate (flat: 0.88 x 4800 GB/s).
    assert all(1.5e12 < r.bytes_per_s < 2.5e12 for r in rates)


def test_committed_kernel_overhead_is_the_steps_gaps() -> None:
    committed = yaml.safe_load((PROFILES_DIR / "hgx-h200.yaml").read_text())[
        "efficiency"]["kernel_overhead_us"]
    assert committed == round(kernel_gap_s(PHASES) * 1e6, 1)
    assert 2.0 < committed < 4.0


def test_foreach_adamw_launches_what_the_steps_launched(cases_dir: Path) -> None:
    """The optimizer phase of the profiled steps launched 72 (1.3B on 8 ranks), 328 (7B
    on 8) and 52 (13B on 128) kernels: the 8 foreach ops of AdamW as multi_tensor_apply
    packs the rank's shard (zsim.analytic.compute.foreach_launches)."""
    runs = {r.name: r for r in load_runs(cases_dir / "h200-fsdp2-runs.yaml")}
    with (PHASES / "phases.csv").open() as f:
        measured = {(r["run"], int(r["step"])): int(r["kernels"]) for r in csv.DictReader(f)
                    if r["phase"] == "optimizer"}
    for name in ("1p3b_n8", "7b_n8", "13b_n128_mb1"):
        spec, n = runs[name].spec, runs[name].plan.dp_shard
        tensors = spec.num_layers * len(spec.block_tensors()) + len(spec.root_tensors())
        work = optimizer_flops(spec.num_params / n, optimizer="adamw", tensors=tensors,
                               master_bytes=4, state_bytes_per_param=8, grad_bytes=4,
                               param_copy_bytes=0, foreach="multi_tensor_apply")
        assert work.kernels == measured[name, 0], name
        assert optimizer_flops(spec.num_params / n, optimizer="adamw", tensors=tensors,
                               master_bytes=4, state_bytes_per_param=8, grad_bytes=4,
                               param_copy_bytes=0).kernels == 9 * tensors


def test_top_kernel_cells_are_read_by_name() -> None:
    cell = ("void at::native::detail::chunk_cat_cuda_kernel<float, c10::BFloat16>(c10::BFlo"
            "at16**, float*, long*,: 0.02071; Memcpy DtoD (Device -> Device): 0.01451")
    assert kernel_seconds(cell, ("chunk_cat_cuda_kernel<float",)) == 0.02071
    assert kernel_seconds(cell, ("DtoD",)) == 0.01451
    assert kernel_seconds(cell, ("split_with_sizes",)) is None


def test_guard_step_time_without_communication(rows: list[dict[str, Any]]) -> None:
    """Today's level (mean 3.9%, max 12.4% at the CPU-offload run; bf16 without offload
    at most 6.5%, 1p3b_n64, whose forward is host-bound); a regression fails."""
    mean, worst = _stats(rows, "step_time_s")
    assert mean < 0.045 and worst < 0.14
    bf16 = [r for r in rows if r["kind"] in ("plain", "recompute")]
    assert _stats(bf16, "step_time_s")[1] < 0.075


def test_guard_peak_allocated(rows: list[dict[str, Any]]) -> None:
    """Today's level (mean 0.10%, max 0.56%: 1.3B with full recomputation, whose state
    after the step reads 1.6% short) is not lost. It was mean 0.77%, max 2.34% before
    the runs' program was modelled as their memory shows it was written
    (zsim.validation.published_runs.HARNESS) and the gradient of a block's output was
    held through its backward."""
    mean, worst = _stats(rows, "peak_memory_bytes")
    assert mean < 0.0015 and worst < 0.006


def test_guard_peak_allocated_under_full_recomputation(rows: list[dict[str, Any]]) -> None:
    """The four full-recomputation runs: 7B +0.07% and 13B +0.03% and +0.03% (micro-
    batch 1 and 2), whose peak is a checkpointed block's backward (the gradient of the
    block's output beside the recomputed block, zsim.analytic.allocations._block_backward;
    each block's bf16 copy of RoPE's tables, zsim.analytic.activations.block_input_casts),
    and 1.3B -0.56%, at the loss's backward. They read +0.66%, -1.64%, -2.34% and +1.24%
    (1.3B, 7B, 13B, 13B micro-batch 2) before."""
    full = {r["run"]: r["peak_memory_bytes"] for r in rows if r["kind"] == "recompute"}
    assert len(full) == 4
    assert all(abs(err) < 0.006 for err in full.values())
    assert all(abs(full[run]) < 0.001
               for run in ("7b_n64_ac", "13b_n128_mb1_ac", "13b_n128_mb2_ac"))


def test_state_after_step(rows: list[dict[str, Any]]) -> None:
    """What a rank holds between steps (sharded parameters, AdamW's states, module buffers,
    the two cuBLAS workspaces) against state_after_step_gib: mean 0.9%, max 2.3%. The
    CPU-offloaded run keeps only buffers and the workspaces on the GPU (0.063 GiB): without
    the workspaces it read 0.002 GiB."""
    mean, worst = _stats(rows, "state_memory_bytes")
    assert mean < 0.01 and worst < 0.025


@pytest.mark.xfail(strict=True, reason="H200 target not reached: mean 3.9%, max 12.4%")
def test_target_step_time(rows: list[dict[str, Any]]) -> None:
    mean, worst = _stats(rows, "step_time_s")
    assert mean <= 0.03 and worst <= 0.06


def test_target_peak_allocated(rows: list[dict[str, Any]]) -> None:
    mean, worst = _stats(rows, "peak_memory_bytes")
    assert mean <= 0.005 and worst <= 0.015


@pytest.mark.xfail(strict=True, reason="H200 target not reached: reserved within 7.4%")
def test_target_peak_reserved(rows: list[dict[str, Any]]) -> None:
    assert _stats(rows, "reserved_memory_bytes")[1] <= 0.03
