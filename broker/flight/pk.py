"""Primary-key tables on the table API: upsert/delete streams, lookups, prefix lookups, KV snapshots, full reads.

An upsert or delete is a `DoPut` whose descriptor command is JSON `{"table", "op":
"upsert"|"delete", "columns": [...] | null}` (`columns`: a partial update's target
columns); each batch is acknowledged with `{"written": [[bucket, base_offset, rows], ...]}`
once durable. Lookups are actions whose body carries the keys as base64 Arrow IPC and
whose result is an Arrow IPC stream of the rows found; under flush policy `ack` a lookup
answers once the changelog of the rows it read is durable (a power loss cannot take back
what it returned).

A lookup session is a `DoExchange` whose descriptor command is JSON `{"table", "op":
"lookup-session"}`: the client sends each lookup's keys as one record batch and reads
the rows found as one record batch, in order, on the same stream. Only the first message
of each direction carries a schema; a lookup then costs one message each way on an open
HTTP/2 stream instead of a whole call (headers, authentication, JSON, base64). The
table's ACLs are checked per lookup; the broker ends the stream (no error) when the
table's columns changed or it is stopping, and the client opens a new session. An open
session holds a Flight thread and a stopping broker waits for it: clients close sessions
idle for a second.
"""
from __future__ import annotations

import base64
import functools
import json
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from fluvial.errors import InvalidRequestError

LOOKUP = "lookup"
PREFIX_LOOKUP = "prefix-lookup"
KV_SNAPSHOT = "kv-snapshot"
KV_SNAPSHOTS = "kv-snapshots"
FULL_READ = "full-read"
REMOTE_SNAPSHOT = "kv-remote-snapshot"
PK_OPS = ("upsert", "delete")
LOOKUP_SESSION = "lookup-session"

ACTIONS = {
    LOOKUP: "Current rows of primary keys. Body: {table, keys: base64 Arrow IPC of the key columns}; result: Arrow IPC.",
    PREFIX_LOOKUP: "Current rows whose bucket key equals a prefix. Body: {table, prefixes: base64 Arrow IPC}; "
                   "result: Arrow IPC.",
    KV_SNAPSHOT: "Take a KV snapshot of every bucket now. Body: {table}; result: JSON list of snapshots.",
    KV_SNAPSHOTS: "The KV snapshots kept per bucket. Body: {table}; result: JSON.",
    REMOTE_SNAPSHOT: "Where the newest KV snapshot of a bucket is in the object store. Body: {table, bucket}; "
                     "result: JSON {store: {url, options}, snapshot} or null.",
    FULL_READ: "Current rows of a bucket and the changelog offset they cover. Body: {table, bucket}; result: "
               "Arrow IPC whose schema metadata `fluvial.log_offset` is the offset to scan the changelog from.",
}


def ipc_bytes(table: pa.Table, metadata: dict[str, str] | None = None) -> bytes:
    schema = table.schema.with_metadata({**(table.schema.metadata or {}), **(metadata or {})})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        w.write_table(table.cast(schema) if metadata else table)
    return sink.getvalue().to_pybytes()


def read_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _arrow_body(body: dict, name: str) -> pa.Table:
    text = body.get(name)
    if not isinstance(text, str):
        raise InvalidRequestError(f"the request carries no {name} (base64 Arrow IPC)")
    return read_ipc(base64.b64decode(text))


def pk_put_request(descriptor: flight.FlightDescriptor) -> dict | None:
    """The upsert/delete request a DoPut descriptor carries, or None for an append."""
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        return None
    try:
        body = json.loads(descriptor.command)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("op") not in PK_OPS:
        return None
    return body


