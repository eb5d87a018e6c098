"""The runs of the GPU validation report (zsim.validation.gpu_report) that one GPU can host,
and how one is measured in its process.

Owns the runs, by process (Group): world 1 on a real process group (NCCL; gloo on CPU)
and rank 0 of N on the fake process group at N = 8, 64 and 512 (FSDP2: fsdp,
fsdp-no-reshard, recomputation, fp32 with TF32 matmuls, CPU offload, hsdp; DDP at world
1), and DeepSpeed ZeRO-2 at world 1; the quick mode's tiny ones for a CPU smoke test. A
run is measured (measure_run) with the protocol of zsim.backend.measured_step: its memory
over the steady-state step (allocated after init and after a step, per-phase peaks, peak
reserved, saved activations), then warm-up steps, steps synchronised after each phase and
unsynchronised steps, each timed by zsim.backend.step_timing. Imports torch.
"""

from __future__ import annotations

import statistics
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from zsim.backend import training
from zsim.backend.measured_step import steady_state
from zsim.backend.runner import RankContext
from zsim.backend.step_timing import timed_step
from zsim.calibration.gpu_kernel_bench import P1B3, matmul_precision
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.validation.budgeted_runs import Group, Run
from zsim.validation.comparison import backend_knobs

SMALL = ModelSpec(name="0p4b-v128k", num_layers=16, d_model=1024, num_heads=16,
                  num_kv_heads=4, ffn_hidden=2816, vocab_size=128256, max_seq_len=2048)
"""A 0.44B GQA Llama with Llama 3's 128k vocabulary (the output layer is 60% of it)."""

P7B = ModelSpec(name="7b", num_layers=32, d_model=4096, num_heads=32, num_kv_heads=32,
                ffn_hidden=11008, vocab_size=32000, max_seq_len=4096)
"""Llama-2-7B as in tests/data/cases/h200-fsdp2-runs.yaml."""

