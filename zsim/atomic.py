"""Atomic file output: every file zsim writes (reports, traces, profiles) goes through
here, so a failure never leaves a half-written file behind. Standard library only."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path


def write_files(out_dir: Path, files: Mapping[str, bytes]) -> list[Path]:
    """Write every file into `out_dir`, all or nothing: each goes to a temporary file in
    the same folder first, and only when all are written are they renamed into place
    (os.replace, atomic per file), so a failure leaves no partial file behind.

    Returns:
        The written paths, in `files` order.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[str, Path]] = []
    # mkstemp creates 0600 files; give the report the mode a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    try:
        for name, data in files.items():
            fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.")
            staged.append((tmp, out_dir / name))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o666 & ~umask)
        for tmp, final in staged:
            os.replace(tmp, final)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [final for _, final in staged]
