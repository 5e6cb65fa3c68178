"""Sparse segment indexes: the offset index (offset -> file position) and the time index.

An index file is a flat array of little-endian (int64 key, int64 value) pairs, mirrored in
NumPy arrays so a lookup is one ``searchsorted``. Index files are derived data: recovery
rebuilds them from the segment when they are missing or do not agree with it, and a file
missing its newest entries only makes the next open walk more batch headers. So new
entries are appended to the file in groups of ``WRITE_EVERY`` (and whatever is left when
the segment stops taking appends), not one by one: under many small producers an entry
falls due every flush or two, and opening the file for each was a good part of the flush's
own CPU.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

ENTRY_DTYPE = np.dtype([("key", "<i8"), ("value", "<i8")])
# Entries held in memory before they are appended to the file. After a crash, the active
# segment's index may lack up to this many entries: at index.interval.bytes (4 KB by
# default) apart, the next open walks at most about 128 KB more of batch headers.
WRITE_EVERY = 32


class SparseIndex:
    """Append-only sorted (key, value) pairs; readers see an immutable snapshot."""

    def __init__(self, path: Path, entries: np.ndarray | None = None):
        self.path = path
        entries = np.empty(0, ENTRY_DTYPE) if entries is None else entries
        capacity = max(64, len(entries) * 2)
        self._keys = np.empty(capacity, np.int64)
        self._values = np.empty(capacity, np.int64)
        count = len(entries)
        self._keys[:count] = entries["key"]
        self._values[:count] = entries["value"]
        # Swapped as one object so a reader on another thread never sees keys and count disagree.
        self._snapshot = (self._keys, self._values, count)
        # Off while recovery rebuilds the index in memory; store() then writes it at once.
        self.write_through = True
        self._written = count  # entries the file holds (a loaded index was read from it)

    @staticmethod
    def read_entries(path: Path) -> np.ndarray | None:
        """The entries stored in ``path``; None when missing or not a whole number of entries."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) % ENTRY_DTYPE.itemsize:
            return None
        return np.frombuffer(raw, ENTRY_DTYPE)

    def write_all(self) -> None:
        """Replace the file with the in-memory entries (after a rebuild)."""
        keys, values, count = self._snapshot
        entries = np.empty(count, ENTRY_DTYPE)
        entries["key"] = keys[:count]
        entries["value"] = values[:count]
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_bytes(entries.tobytes())
        os.replace(tmp, self.path)
        self._written = count

    def store(self) -> None:
        """Make the file hold exactly the in-memory entries (rewritten only when it does not
        already: a replace costs a rename) and append new entries to it from now on."""
        if not self.stored():
            self.write_all()
        self._written = len(self)
        self.write_through = True

    def stored(self) -> bool:
        """Whether the file holds exactly the in-memory entries."""
        keys, values, count = self._snapshot
        on_disk = self.read_entries(self.path)
        return (on_disk is not None and len(on_disk) == count
                and np.array_equal(on_disk["key"], keys[:count]) and np.array_equal(on_disk["value"], values[:count]))

    def create_empty(self) -> None:
        self.path.write_bytes(b"")
        self._written = 0

    def append(self, key: int, value: int) -> None:
        keys, values, count = self._snapshot
        if count == len(keys):
            keys = np.concatenate([keys, np.empty(len(keys), np.int64)])
            values = np.concatenate([values, np.empty(len(values), np.int64)])
            self._keys, self._values = keys, values
        keys[count] = key
        values[count] = value
        self._snapshot = (keys, values, count + 1)
        if self.write_through and count + 1 - self._written >= WRITE_EVERY:
            self.write_unwritten()

    def write_unwritten(self) -> None:
        """Append the entries the file does not hold yet. The file is opened for each group
        rather than held open, so a bucket costs one file descriptor (its active segment's),
        not three."""
        keys, values, count = self._snapshot
        start = self._written
        if count <= start or not self.write_through:
            return
        entries = np.empty(count - start, ENTRY_DTYPE)
        entries["key"] = keys[start:count]
        entries["value"] = values[start:count]
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, entries.tobytes())
        finally:
            os.close(fd)
        self._written = count

    def __len__(self) -> int:
        return self._snapshot[2]

    def keys(self) -> np.ndarray:
        keys, _, count = self._snapshot
        return keys[:count]

    def values(self) -> np.ndarray:
        _, values, count = self._snapshot
        return values[:count]

    def last(self) -> tuple[int, int] | None:
        keys, values, count = self._snapshot
        return (int(keys[count - 1]), int(values[count - 1])) if count else None

    def floor(self, key: int) -> tuple[int, int] | None:
        """The entry with the largest key <= ``key``."""
        keys, values, count = self._snapshot
        i = int(np.searchsorted(keys[:count], key, side="right")) - 1
        return (int(keys[i]), int(values[i])) if i >= 0 else None

    def lower(self, key: int) -> tuple[int, int] | None:
        """The entry with the largest key < ``key``."""
        keys, values, count = self._snapshot
        i = int(np.searchsorted(keys[:count], key, side="left")) - 1
        return (int(keys[i]), int(values[i])) if i >= 0 else None

    def first_at_least(self, key: int) -> int:
        """Position of the first entry with key >= ``key`` (len when none)."""
        keys, _, count = self._snapshot
        return int(np.searchsorted(keys[:count], key, side="left"))

    def entry(self, i: int) -> tuple[int, int]:
        keys, values, _ = self._snapshot
        return int(keys[i]), int(values[i])


class OffsetIndex(SparseIndex):
    """Batch base offset -> file position of the batch message, strictly increasing in both."""

    def consistent_with(self, base_offset: int, first_position: int, file_size: int) -> bool:
        keys, positions = self.keys(), self.values()
        if not len(keys):
            return True
        return bool(
            keys[0] >= base_offset
            and positions[0] >= first_position
            and positions[-1] < file_size
            and np.all(np.diff(keys) > 0)
            and np.all(np.diff(positions) > 0)
        )


class TimeIndex(SparseIndex):
    """Largest timestamp so far in the segment -> base offset of the batch that ends that prefix.

    Keys never decrease: an entry (t, o) says every record up to the end of the batch at
    offset o has a timestamp <= t.
    """

    def consistent_with(self, base_offset: int) -> bool:
        times, offsets = self.keys(), self.values()
        if not len(times):
            return True
        return bool(
            offsets[0] >= base_offset
            and np.all(np.diff(times) >= 0)
            and np.all(np.diff(offsets) > 0)
        )