TINY = ModelSpec(name="tiny", num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                 ffn_hidden=176, vocab_size=512, max_seq_len=64)
"""The quick mode's model (CPU smoke test)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Steps:
    """Steps per run after the two memory steps."""

    warmup: int
    phased: int
    unsynced: int


FULL_STEPS = Steps(warmup=2, phased=3, unsynced=3)
QUICK_STEPS = Steps(warmup=1, phased=2, unsynced=2)


def _run(name: str, spec: ModelSpec, strategy: str, gpus: int, knobs: dict[str, Any], *,
         shard_group: int | None = None, tf32: bool = False, published: str = "",
         **changes: Any) -> Run:
    plan = Plan.for_strategy(strategy, gpus=gpus, shard_group=shard_group,
                             **{**knobs, **changes})
    return Run(name=name, spec=spec, plan=plan, tf32=tf32, published=published)


def groups(quick: bool, device_type: str) -> list[Group]:
    """The FSDP2 and DDP validation rows, by process, in the order they run (most wanted
    first within a process). Specs carry the kernel knobs of `device_type`
    (zsim.validation.comparison.backend_knobs)."""
    knobs = backend_knobs(device_type)
    fp32 = {"param_dtype": "fp32", "grad_dtype": "fp32"}
    if quick:
        t = replace(TINY, **knobs)
        k = {"seq_len": 64, "micro_batch": 2, "reduce_dtype": "fp32"}
        return [
            Group(key="n1", backend="real", world_size=1, runs=(
                _run("tiny_n1", t, "fsdp", 1, k), _run("tiny_n1_ddp", t, "ddp", 1, k))),
            Group(key="n8", backend="fake", world_size=8, runs=(
                _run("tiny_n8", t, "fsdp", 8, k),
                _run("tiny_n8_fp32", t, "fsdp", 8, k, tf32=True, **fp32))),
            Group(key="n64", backend="fake", world_size=64, runs=(
                _run("tiny_n64_hsdp8x8", t, "hsdp", 64, k, shard_group=8),)),
            Group(key="n512", backend="fake", world_size=512, runs=(
                _run("tiny_n512", t, "fsdp", 512, k),)),
        ]
    b, s, m = (replace(x, **knobs) for x in (P1B3, SMALL, P7B))
    kb = {"seq_len": 2048, "micro_batch": 4, "reduce_dtype": "fp32"}
    ks = {"seq_len": 2048, "micro_batch": 2, "reduce_dtype": "fp32"}
    km = {"seq_len": 4096, "micro_batch": 1, "reduce_dtype": "fp32"}
    return [
        Group(key="n1", backend="real", world_size=1, runs=(
            _run("1p3b_n1", b, "fsdp", 1, kb, published="1p3b_n1"),
            _run("0p4b_n1", s, "fsdp", 1, ks), _run("0p4b_n1_ddp", s, "ddp", 1, ks))),
        Group(key="n8", backend="fake", world_size=8, runs=(
            _run("1p3b_n8", b, "fsdp", 8, kb, published="1p3b_n8"),
            _run("1p3b_n8_raf0", b, "fsdp-no-reshard", 8, kb, published="1p3b_n8_raf0"),
            _run("1p3b_n8_ac", b, "fsdp", 8, kb, recompute="full", published="1p3b_n8_ac"),
            _run("1p3b_n8_sac", b, "fsdp", 8, kb, recompute="selective"),
            _run("1p3b_n8_fp32", b, "fsdp", 8, kb, tf32=True, published="1p3b_n8_fp32",
                 **fp32),
            _run("1p3b_n8_offload", b, "fsdp", 8, kb, offload="params",
                 published="1p3b_n8_offload"),
            _run("0p4b_n8", s, "fsdp", 8, ks), _run("0p4b_n8_raf0", s, "fsdp-no-reshard", 8, ks))),
        Group(key="n64", backend="fake", world_size=64, runs=(
            _run("1p3b_n64", b, "fsdp", 64, kb, published="1p3b_n64"),
            _run("1p3b_n64_raf0", b, "fsdp-no-reshard", 64, kb, published="1p3b_n64_raf0"),
            _run("1p3b_n64_hsdp8x8", b, "hsdp", 64, kb, shard_group=8),
            _run("0p4b_n64", s, "fsdp", 64, ks),
            _run("0p4b_n64_hsdp8x8", s, "hsdp", 64, ks, shard_group=8),
            _run("7b_n64", m, "fsdp", 64, km, published="7b_n64"))),
        Group(key="n512", backend="fake", world_size=512, runs=(
            _run("1p3b_n512", b, "fsdp", 512, kb),
            _run("1p3b_n512_hsdp64x8", b, "hsdp", 512, kb, shard_group=64),
            _run("0p4b_n512", s, "fsdp", 512, ks))),
    ]


def deepspeed_groups(quick: bool, device_type: str) -> list[Group]:
    """DeepSpeed ZeRO-2 at world 1 (skipped when deepspeed is not installed)."""
    knobs = backend_knobs(device_type)
    if quick:
        run = _run("tiny_n1_zero2", replace(TINY, **knobs), "zero2", 1,
                   {"seq_len": 64, "micro_batch": 2, "reduce_dtype": "fp32"})
    else:
        run = _run("0p4b_n1_zero2", replace(SMALL, **knobs), "zero2", 1,
                   {"seq_len": 2048, "micro_batch": 2, "reduce_dtype": "fp32"})
    return [Group(key="deepspeed", backend="real", world_size=1, needs="deepspeed",
                  runs=(run,))]


def measure_run(ctx: RankContext, run: Run, *, steps: Steps) -> dict[str, Any]:
    """The run's figures in its process (see the module docstring): memory in bytes less
    what a previous run of the process left allocated, times in seconds (medians)."""
    spec, plan = run.spec, run.plan
    cuda = ctx.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    leftover = torch.cuda.memory_allocated() if cuda else 0
    with matmul_precision("tf32") if run.tf32 else nullcontext():
        prep, memory, saved, _ = steady_state(ctx, spec, plan)
        micro = training.batches(spec, plan, device=ctx.device, rank=ctx.rank, step=2)
        for _ in range(steps.warmup):
            timed_step(prep, micro, ctx.device, phases=False)
        phased = [timed_step(prep, micro, ctx.device, phases=True)
                  for _ in range(steps.phased)]
        unsynced = [timed_step(prep, micro, ctx.device, phases=False)
                    for _ in range(steps.unsynced)]
    del prep
    return {
        "leftover_bytes": leftover,
        **{f.name: getattr(memory, f.name) - (f.name != "reserved_bytes") * leftover
           for f in fields(memory)},
        "saved_blocks_bytes": sum(t.bytes for t in saved if t.scope != "root"),
        "saved_root_bytes": sum(t.bytes for t in saved if t.scope == "root"),
        "step_s": statistics.median(s["step_s"] for s in unsynced),
        "host_issue_s": statistics.median(s["host_issue_s"] for s in unsynced),
        **{k: statistics.median(s[k] for s in phased)
           for k in ("forward_s", "backward_s", "optimizer_s")},
        "step_phased_s": statistics.median(s["step_s"] for s in phased),
        "step_times_s": [round(s["step_s"], 6) for s in unsynced],
        "note": (f"{leftover} B left allocated by the previous run were subtracted"
                 if leftover else ""),
    }
