"""`zsim report` end to end on the toy scenario: the chosen figures as SVG (no PNG), the
markdown showing them, `--set` and `--all`; bad report settings are one line naming the
file, field and value, exit code 2, with nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from zsim import api
from zsim.cli import app
from zsim.errors import ConfigError
from zsim.report.files import FIGURES
from zsim.scenario import REPORT_FIGURES, scenario_from_dict


def report(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["report", *args])
    return result.exit_code, result.stdout, result.stderr


REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_studies_are_the_repositorys_scenarios() -> None:
    """In a checkout's (editable) install, the shipped studies are scenarios/*.yaml: the
    repository's folder is their one source (the installed copy is checked by
    tests/cli/test_output_locations.py)."""
    assert api.shipped_scenarios() == sorted((REPO / "scenarios").glob("*.yaml"))


def test_every_report_figure_has_a_file_name_and_caption() -> None:
    assert list(FIGURES) == list(REPORT_FIGURES)


def test_report_writes_the_chosen_figures_as_svg(toy_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = report(
        "--scenario", str(toy_path), "--out", str(out),
        "--set", "report.figures=[pareto, heatmap, gantt]",
        "--set", "report.heatmap={x: gpus, y: plan_name, value: mfu}",
        "--set", "report.gantt=hsdp")
    assert code == 0, stderr
    stems = ["toy-pareto", "toy-heatmap", "toy-gantt"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["toy.csv", "toy.md", *(f"{s}.svg" for s in stems)])
    md = (out / "toy.md").read_text()
    for stem in stems:
        assert f"]({stem}.svg)" in md
    assert stdout.splitlines()[0] == f"wrote {out / 'toy.csv'}"
    assert "toy [3/3] ddp-huge" in stderr


def test_all_regenerates_every_shipped_scenario_from_any_folder(
        toy_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--all takes the shipped studies from the installed package (here stood in for by
    two toy scenarios), not from a scenarios/ folder under the working folder, which
    was once found missing when run outside the repository."""
    (tmp_path / "shipped").mkdir()
    shipped = []
    for name in ("one", "two"):
        data = dict(yaml.safe_load(toy_path.read_text()), name=name,
                    plans={"fsdp": {"strategy": "fsdp"}})
        shipped.append(tmp_path / "shipped" / f"{name}.yaml")
        shipped[-1].write_text(yaml.safe_dump(data))
    monkeypatch.setattr(api, "shipped_scenarios", lambda: shipped)
    monkeypatch.chdir(tmp_path / "shipped")
    code, _, stderr = report("--all", "--out", str(tmp_path / "reports"))
    assert code == 0, stderr
    assert {p.name for p in (tmp_path / "reports").iterdir()} == {
        f"{n}{suffix}" for n in ("one", "two")
        for suffix in (".csv", ".md", "-step-time.svg", "-memory.svg", "-memory-curve.svg")}


@pytest.mark.parametrize(("override", "message"), [
    ("report.figures=[pareto, sankey]", "report.figures[1]='sankey': unknown figure"),
    ("report.figures=[heatmap]", "report.heatmap=None: must be a mapping"),
    ("report.heatmap={x: gpus, y: plan_name}", "report.heatmap.value=None: missing"),
    ("report.gantt=zero9", "report.gantt='zero9': no such run"),
    ("report.heatmap={x: gpuz, y: plan_name, value: mfu}",
     "report.heatmap.x='gpuz': not a column of the sweep frame"),
    ("report.gantt=ddp-huge", "report.gantt='ddp-huge': not simulated"),
])
def test_bad_report_settings_are_one_line_and_exit_2(toy_path: Path, tmp_path: Path,
                                                     override: str, message: str) -> None:
    figures = "report.figures=[gantt, heatmap]" if "gantt" in override else \
        "report.figures=[heatmap]" if "heatmap=" in override else None
    args = ["--scenario", str(toy_path), "--out", str(tmp_path / "o"), "--set", override]
    if figures and figures != override:
        args += ["--set", figures]
    if "gantt" in override:
        args += ["--set", "report.heatmap={x: gpus, y: plan_name, value: mfu}"]
    code, stdout, stderr = report(*args)
    assert (code, stdout) == (2, "")
    errors = [line for line in stderr.splitlines() if not line.startswith("toy [")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {message}")
    # The file, or the --set that gave the value.
    assert errors[0].endswith((f"(in {toy_path})", f"(--set {override.split('=')[0]})"))
    assert not (tmp_path / "o").exists()


def test_two_scenarios_of_one_name_are_refused(toy_path: Path, tmp_path: Path) -> None:
    code, _, stderr = report("--scenario", str(toy_path), "--scenario", str(toy_path),
                             "--out", str(tmp_path / "o"))
    assert code == 2 and stderr.startswith("error: name='toy': in ")
    assert not (tmp_path / "o").exists()


def test_no_scenario_is_an_error(tmp_path: Path) -> None:
    code, _, stderr = report("--out", str(tmp_path / "o"))
    assert code == 2 and "give at least one --scenario" in stderr


@pytest.mark.parametrize(("report_settings", "field", "value"), [
    ({"figures": "pareto"}, "report.figures", "pareto"),
    ({"figures": ["pareto", "pareto"]}, "report.figures[1]", "pareto"),
    ({"heatmap": {"x": "gpus", "y": 3, "value": "mfu"}}, "report.heatmap.y", 3),
    ({"heatmap": {"x": "gpus", "y": "plan_name", "value": "mfu", "plan": "ddp"}},
     "report.heatmap.plan", "ddp"),
    ({"heatmap": {"x": "gpus", "y": "plan_name", "value": "mfu", "z": 1}},
     "report.heatmap.z", 1),
])
def test_report_settings_are_checked_when_loaded(
        report_settings: dict[str, Any], field: str, value: object, toy_path: Path) -> None:
    data = dict(yaml.safe_load(toy_path.read_text()), report=report_settings)
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(data, base_dir=toy_path.parent)
    assert (e.value.field, e.value.value) == (field, value)
