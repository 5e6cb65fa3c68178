"""The data files of one Iceberg snapshot, and reading them, without pyiceberg.

Importing pyiceberg takes 1-4 s on a loaded machine (pydantic, SQLAlchemy, ...), and Spark
pays that in every planning worker and every executor worker: more than a whole union read
of a million rows. A snapshot's files are three small documents away from its metadata
file: the metadata JSON names the snapshot's manifest list (Avro), which names manifests
(Avro), which name the data files. fastavro reads those in milliseconds; pyarrow reads the
Parquet data files (projection and row-group pruning by statistics).

Used when the metadata file is on a file system pyarrow opens from its URI alone (local
`file://` warehouses: the embedded lake) and the snapshot has no delete files; anything
else goes through pyiceberg.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

# Manifest entry status and content types (Iceberg spec).
DELETED = 2
DATA = 0


@dataclass(frozen=True)
class DataFile:
    path: str
    record_count: int
    size: int


class NotPlain(Exception):
    """The snapshot cannot be read from its data files alone (delete files, another format or
    file system): read it through pyiceberg."""


def _open(uri: str) -> tuple[pafs.FileSystem, str]:
    if not uri.startswith("file://") and not uri.startswith("/"):
        raise NotPlain(f"{uri.split(':', 1)[0]} file system")
    return pafs.LocalFileSystem(), uri[len("file://"):] if uri.startswith("file://") else uri


def read_bytes(uri: str) -> bytes:
    fs, path = _open(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


def _avro(uri: str) -> list[dict]:
    import io

    import fastavro

    return list(fastavro.reader(io.BytesIO(read_bytes(uri))))


def snapshot_files(metadata_location: str, snapshot_id: int) -> list[DataFile]:
    """The live data files of a snapshot. Raises NotPlain when it also has delete files or
    its files are not on a local file system."""
    meta = json.loads(read_bytes(metadata_location))
    snapshot = next((s for s in meta.get("snapshots", []) if s["snapshot-id"] == snapshot_id), None)
    if snapshot is None:
        raise NotPlain(f"snapshot {snapshot_id} is not in {metadata_location}")
    if "manifest-list" not in snapshot:
        raise NotPlain("format v1 manifests")
    files: list[DataFile] = []
    for manifest in _avro(snapshot["manifest-list"]):
        entries = _avro(manifest["manifest_path"])
        live = [e for e in entries if e["status"] != DELETED]
        if manifest.get("content", DATA) != DATA:
            if live:
                raise NotPlain("delete files")
            continue
        for e in live:
            df = e["data_file"]
            if df.get("content", DATA) != DATA:
                raise NotPlain("delete files")
            if str(df.get("file_format", "PARQUET")).upper() != "PARQUET":
                raise NotPlain(f"{df.get('file_format')} data files")
            files.append(DataFile(df["file_path"], int(df["record_count"]), int(df["file_size_in_bytes"])))
    return files


def arrow_filter(filters: Sequence[Any], names: set[str]) -> pc.Expression | None:
    """Row-group pruning for the Parquet reader: filters on columns the file has. (Every
    filter is applied exactly after the read in any case.)"""
    expr = None
    for f in filters:
        column, op, value = f.column, f.op, f.value
        if column not in names:
            continue
        field = pc.field(column)
        if op == "is_null":
            e = field.is_null()
        elif op == "not_null":
            e = field.is_valid()
        elif op == "in":
            e = field.isin(value)
        elif op == "not in":
            continue  # nothing to prune by
        else:
            scalar = value
            e = {"=": field == scalar, "!=": field != scalar, "<": field < scalar, "<=": field <= scalar,
                 ">": field > scalar, ">=": field >= scalar}[op]
        expr = e if expr is None else expr & e
    return expr


def read_files(files: Sequence[DataFile | str], columns: Sequence[str], filters: Sequence[Any] = ()) -> pa.Table:
    """The files' rows, the given columns (those a file lacks are left out: older files
    written before a column was added), filters used to prune row groups."""
    parts = []
    for f in files:
        lake_file = _LakeFile(f, columns, filters)
        parts.append(pa.Table.from_batches(list(lake_file.batches()), lake_file.schema))
    if not parts:
        return pa.table({})
    return pa.concat_tables(parts, promote_options="permissive")


def iter_files(files: Sequence[DataFile | str], columns: Sequence[str], filters: Sequence[Any] = (),
               batch_size: int = 64 * 1024) -> Iterator[pa.RecordBatch]:
    """The files' rows as batches of at most `batch_size` rows, read as they are consumed
    (the same columns and pruning as `read_files`)."""
    for f in files:
        yield from _LakeFile(f, columns, filters).batches(batch_size)


class _LakeFile:
    """One data file opened for reading: the asked columns it has, its row-group filter."""

    def __init__(self, f: DataFile | str, columns: Sequence[str], filters: Sequence[Any]):
        self._fs, self._local = _open(f.path if isinstance(f, DataFile) else f)
        self._parquet = pq.ParquetFile(self._local, filesystem=self._fs)
        schema = self._parquet.schema_arrow
        have = set(schema.names)
        self.columns = [c for c in columns if c in have]
        self.schema = pa.schema([schema.field(c) for c in self.columns])
        self._filter = _typed_filter(filters, schema, have)

    def batches(self, batch_size: int | None = None) -> Iterator[pa.RecordBatch]:
        size = {"batch_size": batch_size} if batch_size else {}
        if self._filter is None:
            yield from self._parquet.iter_batches(columns=self.columns, **size)
            return
        import pyarrow.dataset as ds

        yield from ds.dataset(self._local, filesystem=self._fs, format="parquet").to_batches(
            columns=self.columns, filter=self._filter, **size)


def _typed_filter(filters: Sequence[Any], schema: pa.Schema, have: set[str]) -> pc.Expression | None:
    """`arrow_filter` with each value cast to the file's column type (timestamps in the lake
    are microseconds, narrow integers are widened)."""
    typed = []
    for f in filters:
        if f.column not in have or f.value is None:
            typed.append(f)
            continue
        t = schema.field(f.column).type
        try:
            value = f.value.cast(t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            continue  # not pushed; applied exactly after the read
        typed.append(type(f)(f.column, f.op, value))
    return arrow_filter(typed, have)
