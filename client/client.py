"""The native client of Fluvial's table API (Arrow Flight): tables, projected scans, follow, append."""
from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight

from fluvial.client import filters, pk, remote, union
from fluvial.client.streams import ArrowResults
from fluvial.client.auth import ConnectionSecurity, TokenSession, flight_client
from fluvial.client.errors import (
    BrokerUnavailableError, InvalidRequestError, OffsetOutOfRangeError, UnknownColumnError, from_flight,
)
from fluvial.errors import ObjectNotFound, ObjectStoreError
from fluvial.client.wire import (
    CREATE_TABLE, DESCRIBE, DROP_TABLE, LIST_TABLES, OFFSETS, Appended, AppendRequest, ScanRequest, ScanStats,
    schema_from_b64, schema_to_b64,
)

# Rows per appended message: large enough to amortize a round trip, small enough to stream.
APPEND_BYTES = 8 * 1024 * 1024


def _typed_errors(fn):
    """Flight errors leave the client as Fluvial's typed errors."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except flight.FlightError as exc:
            raise from_flight(exc) from None
    return wrapper


def connect(url: str = "grpc://127.0.0.1:8815", *, remote_reads: bool = True,
            object_store_options: dict[str, str] | None = None, username: str | None = None,
            password: str | None = None, tls_root_certs: str | bytes | None = None) -> "Client":
    """Connect to a broker's table API.

    url: grpc://host:port, or grpc+tls://host:port when the broker serves the table API
        over TLS.
    username, password: a user of the broker (the same users as SASL on the Kafka port),
        when the broker authenticates table API clients. The client authenticates at once
        (a wrong password fails here with AuthenticationError) and sends the bearer token
        the broker gives on every call, renewing it before it expires.
    tls_root_certs: the CA certificate(s) the broker's certificate is checked against, a
        PEM file's path or PEM text (default: the system's trust store).

    remote_reads: scans read tiered offsets (segments the broker moved to the object store)
        straight from the object store instead of through the broker.
    object_store_options: the client's own object store settings for those reads
        (access_key_id, secret_access_key, session_token, endpoint_url, region); without
        them the standard AWS environment variables and profiles are used. The broker never
        hands out credentials.

    >>> client = connect("grpc://127.0.0.1:8815")
    >>> client.list_tables()
    ['orders', 'clicks']
    >>> secure = connect("grpc+tls://broker.example.com:8815", username="alice", password=secret,
    ...                  tls_root_certs="/etc/fluvial/ca.pem")
    """
    return Client(url, remote_reads=remote_reads, object_store_options=object_store_options,
                  security=ConnectionSecurity(username, password, tls_root_certs))


@dataclass(frozen=True)
class BucketOffsets:
    bucket: int
    log_start: int
    high_watermark: int


@dataclass(frozen=True)
class TableInfo:
    """A table as the broker describes it."""

    name: str
    kind: str
    buckets: int
    primary_key: list[str] | None
    kafka_format: str
    schema: pa.Schema
    offsets: list[BucketOffsets]
    configs: dict[str, str]
    kv_stats: dict | None = None  # merge-state figures of a primary-key table ('retract': rows kept per key)

    @classmethod
    def from_json(cls, body: dict) -> "TableInfo":
        return cls(body["name"], body["kind"], body["buckets"], body.get("primary_key"), body["kafka_format"],
                   schema_from_b64(body["schema"]), [BucketOffsets(**o) for o in body["offsets"]],
                   body.get("configs", {}), body.get("kv_stats"))


class Client:
    """A connection to one broker's table API. Thread-safe; close it (or use `with`) when done."""

    def __init__(self, url: str, *, remote_reads: bool = True, object_store_options: dict[str, str] | None = None,
                 security: ConnectionSecurity | None = None):
        self.url = url
        self.security = security or ConnectionSecurity()
        self._flight = flight_client(url, self.security)
        self._session: TokenSession | None = None
        if self.security.username is not None or self.security.token_provider is not None:
            self._session = TokenSession(self._flight, self.security.username, self.security.password,
                                         self.security.token_provider)
            self._authenticate()
        self.remote_reads = remote_reads
        self.object_store_options = dict(object_store_options or {})
        self._broker_tiers = True  # False once the broker says it has no remote-segments action
        self._lookups = pk.LookupSessions(self)

    def close(self) -> None:
        self._lookups.close()
        self._flight.close()

    def _authenticate(self) -> None:
        try:
            self._session.authenticate()
        except flight.FlightUnauthenticatedError as exc:
            raise from_flight(exc) from None
        except flight.FlightError as exc:
            raise _connection_failure(exc, self.url) from None

    def _options(self, aligned: bool = False) -> flight.FlightCallOptions:
        """Options of one call: the bearer token (renewed when near its expiry), and for
        scans realigned reads."""
        read_options = _ALIGNED_READS if aligned else None
        if self._session is None:
            return flight.FlightCallOptions(read_options=read_options)
        try:
            header = self._session.header()
        except flight.FlightUnauthenticatedError as exc:
            raise from_flight(exc) from None
        except flight.FlightError as exc:
            raise _connection_failure(exc, self.url) from None
        return flight.FlightCallOptions(headers=[header], read_options=read_options)

    def remote_log(self, table: str, bucket: int, start: int) -> "remote.RemoteLog | None":
        """Where a bucket's tiered offsets from `start` on are (None: nothing is tiered, or
        the broker does not tier)."""
        if not self._broker_tiers:
            return None
        try:
            body = self._action(remote.REMOTE_SEGMENTS, {"name": table, "table": table, "bucket": bucket,
                                                         "start": start})
        except InvalidRequestError as exc:
            if "unknown action" in exc.message:
                self._broker_tiers = False
                return None
            raise
        if not body or not body.get("segments"):
            return None
        return remote.RemoteLog.from_json(body)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @_typed_errors
    def _action(self, kind: str, body: dict | None = None) -> Any:
        action = flight.Action(kind, json.dumps(body or {}).encode())
        try:
            results = list(self._flight.do_action(action, self._options()))
        except flight.FlightUnauthenticatedError:
            if self._session is None:
                raise
            # The token is no longer valid (the broker restarted): authenticate again, once.
            self._authenticate()
            results = list(self._flight.do_action(action, self._options()))
        return json.loads(results[0].body.to_pybytes()) if results else None

    def list_tables(self) -> list[str]:
        """Names of all tables, sorted."""
        return [t["name"] for t in self._action(LIST_TABLES)]

    def storage_status(self, name: str) -> dict:
        """Local and remote (tiered) offsets, bytes and segment counts of every bucket."""
        return self._action("status", {"name": name})

    def describe(self, name: str) -> TableInfo:
        """Schema (with field ids), kind, buckets, formats and offsets of a table."""
        return TableInfo.from_json(self._action(DESCRIBE, {"table": name}))

    def create_table(self, name: str, schema: pa.Schema | None = None, *, buckets: int = 1,
                     kafka_format: str | None = None, configs: dict[str, str] | None = None,
                     primary_key: Sequence[str] | None = None, bucket_key: Sequence[str] | None = None,
                     merge_engine: str | None = None, version_column: str | None = None,
                     upsert_key: Sequence[str] | None = None, retract_state_ttl_ms: int | None = None,
                     aggregates: dict[str, str] | None = None, lake: bool = False,
                     bucket_function: str | None = None) -> "Table":
        """Create a log table. With `schema` (the user columns) its rows are typed; Kafka
        clients see each row as a compact JSON object (`kafka_format="json"`, the default)
        or as Avro (`"avro"`, schema derived from the Arrow one and registered under
        `<name>-value`). Without a schema the table is raw: one binary column `value`.

        Primary-key tables choose a merge engine (see docs/primary_keys.md): `"retract"`
        materializes a changelog that arrives reordered (`upsert_key`: the columns that
        identify a row among a key's live rows, default all; `retract_state_ttl_ms` bounds
        how long hidden rows are kept); `"aggregation"` folds rows with `aggregates`, a
        function per column (`{"total": "sum", "n": "count"}`). `bucket_function` says how
        a key picks its bucket: `"murmur2"` (default; Java Kafka producers) or `"crc32"`
        (librdkafka's default partitioner, so confluent-kafka producers with default settings
        write to the right partitions).

        `lake=True` materializes the table into a lake table (Apache Iceberg) kept up to date
        by tiering (`fluvial.lake.enable`; `fluvial.lake.freshness` sets the target lag).

        >>> orders = client.create_table("orders", pa.schema([("id", pa.int64()), ("amount", pa.float64())]),
        ...                              buckets=3)
        """
        configs = {**(configs or {}), **pk.table_configs(primary_key, bucket_key, merge_engine, version_column,
                                                          upsert_key, retract_state_ttl_ms, aggregates,
                                                          bucket_function)}
        if lake:
            configs["fluvial.lake.enable"] = "true"
        body = {"table": name, "schema": schema_to_b64(schema) if schema is not None else None,
                "buckets": buckets, "kafka_format": kafka_format, "configs": configs}
        return Table(self, TableInfo.from_json(self._action(CREATE_TABLE, body)))

    def drop_table(self, name: str) -> None:
        self._action(DROP_TABLE, {"table": name})

    def table(self, name: str) -> "Table":
        """A handle on an existing table (raises UnknownTableError)."""
        return Table(self, self.describe(name))

    def lake_info(self, name: str) -> dict | None:
        """Where a lake-enabled table's Iceberg table is (catalog properties without secrets,
        identifier) and the offsets its current snapshot covers; None if the table is not
        lake-enabled."""
        return self._action("lake-info", {"name": name})

    def lake_status(self, name: str | None = None) -> list[dict]:
        """Tiering state, lake snapshot, tiered offsets and lag of the lake tables (or one)."""
        return self._action("lake-status", {"name": name} if name else {})


