"""The published measurements of tests/data/cases/published.yaml
replayed in the simulator: whole training steps (torchtitan on 8 H100, MosaicML's MPT-7B
on 8 to 128 A100) and nccl-tests collective sweeps, each as residuals (predicted /
measured - 1) for the profiles' error bands (zsim.validation.profile_bands).

A step row carries the run's name, kind of plan and program (zsim.spec.error_bands), its
world size and micro-batch, whether it had communication, and its residual per metric it
measured; a collective row the case, its call and the residual of the call's time. Each
replay names what it changes in the profile to match the measured hardware (a part's
memory, its NICs). Imports no torch.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from zsim.analytic.collectives import CommGroup, bus_bytes, candidates, collective_time_s
from zsim.simulate import simulate
from zsim.spec.error_bands import plan_kind, program_of
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.presets import PRESETS
from zsim.units import GB, GiB

Cases = dict[str, dict[str, Any]]
"""published.yaml's cases by id."""

TT_HBM_GIB = 95.0
"""TT-L3-8B's 96 GB H100 parts as torch sees them: 96 GiB less the ~0.9 GiB the driver
and context keep (dgx-h100.yaml: 80 GiB parts report 79.1)."""

A100_40_HBM_GIB = 39.4
"""MPT-7B's scaling runs' 40 GB A100 parts: 40 GiB less the ~0.6 GiB the driver keeps
(tests/engine/test_published.py)."""

PLATEAU_BYTES = 8 * GiB
"""A message on the bus-bandwidth plateau, where a case gives one figure without its size
(the DGX H100 sweep's busbw is flat within 1% from 4 GiB)."""

RING_NODES = 3
"""Nodes of the maintainers' ring figures (">= 3 nodes for ring-representative numbers")."""


def step_row(name: str, plan: Plan, residuals: dict[str, float], *,
             communication: bool) -> dict[str, Any]:
    """One whole-step evidence row (zsim.spec.error_bands.band_ranges)."""
    return {"run": name, "kind": plan_kind(plan), "program": program_of(plan),
            "world_size": plan.world_size, "micro_batch": plan.micro_batch,
            "communication": communication, **residuals}


def torchtitan_llama3_8b(cases: Cases, hw: HardwareProfile) -> list[dict[str, Any]]:
    """TT-L3-8B-FSDP2-8xH100, its eager FSDP row: Llama 3.1 8B, FSDP2 on 8 GPUs, seq 8192,
    micro-batch 2, per-op selective recomputation, fp32 gradient reduction; 5,762 tokens/s
    per GPU. Replayed on `hw` with the parts' 96 GB (TT_HBM_GIB). Its GPUs ran at a 500 W
    power cap, which no profile models. Its memory figure is reserved, not allocated, so
    only the step time is a residual."""
    case = cases["TT-L3-8B-FSDP2-8xH100"]
    model, plan_in = case["model"], case["plan"]
    spec = PRESETS["llama3-8b"]
    assert (spec.num_layers, spec.d_model, spec.vocab_size) == (
        model["layers"], model["hidden"], model["vocab"])
    plan = Plan.for_strategy("fsdp", gpus=case["cluster"]["gpus"], seq_len=model["seq"],
                             micro_batch=plan_in["micro_batch"], recompute="selective",
                             reduce_dtype="fp32")
    eager = next(v for v in case["measured"]["variants"] if v["label"] == "FSDP (eager)")
    r = simulate(spec, replace(hw, hbm_bytes=TT_HBM_GIB * GiB), plan)
    assert r.tokens_per_s_per_gpu is not None
    return [step_row(case["id"], plan,
                     {"step_time_s": eager["tps_per_gpu"] / r.tokens_per_s_per_gpu - 1.0},
                     communication=True)]


def _mpt7b(case: dict[str, Any]) -> ModelSpec:
    """llm-foundry's MPT-7B benchmark model: the gpt3-6.7b shape with MPT's vocabulary, its
    loss on the bf16 logits (flash-attn's fused cross-entropy)."""
    return replace(PRESETS["gpt3-6.7b"], vocab_size=case["model"]["vocab"],
                   logits_upcast=False)


def mpt7b_a100(cases: Cases, hw: HardwareProfile) -> list[dict[str, Any]]:
    """MOS-MPT7B-FSDP-8xA100-80-noAC (8 A100 80GB, FSDP1 FULL_SHARD, micro-batch 6 x 2,
    fp32 reduction) and the five rows of MOS-MPT7B-FSDP-scaling-A100-40-RoCE (8 to 128
    A100 40GB, bf16 reduction, full recomputation, micro-batch 12-18, replayed with the
    40 GB parts' memory, A100_40_HBM_GIB): tokens/s per GPU as published."""
    rows = []
    case = cases["MOS-MPT7B-FSDP-8xA100-80-noAC"]
    plan = Plan.for_strategy("fsdp", impl="fsdp1", gpus=case["cluster"]["gpus"],
                             seq_len=case["model"]["seq"], micro_batch=case["plan"]["micro_batch"],
                             grad_accum=case["plan"]["grad_accum"], reduce_dtype="fp32")
    r = simulate(_mpt7b(case), hw, plan)
    assert r.tokens_per_s_per_gpu is not None
    rows.append(step_row(case["id"], plan, {
        "step_time_s": case["measured"]["tokens_per_s_per_gpu"] / r.tokens_per_s_per_gpu - 1.0},
        communication=True))
    case = cases["MOS-MPT7B-FSDP-scaling-A100-40-RoCE"]
    small = replace(hw, hbm_bytes=A100_40_HBM_GIB * GiB)
    for row in case["measured"]["rows"]:
        plan = Plan.for_strategy("fsdp", impl="fsdp1", gpus=row["gpus"],
                                 seq_len=case["model"]["seq"], micro_batch=row["micro_batch"],
                                 grad_accum=row["grad_accum"], recompute="full",
                                 reduce_dtype="bf16")
        r = simulate(_mpt7b(case), small, plan)
        assert r.tokens_per_s_per_gpu is not None
        rows.append(step_row(f"{case['id']} n{row['gpus']}", plan, {
            "step_time_s": row["tokens_per_s_per_gpu"] / r.tokens_per_s_per_gpu - 1.0},
            communication=True))
    return rows


