"""Union reads of a lake-enabled table: the lake snapshot up to the offsets it covers, then the
broker's log from exactly those offsets, seen as one table.

The Iceberg snapshot's summary `fluvial.offsets` ({bucket: end offset, exclusive}) says what
the lake holds; a read pins one snapshot and takes its offsets from that very snapshot, so a
tiering round committing meanwhile can neither open a gap nor return a row twice. Log
tables: lake rows (their `_offset` below the snapshot's end per bucket) followed by the log
from that end. Primary-key tables: the lake holds the current state as of the snapshot; the
changelog after it is folded in by key (the last change per key by offset wins, -D removes
the key, a changed key's lake row is replaced). Everything runs on whole Arrow tables.
"""
from __future__ import annotations

import datetime as dt
import decimal
import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.client import lake_files
from fluvial.client.lake_files import DataFile, NotPlain
from fluvial.client.predicates import Filter, filter_mask, parse_filter
from fluvial.client.streams import ArrowResults
from fluvial.client.wire import ScanStats
from fluvial.errors import InvalidRequestError, UnknownColumnError

if TYPE_CHECKING:  # pragma: no cover
    from fluvial.client.client import Table

LAKE_INFO = "lake-info"
LAKE_ENABLE = "fluvial.lake.enable"
OFFSETS_SUMMARY = "fluvial.offsets"
SOURCES = ("union", "lake", "log")

# Change types of a primary-key table's changelog (the `_change` column).
UPDATE_BEFORE = 2
DELETE = 4

