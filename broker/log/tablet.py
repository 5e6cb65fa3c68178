"""The log tablet of one bucket: ordered segments, appends, reads, lookups, retention and flushing."""
from __future__ import annotations

import bisect
import collections
import logging
import os
import shutil
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.broker.latency import FSYNC_LATENCY
from fluvial.broker.log.batch_meta import ATTR_LOG_APPEND_TIME, BatchMeta, StoredBatch, encode_parts, envelope
from fluvial.broker.gc_untracked import untracked_tuple
from fluvial.broker.log.checkpoint import OffsetCheckpoint, fsync_directory
from fluvial.broker.log.config import FlushPolicy, LogConfig, TimestampType
from fluvial.broker.log.leader_epoch import LeaderEpochCache
from fluvial.broker.log.segment import DATA_SUFFIX, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX, LogSegment
from fluvial.broker.log.segment_format import BatchHeader, SegmentFormatError, encode_batch, split_parts
from fluvial.broker.log.statistics import ColumnStats, compute_stats, decode_stats, stats_columns
from fluvial.errors import InvalidRecordError, InvalidRequestError, OffsetOutOfRangeError, StorageError

log = logging.getLogger(__name__)

OFFSET_FIELD = pa.field("_offset", pa.int64())
TIMESTAMP_COLUMN = "_timestamp"
LOG_START_CHECKPOINT = "log-start-offset.checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point.checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch.checkpoint"
CLEANER_CHECKPOINT = "cleaner-offset.checkpoint"
# Log compaction's crash-safe swap (broker/log/cleaner.py): a cleaned copy of a segment is
# written as `<segment>.cleaned`, fsynced, renamed to `<segment>.swap` (the commit point)
# and then renamed over the segment.
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
# How often a flush also writes the recovery point: after a crash, at most about this much
# of the newest data is checked (and at least every rolled segment is skipped).
RECOVERY_CHECKPOINT_INTERVAL_MS = 500
# Coalesced appends (`append(coalesce=True)`) waiting to be written are written at once when
# they reach this many bytes (or an eighth of segment.bytes, so that segments still hold
# many messages); the flush writes them otherwise. A batch this large on its own is not
# coalesced (copying it into a bigger one would cost more than its own message does).
COALESCE_MAX_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A segment as seen from outside the tablet (for tiering and tools)."""

    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp: int
    path: Path
    offset_index_path: Path
    time_index_path: Path
    active: bool


@dataclass(frozen=True, slots=True)
class _SegmentList:
    """An immutable snapshot of the segments; replaced whole on roll and deletion."""

    segments: tuple[LogSegment, ...]
    bases: tuple[int, ...]

    @classmethod
    def of(cls, segments: tuple[LogSegment, ...] | list[LogSegment]) -> _SegmentList:
        segments = tuple(segments)
        return cls(segments, tuple(s.base_offset for s in segments))

    def index_of(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self.bases, offset) - 1)


class LogTablet:
    """One bucket's log. Appends come from one thread at a time; reads may run on any thread."""

    def __init__(self, directory: Path, config: LogConfig):
        self.directory = directory
        self.config = config
        self._write_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        # Flushes are published in the order they began (see flush_up_to): tickets handed
        # out, tickets published, and the end of what the flushes begun so far cover.
        self._flush_published = threading.Condition(threading.Lock())
        self._flush_tickets = 0
        self._flush_published_tickets = 0
        self._flush_begun_offset = 0
        self._view = _SegmentList.of(())
        self._log_start = 0
        self._empty_end = 0  # the log end offset while no segment exists
        self._log_start_checkpoint = OffsetCheckpoint(directory / LOG_START_CHECKPOINT)
        self._recovery_checkpoint = OffsetCheckpoint(directory / RECOVERY_POINT_CHECKPOINT)
        self._flushed_offset = 0
        self._last_flush_ms = _now_ms()
        self._checkpoint_ms = 0  # when the recovery point was last written
        self._directory_dirty = False
        # A bucket directory made by this open is durable only once its parent is synced.
        self._parent_dirty = False
        self._closed = False
        # Since the tablet was opened: what the metrics report as bytes and records in.
        self.appended_records = 0
        self.appended_bytes = 0
        # Why the tablet is offline after a failed write or fsync; None while healthy.
        self._failure: str | None = None
        self._schema_cache: tuple[pa.Schema, pa.Schema, tuple[int, ...], bool] | None = None
        self.leader_epochs: LeaderEpochCache
        # Called with the new segment's base offset after each roll, by the appending thread
        # under the write lock: must be quick and must not raise (e.g. producer-state snapshots).
        self.roll_listeners: list = []
        # With remote storage: retention may delete only segments wholly below this offset
        # (the end of the committed remote log), so no local copy goes before it is uploaded.
        # None: no such limit.
        self.retention_limit_offset: int | None = None
        # Log compaction: one cleaning of this tablet at a time; the first offset not cleaned yet.
        self.cleaner_lock = threading.Lock()
        self.cleaner_checkpoint = OffsetCheckpoint(directory / CLEANER_CHECKPOINT)
        # Set by roll(): the next append starts a new segment, so the last one may be cleaned.
        self._roll_requested = False
        # Coalesced appends: offsets given, not written yet (stamped batch, filled meta), all
        # of one input schema; the log end offset counts them.
        self._pending: list[tuple[pa.RecordBatch, BatchMeta]] = []
        # Flush windows: pending lists the group commit took (`take_pending`, on the event
        # loop) to be written off the loop (`write_taken`), oldest first. Every writer of
        # the segments writes them first, under the write lock, so the log stays in offset
        # order; only a holder of the write lock removes one (once written).
        self._windows: collections.deque[list[tuple[pa.RecordBatch, BatchMeta]]] = collections.deque()
        # Guards the pending list, the windows and the offsets they hand out. Taken after the
        # write lock: writers hold both while they write at the log end, so a coalesced
        # append that only joins the pending list (`_append_pending`) never waits for a
        # window being written off the loop, which holds the write lock alone.
        self._pending_lock = threading.Lock()
        self._pending_schema: pa.Schema | None = None
        self._pending_end = 0
        self._pending_rows = 0
        self._pending_bytes = 0

    # -- opening and recovery -------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, config: LogConfig) -> LogTablet:
        """Load the bucket's segments, recovering any that may hold unflushed data."""
        directory = Path(directory)
        fresh = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        tablet = cls(directory, config)
        tablet._parent_dirty = fresh
        tablet._load()
        return tablet

    def _load(self) -> None:
        for leftover in self.directory.glob("*.tmp"):
            leftover.unlink()
        self._finish_cleaner_swaps()
        self.leader_epochs = LeaderEpochCache(self.directory / LEADER_EPOCH_CHECKPOINT)
        log_start = self._log_start_checkpoint.read(0)
        recovery_point = self._recovery_checkpoint.read(0)
        bases = sorted(int(p.stem) for p in self.directory.glob("*" + DATA_SUFFIX) if p.stem.isdigit())
        self._remove_orphan_indexes(set(bases))
        segments: list[LogSegment] = []
        recovered: list[LogSegment] = []
        expected: int | None = None
        for i, base in enumerate(bases):
            if expected is not None and base != expected:
                # A gap after a cut segment: later data cannot be served in order.
                self._remove_segment_files(base)
                continue
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            # Segments wholly below the recovery point were fsynced before it was written:
            # trusted. A segment holding the recovery point is checked only from there on
            # (what may be torn); segments above it entirely.
            wholly_flushed = next_base is not None and next_base <= recovery_point
            segment = LogSegment.load(
                self.directory, base, self.config.index_interval_bytes, recover=not wholly_flushed,
                recover_from=recovery_point if base < recovery_point else None,
            )
            may_be_unflushed = segment is not None and segment.state.next_offset > recovery_point
            if segment is None or segment.state.batch_count == 0:
                self._remove_segment_files(base)
                expected = base
                continue
            if may_be_unflushed:
                recovered.append(segment)
            segments.append(segment)
            expected = segment.state.next_offset
        log_end = expected if expected is not None else log_start
        if log_start > log_end:
            # Data below a durable log start was lost (no fsync policy): nothing left to serve.
            for segment in segments:
                segment.delete()
            segments = []
            log_end = log_start
        if segments:
            log_start = max(log_start, segments[0].base_offset)
            segments[-1].open_for_append()
        self._log_start = log_start
        self._empty_end = log_end
        # The log end this process found (before any append of its own): lets a process tell
        # what an earlier one appended from what it appends itself.
        self.opened_end_offset = log_end
        self._view = _SegmentList.of(segments)
        self.leader_epochs.truncate_from_end(log_end)
        self._flushed_offset = log_end
        if recovered:
            # What was recovered becomes the durable baseline: later crashes rescan only newer data.
            for segment in recovered:
                segment.flush()
            fsync_directory(self.directory)
            self._recovery_checkpoint.write(log_end, durable=False)

    def _finish_cleaner_swaps(self) -> None:
        """After a crash during log compaction: a `.swap` file is a whole, fsynced cleaned copy
        of its segment, so it replaces the segment (unless the segment itself is gone, deleted
        by retention meanwhile); a `.cleaned` file was not finished and is dropped. Index files
        of a replaced segment are removed, to be rebuilt from the data."""
        changed = False
        for swap in sorted(self.directory.glob("*" + DATA_SUFFIX + SWAP_SUFFIX)):
            base = swap.name[: -len(DATA_SUFFIX + SWAP_SUFFIX)]
            target = self.directory / (base + DATA_SUFFIX)
            changed = True
            if not target.exists() or not base.isdigit():
                swap.unlink()
                continue
            # The copy may stand for several segments (merged): those up to its end go.
            copy = LogSegment(self.directory, int(base), self.config.index_interval_bytes)
            copy.data_path = swap
            copy.offset_index.path = swap.with_name(base + OFFSET_INDEX_SUFFIX + SWAP_SUFFIX)
            copy.time_index.path = swap.with_name(base + TIME_INDEX_SUFFIX + SWAP_SUFFIX)
            if not copy._load_schema():
                swap.unlink()
                continue
            copy.recover()
            end = copy.state.next_offset
            copy.close_for_append()
            for path in self.directory.glob("*" + DATA_SUFFIX):
                if path.stem.isdigit() and int(base) < int(path.stem) < end:
                    self._remove_segment_files(int(path.stem))
            for suffix in (OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                (self.directory / (base + suffix)).unlink(missing_ok=True)
            os.replace(swap, target)
        for pattern in ("*" + CLEANED_SUFFIX, "*" + SWAP_SUFFIX):
            for leftover in self.directory.glob(pattern):
                leftover.unlink()
                changed = True
        if changed:
            fsync_directory(self.directory)

    def _remove_orphan_indexes(self, bases: set[int]) -> None:
        for suffix in (OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            for path in self.directory.glob("*" + suffix):
                if not path.stem.isdigit() or int(path.stem) not in bases:
                    path.unlink()

    def _remove_segment_files(self, base: int) -> None:
        LogSegment(self.directory, base, self.config.index_interval_bytes).delete()

    # -- offsets and sizes ----------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign (coalesced appends not written yet included)."""
        if self._pending or self._windows:
            return self._pending_end
        segments = self._view.segments
        return segments[-1].state.next_offset if segments else self._empty_end

    @property
    def written_end_offset(self) -> int:
        """The end of what is written to the segments (what readers may reach)."""
        segments = self._view.segments
        return segments[-1].state.next_offset if segments else self._empty_end

    @property
    def high_watermark(self) -> int:
        """The end of what readers may see (Kafka's high watermark and last stable offset).

        A single replica commits what it has written; under flush policy ``ack`` a record is
        also committed only once it is fsynced, so nothing a reader saw can be taken back by
        a power loss. Under ``interval`` and ``none`` readers see the log end, as in Kafka.
        """
        if self.config.flush_policy is FlushPolicy.ACK:
            return self._flushed_offset
        return self.written_end_offset

    # -- failures ---------------------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        """Why the tablet is offline (a write or fsync failed), or None."""
        return self._failure

    def check_online(self) -> None:
        """Raise StorageError (KAFKA_STORAGE_ERROR) when the tablet is offline."""
        if self._failure is not None:
            raise StorageError(f"the log of {self.directory} is offline: {self._failure}")

    def _fail(self, what: str, exc: OSError) -> StorageError:
        """Take the tablet offline after a failed write or fsync and return the error to raise.

        After a failed fsync the kernel may have dropped the dirty pages and marked them
        clean, so a retried fsync would succeed without the data being on disk. Nothing
        more is appended, flushed or read until a restart, whose recovery decides from the
        files what is there.
        """
        if self._failure is None:
            self._failure = f"{what} failed: {exc}"
            log.critical("log tablet %s is OFFLINE: %s failed (%s); produce and fetch of this bucket are "
                         "answered KAFKA_STORAGE_ERROR until a restart recovers it", self.directory, what, exc)
        return StorageError(f"the log of {self.directory} is offline: {self._failure}")

    @property
    def size_bytes(self) -> int:
        return sum(s.state.size for s in self._view.segments)

    def segment_infos(self) -> list[SegmentInfo]:
        segments = self._view.segments
        return [
            SegmentInfo(s.base_offset, s.state.next_offset, s.state.size, s.state.max_timestamp,
                        s.data_path, s.offset_index.path, s.time_index.path, i == len(segments) - 1)
            for i, s in enumerate(segments)
        ]

    # -- appending ------------------------------------------------------------------------

    def append(
        self, records: pa.RecordBatch, meta: BatchMeta, *, leader_epoch: int | None = None, now_ms: int | None = None,
        coalesce: bool = False,
    ) -> BatchMeta:
        """Append one batch at the log end; returns ``meta`` with offsets and timestamps filled.

        ``leader_epoch`` is the appending leader's epoch: as in Kafka it replaces the batch's
        partition leader epoch (producers send -1) and a new epoch is recorded in the cache.

        ``coalesce``: the batch gets its offsets now but is written later, together with the
        other coalesced appends that follow it, as one message (`write_pending`, which every
        flush and every plain append does first). Readers see it only once written; the
        caller must not acknowledge it before the flush covering it (flush policy ``ack``).
        """
        count = records.num_rows
        if count == 0:
            raise InvalidRecordError("an appended batch must hold at least one record")
        if hasattr(records, "convert_together") and not (
                coalesce and self.config.message_timestamp_type is not TimestampType.LOG_APPEND_TIME):
            records = records.convert_together([records])
        stored_schema, stat_columns, opaque = self._stored_schema(records.schema)
        if coalesce and (self._pending or self._windows):
            filled = self._append_pending(records, meta, now_ms, leader_epoch)
            if filled is not None:
                return filled
        with self._write_lock, self._pending_lock:
            self._check_open()
            self.check_online()
            pending = self._pending
            if not coalesce:
                # Written at the segments' end: every taken window and pending append first.
                if pending or self._windows:
                    self._write_pending_locked()
                    pending = self._pending
            elif pending and not (self._pending_schema is records.schema
                                  or self._pending_schema.equals(records.schema, check_metadata=True)):
                self._write_pending_locked()
                pending = self._pending  # a fresh list: the one written is not appended to again
            base = self.log_end_offset
            records, filled = self._stamp(records, meta, base, now_ms, leader_epoch)
            if coalesce:
                size = _approximate_size(records)
                limit = min(COALESCE_MAX_BYTES, self.config.segment_bytes // 8)
                if size < limit:
                    if not pending:
                        self._pending_schema = records.schema
                    pending.append((records, filled))
                    self._pending_end = filled.next_offset
                    self._pending_rows += count
                    self._pending_bytes += size
                    if self._pending_bytes >= limit:
                        self._write_pending_locked()
                    return filled
                self._write_pending_locked()
                if hasattr(records, "convert_together"):
                    records = records.convert_together([records])
            self._write_locked([records], [filled], stored_schema, stat_columns, opaque)
            return filled

    def _append_pending(self, records: pa.RecordBatch, meta: BatchMeta, now_ms: int | None,
                        leader_epoch: int | None) -> BatchMeta | None:
        """A coalesced append joining the appends not written yet, under the pending lock
        only (not the write lock, which a window being written off the loop holds); None
        when it needs the write lock (nothing pending: its offsets follow the segments;
        another schema; the window full), and `append` goes on under both locks."""
        size = _approximate_size(records)
        limit = min(COALESCE_MAX_BYTES, self.config.segment_bytes // 8)
        with self._pending_lock:
            if not (self._pending or self._windows):
                return None
            self._check_open()
            self.check_online()
            pending = self._pending
            if pending and not (self._pending_schema is records.schema
                                or self._pending_schema.equals(records.schema, check_metadata=True)):
                return None
            if self._pending_bytes + size >= limit:
                return None
            records, filled = self._stamp(records, meta, self._pending_end, now_ms, leader_epoch)
            if not pending:
                self._pending_schema = records.schema
            pending.append((records, filled))
            self._pending_end = filled.next_offset
            self._pending_rows += filled.record_count
            self._pending_bytes += size
            return filled

    def write_pending(self) -> None:
        """Write the coalesced appends waiting to be written (one message per schema run)."""
        if self._pending or self._windows:
            with self._write_lock, self._pending_lock:
                self._write_pending_locked()

    def take_pending(self) -> int:
        """Close the current flush window: the coalesced appends pending so far become a
        window that `write_taken` writes (off the event loop); appends from now on go to
        the next one. Cheap (a list swap). Returns the log end offset, which the window's
        flush makes durable once the window is written."""
        with self._pending_lock:
            if self._pending:
                self._windows.append(self._pending)
                self._pending = []
                self._pending_bytes = 0
                return self._pending_end
            if self._windows:
                return self._pending_end
            segments = self._view.segments
            return segments[-1].state.next_offset if segments else self._empty_end

    def write_taken(self, offset: int) -> None:
        """Write the windows taken by `take_pending` (unless a writer did already), then make
        every batch below ``offset`` durable: the group commit's flush, off the event loop.
        A failed write takes the tablet offline and raises StorageError."""
        if self._windows:
            with self._write_lock:
                self.check_online()
                self._write_windows_locked(pending_locked=False)
        self.flush_up_to(offset)

    @property
    def pending_records(self) -> int:
        """Records appended with ``coalesce`` and not written yet."""
        return self._pending_rows

    def _write_windows_locked(self, *, pending_locked: bool) -> None:
        """Write the taken windows, oldest first; the caller holds the write lock (and the
        pending lock when ``pending_locked``)."""
        windows = self._windows
        while windows:
            window = windows[0]
            self._write_coalesced(window)
            rows = sum(f.record_count for _, f in window)
            if pending_locked:
                windows.popleft()
                self._pending_rows -= rows
            else:
                with self._pending_lock:
                    windows.popleft()
                    self._pending_rows -= rows

    def _write_pending_locked(self) -> None:
        """Write the taken windows and the pending appends; the caller holds both locks."""
        if self._windows:
            self._write_windows_locked(pending_locked=True)
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._write_coalesced(pending)

    def _write_coalesced(self, pending: list[tuple[pa.RecordBatch, BatchMeta]]) -> None:
        stored_schema, stat_columns, opaque = self._stored_schema(pending[0][0].schema)
        try:
            batches = _convert_runs([r for r, _ in pending])
            self._write_locked(batches, [f for _, f in pending], stored_schema, stat_columns, opaque)
        except StorageError:
            raise  # the tablet is offline already
        except Exception as exc:
            # Checked when appended, so this is a bug, memory running out or corruption: the
            # offsets were answered already (and recorded in the producer state), so nothing
            # may take them instead, whatever the failure was.
            raise self._fail("writing coalesced appends", OSError(repr(exc))) from exc

    def _write_locked(self, batches: list[pa.RecordBatch], metas: list[BatchMeta], stored_schema: pa.Schema,
                      stat_columns: tuple[int, ...], opaque: bool) -> None:
        """Write the rows of stamped batches (``metas``) at the log end as one message: a
        coalesced one (one Arrow batch, one IPC message, one write and one index entry, with
        the BatchMeta of each Kafka batch in it) when there are several."""
        records = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        if len(metas) == 1:
            filled = metas[0]
            parts: tuple[BatchMeta, ...] = ()
        else:
            parts = untracked_tuple(tuple(metas))  # kept by the segment: not walked by the collector
            filled = envelope(parts)
        count = records.num_rows
        base = filled.base_offset
        try:
            # Statistics skip the system columns, so the batch without _offset gives the same.
            stats = compute_stats(records, stat_columns) if self.config.batch_statistics else b""
            # add_column rather than from_arrays(schema=...): the columns were checked
            # against the schema already, and re-validating them costs more than the rest
            # of a small append.
            offsets = pa.Array.from_buffers(pa.int64(), count,
                                            [None, pa.py_buffer(np.arange(base, base + count, dtype=np.int64))])
            batch = records.add_column(0, OFFSET_FIELD, offsets)
            # The stored schema is the cached input schema with _offset first, so a batch of
            # that schema gets it by construction. Compared with the input schema, which is
            # one pointer comparison when the batch was built on it (converted Kafka
            # records), rather than with the new schema add_column made, whose metadata
            # fingerprint was computed for every message.
            cached = self._schema_cache
            if not ((cached is not None and records.schema.equals(cached[0], check_metadata=True))
                    or batch.schema.equals(stored_schema, check_metadata=True)):
                batch = pa.RecordBatch.from_arrays([offsets, *records.columns], schema=stored_schema)
            encoded = encode_batch(batch, filled, stats, schema=stored_schema, compression=self._compression(opaque),
                                   parts=encode_parts(parts) if parts else b"")
        except (pa.ArrowException, ValueError) as exc:
            # Coalesced appends were answered with their offsets already: nothing may take
            # those offsets instead, so the tablet goes offline (a restart recovers it).
            raise self._fail("encoding a batch", OSError(str(exc))) from exc
        view = self._view
        active = view.segments[-1] if view.segments else None
        try:
            if active is None or self._should_roll(active, encoded, filled):
                rolled = LogSegment.create(self.directory, base, self.config.index_interval_bytes)
                self._directory_dirty = True
                try:
                    rolled.append(encoded, filled, parts)
                except OSError:
                    rolled.delete()
                    raise
                self._view = _SegmentList.of(view.segments + (rolled,))
                # Closed only now, so a failed roll leaves the old segment writable.
                if active is not None:
                    active.close_for_append()
                    for listener in self.roll_listeners:
                        listener(base)
            else:
                active.append(encoded, filled, parts)
        except OSError as exc:
            raise self._fail("a write", exc) from exc
        # Counted under the write lock, for the metrics (bytes and records in).
        self.appended_records += count
        self.appended_bytes += encoded.size
        # A new leader epoch is rare: looked for part by part only when the message holds one.
        latest = self.leader_epochs.latest_epoch
        top = max([p.partition_leader_epoch for p in parts]) if parts else filled.partition_leader_epoch
        if top >= 0 and (latest is None or top > latest):
            for part in parts or (filled,):
                latest = self.leader_epochs.latest_epoch
                if part.partition_leader_epoch >= 0 and (latest is None or part.partition_leader_epoch > latest):
                    self.leader_epochs.assign(part.partition_leader_epoch, part.base_offset)

    def _stamp(
        self, records: pa.RecordBatch, meta: BatchMeta, base: int, now_ms: int | None, leader_epoch: int | None
    ) -> tuple[pa.RecordBatch, BatchMeta]:
        """Fill the batch metadata from the rows; with LogAppendTime also rewrite the timestamps."""
        count = records.num_rows
        attributes = meta.attributes
        if hasattr(records, "convert_together"):
            # Rows converted later (coalesced appends): their timestamps were read when checked.
            base_timestamp = meta.base_timestamp if meta.base_timestamp >= 0 else records.first_timestamp
            max_timestamp = records.max_timestamp
        elif self.config.message_timestamp_type is TimestampType.LOG_APPEND_TIME:
            now = _now_ms() if now_ms is None else now_ms
            column = pa.array(np.full(count, now, dtype=np.int64)).cast(records.schema.field(TIMESTAMP_COLUMN).type)
            records = records.set_column(records.schema.get_field_index(TIMESTAMP_COLUMN),
                                         records.schema.field(TIMESTAMP_COLUMN), column)
            base_timestamp = max_timestamp = now
            attributes |= ATTR_LOG_APPEND_TIME
        else:
            column = records.column(TIMESTAMP_COLUMN)
            if count == 1 and not column.null_count:
                # One row (many small producers): the scalar, without a NumPy view or reduction.
                max_timestamp = first = column[0].value
            else:
                timestamps = _as_int64(column)
                max_timestamp, first = int(timestamps.max()), int(timestamps[0])
            base_timestamp = meta.base_timestamp if meta.base_timestamp >= 0 else first
        filled = BatchMeta(
            base, count - 1, count, base_timestamp, max_timestamp, meta.producer_id, meta.producer_epoch,
            meta.base_sequence, attributes,
            meta.partition_leader_epoch if leader_epoch is None else leader_epoch, meta.schema_id,
            meta.producer_record_count,
        )
        return records, filled

    def start_leader_epoch(self, epoch: int) -> None:
        """This replica leads from ``epoch`` on: the epoch starts at the current log end.

        Kafka does this when a replica becomes leader, so OffsetForLeaderEpoch can answer for
        the epoch before any batch of it is appended.
        """
        with self._write_lock, self._pending_lock:
            latest = self.leader_epochs.latest_epoch
            if latest is None or epoch > latest:
                self.leader_epochs.assign(epoch, self.log_end_offset)

    def compression_for(self, schema: pa.Schema) -> str:
        """The storage codec a batch of this schema is written with under the current config."""
        return self._compression(_opaque_values(schema))

    def _compression(self, opaque: bool) -> str:
        compression = self.config.compression
        if compression == "auto":
            return "none" if opaque else "zstd"
        return compression

    def _stored_schema(self, schema: pa.Schema) -> tuple[pa.Schema, tuple[int, ...], bool]:
        """The schema as stored (``_offset`` first), the input columns that get statistics and
        whether the user data is opaque bytes (a raw table), checked once per distinct input schema."""
        cached = self._schema_cache
        if cached is not None and (cached[0] is schema or cached[0].equals(schema, check_metadata=True)):
            return cached[1], cached[2], cached[3]
        names = schema.names
        if OFFSET_FIELD.name in names:
            raise InvalidRecordError("_offset is assigned by the log, not given")
        if TIMESTAMP_COLUMN not in names or not pa.types.is_timestamp(schema.field(TIMESTAMP_COLUMN).type):
            raise InvalidRecordError("an appended batch needs a _timestamp column of a timestamp type")
        if any(pa.types.is_dictionary(t) for t in schema.types):
            raise InvalidRecordError("dictionary-encoded columns are not stored; decode them first")
        stored = schema.insert(0, OFFSET_FIELD)
        self._schema_cache = (schema, stored, stats_columns(schema), _opaque_values(schema))
        return stored, self._schema_cache[2], self._schema_cache[3]

    def _should_roll(self, active: LogSegment, encoded, meta: BatchMeta) -> bool:
        if self._roll_requested:
            self._roll_requested = False
            return True
        state = active.state
        if not active.accepts_schema(encoded.schema_message):
            return True  # one schema per segment file keeps every segment a plain IPC stream
        if state.size + encoded.size > self.config.segment_bytes:
            return True
        if (len(active.offset_index) + 1) * 16 > self.config.segment_index_bytes:
            return True  # the offset index is full (segment.index.bytes)
        return meta.max_timestamp - state.first_max_timestamp > self.config.segment_ms

    # -- log compaction (broker/log/cleaner.py does the cleaning) ----------------------------

    def roll(self) -> None:
        """Close the active segment for cleaning: the next append starts a new segment."""
        with self._write_lock:
            if self._view.segments:
                self._roll_requested = True

    def closed_segments(self) -> tuple[LogSegment, ...]:
        """The segments no append will touch again, oldest first, all below the high
        watermark (so nothing a crash could take back is cleaned)."""
        with self._write_lock:
            segments = self._view.segments
            closed = segments if self._roll_requested else segments[:-1]
            visible = self.high_watermark
        return tuple(s for s in closed if s.state.next_offset <= visible)

    def replace_segments(self, olds: tuple[LogSegment, ...], cleaned: LogSegment, swap_path: Path,
                         swap_indexes: tuple[Path, Path]) -> bool:
        """Install a cleaned copy of the consecutive segments ``olds`` (covering the same
        offsets, named as the first), written and fsynced at ``swap_path``. False (and the
        copy removed) when one of them left the log meanwhile (retention, DeleteRecords)."""
        # Readers holding an older view go on reading the old files through their mappings.
        for old in olds:
            old.pin_mapping()
        first = olds[0]
        with self._write_lock:
            segments = self._view.segments
            at = next((i for i, s in enumerate(segments) if s is first), None)
            if at is None or segments[at:at + len(olds)] != olds or self._closed:
                for path in (swap_path, *swap_indexes):
                    path.unlink(missing_ok=True)
                return False
            for old in olds:
                old.close_for_append()  # the segment last active before a roll() may still hold it
                for path in (old.offset_index.path, old.time_index.path):
                    path.unlink(missing_ok=True)
            # A crash from here on is finished on open: the `.swap` file covers these segments.
            for old in olds[1:]:
                old.data_path.unlink(missing_ok=True)
            os.replace(swap_path, first.data_path)
            cleaned.data_path = first.data_path
            for index, path, target in ((cleaned.offset_index, swap_indexes[0], first.offset_index.path),
                                        (cleaned.time_index, swap_indexes[1], first.time_index.path)):
                os.replace(path, target)
                index.path = target
            for old in olds:
                old.deleted = True
            self._view = _SegmentList.of(segments[:at] + (cleaned,) + segments[at + len(olds):])
        fsync_directory(self.directory)
        return True

    # -- reading --------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        columns: list[str] | None = None,
        max_offset: int | None = None,
        uncommitted: bool = False,
        uses: Collection[str] | None = None,
    ) -> list[StoredBatch]:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (at least one).

        ``columns`` projects: the segments are memory-mapped and batches read zero-copy, so
        buffers of columns not asked for are never touched. ``uses`` (without ``columns``):
        the user columns the caller will look at, for batches of any schema; a compressed
        batch comes with those and the system columns only (the others are not
        decompressed), an uncompressed one whole. Batches starting at or after
        ``max_offset`` are not returned, nor those past the high watermark unless
        ``uncommitted`` (the broker's own replays: producer state, KV tablets). Sizes count
        the (projected) column buffers.
        """
        self.check_online()
        view = self._view
        log_start = self._log_start
        visible = self.high_watermark
        end = view.segments[-1].state.next_offset if view.segments else self._empty_end
        if offset < log_start or offset > max(end, self.log_end_offset):
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside the log [{log_start}, {max(end, self.log_end_offset)}]"
            )
        if not uncommitted:
            end = min(end, visible)
        limit = end if max_offset is None else min(end, max_offset)
        result: list[StoredBatch] = []
        if offset >= limit:
            return result
        used = 0
        try:
            for segment in view.segments[view.index_of(offset):]:
                state = segment.state
                if state.next_offset <= offset:
                    continue
                for header in segment.headers_from(segment.position_for_offset(offset), state):
                    meta = header.meta
                    if meta.next_offset <= offset:
                        continue
                    if meta.base_offset >= limit:
                        return result
                    wanted = columns
                    if wanted is None and uses is not None and header.compressed:
                        wanted = [n for n in segment.read_schema().names if n in uses or n.startswith("_")]
                    batch = segment.read_batch(header, state, wanted)
                    if columns is not None:
                        batch = _project(batch, columns)
                        size = batch.get_total_buffer_size()
                    else:
                        size = header.body_length
                    # A plain message is one Kafka batch; a coalesced one holds several, each
                    # counted with its rows' share of the message's size.
                    total = max(1, meta.record_count)
                    for part, rows in split_parts(header, batch):
                        if part.next_offset <= offset:
                            continue
                        if part.base_offset >= limit:
                            return result
                        part_size = size if part is meta else size * part.record_count // total
                        if result and used + part_size > max_bytes:
                            return result
                        result.append(StoredBatch(part, rows))
                        used += part_size
                        if used >= max_bytes:
                            return result
        except FileNotFoundError as exc:
            # Retention removed the segment between our snapshot and the read.
            raise OffsetOutOfRangeError(f"offset {offset} was deleted by retention") from exc
        except SegmentFormatError as exc:
            raise StorageError(f"corrupt segment data at offset {offset}: {exc}") from exc
        return result

    def batch_metas(self, offset: int | None = None) -> Iterator[BatchMeta]:
        """The metadata of every batch from the one holding ``offset`` (default: the log start) to
        the end, read from batch headers only, e.g. to rebuild producer state after a restart."""
        start = self._log_start if offset is None else offset
        for header in self._headers_from(offset):
            for meta in header.metas:
                if meta.next_offset > start:
                    yield meta

    def batch_statistics(self, offset: int | None = None) -> Iterator[tuple[BatchMeta, dict[str, ColumnStats]]]:
        """Each batch's metadata and column statistics from the one holding ``offset``, from
        headers only: a scan with a filter reads just the batches whose bounds can match. The
        Kafka batches of a coalesced message share its statistics (bounds of all of them)."""
        start = self._log_start if offset is None else offset
        for header in self._headers_from(offset):
            stats = decode_stats(header.stats)
            for meta in header.metas:
                if meta.next_offset > start:
                    yield meta, stats

    def _headers_from(self, offset: int | None) -> Iterator[BatchHeader]:
        view = self._view
        offset = self._log_start if offset is None else offset
        for segment in view.segments[view.index_of(offset):]:
            state = segment.state
            if state.next_offset <= offset:
                continue
            for header in segment.headers_from(segment.position_for_offset(offset), state):
                if header.meta.next_offset > offset:
                    yield header

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """ListOffsets: the earliest offset whose record timestamp is >= ``timestamp_ms``, with
        that timestamp; only records below the high watermark count."""
        view = self._view
        log_start = self._log_start
        visible = self.high_watermark
        for segment in view.segments:
            state = segment.state
            if state.max_timestamp < timestamp_ms or state.next_offset <= log_start:
                continue
            for header in segment.headers_from(segment.position_before_timestamp(timestamp_ms), state):
                meta = header.meta
                if meta.max_timestamp < timestamp_ms or meta.next_offset <= log_start:
                    continue
                batch = segment.read_batch(header, state, _TIME_COLUMNS)
                timestamps, offsets = _timestamps_and_offsets(batch)
                hits = np.flatnonzero((timestamps >= timestamp_ms) & (offsets >= log_start))
                if len(hits):
                    if offsets[hits[0]] >= visible:
                        return None
                    return int(offsets[hits[0]]), int(timestamps[hits[0]])
        return None

    def max_timestamp(self) -> tuple[int, int] | None:
        """The offset and timestamp of the record with the largest timestamp (earliest on ties)."""
        view = self._view
        log_start = self._log_start
        live = [s for s in view.segments if s.state.next_offset > log_start]
        if not live:
            return None
        segment = max(live, key=lambda s: s.state.max_timestamp)  # max() keeps the first on ties
        state = segment.state
        target = state.max_timestamp
        # The time index's running maximum first reaches the target in the entry after this one.
        reached = segment.time_index.first_at_least(target)
        position = (segment.position_for_offset(segment.time_index.entry(reached - 1)[1])
                    if reached > 0 else len(segment.schema_message))
        best: tuple[int, int] | None = None
        for header in segment.headers_from(position, state):
            meta = header.meta
            if meta.next_offset <= log_start or (best is not None and meta.max_timestamp <= best[1]):
                continue
            timestamps, offsets = _timestamps_and_offsets(segment.read_batch(header, state, _TIME_COLUMNS))
            if not len(timestamps):
                continue  # a batch log compaction emptied
            timestamps = np.where(offsets >= log_start, timestamps, np.iinfo(np.int64).min)
            i = int(np.argmax(timestamps))
            if best is None or timestamps[i] > best[1]:
                best = (int(offsets[i]), int(timestamps[i]))
            if best[1] >= target:
                break
        return best

    # -- flushing -------------------------------------------------------------------------

    def flush_up_to(self, offset: int) -> None:
        """Make every batch below ``offset`` durable; callers waiting together share one fsync.

        Blocking: the broker calls it off the event loop. Two callers may sync at once (the
        group commit starts the next flush while one is under way, so that appends written
        meanwhile are not held for the whole of it first), but the flushed offset moves in
        the order the flushes began: a flush is published only after every flush begun
        before it succeeded, so a failed one is never covered by a later one that
        succeeded (after a failed fsync the kernel may have marked the lost pages clean).
        """
        self.check_online()
        if offset <= self._flushed_offset:
            return
        with self._flush_lock:
            self.check_online()
            covered = offset <= self._flush_begun_offset
            view = self._view
            if covered or offset <= self._flushed_offset or not view.segments:
                pending = None
            else:
                target = view.segments[-1].state.next_offset
                pending = view.segments[view.index_of(self._flushed_offset):]
                # A directory entry made durable by this flush: one begun later may finish
                # first, but it is published only after this one.
                directory_dirty, self._directory_dirty = self._directory_dirty, False
                parent_dirty, self._parent_dirty = self._parent_dirty, False
                ticket = self._flush_tickets
                self._flush_tickets += 1
                self._flush_begun_offset = max(self._flush_begun_offset, target)
        if pending is None:
            if covered and offset > self._flushed_offset:
                self._await_flushed(offset)  # a flush under way covers it
            return
        started = time.perf_counter()
        failure: StorageError | None = None
        try:
            for segment in pending:
                segment.flush()
            if directory_dirty:
                fsync_directory(self.directory)
            if parent_dirty:
                fsync_directory(self.directory.parent)
        except OSError as exc:
            failure = self._fail("an fsync", exc)
        else:
            FSYNC_LATENCY.observe(time.perf_counter() - started)
        with self._flush_published:
            while self._flush_published_tickets != ticket:
                self._flush_published.wait()
            try:
                if failure is not None:
                    raise failure
                self.check_online()  # a flush begun before this one failed
                self._flushed_offset = max(self._flushed_offset, target)
                self._last_flush_ms = _now_ms()
                if len(pending) > 1 or self._last_flush_ms - self._checkpoint_ms >= RECOVERY_CHECKPOINT_INTERVAL_MS:
                    # Everything below target is durable: recovery after a crash checks only what
                    # follows it (rolled segments are skipped, the active one is checked from the
                    # index entry before it). The checkpoint only bounds recovery work (a stale or
                    # lost one means more checking, never less), so no fsync.
                    try:
                        self._recovery_checkpoint.write(self._flushed_offset, durable=False)
                        self._checkpoint_ms = self._last_flush_ms
                    except OSError as exc:
                        log.warning("recovery point of %s not updated: %s", self.directory, exc)
            finally:
                self._flush_published_tickets += 1
                self._flush_published.notify_all()

    def _await_flushed(self, offset: int) -> None:
        """Wait for the flushes under way that cover ``offset`` (one begun already does)."""
        with self._flush_published:
            while self._flushed_offset < offset and self._flush_published_tickets < self._flush_tickets:
                self._flush_published.wait()
        self.check_online()

    def flush(self) -> None:
        self.write_pending()
        self.flush_up_to(self.log_end_offset)

    @property
    def flushed_offset(self) -> int:
        """Every batch below this offset has been fsynced."""
        return self._flushed_offset

    def maybe_flush(self, now_ms: int | None = None) -> bool:
        """For FlushPolicy.INTERVAL: flush when the interval has passed; the broker's ticker calls it."""
        if self.config.flush_policy is not FlushPolicy.INTERVAL or self._failure is not None:
            return False
        now = _now_ms() if now_ms is None else now_ms
        if now - self._last_flush_ms < self.config.flush_interval_ms or self._flushed_offset >= self.log_end_offset:
            return False
        self.flush()
        return True

    # -- retention ------------------------------------------------------------------------

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete whole old segments past the time or size limit (never the active one); returns how many."""
        now = _now_ms() if now_ms is None else now_ms
        with self._write_lock:
            segments = self._view.segments
            closed = segments[:-1]
            cut = 0
            while cut < len(closed) and closed[cut].state.next_offset <= self._log_start:
                cut += 1
            deleted_records = cut  # wholly below the log start: unreadable, always deletable
            if self.config.retention_ms >= 0:
                while cut < len(closed) and now - closed[cut].state.max_timestamp > self.config.retention_ms:
                    cut += 1
            if self.config.retention_bytes >= 0:
                total = sum(s.state.size for s in segments[cut:])
                while cut < len(closed) and total - closed[cut].state.size >= self.config.retention_bytes:
                    total -= closed[cut].state.size
                    cut += 1
            limit = self.retention_limit_offset
            if limit is not None:
                while cut > deleted_records and closed[cut - 1].state.next_offset > limit:
                    cut -= 1
            doomed = self._drop_oldest(cut)
        # Unlinking big files and fsyncing the epoch file take a while: not under the lock
        # appends wait on.
        self._finish_drop(doomed)
        return cut

    def advance_log_start(self, offset: int) -> int:
        """DeleteRecords: records below ``offset`` become unreadable, and stay so after a restart."""
        with self._write_lock:
            self._check_open()
            if offset > self.high_watermark or offset < 0:
                raise OffsetOutOfRangeError(
                    f"cannot move the log start to {offset}: the high watermark is {self.high_watermark}"
                )
            if offset <= self._log_start:
                return self._log_start
            self._log_start_checkpoint.write(offset)
            self._log_start = offset
            closed = self._view.segments[:-1]
            cut = 0
            while cut < len(closed) and closed[cut].state.next_offset <= offset:
                cut += 1
            doomed = self._drop_oldest(cut)
            epochs_changed = self.leader_epochs.truncate_from_start(self._log_start, persist=False)
            start = self._log_start
        self._finish_drop(doomed, persist_epochs=epochs_changed)
        return start

    def _drop_oldest(self, count: int) -> tuple[LogSegment, ...]:
        """Take the oldest segments out of the log; the caller deletes their files."""
        if count == 0:
            return ()
        segments = self._view.segments
        doomed, kept = segments[:count], segments[count:]
        new_start = max(self._log_start, kept[0].base_offset)
        if new_start != self._log_start:
            # Not fsynced: on restart the start is at least the first remaining segment's base anyway.
            self._log_start_checkpoint.write(new_start, durable=False)
            self._log_start = new_start
        self._view = _SegmentList.of(kept)
        self.leader_epochs.truncate_from_start(self._log_start, persist=False)
        return doomed

    def _finish_drop(self, doomed: tuple[LogSegment, ...], *, persist_epochs: bool = False) -> None:
        """After `_drop_oldest`, outside the write lock: persist the epochs, remove the files."""
        if doomed or persist_epochs:
            self.leader_epochs.persist()
        for segment in doomed:
            segment.delete()

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Flush everything and record that no recovery is needed on the next open."""
        with self._write_lock, self._pending_lock:
            if self._closed:
                return
            try:
                if self._failure is None:
                    self._write_pending_locked()
                    self.flush_up_to(self.log_end_offset)
                    self._recovery_checkpoint.write(self.log_end_offset)
            except (OSError, StorageError) as exc:
                # A full or failing disk: the next open recovers from the files instead.
                log.error("closing log tablet %s: %s; it will be recovered on the next start", self.directory, exc)
            self._pending = []
            self._windows.clear()
            self._pending_rows = 0
            for segment in self._view.segments:
                segment.close_for_append()
            self._closed = True

    def delete(self) -> None:
        """Remove the bucket's files (DeleteTopics)."""
        with self._write_lock, self._pending_lock:
            self._pending = []
            self._windows.clear()
            self._pending_rows = 0
            for segment in self._view.segments:
                segment.close_for_append()
                segment.deleted = True
            self._view = _SegmentList.of(())
            self._closed = True
            shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def closed(self) -> bool:
        """Closed or deleted: nothing more is appended or flushed."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"log tablet {self.directory} is closed")

    def __repr__(self) -> str:
        return f"LogTablet({self.directory}, [{self.log_start_offset}, {self.log_end_offset}))"


def _approximate_size(records) -> int:
    """Bytes of a batch to append (of its Kafka records section when not converted yet)."""
    section = getattr(records, "section", None)
    if section is not None:
        return len(section)
    return records.nbytes


def _convert_runs(records: list) -> list[pa.RecordBatch]:
    """Arrow batches of pending appends: rows not converted yet (those with a
    ``convert_together``, e.g. Kafka records checked on append) converted run by run, one
    conversion for each run of the same kind."""
    out: list[pa.RecordBatch] = []
    run: list = []
    for r in records:
        convert = getattr(r, "convert_together", None)
        if run and (convert is None or convert != run[0].convert_together):
            out.append(run[0].convert_together(run))
            run = []
        if convert is None:
            out.append(r)
        else:
            run.append(r)
    if run:
        out.append(run[0].convert_together(run))
    return out


def _project(batch: pa.RecordBatch, columns: list[str]) -> pa.RecordBatch:
    missing = [c for c in columns if batch.schema.get_field_index(c) < 0]
    if missing:
        raise InvalidRequestError(f"unknown column(s) {missing}")
    return batch.select(columns)


def _as_int64(timestamps: pa.Array) -> np.ndarray:
    """Milliseconds as int64, zero-copy when there are no nulls (a null timestamp counts as -1)."""
    if timestamps.null_count:
        timestamps = pc.fill_null(timestamps, pa.scalar(-1, pa.int64()).cast(timestamps.type))
    return timestamps.view(pa.int64()).to_numpy()


_TIME_COLUMNS = [OFFSET_FIELD.name, TIMESTAMP_COLUMN]


def _timestamps_and_offsets(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    offsets = batch.column(OFFSET_FIELD.name)
    return _as_int64(batch.column(TIMESTAMP_COLUMN)), offsets.to_numpy(zero_copy_only=False)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _opaque_values(schema: pa.Schema) -> bool:
    """A raw table's schema: one binary user column (`value`) beside the system columns. Its
    values are bytes the producer chose (often compressed already, or random), which storage
    compression would spend CPU on for little gain."""
    user = [f for f in schema if not f.name.startswith("_")]
    return len(user) == 1 and (pa.types.is_binary(user[0].type) or pa.types.is_large_binary(user[0].type))