class Table:
    """One table: its schema, offsets, scans and appends."""

    def __init__(self, client: Client, info: TableInfo):
        self.client = client
        self.name = info.name
        self.info = info

    def __repr__(self) -> str:
        return f"Table({self.name!r}, buckets={self.info.buckets})"

    @property
    def schema(self) -> pa.Schema:
        """The user columns (field ids in each field's metadata `fluvial.field_id`)."""
        return self.info.schema

    def kv_stats(self) -> dict | None:
        """Current merge-state figures of a primary-key table (for 'retract': keys, live rows
        kept, rows per key and their histogram, retractions that found no row, rows expired)."""
        return self.refresh().info.kv_stats

    def refresh(self) -> "Table":
        self.info = self.client.describe(self.name)
        return self

    def offsets(self) -> list[BucketOffsets]:
        """Log start offset and high watermark of each bucket."""
        return [BucketOffsets(**o) for o in self.client._action(OFFSETS, {"table": self.name})]

    @property
    def lake_enabled(self) -> bool:
        """Whether the table is copied into a lake table (`fluvial.lake.enable`)."""
        return union.is_lake_enabled(self.info.configs)

    def lake_info(self) -> "union.LakeInfo | None":
        """The table's lake as the broker reports it: catalog, snapshot, offsets tiered, state."""
        return union.lake_info(self)

    def scan(self, columns: Sequence[str] | None = None, filter: Any = None, start: Any = "earliest",
             end: Any = None, buckets: Sequence[int] | None = None, *, source: str | None = None,
             lake_catalog: dict[str, str] | None = None) -> "Scan | union.UnionScan":
        """A scan of the table's rows (nothing is read until its results are asked for).

        columns: names to read, default all user columns; system columns `_offset`,
            `_timestamp`, `_change`, `_key`, `_headers`, `_bucket` are given when named.
        filter: a `pyarrow.compute` Expression (`pc.field("score") > 5`, the form of
            pyarrow.dataset): its AND-ed comparisons, isin, is_null, is_valid with literals are
            pushed down to the broker, the rest is applied by the client, with pyarrow's
            result. Or (column, op, value) or a list of them, all AND-ed; ops are
            = != < <= > >= in, not in (value: a list), is_null, not_null (value: None).
            Checked before any request (FilterTypeError, FilterColumnError, FilterError).
        start: "earliest", "latest", an offset, a datetime (first record at or after it),
            or a dict {bucket: offset}.
        end: exclusive end offset (int or {bucket: offset}); default the high watermark
            of each bucket when the scan starts.
        buckets: which buckets (default all); they are read in parallel.

        source: "union" (the lake snapshot, then the log from exactly the offsets it covers:
            every row once, also rows the broker no longer holds; for primary-key tables
            the current rows), "lake" (the lake snapshot only) or "log" (the broker only).
            Default: "union" for lake-enabled log tables read from "earliest", else "log"
            (a scan from offsets or a time is positional; a primary-key table's scan stays
            its changelog unless source="union" asks for the current rows).
        lake_catalog: extra catalog properties for reading the lake (credentials the broker
            does not hand out).

        >>> t.scan(columns=["id", "amount"], filter=[("amount", ">", 100)]).to_pandas()
        """
        if source is None:
            source = union.default_source(self, start)
        if source == "log":
            return Scan(self, columns, filter, start, end, buckets)
        if source not in union.SOURCES:
            raise ValueError(f"source must be one of {union.SOURCES}, not {source!r}")
        return union.UnionScan(self, columns, filter, start, end, buckets, source, lake_catalog)

    @_typed_errors
    def append(self, data: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch] | Any, *,
               bucket: int | None = None) -> list[Appended]:
        """Append rows (Arrow table, batch(es) or a pandas DataFrame) whose columns are the
        table's user columns (optionally `_timestamp`, `_key`, `_headers` too). Batches are
        spread over the buckets unless `bucket` is given. Returns the offsets given, once
        the broker has stored (and, with its `ack` flush policy, fsynced) the rows.

        >>> t.append(pa.table({"id": [1, 2], "amount": [9.5, 120.0]}))
        [Appended(bucket=0, base_offset=0, record_count=2)]
        """
        batches = _as_batches(data)
        if not batches:
            return []
        schema = batches[0].schema
        descriptor = flight.FlightDescriptor.for_command(AppendRequest(self.name, bucket).to_bytes())
        writer, acks = self.client._flight.do_put(descriptor, schema, self.client._options())
        done: list[Appended] = []
        try:
            for batch in batches:
                for part in _chunks(batch):
                    writer.write_batch(part)
            writer.done_writing()
            while True:
                ack = acks.read()
                if ack is None:
                    break
                done += [Appended(*a) for a in json.loads(ack.to_pybytes())["appended"]]
        finally:
            writer.close()
        return done

    # -- primary-key tables (see fluvial.client.pk) ----------------------------------------

    def upsert(self, data: Any, *, columns: Sequence[str] | None = None) -> list[tuple[int, int, int]]:
        """Insert or update rows by primary key (Arrow table/batch, list of dicts, DataFrame).
        With `columns` (the primary key and the target columns) a partial update: the other
        columns keep their values. A `_change` column gives each row's change type ("+I",
        "-U", "+U", "-D"; absent: every row an ADD): a changelog written as it is. Returns
        (bucket, base_offset, changelog rows) per write, once durable.

        >>> accounts.upsert([{"id": 1, "owner": "ann", "balance": 10}])
        >>> joined.upsert([{"_change": "-U", "id": 1, "level": 10, "attr": "a1"}])
        """
        return pk.write(self, data, "upsert", list(columns) if columns else None)

    def delete(self, keys: Any) -> list[tuple[int, int, int]]:
        """Delete rows by primary key (the key columns)."""
        return pk.write(self, keys, "delete")

    def lookup(self, keys: Any) -> pa.Table:
        """The current rows of the given primary keys; keys without a row are left out.

        >>> accounts.lookup([{"id": 1}, {"id": 2}])
        """
        return pk.lookup(self, keys)

    def lookup_batches(self, batches: Iterable[Any], in_flight: int = 2) -> Iterator[pa.Table]:
        """The rows found for each batch of keys, in order, with up to `in_flight` batches
        on their way at once (the broker looks up one while the next arrives): for many
        batches in a row, e.g. enriching a stream.

        >>> for rows in accounts.lookup_batches(key_batches):
        ...     use(rows)
        """
        return pk.lookup_batches(self, batches, in_flight)

    def prefix_lookup(self, prefixes: Any) -> pa.Table:
        """The current rows whose bucket-key columns (a prefix of the primary key) match."""
        return pk.prefix_lookup(self, prefixes)

    def snapshot(self) -> list[dict]:
        """Take a KV snapshot of every bucket now; returns what was taken."""
        return pk.snapshot(self)

    def snapshots(self) -> list[list[dict]]:
        """The KV snapshots kept for each bucket."""
        return pk.snapshots(self)

    def full_read(self, source: str = "broker") -> "pk.FullRead":
        """Rows plus the exact changelog offsets after them (`.changelog()` scans on).

        source: "broker" (the current rows, read by the broker from RocksDB) or "snapshot"
            (each bucket's newest KV snapshot read straight from the object store as Parquet,
            no broker CPU; the rows as of the snapshot's offset, `.current()` folds in the
            changelog after it). Buckets without a remote snapshot are read from the broker.
        """
        return pk.full_read(self, source)


