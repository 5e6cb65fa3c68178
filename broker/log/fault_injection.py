"""Injected fsync failures and stalls, for tests of how the broker meets a failing or slow disk.

When ``FLUVIAL_FSYNC_FAULTS`` names a file, every segment fsync first reads that file (if
it exists). Each non-empty line is a path fragment, optionally preceded by ``hold ``:

- ``<fragment>``: an fsync of a segment whose path contains it fails with EIO, as a disk
  that lost a write would report it;
- ``hold <fragment>``: such an fsync waits (the data is written, not yet durable) while the
  line stays in the file, then goes on as the file then says (succeeds, or fails when the
  line was turned into a plain fragment). While an fsync waits, the file ``<faults>.held``
  exists, so a test knows the write it is about is appended but not durable.

A test turns faults on and off while the broker runs by replacing the file (a rename:
a held fsync polls it, and a file read half-rewritten would release it as if no fault were set). Off by default
(one module-global check per fsync).
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path

ENV_VAR = "FLUVIAL_FSYNC_FAULTS"
HOLD = "hold "
_HOLD_POLL_S = 0.01

_faults_file: Path | None = Path(os.environ[ENV_VAR]) if os.environ.get(ENV_VAR) else None


def held_marker(faults_file: Path) -> Path:
    """The file that exists while an fsync is held by ``faults_file``."""
    return faults_file.with_name(faults_file.name + ".held")


def _lines() -> list[str]:
    try:
        return [line.strip() for line in _faults_file.read_text(encoding="utf-8").splitlines()]
    except FileNotFoundError:
        return []


def _matches(lines: list[str], text: str, hold: bool) -> bool:
    for line in lines:
        is_hold = line.startswith(HOLD)
        fragment = line[len(HOLD):].strip() if is_hold else line
        if fragment and is_hold == hold and fragment in text:
            return True
    return False


def before_fsync(path: Path) -> None:
    """Wait while a ``hold`` line names a fragment of ``path``; then raise OSError(EIO) when
    a plain line names one."""
    if _faults_file is None:
        return
    text = str(path)
    lines = _lines()
    if _matches(lines, text, hold=True):
        marker = held_marker(_faults_file)
        marker.touch()
        try:
            while _matches(lines, text, hold=True):
                time.sleep(_HOLD_POLL_S)
                lines = _lines()
        finally:
            marker.unlink(missing_ok=True)
    if _matches(lines, text, hold=False):
        raise OSError(errno.EIO, f"injected fsync failure ({ENV_VAR})", str(path))
