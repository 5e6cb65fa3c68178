"""One log segment: an Arrow IPC stream file with its offset and time indexes, and its recovery."""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from fluvial.broker.log import fault_injection, sync_journal
from fluvial.broker.log.batch_meta import BatchMeta
from fluvial.broker.log.index import OffsetIndex, SparseIndex, TimeIndex
from fluvial.broker.log.segment_format import (
    BatchHeader,
    EncodedBatch,
    SegmentFormatError,
    checksum_matches,
    parse_batch_header,
    read_batch,
    read_schema_message,
    schema_checksum,
)

log = logging.getLogger(__name__)

DATA_SUFFIX = ".arrows"
OFFSET_INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
# Parsed headers kept per segment, counted in Kafka batches: a coalesced message holds one
# BatchMeta per producer batch (tens under many small producers), and every one of them is
# an object the garbage collector walks on each full collection.
_HEADER_CACHE_BATCHES = 4096


def _sync(fd: int, path: Path, sync) -> None:
    fault_injection.before_fsync(path)
    if sync_journal.enabled():
        size = os.fstat(fd).st_size  # what this fsync surely covers
        sync(fd)
        sync_journal.synced(path, size)
    else:
        sync(fd)


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


@dataclass(frozen=True, slots=True)
class SegmentState:
    """What readers may see of a segment; replaced whole after each append."""

    size: int  # bytes of whole batches; readers never look past it
    next_offset: int
    max_timestamp: int  # -1 while empty
    first_max_timestamp: int  # max timestamp of the first batch: the basis of time-based rolls
    batch_count: int


def pwrite_parts(fd: int, parts: list, position: int, total: int | None = None) -> int:
    """Write ``parts`` one after another at ``position`` with one gather write (pwritev);
    returns the bytes written. A short write (only for huge batches) is finished plainly.
    ``total``: their size when the caller knows it (else it is summed here)."""
    if total is None:
        total = sum([memoryview(p).nbytes for p in parts])
    written = os.pwritev(fd, parts, position)
    if written < total:
        rest = memoryview(b"".join(bytes(memoryview(p)) for p in parts))[written:]
        while rest:
            n = os.pwrite(fd, rest, position + written)
            written += n
            rest = rest[n:]
    return written


