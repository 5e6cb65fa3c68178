"""Client-side stitching: scans read tiered offsets straight from the object store.

For a bucket whose early segments are in the object store, the broker only says where they
are (Flight action `remote-segments`: the store's URL and public options, the remote
segments, the first offset still local). The client opens the store itself, with its own
credentials (options given to `connect`, else the standard AWS environment), reads the
segments' Parquet column chunks for the columns it needs, skips batches by the footer's
column statistics and filters rows exactly as the broker does (`fluvial.client.predicates`),
then continues at the broker from the offset where the remote data ended. The broker
spends no CPU on the tiered part of the read.

The switch is exact: remote batches are cut at the scan's start and end offsets, and the
broker scan starts at the first offset the remote part did not return. When the broker no
longer holds that offset (local retention deleted it meanwhile), the client asks for the
remote segments again from there.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from fluvial.client.predicates import (Filter, batch_may_match, filter_mask, hide_state_rows, parse_filter,
                                      read_columns)
from fluvial.errors import InvalidRequestError, OffsetOutOfRangeError, UnknownColumnError

REMOTE_SEGMENTS = "remote-segments"
BUCKET = "_bucket"
# Row groups kept by a scan's reader: a filtered scan reads several batches of one group.
READER_CACHE_BYTES = 32 << 20


@dataclass
class RemoteLog:
    """What the broker said about one bucket's tiered log."""

    store: dict                      # {"url", "options"} without secrets
    segments: list                   # RemoteSegment, ordered, contiguous
    local_start_offset: int          # the first offset the broker holds locally
    log_start_offset: int            # the first offset of the remote log still readable

    @property
    def end_offset(self) -> int:
        return self.segments[-1].next_offset if self.segments else self.log_start_offset

    @classmethod
    def from_json(cls, body: dict) -> "RemoteLog":
        from fluvial.tiering.remote_segment import RemoteSegment
        segments = [RemoteSegment.from_json(s) for s in body.get("segments") or []]
        start = body.get("log_start_offset")
        if start is None:
            start = segments[0].base_offset if segments else int(body.get("local_start_offset", 0))
        return cls(body.get("store") or {}, segments, int(body.get("local_start_offset", 0)), int(start))


class StoreCache:
    """The object stores one client opened, by URL: S3 clients are costly to create."""

    def __init__(self, options: dict[str, str] | None = None):
        self.options = dict(options or {})
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()

    def open(self, description: dict):
        from fluvial.tiering.object_store import open_object_store
        url = description.get("url")
        if not url:
            raise InvalidRequestError("the broker named no object store for the remote segments")
        with self._lock:
            store = self._stores.get(url)
            if store is None:
                options = None
                if url.startswith("s3://"):
                    # The broker's public options say where the store is; credentials are the client's own.
                    options = {**(description.get("options") or {}), **self.options}
                store = open_object_store(url, options or None)
                self._stores[url] = store
            return store

    def bytes_read(self) -> int:
        with self._lock:
            return sum(s.stats.bytes_read for s in self._stores.values())

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()


@dataclass
class RemotePlan:
    """One bucket's scan as the client runs it on remote segments."""

    bucket: int
    out_schema: pa.Schema
    read_fields: list[pa.Field]   # stored columns to read: the output's and the filters'
    filters: list[Filter]


def plan_remote(bucket: int, users: pa.Schema, columns: list[str] | None, raw_filters: list,
                system_fields: dict[str, pa.Field]) -> RemotePlan:
    """The same checks the broker's `plan_scan` makes, on the table schema the broker described."""
    def field_of(name: str) -> pa.Field:
        index = users.get_field_index(name)
        if index >= 0:
            return users.field(index)
        f = system_fields.get(name)
        if f is None:
            raise UnknownColumnError(f"the table has no column {name!r}; its columns are {users.names}")
        return f

    names = users.names if columns is None else list(columns)
    if not names:
        raise InvalidRequestError("a scan needs at least one column")
    out = pa.schema([field_of(n) for n in names])
    filters = [parse_filter(f, field_of) for f in raw_filters]
    if any(f.column == BUCKET for f in filters):
        raise InvalidRequestError(f"{BUCKET} cannot be filtered on; choose the buckets to scan instead")
    extra = [field_of(c) for c in dict.fromkeys(f.column for f in filters) if c not in names]
    read = [f for f in out if f.name != BUCKET] + extra
    return RemotePlan(bucket, out, read, filters)


@dataclass
class RemoteStats:
    segments: int = 0
    batches_read: int = 0
    batches_skipped: int = 0
    rows_read: int = 0
    rows_sent: int = 0


