"""Remote log segments: one closed local segment rewritten as one column-contiguous Parquet object.

Layout (format ``parquet-1``):

- The stored columns exactly as the log tablet keeps them (``_offset``, ``_timestamp``,
  ``_change``, ``_key``, ``_headers``, user columns), with the Arrow schema in the footer so
  types come back unchanged.
- Consecutive stored batches are grouped into row groups of about `ROW_GROUP_TARGET_BYTES`;
  a row group never splits a batch. Within a row group each column is one contiguous
  column chunk, so a reader asking for 2 columns of 20 fetches those 2 chunks by ranged
  reads and nothing else.
- The footer's key-value metadata ``fluvial.batches`` lists every stored batch: its
  `BatchMeta` (the same text the local segment keeps, so Kafka batches are re-encoded
  exactly: producer id/epoch/sequence, attributes, timestamps, leader epoch, schema id),
  its row group, its first row in the group and its column statistics (min/max/null count,
  the local segment's own). A filter skips batches from the footer alone.
- Page checksums (CRC-32) are written and verified on read; the object's size is recorded in
  the manifest and checked. A bit flip or a truncated or swapped object is an error, never
  wrong data.
"""
from __future__ import annotations

import bisect
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fluvial.broker.log.batch_meta import BatchMeta, StoredBatch
from fluvial.broker.log.statistics import ColumnStats
from fluvial.errors import CorruptRemoteDataError, InvalidRequestError, StorageError
from fluvial.tiering.object_store import ObjectStore

FORMAT = "parquet-1"
BATCHES_KEY = b"fluvial.batches"
# A row group of about this many (uncompressed Arrow) bytes: big enough that per-chunk
# overhead (footer entries, one ranged get per column chunk) stays small, small enough that
# a reader starting mid-segment does not fetch much it skips.
ROW_GROUP_TARGET_BYTES = 8 << 20
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 1


@dataclass(frozen=True)
class RemoteSegment:
    """One entry of a remote log manifest: where a segment's data lives and what it covers."""

    base_offset: int
    next_offset: int  # exclusive
    size_bytes: int  # of the remote object (checked on read)
    max_timestamp: int
    key: str
    batch_count: int = 0
    min_timestamp: int = -1
    local_bytes: int = 0  # of the local segment it came from
    format: str = FORMAT

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RemoteSegment:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True, slots=True)
class _BatchEntry:
    meta: BatchMeta
    row_group: int
    row_start: int
    stats: dict


@dataclass(frozen=True)
class _Footer:
    metadata: pq.FileMetaData
    entries: tuple[_BatchEntry, ...]
    bases: tuple[int, ...]


# -- writing -----------------------------------------------------------------------------


def write_segment_file(batches: Iterable[tuple[StoredBatch, dict[str, ColumnStats] | None]], path: Path,
                       *, row_group_bytes: int = ROW_GROUP_TARGET_BYTES) -> dict:
    """Write stored batches (one local segment, one schema) as a Parquet file at ``path``.

    Returns what the manifest entry needs: base/next offset, timestamps, batch count.
    """
    writer: pq.ParquetWriter | None = None
    entries: list[list] = []
    group: list[pa.RecordBatch] = []
    group_bytes = 0
    row_group = 0
    rows_in_group = 0
    base = next_offset = None
    max_ts = min_ts = None

    def flush_group() -> None:
        nonlocal group, group_bytes, row_group, rows_in_group
        if not group:
            return
        table = pa.Table.from_batches(group)
        writer.write_table(table, row_group_size=max(1, table.num_rows))
        group, group_bytes, rows_in_group = [], 0, 0
        row_group += 1

    try:
        for stored, stats in batches:
            batch, meta = stored.batch, stored.meta
            if writer is None:
                writer = pq.ParquetWriter(
                    str(path), batch.schema, compression=COMPRESSION, compression_level=COMPRESSION_LEVEL,
                    write_page_checksum=True, write_statistics=True, store_schema=True)
                base = meta.base_offset
            elif meta.base_offset != next_offset:
                raise StorageError(f"segment batches are not contiguous: {meta.base_offset} after {next_offset}")
            size = batch.get_total_buffer_size()
            if group and group_bytes + size > row_group_bytes:
                flush_group()
            entries.append([meta.encode().decode("ascii"), row_group, rows_in_group,
                            {k: [s.min, s.max, s.null_count] for k, s in (stats or {}).items()}])
            group.append(batch)
            group_bytes += size
            rows_in_group += batch.num_rows
            next_offset = meta.next_offset
            max_ts = meta.max_timestamp if max_ts is None else max(max_ts, meta.max_timestamp)
            min_ts = meta.base_timestamp if min_ts is None else min(min_ts, meta.base_timestamp)
        if writer is None:
            raise StorageError("an empty segment cannot be tiered")
        flush_group()
        writer.add_key_value_metadata({BATCHES_KEY.decode(): json.dumps({"v": 1, "batches": entries},
                                                                        separators=(",", ":"))})
    finally:
        if writer is not None:
            writer.close()
    return {"base_offset": base, "next_offset": next_offset, "max_timestamp": max_ts,
            "min_timestamp": min_ts, "batch_count": len(entries)}


