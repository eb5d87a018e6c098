"""Offloaded steps on a GPU node: host<->device copies at the pinned or
pageable rate of the profile, and the host AdamW at the rank's share of the node's cores,
checked by hand against hgx-h200's figures (tests/data/cases/h200-microbench.yaml)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from zsim.schedule.lower import lower
from zsim.simulate import simulate
from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model


def _zero2_offload(pin: bool) -> Plan:
    return Plan.for_strategy("zero2", gpus=8, seq_len=2048, offload="optimizer",
                             options=DeepSpeedZero(offload_device="cpu", pin_memory=pin))


def test_pageable_copies_load_the_link_as_pinned_outruns_pageable() -> None:
    hw = resolve_hardware("hgx-h200")
    spec = resolve_model("1.3b")
    pinned_rate = hw.pcie_bytes_per_s * hw.pcie_efficiency  # 64 GB/s x 0.86
    for pin, expected in ((True, {"h2d": 1.0, "d2h": 1.0}),
                          (False, {"h2d": pinned_rate / 16.3e9, "d2h": pinned_rate / 12.7e9})):
        copies = [op for op in lower(spec, hw, _zero2_offload(pin)).ops
                  if op.kind in ("h2d", "d2h")]
        assert copies
        for op in copies:
            ((_, load),) = op.link_loads
            assert load == pytest.approx(expected[op.kind])


def test_unpinned_offload_is_slower_and_fsdp2_pins() -> None:
    hw = resolve_hardware("hgx-h200")
    spec = resolve_model("1.3b")
    pinned = simulate(spec, hw, _zero2_offload(True))
    pageable = simulate(spec, hw, _zero2_offload(False))
    assert pageable.step_time_s > pinned.step_time_s
    fsdp2 = Plan.for_strategy("fsdp", gpus=8, seq_len=2048, offload="params")
    assert fsdp2.pinned_host_buffers and not _zero2_offload(False).pinned_host_buffers


def test_host_step_is_the_ranks_shard_at_its_threads_rate() -> None:
    """1.3B FSDP2 with CPUOffloadPolicy on 8 GPUs: the host AdamW steps num_params / 8 at
    the rate of 112 // 8 = 14 threads, plus 53.8 us per DTensor (host.optimizer_tensor_us)."""
    hw = resolve_hardware("hgx-h200")
    spec = resolve_model("1.3b")
    plan = Plan.for_strategy("fsdp", gpus=8, seq_len=2048, offload="params")
    (step,) = [op for op in lower(spec, hw, plan).ops if op.stream == "host"]
    expected = (spec.num_params / 8 / hw.rank_host_adam_params_per_s()
                + len(spec.parameter_tensors()) * 53.8e-6)
    assert step.compute_s == pytest.approx(expected)
    # A node with twice the cores steps faster, sublinearly (Amdahl).
    more = replace(hw, cpu_cores=224)
    (faster,) = [op for op in lower(spec, more, plan).ops if op.stream == "host"]
    assert expected / 2 < faster.compute_s < expected


def test_fp16_unscales_the_gradients_once_before_the_step() -> None:
    """fp16 adds one read + write of each local gradient element (4 B fp32 shards) to the
    optimizer step at the flat memory-bound rate, and the launches of one foreach op
    (multi_tensor_apply on an H200: chunks of 65,536 elements, half a chunk per tensor
    wasted on average, 320 chunks or 110 tensors a launch); bf16 none."""
    from dataclasses import replace as dc_replace

    hw = dc_replace(resolve_hardware("hgx-h200"), optimizer_tensor_s={"plain": 0.0,
                                                                       "dtensor": 0.0})
    spec = resolve_model("1.3b")
    bf16 = Plan.for_strategy("fsdp", gpus=8, seq_len=2048)
    fp16 = bf16.with_(param_dtype="fp16", grad_dtype="fp16", reduce_dtype="fp16")

    def step_s(plan: Plan) -> float:
        (op,) = [o for o in lower(spec, hw, plan).ops if o.kind == "optimizer"]
        return op.compute_s

    from zsim.schedule.programs.fsdp2 import state_shard_elems

    local = state_shard_elems(spec, 8)
    flat = hw.hbm_bandwidth_bytes_per_s * hw.memory_bound_efficiency
    tensors = len(spec.parameter_tensors())
    launches = max(math.ceil(math.ceil(local / 65536 + tensors / 2) / 320),
                   math.ceil(tensors / 110))
    extra = 2 * local * 4 / flat + launches * hw.kernel_overhead_s
    assert step_s(fp16) - step_s(bf16) == pytest.approx(extra, rel=1e-9)
