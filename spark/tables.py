"""`fluvial.spark.read_table`: a lake-enabled log table read by Spark's own Parquet reader.

A union read through `format("fluvial")` hands every lake row from a Python worker to the
JVM as Arrow batches: for a table that is mostly tiered, that hand-over is most of the read.
The lake files of a log table's snapshot need no Fluvial logic at all (log tables' lake
snapshots have no delete files; every row is an append), so here the driver pins the lake
snapshot, lists its Parquet data files, and has Spark read them with its JVM reader
(vectorized, column pruning and filter pushdown by Spark itself); only the log after the
offsets that very snapshot covers goes through `format("fluvial")` (startingOffsets per
bucket). The two are one DataFrame with exactly `format("fluvial")`'s columns and types
(Parquet types that differ are cast: microsecond timestamps, int32 for narrow integers).

Reads this path cannot take (primary-key tables, which need the changelog folded in by key;
reads from given offsets; lake snapshots with delete files or outside a local warehouse; time
columns, which Spark's Parquet reader does not read) go through `format("fluvial")`, which
returns the same rows.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.types as pt

import fluvial.client as fc
from fluvial.client import union
from fluvial.spark.source import (
    DEFAULT_URL, FluvialSparkError, Options, _describe, _read_fields, _table_spark_schema, _translate,
)
from fluvial.spark.types import METADATA_FIELDS, spark_type

# A log tail after the lake snapshot up to this many offsets is read on the driver (opt-in:
# no gain measured at 1-5M rows on a loaded 2-core machine, see docs/architecture.md).
DRIVER_TAIL_ROWS = 0
# Options of the log side that read_table sets itself.
_OWN_OPTIONS = {"url", "table", "path", "columns", "source", "startingoffsets", "endingoffsets", "includemetadata"}


def read_table(spark: Any, name: str, columns: Sequence[str] | None = None, filter: Any = None,
               url: str = DEFAULT_URL, include_metadata: bool = False, driver_tail_rows: int = DRIVER_TAIL_ROWS,
               **options: Any) -> Any:
    """Table `name` as one DataFrame: for a lake-enabled log table, its lake snapshot read by
    Spark's Parquet reader plus the broker's log after it; any other read as
    `format("fluvial")` does it.

    columns: the columns returned (user and system columns such as `_offset`); all user columns
        when None.
    filter: a Spark Column or SQL condition string, applied before the projection (so it may
        name columns not returned); Spark pushes it into the Parquet scan.
    driver_tail_rows: a log tail after the lake snapshot of at most this many offsets is read
        on the driver and handed to Spark as a local relation (default 0: always by
        format("fluvial") tasks).
    options: any other `format("fluvial")` option (`source`, `startingOffsets`, `pushFilters`,
        `lake.catalog.<key>`, ...).
    """
    raw = {str(k): str(v) for k, v in options.items()}
    raw.update(url=url, table=name)
    if columns is not None:
        raw["columns"] = ",".join(columns)
    if include_metadata:
        raw["includeMetadata"] = "true"
    opts = Options.parse(raw)
    info = _describe(opts)
    fields = _read_fields(info, opts)
    names = [f.name for f in fields]
    plan = _plan(opts, info, fields, filter is not None)
    if plan is None:
        overrides = {}
        if filter is not None:  # the filter may name columns the projection leaves out
            wide = list(info.schema.names)
            if not (info.primary_key and opts.source in ("union", "lake")):  # current rows have none
                wide += [f.name for f in METADATA_FIELDS if f.name not in wide]
            overrides = {"columns": ",".join(dict.fromkeys([*names, *wide]))}
            raw = {k: v for k, v in raw.items() if k.lower() != "includemetadata"}
        df = _fluvial(spark, raw, overrides)
    else:
        df = _union(spark, opts, info, plan, raw, filter is not None, driver_tail_rows)
    if filter is not None:
        df = df.where(filter)
    return df.select(*names)


def _plan(opts: Options, info: fc.TableInfo, fields: list[pa.Field], filtered: bool) -> "union.PinnedLake | None":
    """The pinned lake snapshot when this read can take the Parquet path, else None."""
    source = opts.source or ("union" if opts.starting == "earliest" else "log")
    if (source == "log" or info.primary_key or not union.is_lake_enabled(info.configs)
            or opts.starting != "earliest" or opts.ending != "latest"):
        return None
    wanted = info.schema if filtered else fields
    if any(_has_time(f.type) for f in wanted):
        return None
    try:
        with opts.connect() as client:
            lake = union.lake_info(fc.Table(client, info))
            if lake is None:
                return None
            pinned = union.pin(lake, dict(opts.lake_catalog))
    except fc.FluvialError as exc:
        raise _translate(exc, opts) from None
    if pinned.snapshot_id is not None and pinned.files is None:
        return None  # delete files, or a warehouse Spark is not set up to read here
    system = [f.name for f in (METADATA_FIELDS if filtered else fields) if f.name.startswith("_")]
    if pinned.snapshot_id is not None and any(n not in pinned.columns and n != "_change" for n in system):
        return None  # an older lake table without them: format("fluvial") says what it lacks
    return pinned


def _has_time(t: pa.DataType) -> bool:
    if pt.is_time(t):
        return True
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        return _has_time(t.value_type)
    if pt.is_map(t):
        return _has_time(t.key_type) or _has_time(t.item_type)
    if pt.is_struct(t):
        return any(_has_time(t.field(i).type) for i in range(t.num_fields))
    return False


def _fluvial(spark: Any, raw: dict[str, str], overrides: dict[str, str]) -> Any:
    from fluvial.spark.source import FluvialDataSource

    spark.dataSource.register(FluvialDataSource)  # idempotent: read_table needs no register() first
    reader = spark.read.format("fluvial")
    for k, v in {**raw, **overrides}.items():
        reader = reader.option(k, v)
    return reader.load()


def _union(spark: Any, opts: Options, info: fc.TableInfo, pinned: "union.PinnedLake",
           raw: dict[str, str], filtered: bool, driver_tail_rows: int) -> Any:
    # With a filter, both sides carry every column it may name; Spark prunes the Parquet
    # columns it does not need, the log side reads them.
    if filtered:
        fields = list(info.schema) + [f for f in METADATA_FIELDS if f.name not in info.schema.names]
    else:
        fields = _read_fields(info, opts)
    target = _table_spark_schema(fields, opts.table)
    columns = ",".join(f.name for f in fields)
    source = opts.source or "union"
    log = None
    if source == "union":
        log = _short_tail(spark, opts, info, pinned, fields, target, driver_tail_rows)
    if source == "union" and log is None:
        start = {str(b): pinned.end(b) for b in range(info.buckets)}
        passed = {k: v for k, v in raw.items() if k.lower() not in _OWN_OPTIONS}
        log = _fluvial(spark, passed, {"url": opts.url, "table": opts.table, "source": "log",
                                       "columns": columns, "startingOffsets": json.dumps(start),
                                       "endingOffsets": "latest"})
    lake = _lake_side(spark, pinned, fields, target)
    if lake is None:
        return log if log is not None else spark.createDataFrame([], target)
    return lake if log is None else lake.unionByName(log)


def _short_tail(spark: Any, opts: Options, info: fc.TableInfo, pinned: "union.PinnedLake",
                fields: list[pa.Field], target: Any, limit: int) -> Any:
    """The log after the snapshot read on the driver by the native client and handed to Spark
    as a local relation, when it is short (at most `limit` offsets): a Python task
    costs a Spark query a few hundred milliseconds, more than reading such a tail. None when
    the tail is longer (then format("fluvial") tasks read it)."""
    from fluvial.spark.types import arrow_schema, conform

    try:
        with opts.connect(object_store_options=dict(opts.object_store_options)) as client:
            table = fc.Table(client, info)
            ranges = {o.bucket: (max(pinned.end(o.bucket), o.log_start), o.high_watermark) for o in table.offsets()}
            ranges = {b: r for b, r in ranges.items() if r[1] > r[0]}
            if limit <= 0 or sum(hi - lo for lo, hi in ranges.values()) > limit:
                return None
            names = [f.name for f in fields]
            schema = arrow_schema(target)
            if not ranges:
                return spark.createDataFrame(schema.empty_table(), schema=target)
            rows = table.scan(columns=names, start={b: r[0] for b, r in ranges.items()},
                              end={b: r[1] for b, r in ranges.items()}, buckets=sorted(ranges),
                              source="log").to_arrow()
    except fc.FluvialError as exc:
        raise _translate(exc, opts) from None
    batches = [conform(b, schema) for b in rows.select(names).to_batches()]
    return spark.createDataFrame(pa.Table.from_batches(batches, schema=schema), schema=target)


def _lake_side(spark: Any, pinned: "union.PinnedLake", fields: list[pa.Field], target: Any) -> Any:
    """The snapshot's data files as format("fluvial")'s columns, or None when it has none."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    from fluvial.tiering.lake.schema import TIMESTAMP_TYPE, lake_type

    if pinned.snapshot_id is None or not pinned.files:
        return None
    system = {"_bucket": pa.int32(), "_offset": pa.int64(), "_timestamp": TIMESTAMP_TYPE}
    # Spark reads the files with the lake table's types for the columns it has (files written
    # before a column was added read it as null); the rest is filled here.
    stored = [f for f in fields if f.name in pinned.columns]
    schema = StructType([StructField(f.name, spark_type(system.get(f.name) or lake_type(f.type)), True)
                         for f in stored])
    files = spark.read.schema(schema).parquet(*[f.path for f in pinned.files])
    out = []
    for f, want in zip(fields, target.fields):
        if f.name in pinned.columns:
            col = F.col(f"`{f.name}`")
            col = col if schema[f.name].dataType == want.dataType else col.cast(want.dataType)
        elif f.name == "_change":  # lake rows of a log table are appends
            col = F.lit(0).cast(want.dataType)
        else:
            col = F.lit(None).cast(want.dataType)
        out.append(col.alias(f.name))
    return files.select(*out)


__all__ = ["FluvialSparkError", "read_table"]
