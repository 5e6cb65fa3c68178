"""The console's row browser: a bounded projection scan of a table's buckets.

Runs on a worker thread (log tablet reads are thread-safe; remote segments are read from
the object store), through the same scan planner as the table API, so columns, filters
and offsets are checked, and batches skipped by their statistics, exactly as there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fluvial.broker.flight.catalog import BUCKET, user_schema
from fluvial.broker.flight.scan import plan_scan, scan_bucket
from fluvial.broker.table_cli import cell_text, parse_where_text
from fluvial.client.wire import ScanRequest, ScanStats
from fluvial.errors import FluvialError

MAX_LIMIT = 1000
DEFAULT_LIMIT = 50
MAX_FILTERS = 10
# A tail with a filter reads windows further back until it has its rows; it gives up
# after reading this many rows of a bucket (and says so).
MAX_TAIL_READ_ROWS = 1_000_000
# Shown beside the chosen columns: where each row is.
POSITION_COLUMNS = [BUCKET, "_offset", "_timestamp"]
CELL_WIDTH = 120


class BadParameter(ValueError):
    """A console parameter that cannot be used: answered with HTTP 400 and the reason."""


@dataclass
class RowQuery:
    columns: list[str]
    filters: list[tuple[str, str, Any]]
    where_texts: list[str]
    limit: int
    buckets: list[int] | None  # None: every bucket
    start: str  # "tail", "earliest" or an offset (as text)


@dataclass
class RowPage:
    names: list[str]
    rows: list[list[str]]
    rows_read: int = 0
    batches_skipped: int = 0
    notes: list[str] = field(default_factory=list)


def parse_query(table, query) -> RowQuery:
    """Parameters from the query string (a MultiDict); BadParameter with the reason."""
    users = user_schema(table).names
    chosen = [c for c in query.getall("col", []) if c]
    if not chosen and query.get("columns"):
        chosen = [c.strip() for c in query["columns"].split(",") if c.strip()]
    columns = chosen or list(users)
    unknown = [c for c in columns if c not in users and c not in ("_key", "_change", "_headers")]
    if unknown:
        raise BadParameter(f"table {table.name!r} has no column {unknown[0]!r}; its columns are {users}")
    where_texts = [w for w in query.getall("where", []) if w.strip()]
    if len(where_texts) > MAX_FILTERS:
        raise BadParameter(f"at most {MAX_FILTERS} filters")
    filters = []
    for text in where_texts:
        try:
            filters.append(parse_where_text(text))
        except ValueError as exc:
            raise BadParameter(str(exc)) from None
    limit = _int(query.get("limit", str(DEFAULT_LIMIT)), "limit")
    if not 1 <= limit <= MAX_LIMIT:
        raise BadParameter(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    bucket_text = query.get("bucket", "all") or "all"
    if bucket_text == "all":
        buckets = None
    else:
        b = _int(bucket_text, "bucket")
        if not 0 <= b < len(table.buckets):
            raise BadParameter(f"table {table.name!r} has buckets 0-{len(table.buckets) - 1}, not {b}")
        buckets = [b]
    start = query.get("start", "tail") or "tail"
    if start not in ("tail", "earliest"):
        _int(start, "start")
    return RowQuery(columns, filters, where_texts, limit, buckets, start)


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise BadParameter(f"{name} must be a whole number, not {text!r}") from None


def browse(broker, table, q: RowQuery) -> RowPage:
    """The rows asked for (blocking: call on a worker thread). BadParameter for filters or
    offsets the table refuses."""
    read_columns = list(dict.fromkeys([c for c in POSITION_COLUMNS if c != BUCKET] + q.columns))
    buckets = q.buckets if q.buckets is not None else list(range(len(table.buckets)))
    parts: list[pa.Table] = []
    page = RowPage([], [])
    for index in buckets:
        bucket = table.bucket(index)
        try:
            got = _tail(broker, bucket, q, read_columns, page) if q.start == "tail" \
                else _forward(broker, bucket, q, read_columns, page)
        except FluvialError as exc:
            raise BadParameter(exc.message) from None
        if got.num_rows:
            parts.append(got.append_column(BUCKET, pa.array([index] * got.num_rows, pa.int32())))
    names = list(dict.fromkeys(POSITION_COLUMNS + q.columns))
    page.names = names
    if not parts:
        return page
    rows = pa.concat_tables(parts, promote_options="permissive")
    order = pc.sort_indices(rows, sort_keys=[("_timestamp", "ascending"), (BUCKET, "ascending"),
                                             ("_offset", "ascending")])
    rows = rows.take(order)
    rows = rows.slice(rows.num_rows - q.limit) if q.start == "tail" and rows.num_rows > q.limit \
        else rows.slice(0, q.limit)
    columns = [rows.column(n).to_pylist() for n in names]
    page.rows = [[cell_text(col[i], CELL_WIDTH) for col in columns] for i in range(rows.num_rows)]
    return page


def _scan(broker, bucket, q: RowQuery, columns: list[str], start: Any, end: int | None, page: RowPage,
          limit: int | None) -> pa.Table:
    request = ScanRequest(bucket.table.name, bucket.index, columns=columns, start=start, end=end,
                          filter=[list(f) for f in q.filters])
    plan = plan_scan(bucket, request, broker.remote_log)
    stats = ScanStats()
    batches = []
    got = 0
    for batch in scan_bucket(plan, stats):
        batches.append(batch)
        got += batch.num_rows
        if limit is not None and got >= limit:
            break
    page.rows_read += stats.rows_read
    page.batches_skipped += stats.batches_skipped
    return pa.Table.from_batches(batches, schema=plan.out_schema)


def _forward(broker, bucket, q: RowQuery, columns: list[str], page: RowPage) -> pa.Table:
    start: Any = "earliest" if q.start == "earliest" else int(q.start)
    rows = _scan(broker, bucket, q, columns, start, None, page, q.limit)
    return rows.slice(0, q.limit)


def _tail(broker, bucket, q: RowQuery, columns: list[str], page: RowPage) -> pa.Table:
    """The last `limit` rows passing the filters: windows ending at the high watermark,
    four times larger each round, until enough rows or the log start."""
    end = bucket.tablet.high_watermark
    first = bucket.log_start_offset
    window = q.limit
    while True:
        start = max(first, end - window)
        rows = _scan(broker, bucket, q, columns, start, end, page, None)
        if rows.num_rows >= q.limit or start <= first:
            return rows.slice(max(0, rows.num_rows - q.limit))
        if window >= MAX_TAIL_READ_ROWS:
            page.notes.append(f"bucket {bucket.index}: only the last {window:,} records were searched")
            return rows
        window *= 4
