"""zsim.cores.usable_cores: the affinity mask where the OS has one, else every core."""

from __future__ import annotations

import os

import pytest

from zsim import cores


def test_the_affinity_mask_bounds_the_cores() -> None:
    assert 1 <= cores.usable_cores() <= (os.cpu_count() or 1)


def test_without_an_affinity_mask_every_core_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert cores.usable_cores() == 7
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert cores.usable_cores() == 1
