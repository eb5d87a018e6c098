"""Error bands (zsim.spec.error_bands): the interval a prediction carries, by hand; kinds
of plan; the schema's errors; and where the bands appear (JSON, the simulate and plan
tables)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from zsim.errors import ConfigError
from zsim.spec.error_bands import ErrorBands, band_pct, band_ranges, plan_kind
from zsim.spec.plan import Plan

BANDS: dict[str, Any] = {"runs": 3, "source": "hand-made",
                         "step_time_s": {"plain": [-10.0, 5.0], "offload": [-20.0, 5.0]},
                         "peak_memory_bytes": {"plain": [0.0, 2.0]}}


def test_interval_by_hand() -> None:
    """A residual r = predicted / measured - 1 in [-10%, +5%] puts the measured value of
    a 1.0 s prediction in [1 / 1.05, 1 / 0.9]."""
    bands = ErrorBands.from_dict(BANDS)
    plain = Plan.for_strategy("fsdp", gpus=8, seq_len=2048)
    low, high = bands.interval("step_time_s", plain, 1.0)
    assert (low, high) == pytest.approx((1 / 1.05, 1 / 0.9))
    offload = plain.with_(offload="params")
    assert bands.interval("step_time_s", offload, 1.0) == pytest.approx((1 / 1.05, 1 / 0.8))
    # A kind without its own runs gets the plain band.
    assert bands.interval("step_time_s", plain.with_(recompute="full"), 1.0) == \
        pytest.approx((low, high))
    assert band_pct((low, high), 1.0) == "-5%..+11%"


def test_kinds_and_ranges_from_residuals() -> None:
    plan = Plan.for_strategy("fsdp", gpus=8, seq_len=2048)
    assert plan_kind(plan) == "plain"
    assert plan_kind(plan.with_(recompute="full")) == "recompute"
    assert plan_kind(plan.with_(param_dtype="fp32", grad_dtype="fp32", tf32=True)) == "fp32"
    assert plan_kind(plan.with_(offload="params", recompute="full")) == "offload"
    rows = [{"kind": "plain", "step_time_s": -0.031, "peak_memory_bytes": 0.0},
            {"kind": "plain", "step_time_s": 0.049, "peak_memory_bytes": 0.01},
            {"kind": "offload", "step_time_s": -0.2, "peak_memory_bytes": 0.0}]
    ranges = band_ranges(rows)
    # Rounded outwards to 0.1%; a kind's band includes the plain runs.
    assert ranges["step_time_s"] == {"plain": (-3.1, 4.9), "offload": (-20.0, 4.9)}


@pytest.mark.parametrize(("change", "field"), [
    ({"step_time_s": {"offload": [0, 1]}}, "error_bands.step_time_s"),
    ({"step_time_s": {"plain": [5, 1]}}, "error_bands.step_time_s.plain"),
    ({"step_time_s": {"plain": [0, 1], "typo": [0, 1]}}, "error_bands.step_time_s.typo"),
    ({"runs": 0}, "error_bands.runs"),
    ({"extra": 1}, "error_bands.extra"),
])
def test_bad_bands_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        ErrorBands.from_dict({**BANDS, **change})
    assert e.value.field == field


def _zsim(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "zsim", *args], capture_output=True,
                          text=True, timeout=120, check=True)
    return done.stdout


def test_bands_reach_json_and_tables() -> None:
    args = ("--model", "1.3b", "--gpus", "8", "--hardware", "hgx-h200", "--strategy", "fsdp")
    r = json.loads(_zsim("simulate", *args, "--format", "json"))
    assert r["step_time_s_low"] < r["step_time_s"] < r["step_time_s_high"]
    assert r["peak_memory_bytes_low"] is not None
    assert "%..+" in _zsim("simulate", *args)
    # A profile without validation runs says so and gives no numbers.
    plain = json.loads(_zsim("simulate", "--model", "1.3b", "--gpus", "8", "--hardware",
                             "dgx-a100", "--strategy", "fsdp", "--format", "json"))
    assert plain["step_time_s_low"] is None and plain["step_time_s_high"] is None
    ranked = json.loads(_zsim("plan", *args[:-2], "--format", "json"))["candidates"]
    assert all(c["step_time_band_pct"] for c in ranked if c["step_time_s"] is not None)
