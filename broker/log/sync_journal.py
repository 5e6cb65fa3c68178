"""A record of what the log layer made durable, for power-loss tests.

When the environment variable ``FLUVIAL_SYNC_JOURNAL`` names a file (or ``enable()`` is
called), every segment creation, every fsync of a segment (with the file size it covered),
every cut of a segment by recovery and every directory fsync (with the journal line at
which it began) is appended to that file as one line. Lines go to the operating system at
once, so they survive a kill -9 of the broker. After such a kill, a test cuts each segment
back to what its fsyncs covered (``tests/support/power_loss.py``): the files then hold what
a power loss could have left, and the restarted broker must cope.

Two flushes of one segment may fsync at once (``LogTablet.flush_up_to``), so their lines
may come in either order: a sync line covers its size whatever sync lines follow it.

Off by default: then each call is one check of a module global.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

ENV_VAR = "FLUVIAL_SYNC_JOURNAL"

_lock = threading.Lock()
_journal = None
_lines = 0  # lines the journal file holds


def enable(path: str | os.PathLike) -> None:
    global _journal, _lines
    with _lock:
        if _journal is not None:
            _journal.close()
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            data = b""
        # Line-buffered: each record reaches the kernel before the call returns.
        _journal = open(path, "a", buffering=1, encoding="utf-8")
        if data and not data.endswith(b"\n"):
            _journal.write("\n")  # ends a line cut by a kill, so line numbers stay right
        _lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def disable() -> None:
    global _journal
    with _lock:
        if _journal is not None:
            _journal.close()
        _journal = None


def enabled() -> bool:
    return _journal is not None


def _record(kind: str, path: Path, size: int = -1) -> None:
    global _lines
    with _lock:
        if _journal is not None:
            _journal.write(f"{kind}\t{os.path.abspath(path)}\t{size}\n")
            _lines += 1


def position() -> int:
    """The line the next record gets (0-based): taken before a directory fsync, so that only
    creations recorded before the fsync began count as covered by it."""
    return _lines


def created(path: Path) -> None:
    """A segment file was created: it exists after a power loss only once its directory is synced."""
    if _journal is not None:
        _record("create", path)


def synced(path: Path, size: int) -> None:
    """The first ``size`` bytes of ``path`` are durable (the size is taken before the fsync)."""
    if _journal is not None:
        _record("sync", path, size)


def truncated(path: Path, size: int) -> None:
    """Recovery cut ``path`` to ``size`` bytes and fsynced it: durable up to there, nothing past it."""
    if _journal is not None:
        _record("truncate", path, size)


def directory_synced(path: Path, begun_at: int) -> None:
    """An fsync of directory ``path`` begun at journal line ``begun_at`` (`position`) succeeded."""
    if _journal is not None:
        _record("dirsync", path, begun_at)


if os.environ.get(ENV_VAR):
    enable(os.environ[ENV_VAR])
