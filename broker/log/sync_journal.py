"""A record of what the log layer made durable, for power-loss tests.

When the environment variable ``FLUVIAL_SYNC_JOURNAL`` names a file (or ``enable()`` is
called), every segment creation, every fsync of a segment (with the file size it covered)
and every directory fsync is appended to that file as one line. Lines go to the operating
system at once, so they survive a kill -9 of the broker. After such a kill, a test cuts
each segment back to what its last fsync covered (``tests/support/power_loss.py``): the
files then hold what a power loss could have left, and the restarted broker must cope.

Off by default: then each call is one check of a module global.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

ENV_VAR = "FLUVIAL_SYNC_JOURNAL"

_lock = threading.Lock()
_journal = None


def enable(path: str | os.PathLike) -> None:
    global _journal
    with _lock:
        if _journal is not None:
            _journal.close()
        # Line-buffered: each record reaches the kernel before the call returns.
        _journal = open(path, "a", buffering=1, encoding="utf-8")


def disable() -> None:
    global _journal
    with _lock:
        if _journal is not None:
            _journal.close()
        _journal = None


def enabled() -> bool:
    return _journal is not None


def _record(kind: str, path: Path, size: int = -1) -> None:
    with _lock:
        if _journal is not None:
            _journal.write(f"{kind}\t{os.path.abspath(path)}\t{size}\n")


def created(path: Path) -> None:
    """A segment file was created: it exists after a power loss only once its directory is synced."""
    if _journal is not None:
        _record("create", path)


def synced(path: Path, size: int) -> None:
    """The first ``size`` bytes of ``path`` are durable (the size is taken before the fsync)."""
    if _journal is not None:
        _record("sync", path, size)


def directory_synced(path: Path) -> None:
    if _journal is not None:
        _record("dirsync", path)


if os.environ.get(ENV_VAR):
    enable(os.environ[ENV_VAR])
