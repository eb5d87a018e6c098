"""Suite-wide test settings: hypothesis profiles and the published cases of shared/cases
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
