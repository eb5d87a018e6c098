"""zsim.calibration.storage_bench on this machine's disk: positive, finite figures of a
fixed structure, a 4x larger file takes longer to write, and the stream figures save,
load and clone what they say."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import pytest

from zsim.calibration.storage_bench import StorageFigures, measure_storage, measure_streams
from zsim.units import MiB


def test_figures_are_positive_and_finite(tmp_path: Path) -> None:
    figures = measure_storage(tmp_path, file_bytes=2 * MiB, files=2, threads=2,
                              small_files=8)
    assert [f.name for f in fields(figures)] == [f.name for f in fields(StorageFigures)]
    for name in ("write_bytes_per_s", "read_bytes_per_s", "cold_read_bytes_per_s",
                 "file_create_s", "write_s", "read_s"):
        value = getattr(figures, name)
        assert math.isfinite(value) and value > 0, name
    assert (figures.file_bytes, figures.files, figures.threads, figures.fsync) == \
        (2 * MiB, 2, 2, True)
    assert list(tmp_path.iterdir()) == []  # every file removed


def test_four_times_the_bytes_take_longer(tmp_path: Path) -> None:
    small = measure_storage(tmp_path, file_bytes=4 * MiB, files=1, repeats=5, small_files=1)
    large = measure_storage(tmp_path, file_bytes=16 * MiB, files=1, repeats=5, small_files=1)
    assert large.write_s > small.write_s


def test_rejects_more_threads_than_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        measure_storage(tmp_path, files=1, threads=2)


def test_streams_save_and_load_items_and_leave_nothing(tmp_path: Path) -> None:
    figures = measure_streams(tmp_path, tensor_bytes=8 * MiB, item_bytes=2 * MiB, repeats=1)
    for name in ("save_bytes_per_s", "buffered_save_bytes_per_s", "load_bytes_per_s",
                 "stage_bytes_per_s", "copy_bytes_per_s"):
        value = getattr(figures, name)
        assert math.isfinite(value) and value > 0, name
    assert (figures.tensor_bytes, figures.item_bytes) == (8 * MiB, 2 * MiB)
    assert list(tmp_path.iterdir()) == []


def test_streams_reject_an_item_larger_than_the_tensor(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        measure_streams(tmp_path, tensor_bytes=MiB, item_bytes=2 * MiB)
