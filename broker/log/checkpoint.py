"""Small durable state files of a bucket (log start offset, recovery point), replaced atomically."""
from __future__ import annotations

import os
from pathlib import Path

from fluvial.broker.log import sync_journal


def fsync_directory(directory: Path) -> None:
    """Make file creations, renames and deletions in ``directory`` durable."""
    begun_at = sync_journal.position()
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_journal.directory_synced(directory, begun_at)


def write_text_atomically(path: Path, text: str, *, durable: bool = True) -> None:
    """Write-then-rename, so a crash leaves either the old or the new content, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_directory(path.parent)


class OffsetCheckpoint:
    """One offset kept in a file of its own, e.g. the log start offset."""

    def __init__(self, path: Path):
        self.path = path

    def read(self, default: int = 0) -> int:
        try:
            text = self.path.read_text(encoding="ascii").strip()
            return int(text)
        except (FileNotFoundError, ValueError):
            # A missing or unreadable checkpoint only costs work (recovery rescans), never data.
            return default

    def write(self, offset: int, *, durable: bool = True) -> None:
        write_text_atomically(self.path, f"{offset}\n", durable=durable)
