"""Union reads in `format("fluvial")`: a lake-enabled table read as one table by Spark tasks.

Input partitions: one per lake data file of the pinned Iceberg snapshot (pyiceberg plans
them with the pushed filters and projection; each task reads its file with ranged Parquet
reads), then the broker's log from exactly the offsets that snapshot covers, per bucket.
Primary-key tables: lake tasks drop the rows whose key changed after the snapshot (the
driver reads the changed keys once) and one task per bucket folds the changelog after the
snapshot into the current rows of those keys.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

import fluvial.client as fc
from fluvial.client import union
from fluvial.client.lake_files import iter_files
from fluvial.client.predicates import parse_filter
from fluvial.spark.types import conform as spark_conform

SOURCES = union.SOURCES
# Rows per batch handed to Spark from lake files: the log side's size (broker scans send
# up to 64 Ki rows a message).
SPARK_BATCH_ROWS = 64 * 1024


@dataclass(frozen=True)
class LakeFiles(InputPartition):
    """One task's lake data files (pickled pyiceberg FileScanTasks of the pinned snapshot)."""

    index: int
    tasks: bytes                        # pickled FileScanTasks (pyiceberg path), or b""
    changed_keys: bytes | None = None   # PK tables: keys changed after the snapshot (Arrow IPC)
    paths: tuple[str, ...] = ()         # data files read without pyiceberg (plain snapshot)
    rows: int = 0                       # records in the files (for packing tasks)


@dataclass(frozen=True)
class Pieces(InputPartition):
    """Several pieces (lake files, log ranges) read by one task, one after the other."""

    pieces: tuple


