"""Fixtures for the calibrate tests: the session's real runs, each measured once for all
the tests that check something on it (_runs.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _runs import RealRuns


@pytest.fixture(scope="session")
def real_runs() -> RealRuns:
    """The session's real runs, shared by the tests that measure the same one."""
    pytest.importorskip("torch")
    from _runs import RealRuns  # imports torch

    return RealRuns()
