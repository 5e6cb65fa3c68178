"""Leader epoch cache of a bucket: which leader epoch started at which offset (OffsetForLeaderEpoch)."""
from __future__ import annotations

import bisect
import threading
from pathlib import Path

from fluvial.broker.log.checkpoint import write_text_atomically

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
_FORMAT_VERSION = 0


class LeaderEpochCache:
    """Sorted (epoch, start offset) entries, persisted in the bucket directory.

    The file has Kafka's checkpoint layout: a version line, a count line, then one
    ``epoch start_offset`` line per entry.
    """

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        # Serializes file writes, which happen outside `_lock`: appends read the latest
        # epoch under `_lock` and must not wait for an fsync.
        self._file_lock = threading.Lock()
        self._epochs: list[int] = []
        self._starts: list[int] = []
        self._load()

    def _load(self) -> None:
        try:
            lines = self.path.read_text(encoding="ascii").split("\n")
        except FileNotFoundError:
            return
        try:
            if int(lines[0]) != _FORMAT_VERSION:
                raise ValueError("unknown version")
            count = int(lines[1])
            pairs = [tuple(map(int, line.split())) for line in lines[2 : 2 + count]]
            if len(pairs) != count or any(len(p) != 2 for p in pairs):
                raise ValueError("short file")
        except (ValueError, IndexError) as exc:
            raise ValueError(f"corrupt leader epoch checkpoint {self.path}: {exc}") from exc
        self._epochs = [p[0] for p in pairs]
        self._starts = [p[1] for p in pairs]

    def persist(self) -> None:
        """Write the entries as they are now (durably). Each write takes the latest entries
        once it holds the file lock, so a later state is never overwritten by an earlier one."""
        with self._file_lock:
            with self._lock:
                lines = [str(_FORMAT_VERSION), str(len(self._epochs))]
                lines += [f"{e} {s}" for e, s in zip(self._epochs, self._starts)]
            write_text_atomically(self.path, "\n".join(lines) + "\n")

    def entries(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(zip(self._epochs, self._starts))

    @property
    def latest_epoch(self) -> int | None:
        with self._lock:
            return self._epochs[-1] if self._epochs else None

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` begins at ``start_offset``.

        As in Kafka, an entry that conflicts with the new one (an epoch not older, or a
        start offset not smaller) is removed first; a repeat of the latest is a no-op.
        """
        if epoch < 0:
            return
        with self._lock:
            if self._epochs and self._epochs[-1] == epoch and self._starts[-1] <= start_offset:
                return
            keep = [
                i for i in range(len(self._epochs))
                if self._epochs[i] < epoch and self._starts[i] < start_offset
            ]
            self._epochs = [self._epochs[i] for i in keep] + [epoch]
            self._starts = [self._starts[i] for i in keep] + [start_offset]
        self.persist()

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: the largest epoch <= requested and the offset where it ended."""
        with self._lock:
            if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
                return UNDEFINED_EPOCH, UNDEFINED_OFFSET
            if self._epochs[-1] == requested_epoch:
                return requested_epoch, log_end_offset
            higher = bisect.bisect_right(self._epochs, requested_epoch)
            if higher == len(self._epochs):
                # Newer than any epoch this bucket knows.
                return UNDEFINED_EPOCH, UNDEFINED_OFFSET
            if higher == 0:
                # Older than any known epoch: it ended where the first known one began.
                return requested_epoch, self._starts[0]
            return self._epochs[higher - 1], self._starts[higher]

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs starting at or after ``end_offset`` (the log was cut there)."""
        with self._lock:
            cut = bisect.bisect_left(self._starts, end_offset)
            if cut >= len(self._starts):
                return
            del self._epochs[cut:], self._starts[cut:]
        self.persist()

    def truncate_from_start(self, start_offset: int, *, persist: bool = True) -> bool:
        """The log now starts at ``start_offset``: earlier epochs collapse into one entry there.

        Returns whether the entries changed. With ``persist=False`` the caller writes the
        file (`persist()`) later, outside the locks appends wait on.
        """
        with self._lock:
            floor = bisect.bisect_right(self._starts, start_offset) - 1
            if floor < 0 or (floor == 0 and self._starts[0] == start_offset):
                return False
            self._epochs = self._epochs[floor:]
            self._starts = [start_offset] + self._starts[floor + 1 :]
        if persist:
            self.persist()
        return True

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)