# Types of the system columns as the table API returns them (the lake may store them
# differently: Iceberg timestamps are microseconds, it has no int8).
SYSTEM_FIELDS = {f.name: f for f in (
    pa.field("_offset", pa.int64(), nullable=False),
    pa.field("_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("_change", pa.int8(), nullable=False),
    pa.field("_key", pa.binary()),
    pa.field("_headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    pa.field("_schema_id", pa.int32(), nullable=False),
    pa.field("_bucket", pa.int32(), nullable=False),
)}

class LakeReadError(InvalidRequestError):
    """A union or lake read that cannot be answered as asked (the message says why and what to use)."""


@dataclass(frozen=True)
class LakeInfo:
    """What the broker says of a table's lake (Flight action `lake-info`)."""

    format: str
    catalog: dict[str, str]
    identifier: tuple[str, ...]
    snapshot_id: int | None
    offsets: dict[int, int]
    state: str = ""
    freshness_ms: int = 0
    metadata_location: str | None = None   # the metadata file holding `snapshot_id`

    @classmethod
    def from_json(cls, body: dict) -> "LakeInfo":
        return cls(body.get("format", "iceberg"), dict(body.get("catalog") or {}), tuple(body["identifier"]),
                   body.get("snapshot_id"), {int(k): int(v) for k, v in (body.get("offsets") or {}).items()},
                   body.get("state", ""), int(body.get("freshness_ms") or 0), body.get("metadata_location"))


def is_lake_enabled(configs: dict[str, str]) -> bool:
    return str(configs.get(LAKE_ENABLE, "false")).strip().lower() == "true"


def default_source(table: "Table", start: Any) -> str:
    """What a scan reads when no source is given: a lake-enabled log table read from its
    beginning ("earliest") is read as the union; a scan from given offsets or a time is a
    positional read of the log (what tiering jobs and Spark's log ranges do). A primary-key
    table's scan stays its changelog: the union gives current rows instead, a different
    result, so it must be asked for."""
    if not is_lake_enabled(table.info.configs) or table.info.primary_key:
        return "log"
    return "union" if start == "earliest" else "log"


def lake_info(table: "Table") -> LakeInfo | None:
    """The table's lake, None when it is not lake-enabled."""
    body = table.client._action(LAKE_INFO, {"name": table.name})
    return LakeInfo.from_json(body) if body else None


# -- the lake side --------------------------------------------------------------------------

_catalogs: dict[tuple, Any] = {}
_catalogs_lock = threading.Lock()


def load_catalog(properties: dict[str, str]) -> Any:
    """A pyiceberg catalog for these properties, one per distinct set per process (a SQL
    catalog opens a database engine: not something to do per scan)."""
    from pyiceberg.catalog import load_catalog as _load

    key = tuple(sorted(properties.items()))
    with _catalogs_lock:
        catalog = _catalogs.get(key)
        if catalog is None:
            props = dict(properties)
            catalog = _catalogs[key] = _load(props.pop("name", "fluvial"), **props)
        return catalog


@dataclass(frozen=True)
class PinnedLake:
    """One lake snapshot and the offsets it covers, taken from that snapshot's own summary."""

    table: Any                 # pyiceberg Table (None when read from its files alone)
    snapshot_id: int | None    # None: nothing tiered yet
    offsets: dict[int, int]    # bucket -> end offset (exclusive) the snapshot covers
    columns: frozenset[str] = frozenset()       # the lake table's columns
    files: tuple[DataFile, ...] | None = None   # the snapshot's data files, when read without pyiceberg

    def end(self, bucket: int) -> int:
        return self.offsets.get(bucket, 0)


def pin(info: LakeInfo, extra_catalog: dict[str, str] | None = None) -> PinnedLake:
    """The snapshot a read uses: the one the broker reported (or the table's current one
    when the broker has none yet), with the offsets recorded in it. A snapshot of a local
    warehouse without delete files is read from its files directly (no pyiceberg)."""
    if info.format != "iceberg":
        raise LakeReadError(f"lake format {info.format!r} cannot be read by this client")
    if info.metadata_location and info.snapshot_id is not None:
        try:
            return _pin_files(info.metadata_location, info.snapshot_id)
        except NotPlain:
            pass
    catalog = load_catalog({**info.catalog, **(extra_catalog or {})})
    iceberg = catalog.load_table(tuple(info.identifier))
    snapshot = iceberg.snapshot_by_id(info.snapshot_id) if info.snapshot_id is not None else iceberg.current_snapshot()
    columns = frozenset(f.name for f in iceberg.schema().fields)
    if snapshot is None:
        return PinnedLake(iceberg, None, {}, columns)
    raw = snapshot.summary.additional_properties.get(OFFSETS_SUMMARY) if snapshot.summary else None
    return PinnedLake(iceberg, snapshot.snapshot_id, _offsets_of(raw, snapshot.snapshot_id), columns)


def _pin_files(metadata_location: str, snapshot_id: int) -> PinnedLake:
    meta = json.loads(lake_files.read_bytes(metadata_location))
    snapshot = next((s for s in meta.get("snapshots", []) if s["snapshot-id"] == snapshot_id), None)
    if snapshot is None:
        raise NotPlain(f"snapshot {snapshot_id} is not in {metadata_location}")
    # The current schema reads every snapshot (columns only get added).
    schema = next(s for s in meta["schemas"] if s.get("schema-id") == meta.get("current-schema-id"))
    offsets = _offsets_of((snapshot.get("summary") or {}).get(OFFSETS_SUMMARY), snapshot_id)
    files = lake_files.snapshot_files(metadata_location, snapshot_id)
    return PinnedLake(None, snapshot_id, offsets, frozenset(f["name"] for f in schema["fields"]), tuple(files))


def _offsets_of(raw: str | None, snapshot_id: int) -> dict[int, int]:
    if raw is None:
        raise LakeReadError(f"lake snapshot {snapshot_id} has no {OFFSETS_SUMMARY!r} in its summary, "
                            f"so what it covers is unknown; read with source='log'")
    return {int(k): int(v) for k, v in json.loads(raw).items()}


def iceberg_filter(filters: list[list[Any]], lake_columns: set[str]) -> Any:
    """The filters pyiceberg can push into its scan (file pruning by column statistics and
    row filtering); each client filter is applied exactly afterwards in any case."""
    from pyiceberg import expressions as ex

    parts = []
    for column, op, value in filters:
        if column not in lake_columns:
            continue
        value = _iceberg_value(value)
        if value is _SKIP:
            continue
        if op == "is_null":
            parts.append(ex.IsNull(column))
        elif op == "not_null":
            parts.append(ex.NotNull(column))
        elif op == "in":
            parts.append(ex.In(column, value))
        elif op == "not in":
            parts.append(ex.NotIn(column, value))
        else:
            cls = {"=": ex.EqualTo, "!=": ex.NotEqualTo, "<": ex.LessThan, "<=": ex.LessThanOrEqual,
                   ">": ex.GreaterThan, ">=": ex.GreaterThanOrEqual}[op]
            parts.append(cls(column, value))
    expr: Any = ex.AlwaysTrue()
    for p in parts:
        expr = ex.And(expr, p)
    return expr


_SKIP = object()


def _iceberg_value(value: Any) -> Any:
    """A filter value as a pyiceberg literal accepts it (timestamps as microseconds, dates as
    days); values it has no literal for are not pushed down."""
    if value is None:
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        out = [_iceberg_value(v) for v in value]
        return _SKIP if any(v is _SKIP or v is None for v in out) else out
    if isinstance(value, bool) or isinstance(value, (int, float, str, decimal.Decimal)):
        return value
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return int(value.timestamp() * 1_000_000)
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days
    return _SKIP


def read_lake(lake: PinnedLake, columns: list[str], filters: list[list[Any]]) -> pa.Table:
    """The pinned snapshot's rows: only `columns` are read (columns the lake does not have are
    left out; the caller fills them), filters pushed into the scan (pruning only: callers
    apply them exactly)."""
    present = [c for c in columns if c in lake.columns]
    if lake.snapshot_id is None or not present:
        return pa.table({})
    if lake.files is not None:
        return lake_files.read_files(lake.files, present, loose_filters(filters))
    row_filter = iceberg_filter(filters, set(lake.columns))
    # The current schema reads the pinned snapshot's files: columns added since are null.
    scan = lake.table.scan(row_filter=row_filter, selected_fields=tuple(present), snapshot_id=lake.snapshot_id)
    return scan.to_arrow()


def loose_filters(filters: list[list[Any]]) -> list[Filter]:
    """Filters with values typed by Arrow's inference (each reader casts them to its column
    type); used for pruning only."""
    out = []
    for column, op, value in filters:
        try:
            if op in ("is_null", "not_null"):
                v = None
            elif op in ("in", "not in"):
                v = pa.array(list(value))
            else:
                v = pa.scalar(value)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            continue
        out.append(Filter(column, op, v))
    return out


# -- Arrow helpers ---------------------------------------------------------------------------

def conform(table: pa.Table, fields: list[pa.Field]) -> pa.Table:
    """`table` with exactly `fields` in order: types cast to the table API's, absent columns null."""
    n = table.num_rows
    arrays = []
    for f in fields:
        if f.name in table.column_names:
            col = table.column(f.name)
            if col.type != f.type:
                col = col.cast(f.type)
            arrays.append(col)
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema([f.remove_metadata() for f in fields]))


def apply_filters(table: pa.Table, filters: list[Filter]) -> pa.Table:
    """Rows passing every filter, judged exactly as the broker judges log rows."""
    mask = filter_mask(table, filters) if filters else None
    return table if mask is None else table.filter(mask, null_selection_behavior="drop")


def sort_by_bucket_offset(table: pa.Table) -> pa.Table:
    """Rows in (bucket, offset) order; tiered files need not be in that order. A no-op
    (one NumPy pass) when they already are."""
    if table.num_rows < 2:
        return table
    key = (table.column("_bucket").to_numpy().astype(np.int64) << 40) + table.column("_offset").to_numpy()
    if np.all(key[1:] > key[:-1]):
        return table
    return table.take(pa.array(np.argsort(key, kind="stable")))


def fold_changelog(lake_rows: pa.Table, changes: pa.Table, key: list[str]) -> pa.Table:
    """Current rows: the lake state with the changelog after it applied by key. `changes`
    holds the changelog in offset order per bucket (a key lives in one bucket), with `_change`;
    the result has `lake_rows`' columns."""
    if changes.num_rows == 0:
        return lake_rows
    changes = changes.filter(pc.not_equal(changes.column("_change"), UPDATE_BEFORE))
    changes = changes.append_column("__row", pa.array(np.arange(changes.num_rows, dtype=np.int64)))
    last_rows = changes.group_by(key, use_threads=False).aggregate([("__row", "max")]).column("__row_max")
    last = changes.take(last_rows)
    kept = lake_rows
    if lake_rows.num_rows:
        kept = lake_rows.join(last.select(key), keys=key, join_type="left anti", use_threads=True)
        kept = kept.select(lake_rows.column_names)
    live = last.filter(pc.not_equal(last.column("_change"), DELETE))
    return pa.concat_tables([conform(kept, list(lake_rows.schema)), conform(live, list(lake_rows.schema))])


# -- the union scan --------------------------------------------------------------------------

@dataclass
class UnionPlan:
    """What one union/lake read reads: pinned lake snapshot, log start and end per bucket."""

    lake: PinnedLake
    log_start: dict[int, int] = field(default_factory=dict)   # bucket -> first offset read from the log
    log_end: dict[int, int] = field(default_factory=dict)     # bucket -> high watermark pinned
    gaps: dict[int, tuple[int, int]] = field(default_factory=dict)  # offsets neither side holds


class UnionScan(ArrowResults):
    """A scan of a lake-enabled table as one table (`source="union"`), or of its lake alone
    (`source="lake"`). Same results API as `Scan`: to_arrow, to_pandas, to_batches, follow."""

    def __init__(self, table: "Table", columns: Sequence[str] | None, filter: Any, start: Any, end: Any,
                 buckets: Sequence[int] | None, source: str, lake_catalog: dict[str, str] | None = None):
        from fluvial.client.client import _scan_fields
        from fluvial.client.filters import compile_filter

        if source not in ("union", "lake"):
            raise ValueError(f"source must be one of {SOURCES}, not {source!r}")
        self.table = table
        self.source = source
        self.primary_key = list(table.info.primary_key or [])
        users = {f.name: f for f in table.info.schema}
        compiled = compile_filter(filter, _scan_fields(table), table.name)  # raises before any request
        self._user_filter = filter
        self.filter = compiled.pushed             # tuple filters: pushed into the lake and log reads
        self.client_filter = compiled.residual    # applied to the union's rows at the end (None: nothing)
        self.output_columns = list(columns) if columns is not None else list(users)
        extra = [c for c in compiled.columns if c not in self.output_columns]
        self.columns = [*self.output_columns, *extra]
        self.start, self.end = start, end
        self.buckets = list(buckets) if buckets is not None else list(range(table.info.buckets))
        self.lake_catalog = lake_catalog
        self.fields = [self._field(n, users) for n in self.columns]
        if len(set(self.columns)) != len(self.columns):
            raise InvalidRequestError(f"columns named twice in {self.columns}")
        self.parsed = self._parse_filters(users)
        self._check_options()
        self.schema = pa.schema([f.remove_metadata() for f in self.fields if f.name in self.output_columns])
        self.stats = ScanStats()
        self.plan: UnionPlan | None = None

    # -- checks -----------------------------------------------------------------------------

    def _field(self, name: str, users: dict[str, pa.Field]) -> pa.Field:
        f = users.get(name) or SYSTEM_FIELDS.get(name)
        if f is None:
            raise UnknownColumnError(f"table {self.table.name!r} has no column {name!r}; its columns are {list(users)}")
        if self.primary_key and name.startswith("_") and name not in users:
            raise LakeReadError(f"a union read of primary-key table {self.table.name!r} returns current rows, "
                                f"which have no {name!r}; read the changelog with source='log'")
        return f

    def _parse_filters(self, users: dict[str, pa.Field]) -> list[Filter]:
        parsed = [parse_filter(f, lambda name: self._field(name, users)) for f in self.filter]
        if any(f.column == "_bucket" for f in parsed):
            raise InvalidRequestError("_bucket cannot be filtered on; choose the buckets to scan instead")
        return parsed

    def _check_options(self) -> None:
        if self.primary_key:
            if self.start != "earliest" or self.end is not None:
                raise LakeReadError("a union read of a primary-key table gives the current rows: it takes no "
                                    "start or end (read the changelog with source='log')")
            if sorted(self.buckets) != list(range(self.table.info.buckets)):
                raise LakeReadError("a union read of a primary-key table reads every bucket")
            return
        if isinstance(self.start, dt.datetime) or self.start == "latest" or (
                isinstance(self.start, dict) and any(not isinstance(v, int) for v in self.start.values())):
            raise LakeReadError(f"a union read starts at 'earliest' or at offsets, not {self.start!r} "
                                f"(read from a time or from the latest offset with source='log')")

    # -- planning ----------------------------------------------------------------------------

    def _start(self, bucket: int) -> int:
        if isinstance(self.start, dict):
            v = self.start.get(bucket, "earliest")
            return 0 if v == "earliest" else int(v)
        return 0 if self.start == "earliest" else int(self.start)

    def _end(self, bucket: int) -> int | None:
        v = self.end.get(bucket) if isinstance(self.end, dict) else self.end
        return None if v is None else int(v)

    def _plan(self) -> UnionPlan:
        info = lake_info(self.table)
        if info is None:
            raise LakeReadError(f"table {self.table.name!r} is not lake-enabled (set fluvial.lake.enable=true); "
                                f"read it with source='log'")
        plan = UnionPlan(pin(info, self.lake_catalog))
        if self.source == "union":
            for o in self.table.offsets():
                if o.bucket not in self.buckets:
                    continue
                tiered = plan.lake.end(o.bucket)
                first = max(tiered, self._start(o.bucket))
                if o.log_start > first:
                    plan.gaps[o.bucket] = (first, o.log_start)
                    first = o.log_start
                end = o.high_watermark if self._end(o.bucket) is None else min(o.high_watermark, self._end(o.bucket))
                plan.log_start[o.bucket], plan.log_end[o.bucket] = first, max(first, end)
            if self.primary_key and plan.gaps:
                raise LakeReadError(f"primary-key table {self.table.name!r}: the changelog after the lake snapshot "
                                    f"is no longer held by the broker (missing offsets per bucket: {plan.gaps}), so "
                                    f"the current rows cannot be rebuilt from lake + log")
        self.plan = plan
        return plan

    # -- reading -----------------------------------------------------------------------------

    def _lake_rows(self, plan: UnionPlan) -> pa.Table:
        """Lake rows with the read's columns in the table API's types (log tables: in bucket and
        offset order, restricted to the buckets and offsets asked for)."""
        if self.primary_key:
            want = list(dict.fromkeys([*self.primary_key, *self.columns, *(f[0] for f in self.filter)]))
            users = {f.name: f for f in self.table.info.schema}
            rows = read_lake(plan.lake, want, self.filter)
            return conform(rows, [users[n] for n in want])
        filters = list(self.filter)
        want = list(dict.fromkeys([*self.columns, *(f[0] for f in filters), "_bucket", "_offset"]))
        self._check_lake_has(plan, want)
        if sorted(self.buckets) != list(range(self.table.info.buckets)):
            filters.append(["_bucket", "in", self.buckets])
        low = min((self._start(b) for b in self.buckets), default=0)
        if low > 0:
            filters.append(["_offset", ">=", low])
        rows = read_lake(plan.lake, want, filters)
        fields = [SYSTEM_FIELDS.get(n) or self.table.info.schema.field(n) for n in want]
        rows = conform(rows, fields)
        rows = sort_by_bucket_offset(rows)
        # Exactly the offsets asked for, and never past what the pinned snapshot covers.
        bucket, offset = rows.column("_bucket"), rows.column("_offset")
        lo = np.array([self._start(b) for b in range(self.table.info.buckets)], dtype=np.int64)
        hi = np.array([min(plan.lake.end(b), self._end(b) if self._end(b) is not None else 1 << 62)
                       for b in range(self.table.info.buckets)], dtype=np.int64)
        b = bucket.to_numpy().astype(np.int64)
        o = offset.to_numpy()
        keep = (o >= lo[b]) & (o < hi[b]) & np.isin(b, self.buckets)
        if not keep.all():
            rows = rows.filter(pa.array(keep))
        return rows

    def _check_lake_has(self, plan: UnionPlan, names: list[str]) -> None:
        if plan.lake.snapshot_id is None:
            return
        missing = [n for n in names if n.startswith("_") and n not in plan.lake.columns and n != "_change"]
        if missing:
            raise LakeReadError(f"the lake table of {self.table.name!r} does not keep {missing}; "
                                f"read them with source='log'")

    def _log_scan(self, plan: UnionPlan, columns: list[str], filtered: bool):
        from fluvial.client.client import Scan

        buckets = [b for b in self.buckets if plan.log_end.get(b, 0) > plan.log_start.get(b, 0)]
        if not buckets:
            return None
        return Scan(self.table, columns, self.filter if filtered else None,
                    {b: plan.log_start[b] for b in buckets}, {b: plan.log_end[b] for b in buckets}, buckets)

    def to_arrow(self) -> pa.Table:
        """All rows as one Arrow table. Log tables: bucket after bucket, each in offset order."""
        plan = self._plan()
        if self.primary_key:
            return self._current_rows(plan)
        lake = self._lake_rows(plan)
        if "_change" in self.columns and lake.num_rows:  # lake rows of a log table are appends
            lake = lake.set_column(lake.column_names.index("_change"), "_change",
                                   pa.array(np.zeros(lake.num_rows, dtype=np.int8)))
        lake = apply_filters(lake, self.parsed)
        log = pa.table({})
        if self.source == "union":
            scan = self._log_scan(plan, list(dict.fromkeys([*self.columns, "_bucket"])), filtered=True)
            if scan is not None:
                log = scan.to_arrow()
                self.stats.add(scan.stats)
        parts = []
        for b in self.buckets:
            parts.append(_bucket_rows(lake, b).select(self.columns))
            if log.num_rows:
                parts.append(_bucket_rows(log, b).select(self.columns))
        full = pa.schema([f.remove_metadata() for f in self.fields])
        rows = pa.concat_tables([conform(p, list(full)) for p in parts]) if parts else full.empty_table()
        return self._client_filtered(rows)

    def _client_filtered(self, rows: pa.Table) -> pa.Table:
        """The part of an expression filter the reads could not apply, then the asked columns."""
        if self.client_filter is not None:
            rows = rows.filter(self.client_filter)
        return rows.select(self.output_columns)

    def _current_rows(self, plan: UnionPlan) -> pa.Table:
        key = self.primary_key
        lake = self._lake_rows(plan)
        if self.source == "union":
            want = list(dict.fromkeys([*key, *self.columns, *(f[0] for f in self.filter), "_change"]))
            scan = self._log_scan(plan, want, filtered=False)
            if scan is not None:
                changes = scan.to_arrow()
                self.stats.add(scan.stats)
                lake = fold_changelog(lake, changes, key)
        rows = apply_filters(lake, self.parsed)
        return self._client_filtered(conform(rows, [f.remove_metadata() for f in self.fields]))

    def to_pandas(self, **kwargs):
        return self.to_arrow().to_pandas(**kwargs)

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        yield from self.to_arrow().to_batches()

    def output_schema(self) -> pa.Schema:
        return self.schema

    def with_columns(self, columns: list[str]) -> "UnionScan":
        return UnionScan(self.table, columns, self._user_filter, self.start, self.end, self.buckets, self.source,
                         self.lake_catalog)

    def follow(self) -> Iterator[pa.RecordBatch]:
        """The union up to now, then new rows of the log as they are appended (log tables)."""
        from fluvial.client.client import Scan

        if self.primary_key:
            raise LakeReadError("follow the changelog of a primary-key table with source='log'")
        if self.source != "union":
            raise LakeReadError("a lake-only read cannot follow: the lake only changes per tiering round")
        yield from self.to_arrow().to_batches()
        plan = self.plan
        assert plan is not None
        tail = Scan(self.table, self.output_columns, self._user_filter, {b: plan.log_end.get(b, plan.lake.end(b)) for b in self.buckets},
                    self.end, self.buckets)
        yield from tail.follow()


def _bucket_rows(rows: pa.Table, bucket: int) -> pa.Table:
    if rows.num_rows == 0:
        return rows
    col = rows.column("_bucket")
    b = col.to_numpy()
    if np.all(b[1:] >= b[:-1]):  # sorted by bucket: a slice, no copy
        lo = int(np.searchsorted(b, bucket, side="left"))
        hi = int(np.searchsorted(b, bucket, side="right"))
        return rows.slice(lo, hi - lo)
    return rows.filter(pc.equal(col, bucket))
