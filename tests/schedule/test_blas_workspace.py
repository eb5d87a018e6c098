"""cuBLAS workspaces (zsim.schedule.lower.workspace_pieces): a rank on a GPU profile holds
one per cuBLAS handle of its step, the forward thread's and autograd's, from the first
step on; a CPU profile none. Bytes worked out from the profiles' figures."""

from __future__ import annotations

from dataclasses import replace

from zsim.schedule.lower import lower
from zsim.simulate import simulate
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model

MiB = 2**20


def test_two_workspaces_in_the_state_of_a_gpu_rank(tiny_model: ModelSpec) -> None:
    spec, plan = resolve_model("7b"), Plan.for_strategy("fsdp", gpus=8, seq_len=4096)
    h200 = resolve_hardware("hgx-h200")
    spaces = [b for b in lower(spec, h200, plan).baseline if b.category == "workspace"]
    assert [(b.bytes, b.pieces) for b in spaces] == [(64 * MiB, (32 * MiB, 32 * MiB))]
    # A100's default (8 MiB + 128 KiB per handle).
    a100 = lower(spec, resolve_hardware("dgx-a100"), plan).baseline
    assert sum(b.bytes for b in a100 if b.category == "workspace") == 2 * (8 * MiB + 128 * 1024)
    cpu = lower(tiny_model, resolve_hardware("local-cpu"),
                Plan.for_strategy("fsdp", gpus=2, seq_len=64)).baseline
    assert not [b for b in cpu if b.category == "workspace"]


def test_workspaces_raise_the_peak_and_the_state_by_their_bytes() -> None:
    spec, plan = resolve_model("7b"), Plan.for_strategy("fsdp", gpus=8, seq_len=4096)
    h200 = resolve_hardware("hgx-h200")
    without = simulate(spec, replace(h200, blas_workspace_bytes=0.0), plan)
    with_ = simulate(spec, h200, plan)
    assert with_.baseline_memory_bytes - without.baseline_memory_bytes == 64 * MiB
    assert with_.peak_memory_bytes - without.peak_memory_bytes == 64 * MiB
    assert with_.memory_at_peak["workspace"] == 64 * MiB


def test_pipeline_ranks_hold_them_too() -> None:
    spec = resolve_model("7b")
    plan = Plan.for_strategy("fsdp", gpus=16, seq_len=4096, pp=2, grad_accum=4)
    r = simulate(spec, resolve_hardware("hgx-h200"), plan)
    assert r.memory_at_peak["workspace"] == 64 * MiB
    assert all(s.peak_memory_bytes > 64 * MiB for s in r.pipeline_stages)
