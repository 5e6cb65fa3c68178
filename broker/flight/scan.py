"""Scans of one bucket: resolve offsets, read stored batches, skip, filter, project, coalesce.

Reads run on the Flight server's threads, straight from the log tablet (its reads are
thread-safe and zero-copy over memory-mapped segments: the buffers of columns not asked
for are never touched). Only the requested columns are sent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from fluvial.broker.flight.catalog import BUCKET, column_field, user_schema
from fluvial.broker.log.batch_meta import ATTR_CONTROL, ATTR_TRANSACTIONAL
from fluvial.broker.tables import Bucket
from fluvial.client.predicates import (Filter, batch_may_match, filter_mask, hide_state_rows, parse_filter,
                                      read_columns)
from fluvial.client.wire import ScanRequest, ScanStats
from fluvial.errors import InvalidRequestError, OffsetOutOfRangeError, UnknownColumnError

READ_BYTES = 8 * 1024 * 1024
# Small stored batches (one per Kafka produce) are sent together, up to about 1 MB or 64 Ki
# rows a message: fewer, larger messages; larger batches are sent as they are (no copy).
SEND_ROWS = 64 * 1024
SEND_BYTES = 1024 * 1024
SEND_ALONE_BYTES = 256 * 1024


@dataclass
class ScanPlan:
    bucket: Bucket
    out_schema: pa.Schema    # what the client gets
    read_fields: list[pa.Field]  # out_schema's fields plus the filter columns
    filters: list[Filter]
    start: int
    end: int | None          # exclusive; None: follow without end
    follow: bool
    remote: Any = None       # the broker's RemoteLogManager: offsets below the local log come from it
    hide_state_rows: bool = False  # a 'retract' table's log also holds its merge state's input rows
    # The bucket's transactions (None: it never held one); with `read_committed` the scan
    # stops at the last stable offset and leaves out aborted batches.
    txns: Any = None
    read_committed: bool = True
    # The broker's transaction index: a following scan of a bucket that held no transaction
    # when it started looks again each round (the bucket's first may begin meanwhile).
    txn_index: Any = None

    @property
    def used_columns(self) -> frozenset[str]:
        """The stored columns the scan looks at (system columns are always read)."""
        return frozenset(f.name for f in self.read_fields)

    @property
    def remote_bucket(self) -> Bucket:
        """The bucket whose remote log holds the data (a changelog view's is its table's)."""
        return getattr(self.bucket, "source", self.bucket)


def plan_scan(bucket: Bucket, request: ScanRequest, remote: Any = None) -> ScanPlan:
    """Check columns, filters and offsets of one bucket's scan. Raises UnknownColumnError,
    InvalidRequestError or OffsetOutOfRangeError with the reason."""
    table = bucket.table
    users = user_schema(table)
    names = users.names if request.columns is None else list(request.columns)
    if not names:
        raise InvalidRequestError("a scan needs at least one column")
    if len(set(names)) != len(names):
        raise InvalidRequestError(f"columns named twice in {names}")
    out = pa.schema([_field(table, users, n) for n in names])
    filters = [_filter(table, users, f) for f in request.filter]
    if any(f.column == BUCKET for f in filters):
        raise InvalidRequestError(f"{BUCKET} cannot be filtered on; choose the buckets to scan instead")
    extra = [_field(table, users, c) for c in dict.fromkeys(f.column for f in filters) if c not in names]
    start, end = resolve_offsets(bucket, request.start, request.end, request.follow, remote)
    read = [f for f in out if f.name != BUCKET] + extra
    source = getattr(table, "source", None) or table
    hide = source.configs.get("fluvial.merge.engine") == "retract"
    isolation = getattr(request, "isolation", "read_committed")
    if isolation not in ("read_committed", "read_uncommitted"):
        raise InvalidRequestError(f"isolation must be 'read_committed' or 'read_uncommitted', not {isolation!r}")
    return ScanPlan(bucket, out, read, filters, start, end, request.follow, remote, hide,
                    read_committed=isolation == "read_committed")


def _field(table, users: pa.Schema, name: str) -> pa.Field:
    f = column_field(table, name, users)
    if f is None:
        raise UnknownColumnError(f"table {table.name!r} has no column {name!r}; its columns are {users.names}")
    return f


def _filter(table, users: pa.Schema, raw: list) -> Filter:
    return parse_filter(raw, lambda name: _field(table, users, name))


def resolve_offsets(bucket: Bucket, start: Any, end: int | None, follow: bool,
                    remote: Any = None) -> tuple[int, int | None]:
    """The scan's first offset and its end. With `remote` (the broker's remote log manager)
    the log starts at the remote log's start, as for Kafka consumers."""
    tablet = bucket.tablet
    source = getattr(bucket, "source", bucket)  # a changelog view's remote log is its table's
    log_start = source.log_start_offset if remote is not None else tablet.log_start_offset
    hwm = tablet.high_watermark
    where = f"bucket {bucket.index} of table {bucket.table.name!r} holds offsets [{log_start}, {hwm})"
    if start == "earliest":
        first = log_start
    elif start == "latest":
        first = hwm
    elif isinstance(start, dict) and "timestamp" in start:
        found = None
        if remote is not None and log_start < tablet.log_start_offset:
            found = remote.offset_for_timestamp(source, int(start["timestamp"]))
        if found is None:
            found = tablet.offset_for_timestamp(int(start["timestamp"]))
        first = hwm if found is None else max(found[0], log_start)
    elif isinstance(start, int) and not isinstance(start, bool):
        if not log_start <= start <= hwm:
            raise OffsetOutOfRangeError(f"start offset {start} is out of range: {where}")
        first = start
    else:
        raise InvalidRequestError(f"start must be 'earliest', 'latest', an offset or a timestamp, not {start!r}")
    if end is None:
        return first, None if follow else hwm
    if not isinstance(end, int) or isinstance(end, bool):
        raise InvalidRequestError(f"end must be an offset, not {end!r}")
    if end < first:
        raise OffsetOutOfRangeError(f"end offset {end} is before the start offset {first}: {where}")
    if end > hwm and not follow:
        raise OffsetOutOfRangeError(f"end offset {end} is out of range: {where}")
    return first, end