def upload_segment(store: ObjectStore, key: str, batches: Iterable[tuple[StoredBatch, dict | None]],
                   staging: Path, *, local_bytes: int = 0) -> RemoteSegment:
    """Rewrite a segment's batches into a Parquet file in ``staging``, upload it under ``key``."""
    staging.mkdir(parents=True, exist_ok=True)
    path = staging / (key.replace("/", "_") + ".tmp")
    try:
        info = write_segment_file(batches, path)
        size = path.stat().st_size
        store.put_file(key, path)
    finally:
        path.unlink(missing_ok=True)
    return RemoteSegment(info["base_offset"], info["next_offset"], size, info["max_timestamp"], key,
                         info["batch_count"], info["min_timestamp"], local_bytes)


# -- reading -----------------------------------------------------------------------------


# The tail fetched first for a footer: most footers fit, so one ranged get; a larger one
# takes a second get of exactly the rest. (Parquet readers fetch 64 KiB, which on small
# segments is most of what a narrow projection reads.)
FOOTER_TAIL_BYTES = 16 << 10


def read_footer(store: ObjectStore, key: str, size: int) -> pq.FileMetaData:
    """A Parquet object's footer by ranged gets of its tail only."""
    start = max(0, size - FOOTER_TAIL_BYTES)
    tail = store.get(key, start, size)
    if size < 12 or len(tail) < 12 or tail[-4:] != b"PAR1":
        raise CorruptRemoteDataError(f"remote segment {key} is not a Parquet object (no footer)")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size:
        raise CorruptRemoteDataError(f"remote segment {key} has a footer longer than the object")
    if length + 8 > len(tail):
        tail = store.get(key, size - length - 8, start) + tail
    return pq.read_metadata(pa.BufferReader(tail[len(tail) - length - 8:]))


