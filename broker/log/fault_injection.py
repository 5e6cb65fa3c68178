"""Injected fsync failures, for tests of how the broker meets a failing disk.

When ``FLUVIAL_FSYNC_FAULTS`` names a file, every segment fsync first reads that file (if
it exists): each non-empty line is a path fragment, and an fsync of a segment whose path
contains one fails with EIO, as a disk that lost a write would report it. A test turns
failures on and off while the broker runs by writing the file. Off by default (one
module-global check per fsync).
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

ENV_VAR = "FLUVIAL_FSYNC_FAULTS"

_faults_file: Path | None = Path(os.environ[ENV_VAR]) if os.environ.get(ENV_VAR) else None


def before_fsync(path: Path) -> None:
    """Raise OSError(EIO) when the faults file names a fragment of ``path``."""
    if _faults_file is None:
        return
    try:
        fragments = [line.strip() for line in _faults_file.read_text(encoding="utf-8").splitlines()]
    except FileNotFoundError:
        return
    text = str(path)
    for fragment in fragments:
        if fragment and fragment in text:
            raise OSError(errno.EIO, f"injected fsync failure ({ENV_VAR})", str(path))
