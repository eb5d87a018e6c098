"""A sweep's journal: the append-only record of its finished runs, so an interrupted sweep
resumes where it stopped.

Owns the file format (JSON lines, one per finished run: `{"id": plan id, "row": the run's
row of zsim.report.dataframes.sweep_row, "curve": [[time_s, allocated_bytes], ...] or null}`),
appending a batch durably (unbuffered writes, then fsync) and reading it back. A process killed
mid-write, or a disk that filled up, leaves at most a torn last line: reading drops it and
cuts it off the file, so the next append starts on a line of its own and no run is lost
(it is simply computed again) or counted twice (a repeated id keeps its first line).
Standard library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from zsim.errors import ConfigError

JOURNAL_NAME = "journal.jsonl"
"""The journal's file name in a sweep's --out folder."""

Entry = dict[str, Any]
"""One journal line: {"id": str, "row": dict, "curve": list | None}."""


def read_journal(path: Path) -> dict[str, Entry]:
    """The entries of the journal at `path` by plan id ({} when there is none yet).

    A torn or unreadable line is dropped (its run is computed again), and a torn tail is
    cut off the file so that appends start on a fresh line.

    Raises:
        ConfigError: the journal exists but cannot be read or repaired.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError("out", str(path), f"cannot read the journal ({e.strerror})") from None
    complete = data.rfind(b"\n") + 1
    entries: dict[str, Entry] = {}
    for line in data[:complete].splitlines():
        entry = _entry(line)
        if entry is not None:
            entries.setdefault(entry["id"], entry)
    if complete < len(data):
        try:
            os.truncate(path, complete)
        except OSError as e:
            raise ConfigError("out", str(path),
                              f"cannot repair the journal ({e.strerror})") from None
    return entries


def _entry(line: bytes) -> Entry | None:
    """A parsed journal line, or None for one that is not a whole entry."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if (not isinstance(entry, dict) or not isinstance(entry.get("id"), str)
            or not isinstance(entry.get("row"), dict)):
        return None
    return entry


class Journal:
    """The journal opened for appending (a context manager)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as e:
            raise ConfigError("out", str(self.path),
                              f"cannot open the journal ({e.strerror})") from None

    def append(self, entries: Sequence[Entry]) -> None:
        """Append `entries` in one go, then fsync, so that after a crash
        every entry is either whole on disk or absent but for a torn last line.

        Raises:
            ConfigError: the write failed (a full disk); the entries written whole so far
                stay, and the next read drops the torn one.
        """
        data = b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n"
                        for e in entries)
        view = memoryview(data)
        try:
            while view:  # unbuffered: nothing is left to be written later, at close
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError as e:
            raise ConfigError("out", str(self.path),
                              f"cannot write the journal ({e.strerror})") from None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        os.close(self._fd)
