"""`format("fluvial")`: Spark's Python data source over Fluvial's table API (batch and streaming reads, writes)."""
from __future__ import annotations

import json
import math
import os
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource, DataSourceArrowWriter, DataSourceReader, DataSourceStreamReader, InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

import fluvial.client as fc
from fluvial.spark import union as spark_union
from fluvial.spark.types import METADATA_FIELDS, UnsupportedTypeError, arrow_schema, conform, same_type, spark_schema

try:  # Spark 4.1+
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - Spark 4.0 has no Arrow stream writer: streaming writes need 4.1
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase

try:  # Spark 4.2+: admission control
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
except ImportError:  # pragma: no cover
    ReadAllAvailable = ReadMaxRows = ReadLimit = None  # type: ignore[assignment,misc]

DEFAULT_URL = "grpc://127.0.0.1:8815"
OBJECT_STORE_PREFIX = "objectstore."
# Large buckets are read by several tasks: each reads at most this many offsets.
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000
# How long a read or an offset lookup keeps retrying while the broker cannot be reached
# (a broker restart takes a few seconds).
DEFAULT_RETRY_MS = 60_000
# Rows gathered before one append: amortizes the round trip, bounds the memory held.
WRITE_BATCH_BYTES = 8 * 1024 * 1024

T = TypeVar("T")


class FluvialSparkError(Exception):
    """What went wrong, said in the data source's terms (Spark shows the message)."""


# -- options --------------------------------------------------------------------------------