class LogSegment:
    """An Arrow IPC stream of batches starting at ``base_offset``, plus its sparse indexes."""

    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int):
        name = segment_name(base_offset)
        self.base_offset = base_offset
        self.data_path = directory / (name + DATA_SUFFIX)
        self.offset_index = OffsetIndex(directory / (name + OFFSET_INDEX_SUFFIX))
        self.time_index = TimeIndex(directory / (name + TIME_INDEX_SUFFIX))
        self.state = SegmentState(0, base_offset, -1, -1, 0)
        self.schema: pa.Schema | None = None
        self.schema_message = b""
        self.schema_crc = 0
        self._index_interval = index_interval_bytes
        self._bytes_since_index = 0
        self._fd: int | None = None
        self._fd_lock = threading.Lock()
        self._map: pa.Buffer | None = None
        self._map_lock = threading.Lock()
        # Parsed headers by file position: batches never change once visible, and fetches
        # of recent data (tailing consumers) read the same few batches again and again.
        self._headers: dict[int, BatchHeader] = {}
        self._cached_batches = 0  # Kafka batches (BatchMetas) of the cached headers
        self.deleted = False

    # -- creation and loading -------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, index_interval_bytes: int) -> LogSegment:
        segment = cls(directory, base_offset, index_interval_bytes)
        for index in (segment.offset_index, segment.time_index):
            index.create_empty()
        segment._fd = os.open(segment.data_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sync_journal.created(segment.data_path)
        return segment

    @classmethod
    def load(
        cls, directory: Path, base_offset: int, index_interval_bytes: int, *, recover: bool,
        recover_from: int | None = None,
    ) -> LogSegment | None:
        """Open an existing segment; None when it holds no whole batch (the caller removes it).

        With ``recover`` every batch is checked (checksum, contiguous offsets), the file is
        cut after the last good batch and the indexes are rebuilt; with ``recover_from`` as
        well, batches below that offset are known to be on disk (the recovery point), so only
        the batches from the index entry at or before it are checked. Without ``recover`` the
        indexes are trusted when they agree with the file, and only the batches after the
        last index entry are walked. Any disagreement falls back to full recovery.
        """
        segment = cls(directory, base_offset, index_interval_bytes)
        if not segment._load_schema():
            return None
        if recover:
            if recover_from is None or not segment._recover_tail(recover_from):
                segment.recover()
        elif not segment._load_with_indexes():
            segment.recover()
        if segment.state.batch_count == 0:
            return None
        return segment

    def _load_schema(self) -> bool:
        size = self.data_path.stat().st_size
        if size == 0:
            return False
        view = memoryview(self._mapped(size))
        try:
            length, self.schema = read_schema_message(view, size)
        except SegmentFormatError:
            return False
        self.schema_message = bytes(view[:length])
        self.schema_crc = schema_checksum(self.schema_message)
        self.state = SegmentState(length, self.base_offset, -1, -1, 0)
        return True

    def _load_with_indexes(self) -> bool:
        size = self.data_path.stat().st_size
        offsets = SparseIndex.read_entries(self.offset_index.path)
        times = SparseIndex.read_entries(self.time_index.path)
        if offsets is None or times is None:
            return False
        self.offset_index = OffsetIndex(self.offset_index.path, offsets)
        self.time_index = TimeIndex(self.time_index.path, times)
        first = len(self.schema_message)
        if not (
            self.offset_index.consistent_with(self.base_offset, first, size)
            and self.time_index.consistent_with(self.base_offset)
            # Both are written in step: the same batches, so the same offsets.
            and np.array_equal(self.time_index.values(), self.offset_index.keys())
        ):
            return False
        view = memoryview(self._mapped(size))
        try:
            first_header = parse_batch_header(view, first, size)
            last_entry = self.offset_index.last()
            start, expected = (last_entry[1], last_entry[0]) if last_entry else (first, self.base_offset)
            max_timestamp = self.time_index.last()[0] if len(self.time_index) else -1
            position, count = start, 0
            while position < size:
                header = parse_batch_header(view, position, size)
                if header.meta.base_offset != expected:
                    return False
                expected = header.meta.next_offset
                max_timestamp = max(max_timestamp, header.meta.max_timestamp)
                position = header.end
                count += 1
        except SegmentFormatError:
            return False
        if first_header.meta.base_offset != self.base_offset or count == 0:
            return False
        self._bytes_since_index = size - start
        self.state = SegmentState(
            size, expected, max_timestamp, first_header.meta.max_timestamp,
            batch_count=len(self.offset_index) + count,  # a lower bound is all anyone needs
        )
        return True

    def _recover_tail(self, offset: int) -> bool:
        """Recover only what may be torn: the batches from the index entry at or before
        ``offset`` (below which everything was fsynced) to the end. The indexes are trusted
        up to that entry when they agree with the file and the entry names the batch found
        at its position; False (nothing changed) when they do not."""
        size = self.data_path.stat().st_size
        offsets = SparseIndex.read_entries(self.offset_index.path)
        times = SparseIndex.read_entries(self.time_index.path)
        if offsets is None or times is None or len(offsets) != len(times):
            return False
        offset_index = OffsetIndex(self.offset_index.path, offsets)
        time_index = TimeIndex(self.time_index.path, times)
        first = len(self.schema_message)
        if not (offset_index.consistent_with(self.base_offset, first, size)
                and time_index.consistent_with(self.base_offset)
                and np.array_equal(time_index.values(), offset_index.keys())):
            return False
        keys = offset_index.keys()
        i = int(np.searchsorted(keys, offset, side="right")) - 1
        if i <= 0:
            return False  # the whole segment is to be checked anyway
        view = memoryview(self._mapped(size))
        position = int(offsets["value"][i])
        try:
            first_header = parse_batch_header(view, first, size)
            floor_header = parse_batch_header(view, position, size)
        except SegmentFormatError:
            return False
        if first_header.meta.base_offset != self.base_offset or floor_header.meta.base_offset != int(keys[i]):
            return False
        # Entries before the floor one are kept; the floor batch gets its entry again as the
        # walk adds it. Its time entry is the largest timestamp up to the end of that batch.
        self.offset_index = OffsetIndex(self.offset_index.path, offsets[:i])
        self.time_index = TimeIndex(self.time_index.path, times[:i])
        self.state = SegmentState(position, int(keys[i]), int(times["key"][i]), first_header.meta.max_timestamp, i)
        del view
        self._check_batches(position, size, index_due=True)
        return True

    def recover(self) -> None:
        """Check every batch, cut the file after the last good one and rebuild the indexes."""
        size = self.data_path.stat().st_size
        self.offset_index = OffsetIndex(self.offset_index.path)
        self.time_index = TimeIndex(self.time_index.path)
        position = len(self.schema_message)
        self.state = SegmentState(position, self.base_offset, -1, -1, 0)
        self._check_batches(position, size, index_due=False)

    def _check_batches(self, position: int, size: int, *, index_due: bool) -> None:
        """Walk and check batches from ``position`` (the end of ``self.state``), cut the file
        after the last good one and store the rebuilt indexes."""
        view = memoryview(self._mapped(size))
        self.offset_index.write_through = self.time_index.write_through = False
        self._bytes_since_index = self._index_interval if index_due else 0
        while position < size:
            try:
                header = parse_batch_header(view, position, size)
            except SegmentFormatError:
                break
            if header.meta.base_offset != self.state.next_offset or header.meta.record_count < 0:
                break
            if not checksum_matches(view, header, self.schema_crc):
                break
            self._add_batch(header)
            position = header.end
        del view
        if position < size:
            self._map = None
            with open(self.data_path, "r+b") as f:
                f.truncate(position)
                os.fsync(f.fileno())
            sync_journal.truncated(self.data_path, position)
        for index in (self.offset_index, self.time_index):
            # Rewritten only when it changed: replacing a file costs a rename (ext4 writes the
            # new file's blocks out first), and after a clean close nothing changes.
            index.store()

    def _add_batch(self, header: BatchHeader) -> None:
        """Account for a batch now in the file: index entries when due, then the visible state."""
        meta = header.meta
        state = self.state
        max_timestamp = max(state.max_timestamp, meta.max_timestamp)
        if state.batch_count == 0 or self._bytes_since_index >= self._index_interval:
            self.offset_index.append(meta.base_offset, header.position)
            self.time_index.append(max_timestamp, meta.base_offset)
            self._bytes_since_index = 0
        self._bytes_since_index += header.size
        first_max = meta.max_timestamp if state.batch_count == 0 else state.first_max_timestamp
        self.state = SegmentState(header.end, meta.next_offset, max_timestamp, first_max, state.batch_count + 1)

    def open_for_append(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.data_path, os.O_WRONLY)

    # -- writing ----------------------------------------------------------------------------

    def accepts_schema(self, schema_message: bytes) -> bool:
        return self.state.batch_count == 0 or schema_message == self.schema_message

    def append(self, encoded: EncodedBatch, meta: BatchMeta, kafka_parts: tuple[BatchMeta, ...] = ()) -> None:
        assert self._fd is not None, "append to a segment that is not open for writing"
        position = self.state.size
        parts: list = [encoded.header, *encoded.body_parts]
        total = encoded.size
        if self.state.batch_count == 0:
            self.schema_message = encoded.schema_message
            self.schema_crc = schema_checksum(encoded.schema_message)
            self.schema = None  # parsed on first read
            parts.insert(0, encoded.schema_message)
            total += len(encoded.schema_message)
            position = 0
        start = position
        pwrite_parts(self._fd, parts, position, total)
        batch_position = start + (len(encoded.schema_message) if start == 0 else 0)
        header = BatchHeader(batch_position, len(encoded.header), encoded.body_size, meta, -1, -1, encoded.stats,
                             encoded.compressed, kafka_parts, encoded.delta)
        self._add_batch(header)
        self._remember(header)

    def flush(self) -> None:
        """Force the segment's data to disk (safe beside a concurrent roll).

        Indexes are not fsynced: they are checked against the data on load and rebuilt when
        they disagree, so their durability never decides what is served.
        """
        # The sync runs on a descriptor of its own, outside the lock: a roll may close the
        # append descriptor meanwhile, and two flushes of the log tablet may sync at once.
        # The file is opened again for every flush rather than the append descriptor
        # duplicated: Linux reports a write-back error once per open file, and duplicates
        # share one. With two flushes in flight on a shared open file, only one would see the
        # error, and the other could publish its offset as durable. Each open file sees every
        # error that happens after it was opened (and one that nobody has seen yet).
        with self._fd_lock:
            if self.deleted:
                return
            sync = os.fdatasync if self._fd is not None else os.fsync
            try:
                fd = os.open(self.data_path, os.O_RDONLY)
            except FileNotFoundError:
                return
        try:
            _sync(fd, self.data_path, sync)
        finally:
            os.close(fd)

    def close_for_append(self, *, write_indexes: bool = True) -> None:
        """No more appends: the append descriptor is closed and the indexes' newest entries
        are written out, so a closed segment's index files are whole (tiering uploads them).
        A failure to write them is logged only: a shorter index is still a valid one."""
        with self._fd_lock:
            if self._fd is None:
                return
            os.close(self._fd)
            self._fd = None
        if write_indexes:
            try:
                for index in (self.offset_index, self.time_index):
                    index.write_unwritten()
            except OSError as exc:
                log.warning("index of segment %s not completed: %s", self.data_path, exc)

    def delete(self) -> None:
        self.close_for_append(write_indexes=False)
        self.deleted = True
        for path in (self.data_path, self.offset_index.path, self.time_index.path):
            path.unlink(missing_ok=True)

    # -- reading ----------------------------------------------------------------------------

    def _mapped(self, size: int) -> pa.Buffer:
        """A memory map of at least ``size`` bytes, re-mapped when the file has grown."""
        data = self._map
        if data is None or data.size < size:
            with self._map_lock:
                data = self._map
                if data is None or data.size < size:
                    mapped = pa.memory_map(str(self.data_path), "r")
                    # Buffers handed out keep the mapping alive after the file object closes.
                    data = mapped.read_buffer()
                    mapped.close()
                    self._map = data
        return data

    def pin_mapping(self) -> None:
        """Map the whole file now, so readers keep reading this file's bytes after it is
        replaced by a cleaned copy under the same name (log compaction)."""
        self._mapped(self.state.size)

    def read_schema(self) -> pa.Schema:
        if self.schema is None:
            _, self.schema = read_schema_message(memoryview(self.schema_message), len(self.schema_message))
        return self.schema

    def headers_from(self, position: int, state: SegmentState) -> Iterator[BatchHeader]:
        """Headers of the batches from ``position`` to the end visible in ``state``."""
        view = memoryview(self._mapped(state.size))
        headers = self._headers
        while position < state.size:
            header = headers.get(position)
            if header is None:
                header = parse_batch_header(view, position, state.size)
                self._remember(header)
            yield header
            position = header.end

    def _remember(self, header: BatchHeader) -> None:
        weight = len(header.parts) or 1
        if self._cached_batches + weight > _HEADER_CACHE_BATCHES:
            self._headers = {}
            self._cached_batches = 0
        self._headers[header.position] = header
        self._cached_batches += weight

    def position_for_offset(self, offset: int) -> int:
        """File position of an indexed batch at or before the one holding ``offset``."""
        entry = self.offset_index.floor(offset)
        return entry[1] if entry else len(self.schema_message)

    def position_before_timestamp(self, timestamp: int) -> int:
        """File position from which to look for the first record with a timestamp >= ``timestamp``."""
        entry = self.time_index.lower(timestamp)
        if entry is None:
            return len(self.schema_message)
        return self.position_for_offset(entry[1])

    def read_batch(self, header: BatchHeader, state: SegmentState, columns: list[str] | None = None) -> pa.RecordBatch:
        """The batch; with ``columns`` a compressed batch decompresses only those (the caller
        still projects: an uncompressed batch comes whole, zero-copy)."""
        schema = self.read_schema()
        if columns is not None and header.compressed:
            indexes = [schema.get_field_index(c) for c in columns]
            if all(i >= 0 for i in indexes):
                return read_batch(self._mapped(state.size), header, schema, indexes, self.schema_message)
        return read_batch(self._mapped(state.size), header, schema)
