"""The committed reports of the shipped studies (reports/<name>.*, one per
scenarios/*.yaml) are what `zsim report --all --out reports` generates today: if the
simulator changes, this fails until they are regenerated, so no report can go stale. Also
checks the card's memory table (the 7B/64 study) against the card's closed form by hand.

Regenerating every shipped study here takes about 20 s (figures included)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from zsim.report.dataframes import sweep_frame
from zsim.report.files import report_files
from zsim.scenario import load_scenario, simulate_runs, simulate_timeline

REPO = Path(__file__).resolve().parents[2]
REGENERATE = "zsim report --all --out reports"
SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))


@pytest.fixture(scope="module")
def fresh() -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for path in SHIPPED:
        scenario = load_scenario(path)
        pairs = simulate_runs(scenario)
        files |= report_files(scenario, sweep_frame(pairs),
                              {run.name: r.memory_curve for run, r in pairs},
                              timeline=simulate_timeline(scenario))
    return files


def test_the_shipped_studies_are_there() -> None:
    assert {p.stem for p in SHIPPED} >= {
        "card-7b-64-memory", "seed-13b-128", "scaling-7b-8-4096", "hsdp-vs-fsdp-bandwidth",
        "seq-vs-recompute", "sweep-13b-128-unit-prefetch"}


def test_committed_numbers_match_a_fresh_regeneration(fresh: dict[str, bytes]) -> None:
    stale = [name for name in fresh if name.endswith((".csv", ".md"))
             and (not (REPO / "reports" / name).is_file()
                  or (REPO / "reports" / name).read_bytes() != fresh[name])]
    assert not stale, f"stale or missing: {stale}; run `{REGENERATE}`"


def test_every_figure_is_committed_and_linked(fresh: dict[str, bytes]) -> None:
    for name in fresh:
        assert (REPO / "reports" / name).is_file(), f"reports/{name}: run `{REGENERATE}`"
        if name.endswith(".svg"):
            report = name.split("-")[0]
            md = next(fresh[m].decode() for m in fresh
                      if m.endswith(".md") and name.startswith(m[:-3] + "-"))
            assert f"]({name})" in md, (report, name)


def test_no_figure_or_table_is_left_over(fresh: dict[str, bytes]) -> None:
    """A figure a scenario no longer draws (or a study removed) leaves no file behind."""
    generated = [p.name for p in (REPO / "reports").iterdir()
                 if p.suffix in (".png", ".svg", ".csv", ".md") and p.is_file()]
    assert sorted(set(generated) - set(fresh)) == []


def test_reports_are_small_and_hold_no_png() -> None:
    """Issue 37: reports/ (the studies and the validation evidence) stays under 4 MiB, and
    holds no PNG: every figure is an SVG its command regenerates from committed data."""
    files = [p for p in (REPO / "reports").rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix == ".png"]
    assert sum(p.stat().st_size for p in files) < 4 * 2**20


def test_card_memory_table_is_the_cards_closed_form() -> None:
    """The card: 7B on 64 GPUs -> DDP 112 GB, ZeRO-1 ~29 GB, ZeRO-2 ~15.5 GB, ZeRO-3 ~1.75
    GB; by hand, 16, 4 + 12/64, 2 + 14/64 and 16/64 bytes per parameter times 7.0e9."""
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO(
        (REPO / "reports" / "card-7b-64-memory.csv").read_text()))}
    by_hand = {"ddp": 16, "zero1": 4 + 12 / 64, "zero2": 2 + 14 / 64, "zero3": 16 / 64,
               "fsdp": 16 / 64}
    card = {"ddp": 112, "zero1": 29, "zero2": 15.5, "zero3": 1.75, "fsdp": 1.75}
    for run, bytes_per_param in by_hand.items():
        gb = float(rows[run]["closed_form_model_state_gib"]) * 2**30 / 1e9
        assert gb == pytest.approx(bytes_per_param * 7.0, rel=1e-5)
        assert gb == pytest.approx(card[run], rel=0.02)
    assert rows["ddp"]["fits"] == "False"


def test_the_goodput_study_says_what_its_prose_claims() -> None:
    """The 405B study's prose (scenarios/goodput-405b-16384.template.md) claims that
    DeepSpeed's per-rank files keep more of the day than DCP's plans, whose first write
    after each restart stretches their interval, and that FSDP1's lead over ZeRO-3
    shrinks from tokens per second to tokens per day."""
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO(
        (REPO / "reports" / "goodput-405b-16384.csv").read_text()))}
    zero3, fsdp1 = rows["zero3"], rows["fsdp1"]
    assert zero3["run_checkpoint"] == "deepspeed"
    assert all(rows[r]["run_checkpoint"] == "dcp-async" for r in ("fsdp2-tp8", "fsdp2",
                                                                   "fsdp1"))
    for dcp in ("fsdp2-tp8", "fsdp2", "fsdp1"):
        assert float(rows[dcp]["run_goodput"]) < float(zero3["run_goodput"])
        assert float(rows[dcp]["run_checkpoint_interval_min"]) > 10 * float(
            zero3["run_checkpoint_interval_min"])
    per_s = float(fsdp1["tokens_per_s"]) / float(zero3["tokens_per_s"])
    per_day = float(fsdp1["run_tokens_per_day"]) / float(zero3["run_tokens_per_day"])
    assert 1 < per_day < per_s
