"""Error bands (zsim.spec.error_bands): the interval a prediction carries and each widening
rule, worked by hand; kinds, programs and ranges from residuals; the schema's errors and
round trip; and where the bands appear (JSON, the simulate and plan tables)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import pytest

from zsim.errors import ConfigError
from zsim.spec.error_bands import (
    ErrorBands,
    band_pct,
    band_ranges,
    compound,
    plan_kind,
    program_of,
    widen,
)
from zsim.spec.plan import Plan

PROGRAM_ERRORS = {"zero3[deepspeed]": [-12.0, -6.0], "other": [-20.0, 10.0]}
BANDS: dict[str, Any] = {
    "runs": 3,
    "step_time_s": {"kinds": {"plain": [-10.0, 5.0], "offload": [-20.0, 5.0]},
                    "world_size": 8, "micro_batches": [1, 4],
                    "programs": ["fsdp[fsdp2]"], "program_errors": PROGRAM_ERRORS},
    "peak_memory_bytes": {"kinds": {"plain": [0.0, 2.0]}, "micro_batches": [1, 4],
                          "programs": ["fsdp[fsdp2]"], "program_errors": PROGRAM_ERRORS},
    "collectives": [-20.0, 10.0],
    "evidence": ["3 hand-made runs"],
    "source": "hand-made"}

PLAIN = Plan.for_strategy("fsdp", gpus=8, seq_len=2048)


def _step(plan: Plan, predicted: float = 1.0, **kw: float) -> tuple[float, float, tuple[str, ...]]:
    iv = ErrorBands.from_dict(BANDS).interval("step_time_s", plan, predicted, **kw)
    return iv.low, iv.high, iv.extrapolated


def test_interval_inside_the_domain_by_hand() -> None:
    """A residual r = predicted / measured - 1 in [-10%, +5%] puts the measured value of
    a 1.0 s prediction in [1 / 1.05, 1 / 0.9]; nothing is extrapolated."""
    low, high, why = _step(PLAIN, collective_s=0.5, exposed_collective_s=0.1)
    assert (low, high) == pytest.approx((1 / 1.05, 1 / 0.9))
    assert why == ()
    assert _step(PLAIN.with_(offload="params"))[:2] == pytest.approx((1 / 1.05, 1 / 0.8))
    assert band_pct((low, high), 1.0) == "-5%..+11%"


def test_widen_and_compound_by_hand() -> None:
    # Doubled in ratio: 0.9^2 = 0.81, 1.05^2 = 1.1025; an end on the near side goes to 0.
    assert widen((-0.1, 0.05)) == pytest.approx((-0.19, 0.1025))
    assert widen((0.02, 0.05)) == pytest.approx((0.0, 0.1025))
    # Outwards only: 0.9 x 0.88 = 0.792; the high end keeps 1.05 (the error's is < 0).
    assert compound((-0.1, 0.05), (-0.12, -0.06)) == pytest.approx((-0.208, 0.05))
    assert compound((-0.1, 0.05), (-0.2, 0.1)) == pytest.approx((-0.28, 0.155))


def test_a_kind_without_runs_gets_the_plain_range_doubled() -> None:
    low, high, why = _step(PLAIN.with_(recompute="full"))
    assert (low, high) == pytest.approx((1 / 1.1025, 1 / 0.81))
    assert why == ("kind recompute not validated on this profile",)


def test_a_program_not_validated_compounds_its_error_elsewhere() -> None:
    """zero3[deepspeed] was 6-12% fast where validated: the low end 0.9 x 0.88 = 0.792;
    a program that evidence did not run takes `other` (-20%..+10%)."""
    zero3 = Plan.for_strategy("zero3", gpus=8, seq_len=2048)
    low, high, why = _step(zero3)
    assert (low, high) == pytest.approx((1 / 1.05, 1 / 0.792))
    assert why == ("program zero3[deepspeed] not validated on this profile "
                   "(-12%..-6% where validated)",)
    ddp = Plan.for_strategy("ddp", gpus=8, seq_len=2048)
    assert _step(ddp)[:2] == pytest.approx((1 / (1.05 * 1.1), 1 / (0.9 * 0.8)))


def test_a_micro_batch_outside_the_runs_doubles_the_range() -> None:
    low, high, why = _step(PLAIN.with_(micro_batch=8))
    assert (low, high) == pytest.approx((1 / 1.1025, 1 / 0.81))
    assert why == ("micro-batch 8 outside 1-4 validated",)


def test_a_world_beyond_the_validated_one_bounds_its_collectives() -> None:
    """World 16 > 8: collectives up to 20% slow than predicted (residual -20%) take
    1/0.8 - 1 = 25% longer: 0.4 s of them add at most 0.1 s; up to 10% fast (residual
    +10%) save 0.4 x (1 - 1/1.1) = 0.036 s, capped by the 0.05 s the step waited on them.
    1 s: [1/1.05 - 0.0364, 1/0.9 + 0.1]."""
    wide = PLAIN.with_(dp_shard=16)
    low, high, why = _step(wide, collective_s=0.4, exposed_collective_s=0.05)
    assert (low, high) == pytest.approx((1 / 1.05 - 0.4 * (1 - 1 / 1.1), 1 / 0.9 + 0.1))
    assert why == ("world 16 > 8 validated with communication (collectives -20%..+10%)",)
    # The saving is capped by the exposed wait: 0.01 s here.
    assert _step(wide, collective_s=0.4, exposed_collective_s=0.01)[0] == pytest.approx(
        1 / 1.05 - 0.01)
    # The peak memory has no world rule.
    memory = ErrorBands.from_dict(BANDS).interval("peak_memory_bytes", wide, 100.0)
    assert (memory.low, memory.high) == pytest.approx((100 / 1.02, 100.0))
    assert memory.extrapolated == ()


def test_every_rule_that_applies_widens_in_turn() -> None:
    """Offload kind [-20%, +5%], program other (-20%..+10%): [-36%, +15.5%]; micro-batch
    8: doubled, 0.64^2 = 0.4096 and 1.155^2 = 1.334025; world 16 with 1 s of collectives,
    none exposed: +0.25 s at the high end, nothing at the low."""
    plan = Plan.for_strategy("ddp", gpus=16, seq_len=2048, micro_batch=8, offload="optimizer")
    low, high, why = _step(plan, 2.0, collective_s=1.0, exposed_collective_s=0.0)
    assert (low, high) == pytest.approx((2 / 1.334025, 2 / 0.4096 + 0.25))
    assert [w.split(" ")[0] for w in why] == ["program", "micro-batch", "world"]


def test_kinds_programs_and_ranges_from_residuals() -> None:
    assert plan_kind(PLAIN) == "plain"
    assert plan_kind(PLAIN.with_(recompute="full")) == "recompute"
    assert plan_kind(PLAIN.with_(param_dtype="fp32", grad_dtype="fp32", tf32=True)) == "fp32"
    assert plan_kind(PLAIN.with_(offload="params", recompute="full")) == "offload"
    assert program_of(PLAIN) == "fsdp[fsdp2]"
    assert program_of(Plan.for_strategy("fsdp", gpus=8, impl="fsdp1", seq_len=2048)) == \
        "fsdp[fsdp1]"
    assert program_of(Plan(strategy="fsdp", dp_shard=2, tp=2, pp=2, seq_len=2048)) == \
        "fsdp[fsdp2]+tp+pp"
    rows = [{"kind": "plain", "communication": False, "step_time_s": -0.031,
             "peak_memory_bytes": 0.0},
            {"kind": "plain", "communication": False, "step_time_s": 0.049,
             "peak_memory_bytes": 0.01},
            {"kind": "offload", "communication": False, "step_time_s": -0.2,
             "peak_memory_bytes": 0.0},
            {"kind": "recompute", "communication": True, "step_time_s": -0.3}]
    # Rounded outwards to 0.1%; a kind's range includes the plain runs and the runs with
    # communication; a kind has an entry only with runs of its own.
    assert band_ranges(rows, "step_time_s") == {
        "plain": (-0.3, 0.049), "recompute": (-0.3, 0.049), "offload": (-0.3, 0.049)}
    assert band_ranges(rows[:3], "step_time_s") == {
        "plain": (-0.031, 0.049), "offload": (-0.2, 0.049)}
    assert set(band_ranges(rows, "peak_memory_bytes")) == {"plain", "offload"}
    with pytest.raises(ConfigError):
        band_ranges(rows[2:], "step_time_s")


def test_to_dict_and_from_dict_round_trip() -> None:
    assert ErrorBands.from_dict(BANDS).to_dict() == BANDS


def _changed(path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(BANDS)
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return out


@pytest.mark.parametrize(("path", "value", "field"), [
    ("step_time_s.kinds", {"offload": [0, 1]}, "error_bands.step_time_s.kinds"),
    ("step_time_s.kinds.plain", [5, 1], "error_bands.step_time_s.kinds.plain"),
    ("step_time_s.kinds.typo", [0, 1], "error_bands.step_time_s.kinds.typo"),
    ("step_time_s.world_size", 0, "error_bands.step_time_s.world_size"),
    ("step_time_s.world_size", None, "error_bands.step_time_s.world_size"),
    ("peak_memory_bytes.world_size", 8, "error_bands.peak_memory_bytes.world_size"),
    ("step_time_s.micro_batches", [4, 1], "error_bands.step_time_s.micro_batches"),
    ("step_time_s.program_errors", {"zero3[deepspeed]": [0, 1]},
     "error_bands.step_time_s.program_errors"),
    ("collectives", [-100, 0], "error_bands.collectives"),
    ("runs", 0, "error_bands.runs"),
    ("evidence", [], "error_bands.evidence"),
    ("extra", 1, "error_bands.extra"),
])
def test_bad_bands_name_the_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        ErrorBands.from_dict(_changed(path, value))
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
    # hgx-h200's runs had no communication: 8 GPUs are beyond them.
    assert r["step_time_band_extrapolated"] == [
        "world 8 > 1 validated with communication (collectives -29%..+3%)"]
    assert "h200-fsdp2-runs.yaml" in r["step_time_band_source"]
    assert ("zsim calibrate bands --profile hgx-h200"
            in r["step_time_band_source"])
    assert "%..+" in _zsim("simulate", *args)
    # dgx-a100's evidence ran FSDP1 at micro-batches 6-18 up to 128 GPUs.
    a100 = json.loads(_zsim("simulate", "--model", "1.3b", "--gpus", "8", "--hardware",
                            "dgx-a100", "--strategy", "fsdp", "--format", "json"))
    assert a100["step_time_band_extrapolated"] == [
        "program fsdp[fsdp2] not validated on this profile (+0%..+0% where validated)",
        "micro-batch 1 outside 6-18 validated"]
    ranked = json.loads(_zsim("plan", *args[:-2], "--format", "json"))["candidates"]
    assert all(c["step_time_band_pct"] for c in ranked if c["step_time_s"] is not None)
