"""The committed seed report (reports/seed-13b-128.*) is what `zsim sweep --scenario
scenarios/seed-13b-128.yaml --out reports` generates today: if the simulator changes,
this fails until the report is regenerated, so the report cannot go stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from zsim.report.build import report_files
from zsim.report.frame import sweep_frame
from zsim.scenario import load_scenario, simulate_runs

REPO = Path(__file__).resolve().parents[2]
REGENERATE = "zsim sweep --scenario scenarios/seed-13b-128.yaml --out reports"


@pytest.fixture(scope="module")
def fresh() -> dict[str, bytes]:
    scenario = load_scenario(REPO / "scenarios" / "seed-13b-128.yaml")
    pairs = simulate_runs(scenario)
    return report_files(scenario, sweep_frame(pairs),
                        {run.name: r.memory_curve for run, r in pairs})


@pytest.mark.parametrize("name", ["seed-13b-128.csv", "seed-13b-128.md"])
def test_committed_report_matches_a_fresh_regeneration(fresh: dict[str, bytes],
                                                       name: str) -> None:
    committed = (REPO / "reports" / name).read_bytes()
    assert committed == fresh[name], f"reports/{name} is stale: run `{REGENERATE}`"


def test_every_generated_file_is_committed(fresh: dict[str, bytes]) -> None:
    for name in fresh:
        assert (REPO / "reports" / name).is_file(), f"run `{REGENERATE}`"
    md = fresh["seed-13b-128.md"].decode()
    for name in fresh:
        if name.endswith(".png"):
            assert f"]({name})" in md
