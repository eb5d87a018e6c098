"""Fixtures for the spec tests: a writer for profile YAML (the published cases fixtures
are suite-wide, in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml


@pytest.fixture
def write_yaml(tmp_path: Path) -> Callable[[Any, str], Path]:
    """Write a Python structure as YAML into tmp_path and return the file's path."""

    def write(data: Any, name: str = "profile.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