def _connection_failure(exc: flight.FlightError, url: str) -> BrokerUnavailableError:
    """Authenticating failed before the broker answered: most often TLS on one side only, or a
    certificate the client does not trust. Say which to check."""
    message = str(exc).split(". Detail:")[0]
    if url.startswith(("grpc://", "grpc+tcp://")):
        hint = "if the broker serves the table API over TLS, connect to grpc+tls://..."
    else:
        hint = ("check that the broker serves the table API over TLS and that tls_root_certs holds the CA "
                "that signed its certificate")
    return BrokerUnavailableError(f"cannot reach the table API at {url}: {message} ({hint})")


def _as_batches(data: Any) -> list[pa.RecordBatch]:
    if isinstance(data, pa.RecordBatch):
        return [data]
    if isinstance(data, pa.Table):
        return data.to_batches()
    if hasattr(data, "to_arrow") and not isinstance(data, (list, tuple)):
        return data.to_arrow().to_batches()
    if type(data).__name__ == "DataFrame":
        return pa.Table.from_pandas(data, preserve_index=False).to_batches()
    batches = list(data)
    if batches and isinstance(batches[0], pa.Table):
        return [b for t in batches for b in t.to_batches()]
    return batches


def _chunks(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    size = batch.nbytes
    if size <= APPEND_BYTES or batch.num_rows <= 1:
        yield batch
        return
    rows = max(1, batch.num_rows * APPEND_BYTES // size)
    for lo in range(0, batch.num_rows, rows):
        yield batch.slice(lo, rows)


def _per_bucket(value: Any, bucket: int, what: str) -> Any:
    if isinstance(value, dict):
        return value.get(bucket, "earliest" if what == "start" else None)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return {"timestamp": int(value.timestamp() * 1000)}
    return value


def _scan_fields(table: "Table") -> dict[str, pa.Field]:
    """The columns a scan of the table may name: its user columns, then the system ones."""
    return {**{f.name: f for f in _plain_schema(table.schema)}, **_system_fields()}


_DONE = object()
# gRPC hands IPC bodies at any address; pyarrow's expression evaluation (Acero: the client's
# own filters, pyarrow.dataset on a result) and other consumers want each buffer aligned to
# its type. Scans read realigned: only the buffers that are not (a few percent) are copied.
_ALIGNED_READS = pa.ipc.IpcReadOptions(ensure_alignment=pa.ipc.Alignment.DataTypeSpecific)
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _BrokerServes:
    """The client cannot read the remote segments: the broker serves from `offset` on."""

    offset: Any


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    """The table's columns as a scan returns them (without the field-id metadata of a description)."""
    fields = []
    for f in schema:
        metadata = {k: v for k, v in (f.metadata or {}).items() if k != b"fluvial.field_id"}
        fields.append(f.with_metadata(metadata) if metadata else f.remove_metadata())
    return pa.schema(fields)


def _system_fields() -> dict[str, pa.Field]:
    from fluvial.client.predicates import system_fields
    return system_fields()


class Scan(ArrowResults):
    """The result of `Table.scan`: read it as Arrow, pandas, Polars, batches, a stream
    (`to_reader()`, or any consumer of the Arrow PyCapsule stream protocol), or follow it."""

    def __init__(self, table: Table, columns, filter, start, end, buckets):
        self.table = table
        self.start = start
        self.end = end
        self.buckets = list(buckets) if buckets is not None else list(range(table.info.buckets))
        fields = _scan_fields(table)
        compiled = filters.compile_filter(filter, fields, table.name)  # raises before any request
        self._user_filter = filter
        # What the broker filters (tuples, batches skipped by statistics) and what is left
        # for the client (an expression applied to what arrives; None: nothing).
        self.filter: list[list[Any]] = compiled.pushed
        self.client_filter: pc.Expression | None = compiled.residual
        out = list(columns) if columns is not None else None
        self.output_columns = out if out is not None else [f.name for f in table.schema]
        extra = [c for c in compiled.columns if c not in self.output_columns]
        # Columns asked of the broker: the output ones plus what the client's filter reads.
        self.columns = out if not extra else [*self.output_columns, *extra]
        self.stats = ScanStats()  # the server's figures, summed over buckets, once read
        self.bucket_stats: dict[int, ScanStats] = {}  # per bucket, with the offset each stream ended at
        self.schema: pa.Schema | None = None

    def _read_bucket(self, bucket: int, follow: bool, emit, stop: threading.Event,
                     readers: dict) -> None:
        """One bucket: its tiered part from the object store (when the client reads remote
        data itself), then the rest from the broker, starting exactly where the first ended."""
        start = _per_bucket(self.start, bucket, "start")
        end = _per_bucket(self.end, bucket, "end")
        client = self.table.client
        if not client.remote_reads or start == "latest":
            self._read_broker(bucket, start, end, follow, emit, stop, readers)
            return
        stalled = 0
        while True:
            before = start
            start = self._read_remote(bucket, start, end, emit, stop)
            if start is None or stop.is_set():
                return  # the remote part reached the end
            if isinstance(start, _BrokerServes):
                # The store cannot be read from here: the broker serves the rest, remote part included.
                self._read_broker(bucket, start.offset, end, follow, emit, stop, readers, tiered=True)
                return
            try:
                self._read_broker(bucket, start, end, follow, emit, stop, readers)
                return
            except OffsetOutOfRangeError:
                # Local retention removed the offset since the broker was asked: it is remote now.
                if not isinstance(start, int):
                    raise
                stalled = stalled + 1 if start == before else 0
                again = client.remote_log(self.table.name, bucket, start)
                if again is None or not again.segments or again.end_offset <= start or stalled > 5:
                    raise

    def _read_broker(self, bucket: int, start: Any, end: Any, follow: bool, emit, stop: threading.Event,
                     readers: dict, tiered: bool | None = None) -> None:
        client = self.table.client._flight
        options = self.table.client._options(aligned=True)
        # A client that reads tiered offsets itself leaves them out of what the broker serves.
        tiered = not self.table.client.remote_reads if tiered is None else tiered
        request = ScanRequest(self.table.name, bucket, self.columns, start, end, self.filter, follow,
                              tiered=tiered)
        try:
            reader = client.do_get(flight.Ticket(request.to_bytes()), options)
            readers[bucket] = reader
            if stop.is_set():  # the consumer left before this stream was registered for cancelling
                reader.cancel()
                return
            schema = reader.schema
        except flight.FlightError as exc:
            raise from_flight(exc) from None
        emit(("schema", schema))
        while not stop.is_set():
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            if chunk.app_metadata is not None:
                stats = ScanStats.from_bytes(chunk.app_metadata.to_pybytes())
                if stats is not None:
                    emit(("stats", bucket, stats))
            if chunk.data is not None and chunk.data.num_rows:
                emit(("batch", bucket, chunk.data))

    def _read_remote(self, bucket: int, start: Any, end: Any, emit, stop: threading.Event) -> Any:
        """Read what of [start, end) only the object store holds; returns where the broker
        continues (the original `start` when nothing is remote), None when the end was reached."""
        client = self.table.client
        asked = start if isinstance(start, int) and not isinstance(start, bool) else 0
        log = client.remote_log(self.table.name, bucket, asked)
        if log is None:
            return start
        from fluvial.tiering.remote_segment import RemoteSegmentReader
        reader = RemoteSegmentReader(cache_bytes=remote.READER_CACHE_BYTES)
        figures = remote.RemoteStats()
        offset = start
        store = None
        try:
            store = remote.StoreCache(client.object_store_options).open(log.store)
            if start == "earliest":
                first = log.log_start_offset
            elif isinstance(start, dict) and "timestamp" in start:
                first = remote.first_offset_at(reader, store, log, int(start["timestamp"]))
                if first is None:
                    return start  # the timestamp is past the remote data: the broker finds it
            elif isinstance(start, int) and not isinstance(start, bool):
                remote.check_start(log, start, self.table.name, bucket)
                first = start
            else:
                return start  # the broker says what is wrong with it
            if end is not None and (not isinstance(end, int) or end < first):
                return first if isinstance(end, int) else start
            stop_at = log.local_start_offset if end is None else min(end, log.local_start_offset)
            if first >= stop_at:
                return first
            plan = remote.plan_remote(bucket, _plain_schema(self.table.schema), self.columns, self.filter,
                                      _system_fields())
            emit(("schema", plan.out_schema))
            offset = first
            for batch, offset in remote.read_remote(reader, store, log, plan, first, stop_at, figures,
                                                    stop.is_set):
                if batch is not None:
                    emit(("batch", bucket, batch))
        except (ObjectNotFound, ObjectStoreError) as exc:
            # Not corrupt data (that is an error wherever it is read): a store this client
            # cannot reach or list, or an object removed meanwhile. Rows up to `offset` were
            # read; the broker goes on from there.
            _log.warning("reading remote segments of %s bucket %d from %s failed (%s); the broker serves "
                         "them from offset %s", self.table.name, bucket, log.store.get("url"), exc, offset)
            self._remote_stats(bucket, figures, store, offset, emit)
            return _BrokerServes(offset)
        finally:
            if store is not None:
                store.close()
        self._remote_stats(bucket, figures, store, offset, emit)
        if end is not None and offset >= end:
            return None
        return offset

    @staticmethod
    def _remote_stats(bucket: int, figures: "remote.RemoteStats", store, offset: Any, emit) -> None:
        stats = ScanStats(end_offset=offset if isinstance(offset, int) else -1, remote_segments=figures.segments,
                          remote_batches_read=figures.batches_read, remote_batches_skipped=figures.batches_skipped,
                          remote_rows_read=figures.rows_read, remote_rows_sent=figures.rows_sent,
                          remote_bytes_read=store.stats.bytes_read if store is not None else 0)
        emit(("stats", bucket, stats))

    def _stream(self, follow: bool) -> Iterator[tuple]:
        """Events of all buckets read in parallel, each bucket's in its order."""
        if not self.buckets:
            raise ValueError("a scan needs at least one bucket")
        events: queue.Queue = queue.Queue(maxsize=16)
        stop = threading.Event()
        readers: dict = {}

        def emit(item) -> None:
            while not stop.is_set():
                try:
                    events.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        def run(bucket: int) -> None:
            try:
                self._read_bucket(bucket, follow, emit, stop, readers)
            except BaseException as exc:  # handed to the consumer thread
                emit(("error", exc))
            finally:
                emit(("done",))

        pool = ThreadPoolExecutor(max_workers=min(len(self.buckets), 16), thread_name_prefix="fluvial-scan")
        try:
            for b in self.buckets:
                pool.submit(run, b)
            running = len(self.buckets)
            while running:
                item = events.get()
                if item[0] == "done":
                    running -= 1
                elif item[0] == "error":
                    exc = item[1]
                    raise from_flight(exc) if isinstance(exc, flight.FlightError) else exc
                else:
                    yield item
        finally:
            stop.set()
            for reader in list(readers.values()):
                try:
                    reader.cancel()
                except Exception:
                    pass
            pool.shutdown(wait=True, cancel_futures=True)

    def _events(self, follow: bool) -> Iterator[tuple[int, pa.RecordBatch]]:
        self.stats = ScanStats()
        self.bucket_stats = {}
        residual = self.client_filter
        names = self.output_columns
        for item in self._stream(follow):
            if item[0] == "batch" and residual is not None:
                batch = item[2].filter(residual).select(names)
                if batch.num_rows:
                    yield item[1], batch
                continue
            if item[0] == "schema":
                schema = item[1]
                self.schema = schema if residual is None else pa.schema([schema.field(n) for n in names])
            elif item[0] == "stats":
                bucket, stats = item[1], item[2]
                before = self.bucket_stats.get(bucket)
                if before is not None:  # the remote part's figures, then the broker's
                    before.add(stats)
                    before.end_offset = stats.end_offset
                else:
                    self.bucket_stats[bucket] = ScanStats(**vars(stats))
                self.stats.add(stats)
            else:
                yield item[1], item[2]

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        """Batches as they arrive: each bucket's in offset order, buckets interleaved."""
        for _, batch in self._events(False):
            yield batch

    def to_arrow(self) -> pa.Table:
        """All rows as one Arrow table, bucket after bucket, each in offset order."""
        by_bucket: dict[int, list[pa.RecordBatch]] = {b: [] for b in self.buckets}
        for bucket, batch in self._events(False):
            by_bucket[bucket].append(batch)
        batches = [b for bucket in self.buckets for b in by_bucket[bucket]]
        return pa.Table.from_batches(batches, schema=self.schema)

    def to_pandas(self, **kwargs):
        """The rows as a pandas DataFrame; the Arrow buffers are released while they are
        converted (`self_destruct`), so the rows are not held twice."""
        kwargs.setdefault("self_destruct", True)
        kwargs.setdefault("split_blocks", True)
        return self.to_arrow().to_pandas(**kwargs)

    def with_columns(self, columns: list[str]) -> "Scan":
        return Scan(self.table, columns, self._user_filter, self.start, self.end, self.buckets)

    def output_schema(self) -> pa.Schema:
        """The columns the scan returns, known without a request (from the table's description)."""
        fields = _scan_fields(self.table)
        missing = [n for n in self.output_columns if n not in fields]
        if missing:
            raise UnknownColumnError(f"table {self.table.name!r} has no column {missing[0]!r}; its columns are "
                                     f"{[f.name for f in self.table.schema]}")
        return pa.schema([fields[n] for n in self.output_columns])

    def follow(self) -> Iterator[pa.RecordBatch]:
        """Rows from `start` on, then new rows as they are appended, until the iterator is
        closed (`break` out of the loop, or `.close()`). Ask for `_bucket` and `_offset` to
        know where each row comes from; each bucket's rows arrive in offset order.

        >>> for batch in t.scan(columns=["_bucket", "_offset", "id"], start="latest").follow():
        ...     print(batch.to_pydict())
        """
        for _, batch in self._events(True):
            yield batch
