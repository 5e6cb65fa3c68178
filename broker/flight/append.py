"""Appends through the table API: client Arrow batches -> stored batches of a log table.

Conversion (validation, casts, system columns) runs on the Flight thread; the append
itself runs on the event loop, where Kafka produces append, so that offsets are assigned
in one order and fetch long-polls are woken.
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from fluvial.broker.flight.catalog import SCHEMA_ID, is_typed, user_schema, value_format_of
from fluvial.broker.kafka_batches import CHANGE_APPEND, HEADERS_TYPE, TIMESTAMP_TYPE, stored_schema
from fluvial.broker.log import BatchMeta
from fluvial.broker.tables import Table
from fluvial.errors import SchemaMismatchError
from fluvial.client.wire import Appended
from fluvial.errors import InvalidRecordError

# System columns a client may give with its rows; the rest are assigned by the broker.
CLIENT_SYSTEM_COLUMNS = {"_timestamp": TIMESTAMP_TYPE, "_key": pa.binary(), "_headers": HEADERS_TYPE}


def writer_schema_id(table: Table) -> int:
    """The `_schema_id` of appended rows: the Avro subject's latest id (Kafka consumers get
    values framed with it); for JSON tables 0, i.e. plain compact JSON objects."""
    fmt = value_format_of(table)
    if not is_typed(table):
        return -1
    if fmt.name != "avro":
        from fluvial.schema.codecs import NO_SCHEMA_ID
        return NO_SCHEMA_ID
    codec = fmt.codec
    latest = codec.registry.latest(codec.subject)
    if latest is None:
        raise InvalidRecordError(f"table {table.name!r} has no schema registered under {codec.subject!r}")
    return latest[0].schema_id


def _conform(column: pa.Array, field: pa.Field, what: str) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.type != field.type:
        try:
            column = column.cast(field.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SchemaMismatchError(f"{what} {field.name!r} is {column.type}, the table holds {field.type}: {exc}") \
                from None
    if not field.nullable and column.null_count:
        raise SchemaMismatchError(f"{what} {field.name!r} holds {column.null_count} nulls; the table requires values")
    return column


def to_stored(table: Table, batch: pa.RecordBatch, schema_id: int, now_ms: int | None = None
              ) -> tuple[pa.RecordBatch, BatchMeta]:
    """Validate a client batch against the table's schema and build the stored batch."""
    users = user_schema(table)
    given = batch.schema.names
    if len(set(given)) != len(given):
        raise SchemaMismatchError(f"columns named twice in {given}")
    unknown = [n for n in given if n not in users.names and n not in CLIENT_SYSTEM_COLUMNS]
    missing = [n for n in users.names if n not in given]
    if unknown or missing:
        parts = []
        if missing:
            parts.append(f"missing columns {missing}")
        if unknown:
            parts.append(f"unknown columns {unknown}")
        raise SchemaMismatchError(f"rows do not match table {table.name!r} ({', '.join(parts)}); "
                                  f"its columns are {users.names}")
    n = batch.num_rows
    if n == 0:
        raise InvalidRecordError("an appended batch must hold at least one row")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if "_timestamp" in given:
        ts = _conform(batch.column("_timestamp"), pa.field("_timestamp", TIMESTAMP_TYPE), "column")
        if ts.null_count:
            ts = ts.fill_null(pa.scalar(now, TIMESTAMP_TYPE))
    else:
        ts = pa.array(np.full(n, now, dtype=np.int64), TIMESTAMP_TYPE)
    key = _conform(batch.column("_key"), pa.field("_key", pa.binary()), "column") if "_key" in given \
        else pa.nulls(n, pa.binary())
    headers = _conform(batch.column("_headers"), pa.field("_headers", HEADERS_TYPE), "column") \
        if "_headers" in given else pa.nulls(n, HEADERS_TYPE)
    fmt = value_format_of(table)
    system = [ts, pa.array(np.full(n, CHANGE_APPEND, dtype=np.int8)), key, headers]
    if is_typed(table):
        system.append(pa.array(np.full(n, schema_id, dtype=np.int32)))
    columns = [_conform(batch.column(f.name), f, "column") for f in users]
    records = pa.RecordBatch.from_arrays(system + columns, schema=stored_schema(fmt))
    ms = ts.view(pa.int64()).to_numpy()
    meta = BatchMeta(base_offset=-1, last_offset_delta=n - 1, record_count=n, base_timestamp=int(ms.min()),
                     max_timestamp=int(ms.max()), schema_id=schema_id)
    return records, meta


def split_for_kafka(records: pa.RecordBatch, meta: BatchMeta, max_bytes: int) -> list[tuple[pa.RecordBatch, BatchMeta]]:
    """Stored batches of at most about `max_bytes` each: every stored batch is one Kafka
    record batch on the fetch path, and consumers bound the batch sizes they accept."""
    n = records.num_rows
    size = records.nbytes
    if size <= max_bytes or n == 1:
        return [(records, meta)]
    rows = max(1, int(n * max_bytes / size))
    out = []
    ms = records.column("_timestamp").view(pa.int64()).to_numpy()
    for lo in range(0, n, rows):
        part = records.slice(lo, rows)
        k = part.num_rows
        t = ms[lo:lo + k]
        out.append((part, BatchMeta(base_offset=-1, last_offset_delta=k - 1, record_count=k,
                                    base_timestamp=int(t.min()), max_timestamp=int(t.max()),
                                    schema_id=meta.schema_id)))
    return out


async def append_on_loop(broker, table_name: str, bucket_index: int,
                         chunks: list[tuple[pa.RecordBatch, BatchMeta]]) -> list[Appended]:
    """Append on the event loop thread; with flush policy `ack`, return once durable."""
    table = broker.tables.get(table_name)
    bucket = table.bucket(bucket_index)
    if _has_schema_id(chunks) != is_typed(table):
        raise SchemaMismatchError(f"table {table_name!r} changed its format while rows were sent; send them again")
    done = []
    for records, meta in chunks:
        written = bucket.append(records, meta)
        done.append(Appended(bucket_index, written.base_offset, written.record_count))
    if done and broker.config.flush_policy == "ack":
        await bucket.group_commit.wait_durable(done[-1].base_offset + done[-1].record_count)
    return done


def _has_schema_id(chunks) -> bool:
    return bool(chunks) and SCHEMA_ID in chunks[0][0].schema.names
