"""Suite-wide test settings: hypothesis profiles, the published cases of tests/data/cases
(cases_dir, published_cases) and the session's real runs that tests/backend and
tests/validation share (real_runs, _runs.py). Other fixtures live in each folder's
conftest.py.

`ci` is deterministic (derandomized, no deadline) and is loaded when the CI environment
variable is set; `dev` draws fresh random examples, fewer of them, for quick local runs.

The suite runs on two pytest-xdist workers, a test file at a time (pyproject.toml's
addopts: --dist loadfile), so that a module's fixtures are built once and its tests share
the real runs they measure. `pytest -n 0` runs everything in one process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from hypothesis import settings

if TYPE_CHECKING:
    from _runs import RealRuns

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # A worker's share of the cores for torch's and numba's thread pools (read when they
    # start, after this): two workers each spinning a pool of every core's threads slow
    # each other's in-process runs down four times over.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(
        1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

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


@pytest.fixture(scope="session")
def real_runs() -> RealRuns:
    """The session's real runs (_runs.py), each measured once for all the tests of this
    test process that check something on it, in tests/backend and tests/validation alike."""
    pytest.importorskip("torch")
    from _runs import RealRuns  # imports torch

    return RealRuns()
