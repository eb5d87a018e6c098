"""Every plan the planner ranks on every shipped profile carries error bands: an interval
around its step time and its peak, their source, and a reason for each widening exactly
where the plan leaves what the profile's evidence covered (zsim.spec.error_bands)."""

from __future__ import annotations

import pytest

from zsim.planner import candidate_plans
from zsim.simulate import simulate
from zsim.spec.error_bands import plan_kind, program_of
from zsim.spec.model import ModelSpec
from zsim.spec.registry import hardware_names, resolve_hardware

TINY = ModelSpec(name="tiny", num_layers=2, d_model=256, num_heads=4, num_kv_heads=4,
                 ffn_hidden=1024, vocab_size=2048, max_seq_len=512)


@pytest.mark.parametrize("name", hardware_names())
@pytest.mark.parametrize("micro_batch", [1, 2])
def test_every_ranked_plan_gets_a_band_and_its_reasons(name: str, micro_batch: int) -> None:
    hw = resolve_hardware(name)
    bands = hw.error_bands
    assert bands is not None
    step_band, memory_band = bands.metrics["step_time_s"], bands.metrics["peak_memory_bytes"]
    gpus = 2 * hw.gpus_per_node  # two nodes: HSDP among the candidates
    plans = candidate_plans(hw, gpus=gpus, seq_len=512, micro_batch=micro_batch)
    assert {p.strategy for p in plans} >= {"ddp", "zero3", "fsdp", "hsdp"}
    for plan in plans:
        r = simulate(TINY, hw, plan, reserved=False)
        assert r.step_time_s is not None and r.step_time_band_s is not None, plan.label
        low, high = r.step_time_band_s
        assert 0 < low < high, plan.label
        assert r.peak_memory_band_bytes is not None
        assert r.step_time_band_source == bands.describe()
        for why, band in ((r.step_time_band_extrapolated, step_band),
                          (r.peak_memory_band_extrapolated, memory_band)):
            lo_mb, hi_mb = band.micro_batches
            expected = {
                "kind": plan_kind(plan) not in band.kinds,
                "program": program_of(plan) not in band.programs,
                "micro-batch": not lo_mb <= micro_batch <= hi_mb,
                "world": band.world_size is not None and gpus > band.world_size}
            assert {w.split(" ")[0] for w in why} == {k for k, v in expected.items() if v}