def exchange_request(descriptor: flight.FlightDescriptor) -> dict:
    """The lookup session a DoExchange descriptor asks for (InvalidRequestError otherwise)."""
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        raise InvalidRequestError("a DoExchange descriptor is a command: {\"table\", \"op\": \"lookup-session\"}")
    body = json.loads(descriptor.command)
    if not isinstance(body, dict) or body.get("op") != LOOKUP_SESSION or not isinstance(body.get("table"), str):
        raise InvalidRequestError(f"unknown exchange {body!r}: the broker serves "
                                  f"{{\"table\", \"op\": \"{LOOKUP_SESSION}\"}}")
    return body


def lookup_session(server, require_read: Callable[[str], None], name: str, reader, writer) -> None:
    """Serve one lookup session until the client stops sending (see the module doc).
    Runs on its Flight thread: RocksDB reads here, a wait for durability on the loop."""
    table = server._table(name)
    table.kind.check_primary_key(table)  # refused at once unless a primary-key table
    wait_durable = functools.partial(server._on_loop, table.kind.await_durable)
    schema = None
    while not server.stopping:  # a stopping broker ends busy sessions; idle ones the client closes
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return
        keys = chunk.data
        if keys is None:
            continue
        require_read(name)  # an ACL removed mid-session applies from the next lookup on
        table = server._table(name)
        rows = table.kind.lookup_batch(table, keys, wait_durable=wait_durable)
        if schema is None:
            schema = rows.schema
            writer.begin(schema)
        elif not rows.schema.equals(schema):
            return  # the table's columns changed: the client reopens with the new schema
        writer.write_batch(rows)


def refuse_append(table) -> None:
    """Refuse a plain append the table's kind does not take (a primary-key table takes
    upserts and deletes: an append would bypass the merge; a changelog view takes none)."""
    table.kind.check_appendable(table)


def do_put(server, body: dict, reader, writer) -> None:
    """Upserts or deletes, batch by batch, each acknowledged once durable."""
    table = server._table(body.get("table"))
    table.kind.check_primary_key(table)
    columns = body.get("columns")
    delete = body["op"] == "delete"
    for chunk in reader:
        batch = chunk.data
        if batch is None or batch.num_rows == 0:
            continue
        deletes = np.ones(batch.num_rows, bool) if delete else None
        written = server._on_loop(functools.partial(table.kind.write_rows, table, batch, deletes=deletes,
                                                    partial_columns=columns))
        writer.write(pa.py_buffer(json.dumps(
            {"written": [[b, w.base_offset, w.record_count] for b, w in written]}).encode()))


def do_action(server, kind: str, body: dict) -> list[flight.Result] | None:
    """Serve a primary-key action, or None when `kind` is not one."""
    if kind not in ACTIONS:
        return None
    table = server._table(body.get("table"))
    # Lookups read RocksDB on this Flight thread; only a wait for durability goes to the loop.
    wait_durable = functools.partial(server._on_loop, table.kind.await_durable)
    if kind == LOOKUP:
        rows = table.kind.lookup(table, _arrow_body(body, "keys"), wait_durable=wait_durable)
        return [flight.Result(ipc_bytes(rows))]
    if kind == PREFIX_LOOKUP:
        rows = table.kind.prefix_lookup(table, _arrow_body(body, "prefixes"), wait_durable=wait_durable)
        return [flight.Result(ipc_bytes(rows))]
    if kind == KV_SNAPSHOT:
        infos = server._on_loop(table.kind.kv_snapshot, table)
        return [flight.Result(json.dumps([i.to_json() for i in infos]).encode())]
    if kind == KV_SNAPSHOTS:
        per_bucket = table.kind.kv_snapshots(table)
        return [flight.Result(json.dumps([[i.to_json() for i in b] for b in per_bucket]).encode())]
    bucket = table.bucket(int(body.get("bucket", 0)))
    if kind == REMOTE_SNAPSHOT:
        return [flight.Result(json.dumps(table.kind.remote_kv_snapshot(bucket)).encode())]
    rows, offset = server._on_loop(table.kind.full_read, bucket)
    return [flight.Result(ipc_bytes(rows, {"fluvial.log_offset": str(offset)}))]
