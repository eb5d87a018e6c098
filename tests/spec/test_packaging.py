"""pyproject.toml lists zsim's packages by hand (the hardware profiles and the shipped
studies with their report templates install from the top-level hardware_profiles/ and
scenarios/ folders as zsim.hardware_profiles and zsim.scenarios): the list must name every
package under zsim/, and the data packages' files every file a shipped study reads, or an
installed zsim misses it. reports/ is generated output, no package."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parents[2]


def test_every_package_under_zsim_is_listed() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(REPO).parts)
               for p in (REPO / "zsim").rglob("__init__.py")}
    data = {"zsim.hardware_profiles": "hardware_profiles", "zsim.scenarios": "scenarios"}
    assert set(config["packages"]) == on_disk | set(data) | {"zsim.scenarios.configs"}
    assert config["package-dir"] == data  # zsim.scenarios.configs: scenarios/configs
    for folder in data.values():
        assert (REPO / folder / "__init__.py").is_file()


def test_every_file_a_shipped_study_reads_is_package_data() -> None:
    """Each scenario's template, ds_config and fsdp_config (relative to the scenario, as
    zsim.scenario resolves them) lies in a data package and matches its package-data
    patterns, so that the installed studies find them beside the installed scenario."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {REPO / "hardware_profiles": "zsim.hardware_profiles",
               REPO / "scenarios": "zsim.scenarios",
               REPO / "scenarios" / "configs": "zsim.scenarios.configs"}
    scenarios = sorted((REPO / "scenarios").glob("*.yaml"))
    read = list(scenarios)
    for path in scenarios:
        data = yaml.safe_load(path.read_text())
        template = (data.get("report") or {}).get("template")
        read += [path.parent / template] if template else []
        read += [path.parent / plan[key] for plan in (data.get("plans") or {}).values()
                 for key in ("ds_config", "fsdp_config") if key in (plan or {})]
    # Every template lies beside its scenario, in the studies' own package.
    assert any(p.name.endswith(".template.md") for p in read)
    assert all(p.resolve().parent == REPO / "scenarios"
               for p in read if p.name.endswith(".template.md"))
    assert any(p.parent.name == "configs" for p in read)
    for file in read:
        package = folders[file.resolve().parent]
        patterns = config["package-data"][package]
        assert any(fnmatch.fnmatch(file.name, p) for p in patterns), (file, patterns)


def test_ci_runs_the_readmes_test_command_in_a_fresh_venv() -> None:
    """CI once ran its own install (into the machine's python3, upgrading pip) where
    a user runs the README's; now .ci/run makes a new virtual environment of python3 with
    the pip it comes with and runs the Quickstart's test command, verbatim."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Quickstart")
    quickstart = readme[start:readme.index("\n## ", start)]
    commands = [block.strip() for block in quickstart.split("```bash")[1:]]
    commands = [c[:c.index("```")].strip() for c in commands]
    assert commands == ["pip install -e . && zsim plan --model 13b --gpus 128",
                        "pip install -e '.[test]' && pytest"]
    assert "python3 -m venv .venv && . .venv/bin/activate" in " ".join(quickstart.split())
    lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
             if line and not line.startswith("#")]
    assert lines[-2:] == ['python3 -m venv "$venv" && . "$venv/bin/activate"', commands[1]]
    assert not any(re.search(r"\bpip\b", line) for line in lines[:-1])  # no other install
