"""The table API's Arrow Flight server in the broker process, started by a broker start hook.

pyarrow.flight serves calls on its own threads. Reads (scans, descriptions) run there,
straight from the log tablets; anything that changes tables (create, drop, append) is
handed to the event loop with `run_coroutine_threadsafe`, where the Kafka path changes
them too.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
from typing import Any, Callable

import pyarrow as pa
import pyarrow.flight as flight

from fluvial.broker.broker import on_start, on_stop
from fluvial.broker.flight import auth, catalog
from fluvial.broker.flight.access import LISTING_ACTIONS, Caller, check_action
from fluvial.security.acls import AclOperation
from fluvial.broker.flight import pk as pk_api
from fluvial.broker.flight import tiering as tiering_api
from fluvial.broker.flight import compaction as compaction_api
from fluvial.broker.flight.append import append_on_loop, split_for_kafka, to_stored, writer_schema_id
from fluvial.broker.flight.errors import flight_errors, guard, json_object, malformed_request
from fluvial.broker.flight.scan import plan_scan, scan_bucket
from fluvial.broker.tables import Bucket
from fluvial.client.wire import (
    CREATE_TABLE, DESCRIBE, DROP_TABLE, LIST_TABLES, OFFSETS, AppendRequest, ScanRequest, ScanStats, schema_from_b64,
)
from fluvial.errors import InvalidRequestError
from fluvial.tiering.lake import actions as lake_actions

log = logging.getLogger(__name__)

# A follower re-checks for cancellation and broker shutdown at least this often.
FOLLOW_WAKE_S = 0.5

ACTIONS = {
    LIST_TABLES: "Every table with its description.",
    DESCRIBE: "One table: schema (with field ids), kind, buckets, formats, offsets. Body: {table}.",
    CREATE_TABLE: "Create a log table. Body: {table, schema (base64 IPC, or null: raw), buckets, kafka_format, configs}.",
    DROP_TABLE: "Drop a table. Body: {table}.",
    OFFSETS: "Log start and high watermark of each bucket. Body: {table}.",
}


# Guards the buckets' scan counters (metrics): Flight serves scans on many threads.
_SCAN_COUNT_LOCK = threading.Lock()

class TableFlightServer(flight.FlightServerBase):
    """Serves scans, appends and table metadata of one broker."""

    def __init__(self, broker, loop: asyncio.AbstractEventLoop, location: str, **options):
        super().__init__(location, **options)
        self.broker = broker
        self.loop = loop
        self.stopping = False
        self._next_bucket: dict[str, itertools.count] = {}

    # -- helpers ---------------------------------------------------------------------------

    def _on_loop(self, fn: Callable, *args) -> Any:
        """Run `fn(*args)` (a plain function or a coroutine function) on the event loop and wait."""
        async def call():
            result = fn(*args)
            return await result if asyncio.iscoroutine(result) else result
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result()

    def _wait_for_data(self, bucket: Bucket, offset: int) -> None:
        async def wait():
            if bucket.tablet.high_watermark > offset:
                return
            try:
                await asyncio.wait_for(bucket.data_arrived().wait(), FOLLOW_WAKE_S)
            except asyncio.TimeoutError:
                pass
        if self.stopping:
            return
        try:
            asyncio.run_coroutine_threadsafe(wait(), self.loop).result(FOLLOW_WAKE_S * 4)
        except Exception:  # the loop is stopping: the follower's cancelled() says so next
            self.stopping = self.stopping or self.loop.is_closed()

    def _table(self, name: str):
        return self.broker.tables.get(name)

    # -- metadata ------------------------------------------------------------------------

    def _flight_info(self, table, columns: list[str] | None = None) -> flight.FlightInfo:
        schema = catalog.user_schema(table)
        if columns is not None:
            schema = pa.schema([catalog.column_field(table, c, schema) for c in columns])
        endpoints = [flight.FlightEndpoint(ScanRequest(table.name, b.index, columns).to_bytes(), [])
                     for b in table.buckets]
        total = sum(b.tablet.high_watermark - b.tablet.log_start_offset for b in table.buckets)
        return flight.FlightInfo(schema, flight.FlightDescriptor.for_path(table.name), endpoints, total, -1)

    @flight_errors
    def list_flights(self, context, criteria):
        caller = Caller.of(self.broker, context)
        for table in list(self.broker.tables.tables.values()):
            if caller.may(AclOperation.DESCRIBE, table.name):
                yield self._flight_info(table)

    @flight_errors
    def get_flight_info(self, context, descriptor):
        name, columns = _descriptor_target(descriptor)
        Caller.of(self.broker, context).require(AclOperation.DESCRIBE, name)
        table = self._table(name)
        if columns is not None:
            plan_scan(table.buckets[0], ScanRequest(name, 0, columns))  # checks the columns
        return self._flight_info(table, columns)

    @flight_errors
    def get_schema(self, context, descriptor):
        name, _ = _descriptor_target(descriptor)
        Caller.of(self.broker, context).require(AclOperation.DESCRIBE, name)
        return flight.SchemaResult(catalog.schema_with_field_ids(catalog.user_schema(self._table(name))))

    def list_actions(self, context):
        return list(ACTIONS.items()) + list(pk_api.ACTIONS.items()) + list(lake_actions.ACTIONS.items()) + list(tiering_api.ACTIONS.items()) + list(compaction_api.ACTIONS.items())

    @flight_errors
    def do_action(self, context, action):
        body = json_object(action.body.to_pybytes(), f"body of action {action.type!r}")
        kind = action.type
        # A member of the wrong JSON type fails where the action first uses it.
        caller = Caller.of(self.broker, context)
        check_action(caller, kind, body)
        with malformed_request(f"body of action {kind!r}"):
            results = self._do_action(kind, body)
        if kind in LISTING_ACTIONS:
            results = _visible_only(caller, results)
        return results

    def _do_action(self, kind: str, body: dict) -> list:
        pk_results = pk_api.do_action(self, kind, body)
        if pk_results is not None:
            return pk_results
        lake_results = lake_actions.do_action(self, kind, body)
        if lake_results is not None:
            return lake_results
        tiering_results = tiering_api.do_action(self, kind, body)
        if tiering_results is not None:
            return tiering_results
        compaction_results = compaction_api.do_action(self, kind, body)
        if compaction_results is not None:
            return compaction_results
        if kind == LIST_TABLES:
            result: Any = [catalog.describe(t) for t in sorted(self.broker.tables.tables.values(), key=lambda t: t.name)]
        elif kind == DESCRIBE:
            result = catalog.describe(self._table(_name(body)))
        elif kind == OFFSETS:
            result = catalog.bucket_offsets(self._table(_name(body)), self.broker.extensions.get("txn_index"))
        elif kind == CREATE_TABLE:
            schema = schema_from_b64(body["schema"]) if body.get("schema") else None
            table = self._on_loop(catalog.create_table, self.broker, _name(body), schema,
                                  _buckets(body), body.get("kafka_format"), body.get("configs"))
            result = catalog.describe(table)
        elif kind == DROP_TABLE:
            self._on_loop(self.broker.tables.delete, _name(body))
            result = {}
        else:
            raise InvalidRequestError(f"unknown action {kind!r}; actions are {list(ACTIONS)}")
        return [flight.Result(json.dumps(result).encode())]

    # -- lookup sessions -------------------------------------------------------------------

    @flight_errors
    def do_exchange(self, context, descriptor, reader, writer):
        with malformed_request("exchange descriptor"):
            name = pk_api.exchange_request(descriptor)["table"]
        caller = Caller.of(self.broker, context)
        caller.require(AclOperation.READ, name)
        pk_api.lookup_session(self, lambda table: caller.require(AclOperation.READ, table), name, reader, writer)

    # -- scans ---------------------------------------------------------------------------

    @flight_errors
    def do_get(self, context, ticket):
        with malformed_request("ticket"):
            request = ScanRequest.from_bytes(ticket.ticket)
            if not isinstance(request.table, str) or not isinstance(request.bucket, int):
                raise InvalidRequestError("malformed ticket: table must be a string and bucket an integer")
            Caller.of(self.broker, context).require(AclOperation.READ, request.table)
            table = self._table(request.table)
            bucket = table.bucket(request.bucket)
            plan = plan_scan(bucket, request, getattr(self.broker, "remote_log", None) if request.tiered else None)
            index = self.broker.extensions.get("txn_index")
            if index is not None:
                plan.txns = index.get(bucket)  # may read the bucket's index once: a Flight thread
                plan.txn_index = index
        stats = ScanStats()

        def cancelled() -> bool:
            return (self.stopping or context.is_cancelled()
                    or self.broker.tables.tables.get(table.name) is not table)

        def stream():
            counted = getattr(bucket, "source", bucket)  # a changelog view's reads count for its table
            rows = size = 0
            for batch in scan_bucket(plan, stats, lambda offset: self._wait_for_data(bucket, offset), cancelled):
                yield batch
                # Per batch sent (never per row), for the metrics; scans run on many threads.
                with _SCAN_COUNT_LOCK:
                    counted.scan_records_out += stats.rows_sent - rows
                    counted.scan_bytes_out += stats.bytes_sent - size
                rows, size = stats.rows_sent, stats.bytes_sent
            if self.stopping and plan.follow:
                # A follower must not mistake a broker going away for the end of its table.
                raise flight.FlightUnavailableError("the broker is shutting down")
            yield _empty(plan.out_schema), pa.py_buffer(stats.to_bytes())

        return flight.GeneratorStream(plan.out_schema, guard(stream()))

    # -- appends -------------------------------------------------------------------------

    @flight_errors
    def do_put(self, context, descriptor, reader, writer):
        with malformed_request("put descriptor"):
            pk_request = pk_api.pk_put_request(descriptor)
        caller = Caller.of(self.broker, context)
        if pk_request is not None:
            if isinstance(pk_request.get("table"), str):
                caller.require(AclOperation.WRITE, pk_request["table"])
            return pk_api.do_put(self, pk_request, reader, writer)
        with malformed_request("append descriptor"):
            request = _append_request(descriptor)
        if isinstance(request.table, str):
            caller.require(AclOperation.WRITE, request.table)
        with malformed_request("append descriptor"):
            table = self._table(request.table)
            if request.bucket is not None:
                table.bucket(request.bucket)
        pk_api.refuse_append(table)
        counter = self._next_bucket.setdefault(table.name, itertools.count())
        max_bytes = int(table.config("max.message.bytes"))
        for chunk in reader:
            batch = chunk.data
            if batch is None or batch.num_rows == 0:
                continue
            table = self._table(request.table)
            records, meta = to_stored(table, batch, writer_schema_id(table))
            index = request.bucket if request.bucket is not None else next(counter) % len(table.buckets)
            done = self._on_loop(append_on_loop, self.broker, table.name, index,
                                 split_for_kafka(records, meta, max_bytes))
            writer.write(pa.py_buffer(json.dumps(
                {"appended": [[a.bucket, a.base_offset, a.record_count] for a in done]}).encode()))


def _visible_only(caller: Caller, results: list[flight.Result]) -> list[flight.Result]:
    """A listing (list-tables, lake-status) without the tables the caller may not describe."""
    entries = json.loads(results[0].body.to_pybytes())
    visible = [e for e in entries if caller.may(AclOperation.DESCRIBE, e.get("name") or e.get("table"))]
    return [flight.Result(json.dumps(visible).encode())]


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def _name(body: dict) -> str:
    name = body.get("table")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("the request names no table")
    return name


def _buckets(body: dict) -> int:
    buckets = body.get("buckets", 1)
    if not isinstance(buckets, int) or isinstance(buckets, bool):
        raise InvalidRequestError(f"buckets must be an integer, not {buckets!r}")
    return buckets


def _descriptor_target(descriptor: flight.FlightDescriptor) -> tuple[str, list[str] | None]:
    """A path descriptor names a table; a command descriptor is JSON {table, columns}."""
    if descriptor.descriptor_type == flight.DescriptorType.PATH:
        with malformed_request("descriptor path"):
            path = [p.decode() if isinstance(p, bytes) else p for p in descriptor.path]
        if len(path) != 1:
            raise InvalidRequestError(f"a table descriptor is one path element, not {path}")
        return path[0], None
    body = json_object(descriptor.command, "descriptor command")
    columns = body.get("columns")
    if columns is not None and not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)):
        raise InvalidRequestError("malformed descriptor command: columns must be a list of column names")
    return _name(body), columns


def _append_request(descriptor: flight.FlightDescriptor) -> AppendRequest:
    if descriptor.descriptor_type == flight.DescriptorType.PATH:
        return AppendRequest(_descriptor_target(descriptor)[0])
    try:
        return AppendRequest.from_bytes(descriptor.command)
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"bad append descriptor: {exc}") from None


@on_start
async def start_flight(broker) -> None:
    loop = asyncio.get_running_loop()
    options = auth.server_options(broker)
    scheme = "grpc+tls" if broker.config.security.flight_tls else "grpc+tcp"
    location = f"{scheme}://{broker.config.host}:{broker.config.flight_port}"
    server = TableFlightServer(broker, loop, location, **options)
    broker.extensions["flight"] = server
    broker.ports["flight_port"] = server.port
    log.info("table API (Arrow Flight) listening on %s://%s:%d (authentication: %s)", scheme, broker.config.host,
             server.port, broker.config.security.flight_auth)


@on_stop
async def stop_flight(broker) -> None:
    server = broker.extensions.pop("flight", None)
    if server is None:
        return
    server.stopping = True
    # shutdown() waits for running calls; followers notice `stopping` within a wake period,
    # and appends in flight still need this loop, so wait off the loop.
    await asyncio.to_thread(server.shutdown)
