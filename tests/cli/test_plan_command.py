"""`zsim plan` end to end through typer's CliRunner: the table, JSON and CSV renderings
of one ranking, the recommended plan, and determinism."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import pytest
from typer.testing import CliRunner

from zsim.cli import app

PLAN_13B_128 = ["plan", "--model", "13b", "--gpus", "128"]

LABEL_KEYS = {"plan", "layout", "strategy", "impl", "recompute", "evaluated", "tier", "why",
              "step_time_band_pct", "step_time_band_extrapolated", "step_time_band_source"}
"""Text columns (no unit; the error band as text, e.g. "-5%..+13%", in percent, why it is
widened and where it comes from)."""
DIMENSIONLESS_KEYS = {"dp_shard", "dp_replicate", "ep", "micro_batch", "grad_accum", "fits", "mfu",
                      "yours"}
"""Counts, a flag and a fraction: no unit to name."""
UNITS = ("gib", "gb", "bytes", "s", "flops", "model_sizes")
"""Units zsim names in keys (units are part of a name), as whole words: `peak_gib`,
`comm_gib_per_step`, `tokens_per_s`; `model_sizes` counts multiples of S."""


def invoke(args: list[str]) -> Any:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result


@pytest.fixture(scope="module")
def ranking() -> dict[str, Any]:
    return json.loads(invoke([*PLAN_13B_128, "--format", "json"]).stdout)


def table_rows(out: str) -> list[str]:
    """The 1-D table's data rows of `zsim plan`'s text answer."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("#  "))
    assert lines[header + 1].split() == ["GiB", "GiB", "GiB", "GiB", "s", "%", "/GPU"]
    assert set(lines[header + 2]) <= {"-", " "}
    end = lines.index("", header)
    return lines[header + 3:end]


def test_table_shows_ranked_plans_and_a_recommendation(ranking: dict[str, Any]) -> None:
    out = invoke(PLAN_13B_128).stdout
    # Fits a 120-column terminal, whatever the row (the reasons are on their own lines).
    assert max(len(line) for line in out.splitlines()) <= 120
    rows = table_rows(out)
    assert len(rows) == len(ranking["candidates"])
    recommended = ranking["recommended"]
    assert recommended is not None
    # Row n: its number, its tier's mark and its layout, then ac and mb x ga.
    for n, (row, cand) in enumerate(zip(rows, ranking["candidates"], strict=True), start=1):
        mark = {"recommended": ">", "tied": "="}.get(cand["tier"])
        words = row.split()
        assert words[0] == str(n)
        assert words[1:3] == [mark, cand["layout"]] if mark else words[1] == cand["layout"]
        assert f"  {cand['recompute']}  " in row
        assert f"{cand['micro_batch']} x {cand['grad_accum']}" in row
    assert ranking["candidates"][0]["plan"] == recommended
    # Each row's reason, numbered, below the tables; the one recommendation last.
    lines = out.splitlines()
    why = lines.index("why:")
    assert lines[why + 1].split()[:2] == ["1", "recommended:"]
    last = lines.index("", why)
    assert lines[last + 1].startswith(f"recommended: {recommended}, 1 micro-batch per step "
                                      f"(1-D table): ")


def test_json_candidates_name_their_units(ranking: dict[str, Any]) -> None:
    assert ranking["gpus"] == 128
    assert len(ranking["candidates"]) > 1
    for candidate in ranking["candidates"]:
        for key, value in candidate.items():
            if key in LABEL_KEYS or key in DIMENSIONLESS_KEYS:
                continue
            # None: a time of a plan pruned by the closed form (never simulated).
            assert value is None or isinstance(value, (int, float)), key
            words = key.split("_")
            assert any(unit.split("_") == words[i:i + len(unit.split("_"))]
                       for unit in UNITS for i in range(len(words))), f"{key}: no unit"


def test_recommended_plan_fits_and_ranks_first(ranking: dict[str, Any]) -> None:
    first = ranking["candidates"][0]
    assert first["plan"] == ranking["recommended"]
    assert ranking["recommended_table"] == "1-D"
    assert first["fits"] is True and first["tier"] == "recommended"
    assert first["peak_gib"] <= first["hbm_gib"]
    assert first["why"] == f"recommended: {ranking['recommendation']}"
    fitting = [c for c in ranking["candidates"] if c["fits"]]
    assert ranking["candidates"][:len(fitting)] == fitting  # every fitting plan first
    # The plans tied with the fastest next to the recommended one, then the rest by speed.
    tied = [c for c in fitting if c["tier"] == "tied"]
    rest = fitting[1 + len(tied):]
    assert fitting[1:1 + len(tied)] == tied
    assert all(c["tier"] == "" for c in rest)
    speeds = [c["tokens_per_s"] for c in rest]
    assert speeds == sorted(speeds, reverse=True)
    for loser in ranking["candidates"][1:]:
        assert loser["why"] and "\n" not in loser["why"]
        if not loser["fits"]:
            assert loser["peak_gib"] > loser["hbm_gib"]
            assert loser["why"].startswith("does not fit")


def test_peak_is_the_sum_of_its_categories(ranking: dict[str, Any]) -> None:
    categories = ("params", "grads", "master_params", "optimizer_states", "gathered_params",
                  "gathered_grads", "activations", "comm_buffers", "workspace")
    for c in ranking["candidates"]:
        total = sum(c[f"at_peak_{cat}_gib"] for cat in categories)
        assert c["peak_gib"] == pytest.approx(total, abs=0.01), c["plan"]


def test_csv_parses_to_the_same_ranking(ranking: dict[str, Any]) -> None:
    text = invoke([*PLAN_13B_128, "--format", "csv"]).stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(ranking["candidates"])
    assert list(rows[0]) == list(ranking["candidates"][0])
    assert [r["plan"] for r in rows] == [c["plan"] for c in ranking["candidates"]]
    for row, cand in zip(rows, ranking["candidates"], strict=True):
        assert float(row["peak_gib"]) == cand["peak_gib"]


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_output_is_byte_identical_across_runs(fmt: str) -> None:
    args = [*PLAN_13B_128, "--format", fmt]
    assert invoke(args).stdout_bytes == invoke(args).stdout_bytes


def test_table_numbers_are_plain() -> None:
    # no float noise such as 0.30000000000000004 in the terminal table
    assert not re.search(r"\d\.\d{6,}", invoke(PLAN_13B_128).stdout)