def pack(parts: list[InputPartition], max_rows: int, at_least: int = 1) -> list[InputPartition]:
    """Lake files and log ranges packed into max(at_least, total/max_rows) tasks of similar
    size (largest first onto the lightest task). A union read would otherwise start one task
    per data file plus one per log range: many small tasks, each a Python worker round
    trip."""
    def size(p: Any) -> int:
        return p.rows if isinstance(p, LakeFiles) else max(0, p.end - p.start)

    total = sum(size(p) for p in parts)
    n = max(1, at_least, -(-total // max_rows))
    if n >= len(parts):
        return parts
    tasks: list[list] = [[] for _ in range(n)]
    loads = [0] * n
    for p in sorted(parts, key=size, reverse=True):
        i = loads.index(min(loads))
        tasks[i].append(p)
        loads[i] += size(p)
    return [Pieces(tuple(t)) if len(t) > 1 else t[0] for t in tasks if t]


@dataclass(frozen=True)
class ChangelogRange(InputPartition):
    """A primary-key table's changelog after the lake snapshot, of one bucket: [start, end)."""

    bucket: int
    start: int
    end: int


@dataclass
class LakeRead:
    """What every task of a union read needs (pickled to the executors with the reader)."""

    url: str
    table: str
    catalog: dict[str, str]
    identifier: tuple[str, ...]
    snapshot_id: int | None
    lake_end: dict[int, int]            # bucket -> end offset the snapshot covers
    bounds: dict[int, tuple[int, int]]  # log tables: bucket -> [start, end) offsets asked for
    primary_key: tuple[str, ...]
    user_fields: bytes                  # the table's user schema (Arrow IPC)
    lake_cols: frozenset[str] = frozenset()
    files: tuple[tuple[str, int], ...] | None = None  # (path, rows) of the snapshot's files, read without pyiceberg
    security: fc.ConnectionSecurity = fc.ConnectionSecurity()  # the table API's credentials and TLS trust

    # -- planning (driver) -------------------------------------------------------------------

    @classmethod
    def pin(cls, url: str, info: fc.TableInfo, client: fc.Client, catalog_options: dict[str, str],
            security: fc.ConnectionSecurity = fc.ConnectionSecurity()) -> "LakeRead":
        table = fc.Table(client, info)
        lake = union.lake_info(table)
        if lake is None:
            raise union.LakeReadError(f"table {info.name!r} is not lake-enabled (set fluvial.lake.enable=true); "
                                      f"read it with option('source', 'log')")
        pinned = union.pin(lake, catalog_options)
        files = tuple((f.path, f.record_count) for f in pinned.files) if pinned.files is not None else None
        return cls(url, info.name, {**lake.catalog, **catalog_options}, tuple(lake.identifier), pinned.snapshot_id,
                   dict(pinned.offsets), {}, tuple(info.primary_key or ()),
                   pa.schema(list(info.schema)).serialize().to_pybytes(), pinned.columns, files, security)

    def users(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.user_fields))

    def _iceberg(self) -> Any:
        return union.load_catalog(self.catalog).load_table(self.identifier)

    def bounded(self) -> bool:
        """Whether the read asks for fewer offsets than the snapshot holds (startingOffsets or
        endingOffsets inside it): only then are lake rows checked by `_bucket`/`_offset`."""
        return any(lo > 0 or hi < self.lake_end.get(b, 0) for b, (lo, hi) in self.bounds.items())

    def lake_columns(self, names: Sequence[str], filters: Sequence[Sequence[Any]]) -> list[str]:
        extra = list(self.primary_key) if self.primary_key else ["_bucket", "_offset"] if self.bounded() else []
        return list(dict.fromkeys([*names, *extra, *(f[0] for f in filters)]))

    def file_partitions(self, names: Sequence[str], filters: Sequence[Sequence[Any]],
                        changed_keys: bytes | None = None) -> list[LakeFiles]:
        if self.snapshot_id is None:
            return []
        if self.files is not None:  # one piece per data file, read without pyiceberg
            return [LakeFiles(i, b"", changed_keys, (path,), rows) for i, (path, rows) in enumerate(self.files)]
        iceberg = self._iceberg()
        lake_cols = {f.name for f in iceberg.schema().fields}
        cols = [c for c in self.lake_columns(names, filters) if c in lake_cols]
        scan = iceberg.scan(row_filter=union.iceberg_filter([list(f) for f in filters], lake_cols),
                            selected_fields=tuple(cols) or ("*",), snapshot_id=self.snapshot_id)
        return [LakeFiles(i, pickle.dumps([task]), changed_keys, (), int(task.file.record_count))
                for i, task in enumerate(scan.plan_files())]

    def read_changed_keys(self, client: fc.Client, ends: dict[int, int]) -> bytes:
        """PK tables: every key the changelog after the snapshot touches (read once, on the driver)."""
        table = fc.Table(client, client.describe(self.table))
        start = {b: self.lake_end.get(b, 0) for b in ends if ends[b] > self.lake_end.get(b, 0)}
        if not start:
            keys = self.users().empty_table().select(list(self.primary_key))
        else:
            keys = table.scan(columns=list(self.primary_key), start=start, end={b: ends[b] for b in start},
                              buckets=sorted(start), source="log").to_arrow()
            keys = keys.group_by(list(self.primary_key)).aggregate([]) if keys.num_rows else keys
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, keys.schema) as w:
            w.write_table(keys)
        return sink.getvalue().to_pybytes()

    # -- reading (executors) -----------------------------------------------------------------

    def _fields(self, names: Sequence[str]) -> list[pa.Field]:
        users = {f.name: f for f in self.users()}
        return [users.get(n) or union.SYSTEM_FIELDS[n] for n in names]

    def read_files(self, part: LakeFiles, names: Sequence[str], filters: Sequence[Sequence[Any]],
                   target: pa.Schema) -> Iterator[pa.RecordBatch]:
        """The task's lake rows, streamed in batches of about SPARK_BATCH_ROWS (a whole data
        file handed to Spark as one batch costs the JVM several times the read)."""
        want = self.lake_columns(names, filters)
        fields = self._fields(want)
        parsed = self._parsed(filters, want)
        keys = None
        if self.primary_key and part.changed_keys:
            keys = pa.ipc.open_stream(part.changed_keys).read_all()
            keys = keys if keys.num_rows else None
        for chunk in self._chunks(part, want, filters):
            rows = union.conform(pa.Table.from_batches([chunk]), fields)
            if "_change" in names:  # lake rows of a log table are appends
                rows = rows.set_column(rows.column_names.index("_change"), "_change",
                                       pa.nulls(rows.num_rows, pa.int8()).fill_null(0))
            if self.primary_key:
                if keys is not None and rows.num_rows:
                    rows = rows.join(keys, keys=list(self.primary_key), join_type="left anti").select(want)
            elif self.bounded():
                rows = self._within_bounds(rows)
            rows = union.apply_filters(rows, parsed)
            for batch in rows.to_batches():
                if batch.num_rows:
                    yield spark_conform(batch, target)

    def _chunks(self, part: LakeFiles, want: list[str], filters: Sequence[Sequence[Any]]) -> Iterator[pa.RecordBatch]:
        if part.paths:
            present = [c for c in want if c in self.lake_cols]
            yield from iter_files(part.paths, present, union.loose_filters([list(f) for f in filters]),
                                  SPARK_BATCH_ROWS)
            return
        from pyiceberg.io.pyarrow import ArrowScan

        iceberg = self._iceberg()
        lake_cols = {f.name for f in iceberg.schema().fields}
        present = [c for c in want if c in lake_cols]
        scan = iceberg.scan(row_filter=union.iceberg_filter([list(f) for f in filters], lake_cols),
                            selected_fields=tuple(present), snapshot_id=self.snapshot_id)
        for batch in ArrowScan(iceberg.metadata, iceberg.io, scan.projection(), scan.row_filter, True) \
                .to_record_batches(pickle.loads(part.tasks)):
            for lo in range(0, batch.num_rows, SPARK_BATCH_ROWS):
                yield batch.slice(lo, SPARK_BATCH_ROWS)

    def _within_bounds(self, rows: pa.Table) -> pa.Table:
        """Lake rows of the offsets asked for (startingOffsets/endingOffsets), never past the
        snapshot's end."""
        if rows.num_rows == 0:
            return rows
        import numpy as np

        n = max([*self.lake_end, *self.bounds, -1]) + 1
        lo = np.zeros(n, dtype=np.int64)
        hi = np.array([self.lake_end.get(b, 0) for b in range(n)], dtype=np.int64)
        for b, (s, e) in self.bounds.items():
            lo[b], hi[b] = s, min(hi[b], e)
        b = rows.column("_bucket").to_numpy().astype(np.int64)
        o = rows.column("_offset").to_numpy()
        inside = b < n
        keep = inside & (o >= lo[np.minimum(b, n - 1)]) & (o < hi[np.minimum(b, n - 1)])
        return rows if keep.all() else rows.filter(pa.array(keep))

    def _parsed(self, filters: Sequence[Sequence[Any]], names: Sequence[str]):
        fields = {f.name: f for f in self._fields(list(dict.fromkeys([*names, *(f[0] for f in filters)])))}
        return [parse_filter(list(f), fields.__getitem__) for f in filters]

    def read_changelog(self, part: ChangelogRange, names: Sequence[str], filters: Sequence[Sequence[Any]],
                       target: pa.Schema) -> Iterator[pa.RecordBatch]:
        want = list(dict.fromkeys([*self.primary_key, *names, *(f[0] for f in filters)]))
        with fc.Client(self.url, security=self.security) as client:
            table = fc.Table(client, client.describe(self.table))
            changes = table.scan(columns=[*want, "_change"], start={part.bucket: part.start},
                                 end={part.bucket: part.end}, buckets=[part.bucket], source="log").to_arrow()
        empty = union.conform(pa.table({}), self._fields(want)).slice(0, 0)
        rows = union.fold_changelog(empty, changes, list(self.primary_key))
        rows = union.apply_filters(rows, self._parsed(filters, want))
        for batch in rows.to_batches():
            yield spark_conform(batch, target)


def default_source(info: fc.TableInfo, starting: Any) -> str:
    """As the client decides: lake-enabled log tables read from 'earliest' are read as the
    union; reads from offsets, and primary-key tables (their changelog), read the log unless
    the union is asked for."""
    if not union.is_lake_enabled(info.configs) or info.primary_key:
        return "log"
    return "union" if starting == "earliest" else "log"


def check_columns(info: fc.TableInfo, names: Sequence[str]) -> None:
    if info.primary_key:
        system = [n for n in names if n.startswith("_") and n not in info.schema.names]
        if system:
            raise union.LakeReadError(f"a union read of primary-key table {info.name!r} gives current rows, which "
                                      f"have no {system}; read the changelog with option('source', 'log')")


__all__ = ["ChangelogRange", "LakeFiles", "LakeRead", "Pieces", "SOURCES", "check_columns", "default_source", "pack"]