class RemoteSegmentReader:
    """Reads remote segments with bounded caches: parsed footers, and recently read row groups
    (a Kafka consumer catching up asks for a row group several times, a few batches at a time)."""

    def __init__(self, cache_bytes: int = 64 << 20, footer_entries: int = 512):
        self._footers: OrderedDict[str, _Footer] = OrderedDict()
        self._groups: OrderedDict[tuple, pa.Table] = OrderedDict()
        self._group_bytes = 0
        self._cache_bytes = cache_bytes
        self._footer_entries = footer_entries
        self._lock = threading.Lock()

    def forget(self, key: str) -> None:
        with self._lock:
            self._footers.pop(key, None)
            for k in [k for k in self._groups if k[0] == key]:
                self._group_bytes -= self._groups.pop(k).nbytes

    def _footer(self, store: ObjectStore, segment: RemoteSegment) -> _Footer:
        with self._lock:
            footer = self._footers.get(segment.key)
            if footer is not None:
                self._footers.move_to_end(segment.key)
                return footer
        if segment.format != FORMAT:
            raise CorruptRemoteDataError(f"remote segment {segment.key} has unknown format {segment.format!r}")
        size = store.size(segment.key)
        if size != segment.size_bytes:
            raise CorruptRemoteDataError(
                f"remote segment {segment.key} is {size} bytes, its manifest says {segment.size_bytes}")
        try:
            metadata = read_footer(store, segment.key, size)
            raw = (metadata.metadata or {}).get(BATCHES_KEY)
            if raw is None:
                raise CorruptRemoteDataError(f"remote segment {segment.key} has no batch list")
            decoded = json.loads(raw)
            entries = tuple(_BatchEntry(BatchMeta.decode(m.encode("ascii")), rg, row, stats)
                            for m, rg, row, stats in decoded["batches"])
        except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
            raise CorruptRemoteDataError(f"remote segment {segment.key} is unreadable: {exc}") from exc
        if not entries or entries[0].meta.base_offset != segment.base_offset \
                or entries[-1].meta.next_offset != segment.next_offset:
            raise CorruptRemoteDataError(
                f"remote segment {segment.key} does not cover [{segment.base_offset}, {segment.next_offset})")
        footer = _Footer(metadata, entries, tuple(e.meta.base_offset for e in entries))
        with self._lock:
            self._footers[segment.key] = footer
            while len(self._footers) > self._footer_entries:
                self._footers.popitem(last=False)
        return footer

    def _row_group(self, store: ObjectStore, segment: RemoteSegment, footer: _Footer, index: int,
                   columns: list[str] | None) -> pa.Table:
        cache_key = (segment.key, index, None if columns is None else tuple(columns))
        with self._lock:
            table = self._groups.get(cache_key)
            if table is not None:
                self._groups.move_to_end(cache_key)
                return table
        try:
            # The size was checked when the footer was read: no need to ask the store again.
            with store.open_input(segment.key, segment.size_bytes) as f:
                parquet = pq.ParquetFile(f, metadata=footer.metadata, page_checksum_verification=True)
                table = parquet.read_row_group(index, columns=columns).combine_chunks()
        except StorageError:
            raise  # missing object, store down: said as such
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise CorruptRemoteDataError(f"remote segment {segment.key}, row group {index} is unreadable: {exc}") from exc
        with self._lock:
            self._groups[cache_key] = table
            self._group_bytes += table.nbytes
            while self._group_bytes > self._cache_bytes and len(self._groups) > 1:
                self._group_bytes -= self._groups.popitem(last=False)[1].nbytes
        return table

    def read_batches(self, store: ObjectStore, segment: RemoteSegment, start_offset: int,
                     columns: list[str] | None = None, max_offset: int | None = None) -> Iterator[StoredBatch]:
        """Whole stored batches from the one holding ``start_offset`` to the segment's end
        (or to ``max_offset``); only ``columns`` are fetched."""
        footer = self._footer(store, segment)
        names = footer.metadata.schema.to_arrow_schema().names
        if columns is not None:
            missing = [c for c in columns if c not in names]
            if missing:
                raise InvalidRequestError(f"unknown column(s) {missing}")
        first = max(0, bisect.bisect_right(footer.bases, start_offset) - 1)
        for entry in footer.entries[first:]:
            meta = entry.meta
            if meta.next_offset <= start_offset:
                continue
            if max_offset is not None and meta.base_offset >= max_offset:
                return
            table = self._row_group(store, segment, footer, entry.row_group, columns)
            if entry.row_start + meta.record_count > table.num_rows:
                raise CorruptRemoteDataError(f"remote segment {segment.key}: batch {meta.base_offset} is past its row group")
            piece = table.slice(entry.row_start, meta.record_count)
            batch = piece.to_batches()[0] if piece.num_rows else pa.RecordBatch.from_pylist([], schema=piece.schema)
            if "_offset" in batch.schema.names:
                offsets = batch.column("_offset")
                if offsets[0].as_py() != meta.base_offset or offsets[len(offsets) - 1].as_py() != meta.last_offset:
                    raise CorruptRemoteDataError(
                        f"remote segment {segment.key}: batch {meta.base_offset} holds other offsets")
            yield StoredBatch(meta, batch)

    def batch_statistics(self, store: ObjectStore, segment: RemoteSegment) -> list[tuple[BatchMeta, dict[str, ColumnStats]]]:
        footer = self._footer(store, segment)
        return [(e.meta, {k: ColumnStats(*v) for k, v in e.stats.items()}) for e in footer.entries]

    def batch_metas(self, store: ObjectStore, segment: RemoteSegment) -> list[BatchMeta]:
        return [e.meta for e in self._footer(store, segment).entries]

    def segment_schema(self, store: ObjectStore, segment: RemoteSegment) -> pa.Schema:
        """The stored columns of the segment (from the footer): a segment written before a
        schema change lacks the later columns."""
        return self._footer(store, segment).metadata.schema.to_arrow_schema()


_DEFAULT_READER = RemoteSegmentReader()


def read_remote_batches(store: ObjectStore, segment: RemoteSegment, start_offset: int,
                        columns: list[str] | None = None) -> Iterator[StoredBatch]:
    """Whole stored batches from the one holding ``start_offset``; only ``columns`` are fetched
    (ranged reads of their column chunks). Raises CorruptRemoteDataError on bad data."""
    return _DEFAULT_READER.read_batches(store, segment, start_offset, columns)


def remote_batch_statistics(store: ObjectStore, segment: RemoteSegment) -> list[tuple[BatchMeta, dict[str, ColumnStats]]]:
    """Every batch's metadata and column statistics, from the footer only (for filter skipping)."""
    return _DEFAULT_READER.batch_statistics(store, segment)


def local_segment_batches(tablet, base_offset: int, next_offset: int) -> Iterator[tuple[StoredBatch, dict]]:
    """The batches of one closed local segment with their column statistics (headers only).

    Only what readers may see is tiered: a segment reaching past the high watermark (under
    flush policy ``ack``, not yet fsynced) is refused rather than uploaded short."""
    if next_offset > tablet.high_watermark:
        raise StorageError(f"segment [{base_offset}, {next_offset}) reaches past the high watermark "
                           f"{tablet.high_watermark}: it is tiered once durable")
    stats = tablet.batch_statistics(base_offset)
    offset = base_offset
    while offset < next_offset:
        chunk = tablet.read(offset, 16 << 20, max_offset=next_offset)
        if not chunk:
            break
        for stored in chunk:
            meta, batch_stats = next(stats)
            if meta.base_offset != stored.meta.base_offset:
                raise StorageError(f"batch statistics out of step at offset {stored.meta.base_offset}")
            yield stored, batch_stats
        offset = chunk[-1].meta.next_offset