def _flag(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


@dataclass(frozen=True)
class Options:
    """The data source's options, checked once on the driver."""

    url: str
    table: str
    columns: tuple[str, ...] | None
    starting: Any
    ending: Any
    include_metadata: bool
    max_records_per_partition: int
    max_records_per_trigger: int | None
    retry_ms: int
    scan_stats_dir: str | None
    create_table: bool
    push_filters: bool
    primary_key: tuple[str, ...] | None
    buckets: int
    kafka_format: str | None
    source: str | None = None                 # union | lake | log; None: decided per table
    lake_catalog: tuple[tuple[str, str], ...] = ()  # extra catalog properties (`lake.catalog.<key>`)
    object_store_options: tuple[tuple[str, str], ...] = ()  # `objectStore.<key>`: reading tiered segments
    change_column: str | None = None  # writing: the column holding each row's change type (+I, -U, +U, -D)
    merge_engine: str | None = None  # createTable: the primary-key table's merge engine
    upsert_key: tuple[str, ...] | None = None  # createTable, engine 'retract'
    retract_state_ttl_ms: int | None = None  # createTable, engine 'retract'
    aggregates: tuple[tuple[str, str], ...] = ()  # createTable, engine 'aggregation': `agg.<column>` = function
    bucket_function: str | None = None  # createTable, primary key: murmur2 (default) or crc32
    # A secured table API: `username`, `password` (never shown), `tlsRootCerts` (a PEM file's
    # path on every executor, or the PEM text itself), with a grpc+tls:// url.
    security: fc.ConnectionSecurity = fc.ConnectionSecurity()

    def connect(self, **kwargs) -> fc.Client:
        """A native client for the table API, with this source's credentials and TLS trust."""
        return fc.Client(self.url, security=self.security, **kwargs)

    @classmethod
    def parse(cls, raw: Mapping[str, str], streaming: bool = False) -> "Options":
        opts = {k.lower(): v for k, v in dict(raw).items()}
        table = opts.get("table") or opts.get("path")
        if not table:
            raise FluvialSparkError("option 'table' is required: spark.read.format('fluvial').option('table', ...)")
        columns = None
        if opts.get("columns"):
            columns = tuple(c.strip() for c in opts["columns"].split(",") if c.strip())
            if len(set(columns)) != len(columns):
                raise FluvialSparkError(f"option 'columns' names a column twice: {opts['columns']!r}")
        return cls(
            url=opts.get("url", DEFAULT_URL),
            table=table,
            columns=columns,
            starting=_offsets_option(opts.get("startingoffsets", "latest" if streaming else "earliest"),
                                     "startingOffsets", table),
            ending=_offsets_option(opts.get("endingoffsets", "latest"), "endingOffsets", table),
            include_metadata=_flag(opts.get("includemetadata", "false")),
            max_records_per_partition=_positive(opts, "maxrecordsperpartition", DEFAULT_MAX_RECORDS_PER_PARTITION),
            max_records_per_trigger=_positive(opts, "maxrecordspertrigger", None),
            retry_ms=_positive(opts, "retrytimeoutms", DEFAULT_RETRY_MS, allow_zero=True),
            scan_stats_dir=opts.get("scanstatsdir"),
            create_table=_flag(opts.get("createtable", "false")),
            push_filters=_flag(opts["pushfilters"]) if "pushfilters" in opts else default_push_filters(),
            primary_key=tuple(c.strip() for c in opts["primarykey"].split(",") if c.strip())
            if opts.get("primarykey") else None,
            buckets=_positive(opts, "buckets", 1),
            kafka_format=opts.get("kafkaformat"),
            source=_source_option(opts.get("source")),
            lake_catalog=tuple(sorted((k[len("lake.catalog."):], v) for k, v in dict(raw).items()
                                      if k.lower().startswith("lake.catalog."))),
            object_store_options=tuple(sorted((k[len(OBJECT_STORE_PREFIX):], v) for k, v in opts.items()
                                              if k.startswith(OBJECT_STORE_PREFIX))),
            change_column=opts.get("changecolumn") or None,
            merge_engine=opts.get("mergeengine") or None,
            upsert_key=tuple(c.strip() for c in opts["upsertkey"].split(",") if c.strip())
            if opts.get("upsertkey") else None,
            retract_state_ttl_ms=_positive(opts, "retractstatettlms", None),
            aggregates=tuple(sorted((k[len("agg."):], v) for k, v in dict(raw).items()
                                    if k.lower().startswith("agg.") and v)),
            bucket_function=opts.get("bucketfunction") or None,
            security=fc.ConnectionSecurity(opts.get("username") or None, opts.get("password"),
                                           opts.get("tlsrootcerts") or None),
        )


def _source_option(value: str | None) -> str | None:
    if value is None:
        return None
    source = value.strip().lower()
    if source not in spark_union.SOURCES:
        raise FluvialSparkError(f"option 'source' must be one of {list(spark_union.SOURCES)}, not {value!r}")
    return source


def _positive(opts: dict, key: str, default: Any, allow_zero: bool = False) -> Any:
    if key not in opts:
        return default
    try:
        value = int(opts[key])
    except ValueError:
        value = -1
    if value < 0 or (value == 0 and not allow_zero):
        raise FluvialSparkError(f"option {key!r} must be a positive number, not {opts[key]!r}")
    return value


def _offsets_option(text: str, name: str, table: str) -> Any:
    """'earliest', 'latest', or JSON {bucket: offset} (-2 earliest, -1 latest), also in
    Kafka's nested form {table: {bucket: offset}}."""
    text = str(text).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and len(body) == 1 and isinstance(next(iter(body.values())), dict):
        if table not in body:
            raise FluvialSparkError(f"{name} names table {next(iter(body))!r}, the source reads {table!r}")
        body = body[table]
    if not isinstance(body, dict) or not all(
            str(k).isdigit() and isinstance(v, int) and not isinstance(v, bool) and v >= -2 for k, v in body.items()):
        raise FluvialSparkError(f"{name} must be 'earliest', 'latest' or JSON like {{\"0\": 42, \"1\": -2}} "
                                f"(bucket: offset; -2 earliest, -1 latest), not {text!r}")
    return {int(k): v for k, v in body.items()}


def _resolve(spec: Any, bucket: fc.BucketOffsets, default: str) -> int:
    value = spec.get(bucket.bucket, default) if isinstance(spec, dict) else spec
    if value in ("earliest", -2):
        return bucket.log_start
    if value in ("latest", -1):
        return bucket.high_watermark
    return int(value)


# -- broker access --------------------------------------------------------------------------

def _with_retry(retry_ms: int, fn: Callable[[], T]) -> T:
    """`fn()`, tried again while the broker cannot be reached, for up to `retry_ms`."""
    deadline = time.monotonic() + retry_ms / 1000
    pause = 0.2
    while True:
        try:
            return fn()
        except fc.BrokerUnavailableError:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


def _translate(exc: fc.FluvialError, opts: Options) -> FluvialSparkError:
    if isinstance(exc, fc.UnknownTableError):
        return FluvialSparkError(f"Fluvial table {opts.table!r} does not exist at {opts.url}")
    if isinstance(exc, fc.BrokerUnavailableError):
        return FluvialSparkError(f"cannot reach Fluvial's table API at {opts.url} (option 'url'): {exc}")
    return FluvialSparkError(f"Fluvial table {opts.table!r}: {exc}")


def _describe(opts: Options) -> fc.TableInfo:
    try:
        with opts.connect() as client:
            return _with_retry(opts.retry_ms, lambda: client.describe(opts.table))
    except fc.FluvialError as exc:
        raise _translate(exc, opts) from None


def _offsets(opts: Options) -> list[fc.BucketOffsets]:
    try:
        with opts.connect() as client:
            return _with_retry(opts.retry_ms, lambda: fc.Table(client, client.describe(opts.table)).offsets())
    except fc.FluvialError as exc:
        raise _translate(exc, opts) from None


# -- schema ---------------------------------------------------------------------------------

def _read_fields(info: fc.TableInfo, opts: Options) -> list[pa.Field]:
    """The Arrow fields a read returns: the projection (or all user columns), then metadata."""
    users = {f.name: f.remove_metadata() for f in info.schema}
    system = {f.name: f for f in METADATA_FIELDS}
    names = list(opts.columns) if opts.columns is not None else list(users)
    unknown = [n for n in names if n not in users and n not in system]
    if unknown:
        raise FluvialSparkError(f"Fluvial table {opts.table!r} has no column {', '.join(map(repr, unknown))}; "
                                f"its columns are {list(users)}")
    fields = [users.get(n) or system[n] for n in names]
    if opts.include_metadata:
        fields += [f for f in METADATA_FIELDS if f.name not in names]
    return fields


def _table_spark_schema(fields: list[pa.Field], table: str) -> StructType:
    try:
        return spark_schema(fields)
    except UnsupportedTypeError as exc:
        raise FluvialSparkError(f"Fluvial table {table!r}: {exc}") from None


def _check_user_schema(schema: StructType, info: fc.TableInfo, opts: Options) -> None:
    """A schema given with `.schema(...)` must name columns of the table, with their types."""
    known = {f.name: f for f in info.schema}
    known.update({f.name: f for f in METADATA_FIELDS})
    for field in schema.fields:
        f = known.get(field.name)
        if f is None:
            raise FluvialSparkError(f"the given schema names column {field.name!r}, which Fluvial table "
                                    f"{opts.table!r} does not have; its columns are {[x.name for x in info.schema]}")
        want = _table_spark_schema([f], opts.table).fields[0].dataType
        if not same_type(field.dataType, want):
            raise FluvialSparkError(f"the given schema says column {field.name!r} is {field.dataType.simpleString()}, "
                                    f"Fluvial table {opts.table!r} holds {want.simpleString()}")


# -- reading --------------------------------------------------------------------------------

@dataclass(frozen=True)
class BucketRange(InputPartition):
    """One task's share of a table: offsets [start, end) of one bucket."""

    bucket: int
    start: int
    end: int


def split_ranges(bucket: int, start: int, end: int, size: int) -> list[BucketRange]:
    """[start, end) of one bucket cut into ranges of at most `size` offsets."""
    if end <= start:
        return []
    parts = max(1, math.ceil((end - start) / size))
    step = math.ceil((end - start) / parts)
    return [BucketRange(bucket, lo, min(lo + step, end)) for lo in range(start, end, step)]


@dataclass(frozen=True)
class _Scan:
    """Everything a task needs to read its range (pickled to the executors)."""

    url: str
    table: str
    columns: tuple[str, ...]
    filters: tuple[tuple[str, str, Any], ...]
    schema_json: str
    retry_ms: int
    stats_dir: str | None
    object_store_options: tuple[tuple[str, str], ...] = ()
    security: fc.ConnectionSecurity = fc.ConnectionSecurity()

    def read(self, part: BucketRange) -> Iterator[pa.RecordBatch]:
        target = arrow_schema(StructType.fromJson(json.loads(self.schema_json)))
        # `_offset` is always read: it says where to resume when the broker goes away mid-range
        # (conform() leaves it out again when the query did not ask for it).
        columns = list(self.columns) + ([] if "_offset" in self.columns else ["_offset"])
        offset, rows_sent = part.start, 0
        outage_ends: float | None = None
        stats = fc.ScanStats()
        while offset < part.end:
            try:
                with fc.Client(self.url, security=self.security,
                               object_store_options=dict(self.object_store_options)) as client:
                    table = fc.Table(client, client.describe(self.table))
                    scan = table.scan(columns=columns, filter=[list(f) for f in self.filters] or None,
                                      start=offset, end=part.end, buckets=[part.bucket], source="log")
                    for batch in scan.to_batches():
                        outage_ends = None
                        rows_sent += batch.num_rows
                        offset = batch.column("_offset")[-1].as_py() + 1
                        yield conform(batch, target)
                    stats.add(scan.stats)
                    offset = part.end
            except fc.BrokerUnavailableError:
                outage_ends = outage_ends or time.monotonic() + self.retry_ms / 1000
                if time.monotonic() > outage_ends:
                    raise FluvialSparkError(f"Fluvial broker at {self.url} went away while bucket {part.bucket} "
                                            f"of {self.table!r} was read at offset {offset}") from None
                time.sleep(0.5)
            except fc.FluvialError as exc:
                raise FluvialSparkError(f"reading Fluvial table {self.table!r}, bucket {part.bucket} "
                                        f"[{part.start}, {part.end}): {exc}") from None
        if self.stats_dir:
            self._write_stats(part, stats, rows_sent)

    def _write_stats(self, part: BucketRange, stats: fc.ScanStats, rows: int) -> None:
        os.makedirs(self.stats_dir, exist_ok=True)
        record = {"table": self.table, "bucket": part.bucket, "start": part.start, "end": part.end,
                  "filters": [list(f) for f in self.filters], "rows": rows, "stats": asdict(stats)}
        path = os.path.join(self.stats_dir, f"scan-{part.bucket}-{part.start}-{uuid.uuid4().hex[:8]}.json")
        with open(path, "w") as f:
            json.dump(record, f, default=str)


def read_scan_stats(folder: str) -> list[dict]:
    """The records the tasks of reads with option `scanStatsDir` left in `folder`."""
    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.startswith("scan-") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                out.append(json.load(f))
    return out


def _scan_for(opts: Options, schema: StructType, filters=()) -> _Scan:
    return _Scan(opts.url, opts.table, tuple(schema.fieldNames()), tuple(filters), schema.json(), opts.retry_ms,
                 opts.scan_stats_dir, opts.object_store_options, opts.security)


class FluvialReader(DataSourceReader):
    """Batch reads: one task per bucket, or per offset range of a large bucket."""

    def __init__(self, opts: Options, schema: StructType, info: fc.TableInfo):
        self.opts = opts
        self.schema = schema
        self.types = {f.name: f.type for f in [*info.schema, *METADATA_FIELDS]}
        self.pushed: list[tuple[str, str, Any]] = []
        self.source = opts.source or spark_union.default_source(info, opts.starting)
        # Union and lake reads pin the lake snapshot here, on the driver: every task then
        # reads that snapshot and the log from exactly the offsets it covers.
        self.lake: spark_union.LakeRead | None = None
        if self.source != "log":
            self.lake = self._pin(info)

    def _pin(self, info: fc.TableInfo) -> "spark_union.LakeRead":
        try:
            spark_union.check_columns(info, self.schema.fieldNames())
            if info.primary_key and (self.opts.starting != "earliest" or self.opts.ending != "latest"):
                raise FluvialSparkError(f"a union read of primary-key table {info.name!r} gives its current rows: "
                                        f"it takes no startingOffsets/endingOffsets (read the changelog with "
                                        f"option('source', 'log'))")
            with self.opts.connect() as client:
                lake = spark_union.LakeRead.pin(self.opts.url, info, client, dict(self.opts.lake_catalog),
                                                self.opts.security)
        except fc.FluvialError as exc:
            raise FluvialSparkError(f"Fluvial table {self.opts.table!r}: {exc}") from None
        for b in range(info.buckets):  # offsets asked for, as far as the lake's rows go
            start = self.opts.starting.get(b, -2) if isinstance(self.opts.starting, dict) else self.opts.starting
            end = self.opts.ending.get(b, -1) if isinstance(self.opts.ending, dict) else self.opts.ending
            lake.bounds[b] = (0 if start in ("earliest", -2) else int(start),
                              1 << 62 if end in ("latest", -1) else int(end))
        return lake

    def partitions(self) -> list[InputPartition]:
        if self.source != "log":
            return self._union_partitions()
        parts: list[BucketRange] = []
        for b in _offsets(self.opts):
            start = max(_resolve(self.opts.starting, b, "earliest"), b.log_start)
            end = min(_resolve(self.opts.ending, b, "latest"), b.high_watermark)
            parts += split_ranges(b.bucket, start, end, self.opts.max_records_per_partition)
        return parts or [BucketRange(0, 0, 0)]

    def _union_partitions(self) -> list[InputPartition]:
        """Lake file tasks, then the log after the pinned snapshot (per bucket)."""
        lake = self.lake
        assert lake is not None
        offsets = _offsets(self.opts)
        names = self.schema.fieldNames()
        parts: list[InputPartition] = []
        changed = None
        if lake.primary_key and self.source == "union":
            with self.opts.connect() as client:
                changed = lake.read_changed_keys(client, {b.bucket: b.high_watermark for b in offsets})
        parts += lake.file_partitions(names, self.pushed, changed)
        if self.source == "union":
            for b in offsets:
                tiered = lake.lake_end.get(b.bucket, 0)
                if lake.primary_key:
                    if b.log_start > tiered:
                        raise FluvialSparkError(
                            f"primary-key table {self.opts.table!r}: the changelog of bucket {b.bucket} after the lake "
                            f"snapshot starts at {tiered}, the broker holds it from {b.log_start} only")
                    if b.high_watermark > tiered:
                        parts.append(spark_union.ChangelogRange(b.bucket, tiered, b.high_watermark))
                    continue
                start = _resolve(self.opts.starting, b, "earliest")
                end = min(_resolve(self.opts.ending, b, "latest"), b.high_watermark)
                parts += split_ranges(b.bucket, max(start, tiered, b.log_start), end,
                                      self.opts.max_records_per_partition)
        # As many tasks as buckets at least (what a log read of the table gets).
        return spark_union.pack(parts, self.opts.max_records_per_partition, len(offsets)) or [BucketRange(0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, spark_union.Pieces):
            return (batch for piece in partition.pieces for batch in self.read(piece))
        if isinstance(partition, (spark_union.LakeFiles, spark_union.ChangelogRange)):
            return self._read_lake_side(partition)
        if partition.end <= partition.start:
            return iter(())
        return _scan_for(self.opts, self.schema, self.pushed).read(partition)

    def _read_lake_side(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        lake = self.lake
        assert lake is not None
        target = arrow_schema(self.schema)
        names = self.schema.fieldNames()
        try:
            if isinstance(partition, spark_union.LakeFiles):
                yield from lake.read_files(partition, names, self.pushed, target)
            else:
                yield from lake.read_changelog(partition, names, self.pushed, target)
        except fc.FluvialError as exc:
            raise FluvialSparkError(f"reading Fluvial table {self.opts.table!r}: {exc}") from None


class FluvialFilteringReader(FluvialReader):
    """A batch reader that takes filters (Spark 4.1+; Spark calls pushFilters only when
    `spark.sql.python.filterPushdown.enabled` is on, and refuses readers that have it when off)."""

    def pushFilters(self, filters: list) -> Iterator:
        """Filters the broker evaluates (and uses to skip stored batches by their statistics)
        are taken; the others are given back for Spark to apply."""
        from fluvial.spark.filters import to_fluvial

        self.pushed = []
        for f in filters:
            condition = to_fluvial(f, self.types)
            if condition is None:
                yield f
            else:
                self.pushed.append(condition)


def default_push_filters() -> bool:
    """Spark 4.1 and 4.2 keep the read plan of a scan with pushed filters on the DataFrame it
    came from: a later query on that DataFrame without filters reuses it and returns too few
    rows. Pushing is the default from Spark 4.3, where the plan stays with its scan."""
    import pyspark

    from fluvial.spark import _spark_at_least
    return _spark_at_least(pyspark.__version__, (4, 3))


class FluvialStreamReader(DataSourceStreamReader):
    """Micro-batches of offsets per bucket; Spark's checkpoint holds them, so a query resumes
    exactly where it stopped (the broker keeps the rows: nothing to acknowledge)."""

    def __init__(self, opts: Options, schema: StructType):
        self.opts = opts
        self.schema = schema

    def _latest(self) -> dict[str, int]:
        return {str(b.bucket): b.high_watermark for b in _offsets(self.opts)}

    def initialOffset(self) -> dict:
        return {str(b.bucket): max(_resolve(self.opts.starting, b, "latest"), b.log_start)
                for b in _offsets(self.opts)}

    def getDefaultReadLimit(self):
        if self.opts.max_records_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        latest = self._latest()
        if start is None:
            return latest
        max_rows = getattr(limit, "max_rows", None)  # ReadMaxRows; anything else: all available
        return admit(start, latest, max_rows)

    def reportLatestOffset(self) -> dict:
        return self._latest()

    def partitions(self, start: dict, end: dict) -> Sequence[BucketRange]:
        parts: list[BucketRange] = []
        for bucket, stop in sorted(end.items(), key=lambda kv: int(kv[0])):
            parts += split_ranges(int(bucket), int(start.get(bucket, 0)), int(stop),
                                  self.opts.max_records_per_partition)
        return parts

    def read(self, partition: BucketRange) -> Iterator[pa.RecordBatch]:
        return _scan_for(self.opts, self.schema).read(partition)

    def commit(self, end: dict) -> None:
        pass


def admit(start: Mapping[str, int], latest: Mapping[str, int], max_rows: int | None) -> dict[str, int]:
    """The end offsets of the next micro-batch: everything up to `latest`, or at most
    `max_rows` rows shared among the buckets in proportion to what each has waiting. Each
    bucket with something waiting moves by at least one row when the limit allows one for
    each (no bucket starves); a smaller limit moves the buckets with the most waiting."""
    waiting = {b: max(0, latest[b] - int(start.get(b, latest[b]))) for b in latest}
    total = sum(waiting.values())
    if max_rows is None or total <= max_rows:
        return dict(latest)
    end = {b: int(start.get(b, latest[b])) for b in latest}
    movers = sorted((b for b in waiting if waiting[b]), key=lambda k: (-waiting[k], int(k)))
    # One row each first, then the rest of the budget in proportion to what is still waiting.
    for b in movers[:max_rows]:
        end[b] += 1
        waiting[b] -= 1
    budget = max_rows - min(max_rows, len(movers))
    rest = sum(waiting.values())
    for b in movers:
        if budget <= 0:
            break
        take = min(waiting[b], budget, math.floor((max_rows - len(movers)) * waiting[b] / rest)) if rest else 0
        end[b] += take
        budget -= take
    return end


# -- writing --------------------------------------------------------------------------------

@dataclass
class Written(WriterCommitMessage):
    rows: int
    appends: int


class _Appender:
    """Appends a task's Arrow batches in batches of about WRITE_BATCH_BYTES."""

    def __init__(self, opts: Options):
        self.opts = opts

    def write(self, batches: Iterator[pa.RecordBatch]) -> Written:
        rows = appends = 0
        pending: list[pa.RecordBatch] = []
        size = 0
        try:
            with self.opts.connect() as client:
                table = fc.Table(client, client.describe(self.opts.table))

                keyed = table.info.kind == "primary_key"
                change = self.opts.change_column

                def flush() -> None:
                    nonlocal pending, size, appends
                    if pending:
                        if keyed:  # primary-key tables: insert or update by key
                            rows = pa.Table.from_batches(pending)
                            if change:  # a changelog: each row's change type rides as `_change`
                                rows = rows.rename_columns(["_change" if n == change else n
                                                            for n in rows.column_names])
                            partial = [n for n in table.schema.names if n not in rows.column_names]
                            table.upsert(rows, columns=[n for n in rows.column_names if n != "_change"]
                                         if partial else None)
                        else:
                            table.append(pending)
                        appends += 1
                        pending, size = [], 0

                for batch in batches:
                    if batch.num_rows == 0:
                        continue
                    pending.append(batch)
                    rows += batch.num_rows
                    size += batch.nbytes
                    if size >= WRITE_BATCH_BYTES:
                        flush()
                flush()
        except fc.SchemaMismatchError as exc:
            raise FluvialSparkError(f"the DataFrame does not fit Fluvial table {self.opts.table!r}: {exc}") from None
        except fc.FluvialError as exc:
            raise _translate(exc, self.opts) from None
        return Written(rows, appends)


class FluvialWriter(DataSourceArrowWriter):
    """`df.write.format("fluvial").mode("append")`: each task appends its rows through Flight
    (into a primary-key table: upserts them, a partial update when columns are left out).
    The rows of a finished task are stored whether or not the job as a whole succeeds
    (a log table has no transactions), so a retried task may append its rows twice."""

    def __init__(self, opts: Options):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return _Appender(self.opts).write(iterator)

    def commit(self, messages: list) -> None:
        pass

    def abort(self, messages: list) -> None:
        pass


class FluvialStreamWriter(_StreamWriterBase):
    """`writeStream.format("fluvial")`: each micro-batch appended through Flight (at least once:
    a micro-batch Spark runs again after a failure is appended again)."""

    def __init__(self, opts: Options):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return _Appender(self.opts).write(iterator)

    def commit(self, messages: list, batchId: int) -> None:
        pass

    def abort(self, messages: list, batchId: int) -> None:
        pass


# -- the data source ------------------------------------------------------------------------

class FluvialDataSource(DataSource):
    """spark.read.format("fluvial").option("url", "grpc://host:8815").option("table", "orders").load()"""

    @classmethod
    def name(cls) -> str:
        return "fluvial"

    def _opts(self, streaming: bool = False) -> Options:
        return Options.parse(self.options, streaming)

    def schema(self) -> StructType:
        opts = self._opts()
        info = _describe(opts)
        return _table_spark_schema(_read_fields(info, opts), opts.table)

    def _checked(self, schema: StructType, streaming: bool) -> tuple[Options, fc.TableInfo]:
        opts = self._opts(streaming)
        info = _describe(opts)
        _check_user_schema(schema, info, opts)
        return opts, info

    def reader(self, schema: StructType) -> FluvialReader:
        opts, info = self._checked(schema, False)
        return (FluvialFilteringReader if opts.push_filters else FluvialReader)(opts, schema, info)

    def streamReader(self, schema: StructType) -> FluvialStreamReader:
        opts, _ = self._checked(schema, True)
        return FluvialStreamReader(opts, schema)

    def _writable(self, schema: StructType, overwrite: bool) -> Options:
        opts = self._opts()
        if overwrite:
            raise FluvialSparkError(f"Fluvial log tables are append-only: write to {opts.table!r} "
                                    f"with mode('append')")
        try:
            with opts.connect() as client:
                try:
                    info = client.describe(opts.table)
                except fc.UnknownTableError:
                    if not opts.create_table:
                        raise FluvialSparkError(
                            f"Fluvial table {opts.table!r} does not exist at {opts.url}; create it first, or "
                            f"write with option('createTable', 'true') (and 'buckets', 'kafkaFormat')") from None
                    if opts.change_column and not opts.primary_key:
                        raise FluvialSparkError("option 'changeColumn' writes a changelog into a primary-key "
                                                "table: set 'primaryKey' too")
                    client.create_table(opts.table, _table_schema_of(schema, opts.change_column),
                                        buckets=opts.buckets, kafka_format=opts.kafka_format,
                                        primary_key=opts.primary_key, merge_engine=opts.merge_engine,
                                        upsert_key=opts.upsert_key, retract_state_ttl_ms=opts.retract_state_ttl_ms,
                                        aggregates=dict(opts.aggregates) or None,
                                        bucket_function=opts.bucket_function)
                    return opts
        except fc.FluvialError as exc:
            raise _translate(exc, opts) from None
        _check_writable(schema, info, opts)
        return opts

    def writer(self, schema: StructType, overwrite: bool) -> FluvialWriter:
        return FluvialWriter(self._writable(schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> FluvialStreamWriter:
        return FluvialStreamWriter(self._writable(schema, False))


WRITABLE_SYSTEM_COLUMNS = ("_timestamp", "_key", "_headers")


def _table_schema_of(schema: StructType, change_column: str | None = None) -> pa.Schema:
    fields = [f for f in arrow_schema(schema) if f.name not in WRITABLE_SYSTEM_COLUMNS and f.name != change_column]
    return pa.schema([f.with_type(pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type) and f.type.tz
                      else f for f in fields])


def _check_writable(schema: StructType, info: fc.TableInfo, opts: Options) -> None:
    """The DataFrame's columns must be the table's (types are cast by the broker, which says
    precisely which value does not fit)."""
    names = schema.fieldNames()
    if opts.change_column:
        if opts.change_column not in names:
            raise FluvialSparkError(f"option 'changeColumn' names {opts.change_column!r}, which is not a column of "
                                    f"the DataFrame {names}")
        if info.kind != "primary_key":
            raise FluvialSparkError(f"option 'changeColumn' writes a changelog: {opts.table!r} is a log table, "
                                    "not a primary-key table")
        names = [n for n in names if n != opts.change_column]
    users = info.schema.names
    missing = [n for n in users if n not in names]
    unknown = [n for n in names if n not in users and n not in WRITABLE_SYSTEM_COLUMNS]
    if missing or unknown:
        parts = [f"missing columns {missing}"] if missing else []
        parts += [f"unknown columns {unknown}"] if unknown else []
        if not unknown and info.kind == "primary_key" and all(k in names for k in info.primary_key or []):
            return  # a partial update: the key and some columns; the others keep their values
        raise FluvialSparkError(f"the DataFrame does not fit Fluvial table {opts.table!r} ({', '.join(parts)}); "
                                f"its columns are {users}")