def _row(case: str, call: str, residual: float) -> dict[str, Any]:
    return {"case": case, "call": call, "residual": residual}


def _busbw_residual(measured_gb_per_s: float, size: float, group: CommGroup,
                    hw: HardwareProfile, *, ring_only: bool = False) -> float:
    """Predicted / measured time of an all_reduce given as nccl-tests bus bandwidth: the
    measured bandwidth over the predicted one."""
    bus = bus_bytes("all_reduce", size, group.ranks)
    if ring_only:
        t = min(a.time_s(bus, hw) for a in candidates("all_reduce", size, group, hw)
                if a.algorithm == "ring")
    else:
        t = collective_time_s("all_reduce", size, group, hw)
    return measured_gb_per_s * GB / (bus / t) - 1.0


def _size(text: str) -> int:
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    return int(text[:-3]) * units[text[-3:]]


def dgx_h100_sweep(cases: Cases, hw: HardwareProfile) -> list[dict[str, Any]]:
    """C-DGXH100-8GPU-allreduce-sweep: nccl-tests all_reduce on one DGX H100, 8 B to
    16 GiB, each size's time."""
    case = cases["C-DGXH100-8GPU-allreduce-sweep"]
    node = CommGroup(ranks=8, ranks_per_node=8)
    return [_row(case["id"], f"all_reduce {size} B x8",
                 collective_time_s("all_reduce", size, node, hw) / (time_us * 1e-6) - 1.0)
            for size, time_us, *_ in case["measured"]["rows"]]


def h200_sweep(cases: Cases, hw: HardwareProfile) -> list[dict[str, Any]]:
    """C-8xH200-allreduce-torch-vs-nccltests: nccl-tests all_reduce bus bandwidth on 8
    H200, 32 KiB to 16 GiB, and the 16 GiB call with NVLS disabled (the profile without
    NVLS: a ring)."""
    case = cases["C-8xH200-allreduce-torch-vs-nccltests"]
    node = CommGroup(ranks=8, ranks_per_node=8)
    rows = [_row(case["id"], f"all_reduce {payload} x8", _busbw_residual(busbw, _size(payload),
                                                                         node, hw))
            for payload, _, busbw in case["measured"]["rows"]]
    rows.append(_row(case["id"], "all_reduce 16GiB x8 without NVLS", _busbw_residual(
        case["measured"]["nvls_disabled_16GiB_busbw_GBps"], 16 * GiB, node,
        replace(hw, nvls_bus_bytes_per_s=0.0))))
    return rows


def hgx_a100(cases: Cases, hw: HardwareProfile) -> list[dict[str, Any]]:
    """C-HGXA100-allreduce-1node-and-2node-4xHDR: all_reduce bus bandwidth on one A100
    node and on two with four HDR NICs each (the profile's NICs halved per GPU), at a
    plateau size (PLATEAU_BYTES; the case gives none)."""
    case = cases["C-HGXA100-allreduce-1node-and-2node-4xHDR"]
    measured = case["measured"]
    half = replace(hw, inter_node=replace(
        hw.inter_node, bandwidth_bytes_per_s=hw.inter_node.bandwidth_bytes_per_s / 2))
    return [
        _row(case["id"], "all_reduce x8", _busbw_residual(
            measured["single_node_busbw_GBps"], PLATEAU_BYTES,
            CommGroup(ranks=8, ranks_per_node=8), hw)),
        _row(case["id"], "all_reduce x16, 4 NICs per node", _busbw_residual(
            measured["two_node_busbw_GBps"], PLATEAU_BYTES,
            CommGroup(ranks=16, ranks_per_node=8), half))]


def maintainer_ring(cases: Cases, hw: HardwareProfile, *, fabric: str) -> list[dict[str, Any]]:
    """C-NCCL-maintainer-multinode-reference-points: ring all_reduce bus bandwidth over
    RING_NODES nodes of 8 GPUs at a plateau size. fabric "ndr": 46-48 GB/s per NDR NIC,
    one per GPU (both ends); "dgx_a100": 192 GB/s on DGX A100's 8 x 200 Gb/s."""
    case = cases["C-NCCL-maintainer-multinode-reference-points"]
    group = CommGroup(ranks=8 * RING_NODES, ranks_per_node=8)
    measured = case["measured"]
    if fabric == "dgx_a100":
        figures = [float(measured["dgx_a100_8x200G_IB_allreduce_busbw_GBps"])]
    else:
        match = re.match(r"(\d+)-(\d+)", str(measured["ndr_400G_expected_per_nic_GBps"]))
        assert match is not None
        figures = [float(g) * hw.gpus_per_node for g in match.groups()]
    return [_row(case["id"], f"ring all_reduce x{group.ranks} at {f:.0f} GB/s busbw",
                 _busbw_residual(f, PLATEAU_BYTES, group, hw, ring_only=True))
            for f in figures]