def _statistics(tablet, offset: int, last_base: int) -> dict[int, dict]:
    """Column statistics of the batches from the one holding `offset` to the one at
    `last_base`, by base offset (read from the batch headers only)."""
    out = {}
    for meta, columns in tablet.batch_statistics(offset):
        if meta.base_offset > last_base:
            break
        out[meta.base_offset] = columns
    return out


def _remote_statistics(plan: ScanPlan, stored: list) -> dict[int, dict]:
    """Column statistics of remote batches, from their segments' footers (cached)."""
    manager = plan.remote
    wanted = {s.meta.base_offset for s in stored}
    out: dict[int, dict] = {}
    manifest = manager.manifest(plan.remote_bucket)
    for segment in manifest.segments_from(min(wanted)):
        if segment.base_offset > max(wanted):
            break
        for meta, columns in manager.reader.batch_statistics(manager.store, segment):
            if meta.base_offset in wanted:
                out[meta.base_offset] = columns
    return out


def _output(batch: pa.RecordBatch, plan: ScanPlan) -> pa.RecordBatch:
    columns = []
    for f in plan.out_schema:
        if f.name == BUCKET:
            columns.append(pa.array(np.full(batch.num_rows, plan.bucket.index, dtype=np.int32)))
        else:
            columns.append(batch.column(f.name))
    return pa.RecordBatch.from_arrays(columns, schema=plan.out_schema)


