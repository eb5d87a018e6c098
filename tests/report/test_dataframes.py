"""sweep_frame: one row per run with unit-suffixed columns whose values are the Result's
(converted by hand here), and a CSV that is byte-identical on regeneration."""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import pytest

from zsim.report.dataframes import csv_text, memory_curve_frame, sweep_frame
from zsim.result import Result
from zsim.scenario import Run, load_scenario, simulate_runs

UNIT_SUFFIXES = ("_s", "_gib", "_mib", "_per_s", "_per_gpu")
SETTINGS = {"run", "plan_name", "plan", "strategy", "impl", "gpus", "dp_shard", "dp_replicate",
            "seq_len", "micro_batch", "grad_accum", "recompute", "unit_size", "prefetch",
            "param_dtype",
            "fits", "evaluated", "oom", "peak_op", "mfu"}


def test_one_row_per_run_with_the_results_values(
        toy_pairs: list[tuple[Run, Result]]) -> None:
    frame = sweep_frame(toy_pairs)
    assert list(frame["run"]) == ["fsdp", "hsdp", "ddp-huge"]
    assert list(frame["evaluated"]) == ["simulated", "simulated", "closed form"]
    for (run, r), row in zip(toy_pairs, frame.to_dict(orient="records"), strict=True):
        assert row["peak_memory_gib"] * 2**30 == pytest.approx(r.peak_memory_bytes)
        assert row["fits"] is r.fits
        assert row["plan_name"] == run.plan_name
        # dgx-h100's NDR 400G NIC: 50 GB/s per GPU (hardware_profiles/dgx-h100.yaml).
        assert row["inter_node_gb_per_s"] == 50.0
        assert row["oom"] == (r.oom or "")
        if r.step_time_s is None:  # not simulated: no time figures, empty in the CSV
            assert all(math.isnan(row[c]) for c in ("step_time_s", "exposed_comm_s",
                                                     "all_gather_busy_s", "tokens_per_s"))
            continue
        assert row["step_time_s"] == r.step_time_s
        assert row["exposed_comm_s"] == r.exposed_comm_s
        # Job tokens/s by hand: sequences x tokens x data-parallel ranks / step time.
        p = run.plan
        tokens = p.micro_batch * p.grad_accum * p.seq_len * p.dp_shard * p.dp_replicate
        assert row["tokens_per_s"] == pytest.approx(tokens / r.step_time_s, rel=1e-12)
        # What is live at the peak adds up to the peak.
        at_peak = sum(v for k, v in row.items() if k.startswith("at_peak_"))
        assert at_peak == pytest.approx(row["peak_memory_gib"], rel=1e-12)
        assert row["hbm_gib"] == pytest.approx(79.1)
    assert list(frame["fits"]) == [True, True, False]


def test_columns_are_snake_case_with_units(toy_pairs: list[tuple[Run, Result]]) -> None:
    for column in sweep_frame(toy_pairs).columns:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", column), column
        assert column in SETTINGS or column.endswith(UNIT_SUFFIXES), column


def test_csv_is_byte_identical_on_regeneration(toy_path: Path) -> None:
    first = csv_text(sweep_frame(simulate_runs(load_scenario(toy_path))))
    second = csv_text(sweep_frame(simulate_runs(load_scenario(toy_path))))
    assert first == second
    rows = list(csv.DictReader(io.StringIO(first)))
    assert [r["run"] for r in rows] == ["fsdp", "hsdp", "ddp-huge"]
    assert first.endswith("\n") and "\r" not in first


def test_memory_curve_frame_holds_the_named_curves(
        toy_pairs: list[tuple[Run, Result]]) -> None:
    curves = memory_curve_frame({run.name: r.memory_curve for run, r in toy_pairs},
                                ["hsdp", "fsdp"])
    assert list(curves["run"].unique()) == ["hsdp", "fsdp"]
    fsdp = next(r for run, r in toy_pairs if run.name == "fsdp")
    points = curves[curves["run"] == "fsdp"]
    assert list(points["time_s"]) == [t for t, _ in fsdp.memory_curve]
    assert max(points["allocated_gib"]) * 2**30 == pytest.approx(fsdp.peak_memory_bytes)
