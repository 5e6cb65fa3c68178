"""Per log tablet: open transactions (the last stable offset) and aborted transactions.

A bucket that never saw a transactional batch has no state here and costs one dictionary
lookup per read_committed fetch. The first transactional append to a bucket creates the
file `transactions.idx` in its tablet directory (before that append): its presence says
that the bucket holds transactions, so a restart rebuilds the state only for those
buckets. Each marker the coordinator writes appends one line (`A|C producer first
marker`); the log is the truth, the file a cache: on load the batch headers are replayed
from the log start (open transactions are the producers with transactional batches and
no marker after them), and a marker the file misses (a crash between the marker append
and the line) is read from the log itself. Entries below the log start are dropped with
the segments that held them.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from fluvial.broker.log.batch_meta import ATTR_CONTROL, ATTR_TRANSACTIONAL
from fluvial.broker.producer_state import tablet_batch_metas

log = logging.getLogger(__name__)

INDEX_FILE = "transactions.idx"
ABORT = 0
COMMIT = 1


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker's offset


@dataclass
class BucketTransactions:
    """Open transactions (producer id -> first offset) and aborted ones, oldest first."""

    directory: Path | None
    ongoing: dict[int, int] = field(default_factory=dict)
    aborted: list[AbortedTxn] = field(default_factory=list)

    def last_stable_offset(self, high_watermark: int) -> int:
        if not self.ongoing:
            return high_watermark
        return min(high_watermark, min(self.ongoing.values()))

    def is_aborted(self, producer_id: int, offset: int) -> bool:
        """Whether the producer's batch at `offset` belongs to an aborted transaction."""
        return any(a.producer_id == producer_id and a.first_offset <= offset < a.last_offset
                   for a in self.aborted)

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [start, end) (Kafka's fetch answer)."""
        return [a for a in self.aborted if a.last_offset >= start and a.first_offset < end]


def marker_line(kind: int, producer_id: int, first: int, marker_offset: int) -> str:
    return f"{'C' if kind == COMMIT else 'A'} {producer_id} {first} {marker_offset}\n"


class TransactionIndex:
    """The transaction state of every bucket, loaded on first use."""

    def __init__(self) -> None:
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._absent: weakref.WeakSet = weakref.WeakSet()  # buckets known to hold no transactions
        self._lock = threading.Lock()

    def get(self, bucket) -> BucketTransactions | None:
        """The bucket's state, or None when it never held a transaction (the common case)."""
        state = self._states.get(bucket)
        if state is not None or bucket in self._absent:
            return state
        with self._lock:
            state = self._states.get(bucket)
            if state is None and bucket not in self._absent:
                state = self._load(bucket)
                if state is None:
                    self._absent.add(bucket)
                else:
                    self._states[bucket] = state
        return state

    def prepare(self, bucket) -> BucketTransactions:
        """Before a bucket's first transactional append: create its index file (blocking,
        run it in an I/O thread), so that a restart knows to rebuild the bucket's state."""
        state = self.get(bucket)
        if state is not None:
            return state
        directory = Path(bucket.tablet.directory)
        path = directory / INDEX_FILE
        with open(path, "a") as f:
            f.flush()
            os.fsync(f.fileno())
        with self._lock:
            self._absent.discard(bucket)
            state = self._states.get(bucket)
            if state is None:
                state = self._states[bucket] = BucketTransactions(directory)
        return state

    def known(self, bucket) -> bool:
        """Whether `get` answers without I/O."""
        return bucket in self._states or bucket in self._absent

    def ready(self, bucket) -> bool:
        return self._states.get(bucket) is not None

    def on_append(self, bucket, producer_id: int, base_offset: int) -> None:
        """A transactional batch was appended (the state exists: `prepare` ran before)."""
        self._states[bucket].ongoing.setdefault(producer_id, base_offset)

    def on_marker(self, bucket, producer_id: int, kind: int, marker_offset: int) -> str | None:
        """A marker was appended; returns the line to add to the index file (or None when the
        producer had nothing open here)."""
        state = self._states.get(bucket)
        if state is None:
            return None
        first = state.ongoing.pop(producer_id, None)
        if first is None:
            return None
        if kind == ABORT:
            state.aborted.append(AbortedTxn(producer_id, first, marker_offset))
        return marker_line(kind, producer_id, first, marker_offset)

    @staticmethod
    def append_line(bucket, line: str) -> None:
        """Add a marker's line to the index file (blocking; the log stays the truth)."""
        try:
            with open(Path(bucket.tablet.directory) / INDEX_FILE, "a") as f:
                f.write(line)
        except FileNotFoundError:
            pass  # the bucket was deleted meanwhile

    # -- load ----------------------------------------------------------------------------

    def _load(self, bucket) -> BucketTransactions | None:
        directory = Path(bucket.tablet.directory)
        path = directory / INDEX_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        known: dict[int, int] = {}  # marker offset -> kind
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] in ("A", "C"):
                known[int(parts[3])] = COMMIT if parts[0] == "C" else ABORT
        tablet = bucket.tablet
        start = tablet.log_start_offset
        state = BucketTransactions(directory)
        for meta in tablet_batch_metas(tablet, start):
            if not meta.attributes & ATTR_TRANSACTIONAL:
                continue
            if meta.attributes & ATTR_CONTROL:
                first = state.ongoing.pop(meta.producer_id, None)
                if first is None:
                    continue
                kind = known.get(meta.base_offset)
                if kind is None:
                    kind = read_marker_kind(tablet, meta.base_offset)
                if kind == ABORT:
                    state.aborted.append(AbortedTxn(meta.producer_id, first, meta.base_offset))
            else:
                state.ongoing.setdefault(meta.producer_id, meta.base_offset)
        log.info("transactions of %s: %d open, %d aborted", directory.name, len(state.ongoing), len(state.aborted))
        return state


def read_marker_kind(tablet, offset: int) -> int:
    """The control type (0 abort, 1 commit) of the marker stored at `offset`."""
    for stored in tablet.read(offset, 1):
        keys = stored.batch.column("_key")
        key = keys[0].as_py() if len(keys) else None
        if key is not None and len(key) >= 4:
            return int.from_bytes(key[2:4], "big")
        break
    return ABORT
