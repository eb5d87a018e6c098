"""Fixtures for the spec tests: the published cases folder and a writer for profile YAML."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _cases_dir() -> Path | None:
    """shared/cases: $ZSIM_CASES_DIR, else shared/ inside or beside the checkout."""
    candidates = [Path(os.environ["ZSIM_CASES_DIR"])] if "ZSIM_CASES_DIR" in os.environ else []
    candidates += [REPO / "shared" / "cases", REPO.parent / "shared" / "cases"]
    return next((c for c in candidates if (c / "published.yaml").is_file()), None)


@pytest.fixture(scope="session")
def cases_dir() -> Path:
    """The folder holding published.yaml and h200-microbench.yaml (skip when absent)."""
    found = _cases_dir()
    if found is None:
        pytest.skip("shared/cases not found; set ZSIM_CASES_DIR")
    return found


@pytest.fixture(scope="session")
def published_cases(cases_dir: Path) -> dict[str, dict[str, Any]]:
    """published.yaml cases by id."""
    data = yaml.safe_load((cases_dir / "published.yaml").read_text())
    return {c["id"]: c for c in data["cases"]}


@pytest.fixture
def write_yaml(tmp_path: Path) -> Callable[[Any, str], Path]:
    """Write a Python structure as YAML into tmp_path and return the file's path."""

    def write(data: Any, name: str = "profile.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
