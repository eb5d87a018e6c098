"""Suite-wide test settings: hypothesis profiles and the published cases of tests/data/cases
(cases_dir, published_cases). Other fixtures live in each folder's conftest.py.

`ci` is deterministic (derandomized, no deadline) and is loaded when the CI environment
variable is set; `dev` draws fresh random examples, fewer of them, for quick local runs.
"""

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=50)
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

REPO = Path(__file__).resolve().parents[1]
"""The repository root."""


CASES_DIR = REPO / "tests" / "data" / "cases"
"""The validation cases, copied into the repository (tests/data/cases/README.md)."""


@pytest.fixture(scope="session")
def cases_dir() -> Path:
    """The folder holding published.yaml, h200-microbench.yaml and h200-fsdp2-runs.yaml
    ($ZSIM_CASES_DIR to test against another copy)."""
    return Path(os.environ.get("ZSIM_CASES_DIR", CASES_DIR))


@pytest.fixture(scope="session")
def published_cases(cases_dir: Path) -> dict[str, dict[str, Any]]:
    """published.yaml cases by id."""
    data = yaml.safe_load((cases_dir / "published.yaml").read_text())
    return {c["id"]: c for c in data["cases"]}
