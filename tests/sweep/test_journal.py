"""The journal keeps whole lines only: a torn tail (a kill mid-write, a full disk) is
dropped and cut off, so the next append starts on its own line; a repeated id keeps its
first entry; a failed write is one ConfigError naming the file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from zsim.errors import ConfigError
from zsim.journal import Journal, read_journal


def entry(i: int) -> dict[str, object]:
    return {"id": f"id{i}", "row": {"run": f"r{i}", "step_time_s": i / 3, "fits": i % 2 == 0,
                                    "mfu": None}, "curve": None}


def test_entries_come_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    assert read_journal(path) == {}
    with Journal(path) as j:
        j.append([entry(0), entry(1)])
        j.append([entry(2)])
    assert read_journal(path) == {f"id{i}": entry(i) for i in range(3)}


def test_a_torn_tail_is_dropped_and_cut_so_appends_start_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        j.append([entry(0), entry(1)])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"id":"id2","row":{"run":"r')  # killed mid-write
    assert read_journal(path) == {"id0": entry(0), "id1": entry(1)}
    assert path.read_bytes() == whole
    with Journal(path) as j:
        j.append([entry(2)])
    assert list(read_journal(path)) == ["id0", "id1", "id2"]


def test_broken_lines_are_dropped_and_a_repeated_id_keeps_its_first_entry(
        tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        j.append([entry(0)])
    with open(path, "ab") as f:
        f.write(b'not json\n["a list"]\n{"id": 3, "row": {}}\n')
    later = {**entry(0), "row": {"run": "other"}}
    with Journal(path) as j:
        j.append([later, entry(1)])
    assert read_journal(path) == {"id0": entry(0), "id1": entry(1)}


def test_a_full_disk_is_one_error_and_leaves_only_whole_lines_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        j.append([entry(0)])
    real_write = os.write
    calls: list[int] = []

    def full_disk(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:10]))  # a short write, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_disk)
    with Journal(path) as j, pytest.raises(ConfigError) as info:
        j.append([entry(1), entry(2)])
    monkeypatch.undo()
    assert str(info.value) == f"out='{path}': cannot write the journal (No space left on device)"
    assert read_journal(path) == {"id0": entry(0)}
    assert path.read_bytes().endswith(b"\n")
