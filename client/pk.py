"""Primary-key operations of the native client: upserts, deletes, lookups, KV snapshots, full reads."""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from fluvial.client.errors import from_flight

LOOKUP = "lookup"
PREFIX_LOOKUP = "prefix-lookup"
KV_SNAPSHOT = "kv-snapshot"
KV_SNAPSHOTS = "kv-snapshots"
FULL_READ = "full-read"
REMOTE_SNAPSHOT = "kv-remote-snapshot"


def table_configs(primary_key=None, bucket_key=None, merge_engine=None, version_column=None, upsert_key=None,
                  retract_state_ttl_ms=None, aggregates=None, bucket_function=None) -> dict[str, str]:
    """The table configs of a primary-key table's options (empty for a log table)."""
    out = {}
    if upsert_key:
        out["fluvial.upsert.key"] = ",".join(upsert_key)
    if retract_state_ttl_ms is not None:
        out["fluvial.retract.state.ttl.ms"] = str(int(retract_state_ttl_ms))
    for column, function in (aggregates or {}).items():
        out[f"fluvial.agg.{column}"] = function
    if primary_key:
        out["fluvial.primary.key"] = ",".join(primary_key)
    if bucket_key:
        out["fluvial.bucket.key"] = ",".join(bucket_key)
    if bucket_function:
        out["fluvial.bucket.function"] = bucket_function
    if merge_engine:
        out["fluvial.merge.engine"] = merge_engine
    if version_column:
        out["fluvial.version.column"] = version_column
    return out


def as_arrow(data: Any) -> pa.Table:
    """Rows given as an Arrow table/batch, a list of dicts or a pandas DataFrame."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, list):
        return pa.Table.from_pylist(data)
    if isinstance(data, dict):
        return pa.table(data)
    return pa.Table.from_pandas(data, preserve_index=False)


def _ipc(table: pa.Table) -> str:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")


def _call(client, kind: str, body: dict) -> bytes:
    try:
        results = list(client._flight.do_action(flight.Action(kind, json.dumps(body).encode()), client._options()))
    except flight.FlightError as exc:
        raise from_flight(exc) from None
    return results[0].body.to_pybytes() if results else b""


def write(table, data: Any, op: str, columns: list[str] | None = None) -> list[tuple[int, int, int]]:
    """Stream rows as upserts or deletes; returns (bucket, base_offset, changelog rows) per write."""
    rows = as_arrow(data)
    if rows.num_rows == 0:
        return []
    command = json.dumps({"table": table.name, "op": op, "columns": list(columns) if columns else None}).encode()
    try:
        writer, acks = table.client._flight.do_put(flight.FlightDescriptor.for_command(command), rows.schema,
                                                   table.client._options())
        done: list[tuple[int, int, int]] = []
        try:
            for batch in rows.to_batches(max_chunksize=65536):
                writer.write_batch(batch)
            writer.done_writing()
            while True:
                ack = acks.read()
                if ack is None:
                    break
                done += [tuple(w) for w in json.loads(ack.to_pybytes())["written"]]
        finally:
            writer.close()
    except flight.FlightError as exc:
        raise from_flight(exc) from None
    return done


def lookup(table, keys: Any) -> pa.Table:
    return pa.ipc.open_stream(_call(table.client, LOOKUP, {"table": table.name, "keys": _ipc(as_arrow(keys))})).read_all()


def prefix_lookup(table, prefixes: Any) -> pa.Table:
    body = {"table": table.name, "prefixes": _ipc(as_arrow(prefixes))}
    return pa.ipc.open_stream(_call(table.client, PREFIX_LOOKUP, body)).read_all()


def snapshot(table) -> list[dict]:
    return json.loads(_call(table.client, KV_SNAPSHOT, {"table": table.name}))


def snapshots(table) -> list[list[dict]]:
    return json.loads(_call(table.client, KV_SNAPSHOTS, {"table": table.name}))


@dataclass
class FullRead:
    """A primary-key table read whole: its rows, then the changelog after them.
    `offsets[bucket]` is the exact changelog offset where each bucket's rows end. Read from
    the broker the rows are the current ones; read from remote snapshots they are the rows
    at each snapshot's offset (`sources[bucket]` says which), and `current()` applies the
    changelog after them."""

    rows: pa.Table
    offsets: dict[int, int]
    table: Any
    sources: dict[int, str] = field(default_factory=dict)  # bucket -> "broker" | "snapshot"
    bytes_read: int = 0  # fetched from the object store

    def changelog(self, columns=None, end=None):
        """The changelog after the rows (a Scan; `.follow()` tails it)."""
        cols = list(columns) if columns else ["_change", *self.table.schema.names]
        return self.table.scan(columns=cols, start=dict(self.offsets), end=end)

    def current(self) -> pa.Table:
        """The current rows: these rows with the changelog after them applied by key."""
        from fluvial.client.union import fold_changelog
        names = self.table.schema.names
        changes = self.changelog(["_change", *names]).to_arrow()
        return fold_changelog(self.rows, changes, list(self.table.info.primary_key))


def full_read(table, source: str = "broker") -> FullRead:
    if source not in ("broker", "snapshot"):
        raise ValueError(f"source must be 'broker' or 'snapshot', not {source!r}")
    parts, offsets, sources = [], {}, {}
    bytes_read = 0
    for b in range(table.info.buckets):
        if source == "snapshot":
            got = _snapshot_rows(table, b)
            if got is not None:
                rows, offsets[b], read = got
                parts.append(rows)
                sources[b] = "snapshot"
                bytes_read += read
                continue
        result = pa.ipc.open_stream(_call(table.client, FULL_READ, {"table": table.name, "bucket": b})).read_all()
        offsets[b] = int(result.schema.metadata[b"fluvial.log_offset"])
        parts.append(result.replace_schema_metadata(None))
        sources[b] = "broker"
    schema = parts[0].schema
    return FullRead(pa.concat_tables([p.cast(schema) if p.schema != schema else p for p in parts]), offsets, table,
                    sources, bytes_read)


def _snapshot_rows(table, bucket: int) -> tuple[pa.Table, int, int] | None:
    """The rows of the bucket's newest remote snapshot, read from the object store with the
    client's own credentials, with the offset they cover; None when there is none."""
    body = json.loads(_call(table.client, REMOTE_SNAPSHOT, {"table": table.name, "bucket": bucket}) or b"null")
    if not body or not body.get("snapshot"):
        return None
    from fluvial.client.remote import StoreCache
    from fluvial.tiering.kv_snapshots import RemoteKvSnapshot, read_snapshot_rows
    snap = RemoteKvSnapshot.from_json(body["snapshot"])
    stores = StoreCache(table.client.object_store_options)
    try:
        store = stores.open(body["store"])
        rows = read_snapshot_rows(store, snap)
        return rows, snap.log_offset, store.stats.bytes_read
    finally:
        stores.close()
