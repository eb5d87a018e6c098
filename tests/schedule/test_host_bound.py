"""The host on GPU profiles: an FSDP2 block op lasts at least the host's
time to issue it (hgx-h200's fsdp2_block_host_us, measured in real steps), so small
blocks on many ranks become host-bound while large blocks stay device-bound."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zsim.errors import ConfigError
from zsim.schedule.lower import lower
from zsim.spec.hardware import HardwareProfile
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model

US = 1e-6


def _ops(spec_name: str, plan: Plan, hw: HardwareProfile) -> dict[str, float]:
    return {op.name: op.compute_s for op in lower(resolve_model(spec_name), hw, plan).ops}


def test_small_blocks_on_many_ranks_wait_for_the_host() -> None:
    """125M blocks (d 768) are a few hundred microseconds of kernels: at 64 ranks a block
    forward takes the host's 2026 + 18.6 x 64 us, its backward 2555 + 7.2 x 64 us; with
    full recomputation the forward adds 399 us and the backward re-issues the forward."""
    hw = resolve_hardware("hgx-h200")
    plan = Plan.for_strategy("fsdp", gpus=64, seq_len=1024)
    ops = _ops("125m", plan, hw)
    fwd, bwd = (2026 + 18.6 * 64) * US, (2555 + 7.2 * 64) * US
    assert ops["unit 3 forward (mb 0)"] == pytest.approx(fwd)
    assert ops["unit 3 backward (mb 0)"] == pytest.approx(bwd)
    ac = _ops("125m", plan.with_(recompute="full"), hw)
    assert ac["unit 3 forward (mb 0)"] == pytest.approx(fwd + 399 * US)
    assert ac["unit 3 backward (mb 0)"] == pytest.approx(bwd + fwd)
    # Without the host figures the same ops are the kernels alone, shorter.
    bare = _ops("125m", plan, replace(hw, fsdp2_block_host=None))
    assert bare["unit 3 forward (mb 0)"] < fwd


def test_large_blocks_stay_device_bound() -> None:
    hw = resolve_hardware("hgx-h200")
    plan = Plan.for_strategy("fsdp", gpus=128, seq_len=8192)
    with_host = _ops("13b", plan, hw)
    without = _ops("13b", plan, replace(hw, fsdp2_block_host=None))
    assert with_host["unit 5 forward (mb 0)"] == without["unit 5 forward (mb 0)"]


def test_bad_block_host_names_the_field() -> None:
    import yaml

    from zsim.spec.registry import PROFILES_DIR

    data = yaml.safe_load((PROFILES_DIR / "hgx-h200.yaml").read_text())
    data["host"]["fsdp2_block_host_us"]["forward"] = [1]
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_dict(data, name="hgx-h200")
    assert e.value.field == "host.fsdp2_block_host_us.forward"


def test_the_optimizer_step_pipelines_host_and_device() -> None:
    """AdamW on an async host: the host issues the 8 foreach ops one after another while
    the device runs the ones issued, max(host, device) + min(host, device) / 8. The host
    time is 53.8 us per DTensor (hgx-h200's optimizer_tensor_us); the device time is the
    step's alone, found with the host time set to 0."""
    hw = resolve_hardware("hgx-h200")
    plan = Plan.for_strategy("fsdp", gpus=8, seq_len=4096)
    spec = resolve_model("7b")
    tensors = spec.num_layers * len(spec.block_tensors()) + len(spec.root_tensors())
    host = tensors * 53.8 * US
    device = _ops("7b", plan, replace(hw, optimizer_tensor_s={"plain": 0.0,
                                                              "dtensor": 0.0}))["optimizer step"]
    assert _ops("7b", plan, hw)["optimizer step"] == pytest.approx(
        max(host, device) + min(host, device) / 8, rel=1e-12)