def first_offset_at(reader, store, remote: RemoteLog, timestamp_ms: int) -> int | None:
    """The earliest remote offset whose record timestamp is >= `timestamp_ms` (None: not remote)."""
    for segment in remote.segments:
        if segment.max_timestamp < timestamp_ms or segment.next_offset <= remote.log_start_offset:
            continue
        for meta in reader.batch_metas(store, segment):
            if meta.max_timestamp < timestamp_ms or meta.next_offset <= remote.log_start_offset:
                continue
            for stored in reader.read_batches(store, segment, meta.base_offset, ["_timestamp"],
                                              max_offset=meta.next_offset):
                ts = stored.batch.column("_timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)
                offsets = stored.meta.base_offset + np.arange(len(ts))
                hits = np.flatnonzero((ts >= timestamp_ms) & (offsets >= remote.log_start_offset))
                if len(hits):
                    return int(offsets[hits[0]])
    return None


def read_remote(reader, store, remote: RemoteLog, plan: RemotePlan, start: int, end: int | None,
                stats: RemoteStats, stopped: Callable[[], bool]) -> Iterator[tuple[pa.RecordBatch | None, int]]:
    """Rows of [start, end) the remote segments hold, as (batch of `plan.out_schema`, next
    offset) pairs; the batch is None for stretches skipped by statistics or emptied by filters
    (the offset still moves). Stops at the end of the remote log."""
    offset = start
    for segment in remote.segments:
        if stopped() or (end is not None and offset >= end):
            return
        if segment.next_offset <= offset:
            continue
        if segment.base_offset > offset:
            return  # not contiguous with where the scan is: the broker serves the rest
        stats.segments += 1
        present = set(_segment_columns(reader, store, segment))
        fetch = [f.name for f in plan.read_fields if f.name in present] or ["_offset"]
        if "_change" in present and "_change" not in fetch:
            fetch.append("_change")  # to leave out the merge state's input rows of a 'retract' table
        wanted = _wanted_ranges(reader, store, segment, offset, end, plan.filters, stats)
        for lo, hi, keep in wanted:
            if stopped():
                return
            if not keep:
                offset = hi
                yield None, offset
                continue
            for stored in reader.read_batches(store, segment, lo, fetch, max_offset=hi):
                meta = stored.meta
                stats.batches_read += 1
                batch = stored.batch
                first = max(offset - meta.base_offset, 0)
                last = meta.record_count if end is None else min(end - meta.base_offset, meta.record_count)
                if first > 0 or last < meta.record_count:
                    batch = batch.slice(first, max(0, last - first))
                offset = meta.base_offset + last
                stats.rows_read += batch.num_rows
                batch = read_columns(hide_state_rows(batch), plan.read_fields)
                if plan.filters:
                    batch = batch.filter(filter_mask(batch, plan.filters))
                if batch.num_rows == 0:
                    yield None, offset
                    continue
                out = _output(batch, plan)
                stats.rows_sent += out.num_rows
                yield out, offset
                if end is not None and offset >= end:
                    return
        offset = max(offset, min(segment.next_offset, end) if end is not None else segment.next_offset)


def _wanted_ranges(reader, store, segment, offset: int, end: int | None, filters: list[Filter],
                   stats: RemoteStats) -> list[tuple[int, int, bool]]:
    """[lo, hi) offset ranges of the segment from `offset`, each to read (True) or skipped
    by the batches' statistics (False); consecutive batches alike are merged."""
    stop = segment.next_offset if end is None else min(end, segment.next_offset)
    if not filters:
        return [(offset, stop, True)]
    out: list[list] = []
    for meta, columns in reader.batch_statistics(store, segment):
        if meta.next_offset <= offset:
            continue
        if meta.base_offset >= stop:
            break
        keep = batch_may_match(meta, columns, filters)
        if not keep:
            stats.batches_read += 1
            stats.batches_skipped += 1
        lo = max(meta.base_offset, offset)
        if out and out[-1][2] == keep:
            out[-1][1] = meta.next_offset
        else:
            out.append([lo, meta.next_offset, keep])
    if out:
        out[-1][1] = min(out[-1][1], stop)
    return [tuple(r) for r in out]


def _segment_columns(reader, store, segment) -> list[str]:
    """The stored columns of a remote segment (segments written before a schema change lack
    later columns; `read_columns` adds them as the evolution rules say)."""
    return reader.segment_schema(store, segment).names


def _output(batch: pa.RecordBatch, plan: RemotePlan) -> pa.RecordBatch:
    columns = []
    for f in plan.out_schema:
        if f.name == BUCKET:
            columns.append(pa.array(np.full(batch.num_rows, plan.bucket, dtype=np.int32)))
        else:
            columns.append(batch.column(f.name))
    return pa.RecordBatch.from_arrays(columns, schema=plan.out_schema)


def check_start(remote: RemoteLog, start: int, table: str, bucket: int) -> None:
    if start < remote.log_start_offset:
        raise OffsetOutOfRangeError(f"start offset {start} is out of range: bucket {bucket} of table {table!r} "
                                    f"holds offsets from {remote.log_start_offset}")