def scan_bucket(plan: ScanPlan, stats: ScanStats, wait_for_data: Callable[[int], None] | None = None,
                cancelled: Callable[[], bool] = lambda: False) -> Iterator[pa.RecordBatch]:
    """The plan's rows as batches of `plan.out_schema`. Following, it waits with
    `wait_for_data(offset)` at the log end until `cancelled()`."""
    tablet = plan.bucket.tablet
    offset = plan.start
    pending: list[pa.RecordBatch] = []
    pending_rows = pending_bytes = 0

    def send(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        stats.rows_sent += batch.num_rows
        stats.bytes_sent += pa.ipc.get_record_batch_size(batch)
        yield batch

    def flush() -> Iterator[pa.RecordBatch]:
        nonlocal pending, pending_rows, pending_bytes
        if pending:
            batch = pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, pending_rows, pending_bytes = [], 0, 0
            yield from send(batch)

    while not cancelled():
        if plan.end is not None and offset >= plan.end:
            break
        tiered = plan.remote is not None and offset < tablet.log_start_offset
        if tiered:
            # Below the local log: the remote segments (a client that stitches reads them itself).
            stored = [s for s in plan.remote.read_batches(plan.remote_bucket, offset, READ_BYTES)
                      if plan.end is None or s.meta.base_offset < plan.end]
        else:
            limit = plan.end
            if plan.txns is None and plan.follow and plan.read_committed and plan.txn_index is not None:
                # The high watermark is read before the index: a bucket's index exists before
                # its first transactional batch is appended, so a batch the look missed lies
                # beyond this round's reach.
                hw = tablet.high_watermark
                plan.txns = plan.txn_index.get(plan.bucket)
                if plan.txns is None:
                    limit = hw if limit is None else min(limit, hw)
            if plan.txns is not None and plan.read_committed:
                lso = plan.txns.last_stable_offset(tablet.high_watermark)
                limit = lso if limit is None else min(limit, lso)
            # Only the columns the scan reads are decompressed from compressed batches.
            stored = tablet.read(offset, READ_BYTES, max_offset=limit, uses=plan.used_columns) \
                if limit is None or offset < limit else []
        if not stored:
            yield from flush()
            if not plan.follow:
                break
            if wait_for_data is not None:
                wait_for_data(offset)
            continue
        if not plan.filters:
            bounds = {}
        elif tiered:
            bounds = _remote_statistics(plan, stored)
        else:
            bounds = _statistics(tablet, offset, stored[-1].meta.base_offset)
        for sb in stored:
            stats.batches_read += 1
            meta = sb.meta
            if meta.attributes & _TXN_BITS and _hidden(plan, meta):
                offset = meta.next_offset  # a transaction marker, or an aborted transaction's batch
                continue
            if not batch_may_match(meta, bounds.get(meta.base_offset), plan.filters):
                stats.batches_skipped += 1
                offset = meta.next_offset
                continue
            batch = sb.batch
            if meta.record_count == meta.last_offset_delta + 1:
                lo = max(offset - meta.base_offset, 0)
                hi = meta.record_count if plan.end is None else min(plan.end - meta.base_offset, meta.record_count)
                after = meta.base_offset + hi
            else:
                # A compacted batch: its records' offsets have gaps, so positions come from `_offset`.
                lo, hi, after = _sparse_range(batch, meta, offset, plan.end)
            if lo > 0 or hi < meta.record_count:
                batch = batch.slice(lo, max(hi - lo, 0))
            offset = after
            stats.rows_read += batch.num_rows
            if plan.hide_state_rows:
                batch = hide_state_rows(batch)
            batch = read_columns(batch, plan.read_fields)
            if plan.filters:
                batch = batch.filter(filter_mask(batch, plan.filters))
            if batch.num_rows == 0:
                continue
            batch = _output(batch, plan)
            size = batch.nbytes
            if size >= SEND_ALONE_BYTES:
                yield from flush()
                yield from send(batch)  # large enough alone: no copy
                continue
            pending.append(batch)
            pending_rows += batch.num_rows
            pending_bytes += size
            if pending_rows >= SEND_ROWS or pending_bytes >= SEND_BYTES:
                yield from flush()
        if plan.follow:
            yield from flush()  # a follower wants rows as soon as they are there
    yield from flush()
    stats.end_offset = offset


_TXN_BITS = ATTR_TRANSACTIONAL | ATTR_CONTROL


def _hidden(plan: ScanPlan, meta) -> bool:
    if meta.attributes & ATTR_CONTROL:
        return True
    if not plan.read_committed or plan.txns is None:
        return False
    return plan.txns.is_aborted(meta.producer_id, meta.base_offset)


def _sparse_range(batch: pa.RecordBatch, meta, offset: int, end: int | None) -> tuple[int, int, int]:
    """Rows [lo, hi) of a batch with gaps between its offsets that lie in [offset, end), and
    the offset to read next (the batch's end once its last row is read)."""
    offsets = batch.column("_offset").to_numpy(zero_copy_only=False)
    lo = int(np.searchsorted(offsets, offset))
    if end is None or end >= meta.next_offset:
        return lo, len(offsets), meta.next_offset
    hi = int(np.searchsorted(offsets, end))
    return lo, hi, end
