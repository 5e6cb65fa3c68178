"""Kafka record batches <-> stored Arrow batches of a table.

Produce: a v2 batch becomes one Arrow batch (system columns plus the user columns made
by the table's value format) and a `BatchMeta` with the batch-level Kafka fields.
Fetch: a stored batch becomes a v2 batch again, with the same offsets, timestamps, keys,
values, headers and producer fields, compressed as the topic's `compression.type` says.
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.broker.log import BatchMeta, StoredBatch
from fluvial.broker.log.batch_meta import ATTR_TRANSACTIONAL
from fluvial.errors import InvalidRecordError
from fluvial.protocol.records import (HEADER_SIZE, LENGTH_END, BatchHeader, Compression, RecordColumns, build_batch,
                                     check_records_stats, decode_records, decode_records_section, parse_batch_header,
                                     records_section, verify_crc)

TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")
HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]))
CHANGE_APPEND = 0
# `_change` of a tombstone (a null value) in a compacted typed log table: its user columns are null.
CHANGE_DELETE = 4

# Attribute bits kept in BatchMeta (the codec bits stay too: they name the producer's codec).
ATTR_CODEC_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08

_CODEC_BY_NAME = {"uncompressed": Compression.NONE, "gzip": Compression.GZIP, "snappy": Compression.SNAPPY,
                  "lz4": Compression.LZ4, "zstd": Compression.ZSTD}


class RawValueFormat:
    """A raw table keeps the value bytes as they came: one binary user column `value`."""

    name = "raw"
    user_fields = [pa.field("value", pa.binary())]

    def to_columns(self, values: pa.BinaryArray) -> tuple[list[pa.Array], int]:
        return [values], -1

    def to_values(self, batch: pa.RecordBatch, schema_id: int) -> pa.Array:
        return batch.column("value")


RAW = RawValueFormat()


def _build_stored_schema(value_format) -> pa.Schema:
    return pa.schema([pa.field("_timestamp", TIMESTAMP_TYPE, nullable=False),
                      pa.field("_change", pa.int8(), nullable=False),
                      pa.field("_key", pa.binary()),
                      pa.field("_headers", HEADERS_TYPE)] + list(value_format.user_fields))


# Built once: the log tablet recognises a schema it has seen by identity, and building one
# costs more than decoding a small batch. Typed formats follow their table's schema
# evolution: theirs is built once per table schema (the codec keeps one schema object
# until the table evolves).
_RAW_SCHEMA = _build_stored_schema(RAW)
_TYPED_SCHEMAS: dict[int, tuple[pa.Schema, pa.Schema]] = {}


def stored_schema(value_format=RAW) -> pa.Schema:
    if value_format is RAW:
        return _RAW_SCHEMA
    codec = getattr(value_format, "codec", None)
    if codec is None:
        return _build_stored_schema(value_format)
    table = codec.table_schema
    hit = _TYPED_SCHEMAS.get(id(table))
    if hit is None or hit[0] is not table:
        if len(_TYPED_SCHEMAS) > 1024:
            _TYPED_SCHEMAS.clear()
        hit = _TYPED_SCHEMAS[id(table)] = (table, _build_stored_schema(value_format))
    return hit[1]


# Offset deltas 0..n-1, to check produced batches against without allocating per batch.
_DELTAS = np.arange(1 << 16, dtype=np.int32)
_DELTAS.flags.writeable = False


def _deltas_are_dense(offset_delta: np.ndarray, n: int) -> bool:
    if n == 1:
        # The common small batch: a scalar comparison instead of an array reduction.
        return offset_delta.shape == (1,) and int(offset_delta[0]) == 0
    expected = _DELTAS[:n] if n <= len(_DELTAS) else np.arange(n, dtype=np.int32)
    return offset_delta.shape == (n,) and bool((offset_delta == expected).all())


def _int_array(arrow_type: pa.DataType, values: np.ndarray) -> pa.Array:
    # A contiguous NumPy buffer wrapped as is: pa.array() on it costs several times more.
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def to_arrow(batch: memoryview, header: BatchHeader, *, log_append_time_ms: int | None = None,
             value_format=RAW, tombstones: bool = False) -> tuple[pa.RecordBatch, BatchMeta]:
    """Decode one verified v2 batch into the stored Arrow batch and its meta.

    ``tombstones`` (compacted tables): a typed table takes null values too, stored as rows
    with null user columns and `_change` = CHANGE_DELETE (a raw table stores a null value as is)."""
    cols = decode_records(batch, header)
    n = len(cols.offset_delta)
    if n != header.records_count:
        raise InvalidRecordError(f"batch declares {header.records_count} records but holds {n}")
    if n == 0:
        raise InvalidRecordError("empty record batch")
    # Kafka requires the offset deltas of a produced batch to be 0..n-1.
    if header.last_offset_delta != n - 1 or not _deltas_are_dense(cols.offset_delta, n):
        raise InvalidRecordError("record offset deltas of a produced batch must be 0..n-1")
    attributes = header.attributes & (ATTR_CODEC_MASK | 0x30)
    if log_append_time_ms is not None:
        ts = np.full(n, log_append_time_ms, dtype=np.int64)
        base_ts = max_ts = log_append_time_ms
        attributes |= ATTR_LOG_APPEND_TIME
    else:
        ts = np.add(cols.timestamp_delta, header.base_timestamp, dtype=np.int64)
        base_ts = header.base_timestamp
        max_ts = header.max_timestamp
    change = np.zeros(n, dtype=np.int8)
    if tombstones and value_format is not RAW and cols.values.null_count:
        user_columns, schema_id, change = _typed_with_tombstones(cols.values, value_format)
    else:
        user_columns, schema_id = value_format.to_columns(cols.values)
    arrays = [_int_array(TIMESTAMP_TYPE, ts), _int_array(pa.int8(), change),
              cols.keys, cols.headers, *user_columns]
    records = pa.RecordBatch.from_arrays(arrays, schema=stored_schema(value_format))
    meta = BatchMeta(base_offset=-1, last_offset_delta=n - 1, record_count=n, base_timestamp=base_ts,
                     max_timestamp=max_ts, producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                     base_sequence=header.base_sequence, attributes=attributes,
                     partition_leader_epoch=header.partition_leader_epoch, schema_id=schema_id)
    return records, meta




# The `_change` column of appended rows (all CHANGE_APPEND, 0), sliced rather than built
# for every flush.
_NO_CHANGES = pa.array(np.zeros(1024, np.int8))


class WireRecords:
    """The records of a small produced batch of a raw table, checked but not converted yet.

    Many small producers send batches of one record: converting each to Arrow on its own
    cost about a fifth of the event loop. The log tablet converts the batches of one
    flush window that it writes together (a coalesced append) in one go
    (`convert_together`): one decode of their records sections laid end to end, one
    Arrow batch. The rows are the same as `to_arrow` gives for each batch.
    """

    __slots__ = ("section", "num_rows", "base_timestamp", "first_timestamp", "max_timestamp")
    schema = _RAW_SCHEMA

    def __init__(self, section, num_rows: int, base_timestamp: int, first_timestamp: int, max_timestamp: int):
        self.section = section
        self.num_rows = num_rows
        self.base_timestamp = base_timestamp
        self.first_timestamp = first_timestamp
        self.max_timestamp = max_timestamp

    @staticmethod
    def convert_together(items: "list[WireRecords]") -> pa.RecordBatch:
        """One Arrow batch of the rows of ``items``, in order."""
        if len(items) == 1:
            total = items[0].num_rows
            cols = decode_records_section(items[0].section, total)
            ts = np.add(cols.timestamp_delta, items[0].base_timestamp, dtype=np.int64)
        else:
            counts = [i.num_rows for i in items]
            total = sum(counts)
            cols = decode_records_section(b"".join([i.section for i in items]), total)
            bases = np.array([i.base_timestamp for i in items], np.int64)
            if total != len(items):  # not one record per batch (many small producers)
                bases = np.repeat(bases, counts)
            ts = np.add(cols.timestamp_delta, bases, dtype=np.int64)
        change = _NO_CHANGES.slice(0, total) if total <= len(_NO_CHANGES) else _int_array(
            pa.int8(), np.zeros(total, np.int8))
        arrays = [_int_array(TIMESTAMP_TYPE, ts), change, cols.keys, cols.headers, cols.values]
        return pa.RecordBatch.from_arrays(arrays, schema=_RAW_SCHEMA)


def to_wire_records(batch: memoryview, header: BatchHeader) -> tuple[WireRecords, BatchMeta]:
    """What `to_arrow` gives for a raw table (CreateTime), with the rows left as checked
    Kafka records for the log tablet to convert together with others. Refuses the same
    batches as `to_arrow`, with the same errors."""
    n = header.records_count
    records = records_section(batch, header)
    if n <= 0:
        raise InvalidRecordError("empty record batch")
    # The compiled scanner's measuring pass alone: nothing is copied out of the records.
    first_delta, max_delta, dense = check_records_stats(records, n)
    if header.last_offset_delta != n - 1 or not dense:
        raise InvalidRecordError("record offset deltas of a produced batch must be 0..n-1")
    first = header.base_timestamp + first_delta
    max_ts = header.base_timestamp + max_delta
    meta = BatchMeta(base_offset=-1, last_offset_delta=n - 1, record_count=n, base_timestamp=header.base_timestamp,
                     max_timestamp=header.max_timestamp, producer_id=header.producer_id,
                     producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                     attributes=header.attributes & (ATTR_CODEC_MASK | 0x30),
                     partition_leader_epoch=header.partition_leader_epoch, schema_id=-1)
    # The section is a view of the request's bytes, which stay unchanged (only the batch
    # header's base offset and leader epoch are set later, outside the section).
    return WireRecords(records, n, header.base_timestamp, first, max_ts), meta


def lone_batch_header(records) -> BatchHeader | None:
    """The header of a records field holding exactly one batch, its CRC verified, that is
    neither a control nor a transactional batch (what `split_batches` would return as its
    only batch); None for anything else. Damage raises as `parse_batch_header` and
    `verify_crc` do. The step-by-step form of `records.check_produced`."""
    header = parse_batch_header(records)
    if LENGTH_END + header.batch_length != len(records):
        return None
    verify_crc(records, header)
    if header.is_control or header.attributes & ATTR_TRANSACTIONAL:
        return None
    return header


def checked_wire_records(wire: memoryview, checked: tuple) -> tuple[WireRecords, BatchMeta]:
    """`to_wire_records` of a batch that `records.check_produced` accepted (its result
    ``checked``): the same records and meta, from the fields the compiled check read."""
    (attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence,
     n, partition_leader_epoch, section, first_delta, max_delta) = checked
    meta = BatchMeta(-1, last_offset_delta, n, base_timestamp, max_timestamp, producer_id, producer_epoch,
                     base_sequence, attributes & (ATTR_CODEC_MASK | 0x30), partition_leader_epoch, -1)
    if section is None:
        section = wire[HEADER_SIZE:]
    return WireRecords(section, n, base_timestamp, base_timestamp + first_delta, base_timestamp + max_delta), meta


def _typed_with_tombstones(values: pa.Array, value_format) -> tuple[list[pa.Array], int, np.ndarray]:
    """Typed columns of the non-null values, with all-null rows (and CHANGE_DELETE) for the null ones."""
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    live = np.flatnonzero(valid)
    position = np.full(len(values), -1, np.int64)
    position[live] = np.arange(len(live))
    take = pa.array(position, mask=~valid)
    change = np.where(valid, CHANGE_APPEND, CHANGE_DELETE).astype(np.int8)
    if not len(live):
        columns = [pa.array(np.zeros(len(values), np.int32))] + [
            pa.nulls(len(values), f.type) for f in value_format.user_fields[1:]]
        return columns, -1, change
    decoded, schema_id = value_format.to_columns(values.filter(pa.array(valid)))
    ids = pc.fill_null(decoded[0].take(take), 0)  # the writer schema id column is never null
    return [ids] + [c.take(take) for c in decoded[1:]], schema_id, change


def _values_with_tombstones(batch: pa.RecordBatch, value_format, schema_id: int) -> pa.Array:
    """A typed batch's values, null where a row is a tombstone (CHANGE_DELETE)."""
    deleted = batch.column("_change").to_numpy(zero_copy_only=False) == CHANGE_DELETE
    if not deleted.any():
        return value_format.to_values(batch, schema_id)
    live = np.flatnonzero(~deleted)
    encoded = value_format.to_values(batch.take(pa.array(live)), schema_id) if len(live) else pa.array([], pa.binary())
    position = np.full(batch.num_rows, -1, np.int64)
    position[live] = np.arange(len(live))
    return encoded.take(pa.array(position, mask=deleted))


def format_of(stored: StoredBatch, table_format):
    """The value format a stored batch was written in: a table typed after it had raw
    batches keeps serving those raw."""
    if table_format is RAW or "_schema_id" not in stored.batch.schema.names:
        return RAW
    return table_format


def fetch_codec(compression_type: str, meta: BatchMeta) -> Compression:
    if compression_type == "producer":
        return Compression(meta.attributes & ATTR_CODEC_MASK)
    return _CODEC_BY_NAME[compression_type]


def record_deltas(meta: BatchMeta, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """A stored batch's timestamp and offset deltas against its Kafka batch's bases."""
    ts = batch.column("_timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)
    offsets = batch.column("_offset").to_numpy(zero_copy_only=False)
    return (ts - meta.base_timestamp).astype(np.int64), (offsets - meta.base_offset).astype(np.int32)


def to_wire(stored: StoredBatch, *, compression_type: str = "producer", leader_epoch: int = 0,
            value_format=RAW) -> bytes:
    """Re-encode a stored batch as a Kafka v2 batch with its original offsets."""
    meta, batch = stored.meta, stored.batch
    timestamp_delta, offset_delta = record_deltas(meta, batch)
    cols = RecordColumns(
        timestamp_delta=timestamp_delta,
        offset_delta=offset_delta,
        keys=batch.column("_key"),
        values=value_format.to_values(batch, meta.schema_id) if value_format is RAW
        else _values_with_tombstones(batch, value_format, meta.schema_id),
        headers=batch.column("_headers"),
    )
    return build_batch(base_offset=meta.base_offset, partition_leader_epoch=leader_epoch,
                       attributes=meta.attributes & ~ATTR_CODEC_MASK, base_timestamp=meta.base_timestamp,
                       max_timestamp=meta.max_timestamp, producer_id=meta.producer_id,
                       producer_epoch=meta.producer_epoch, base_sequence=meta.base_sequence, columns=cols,
                       compression=fetch_codec(compression_type, meta),
                       # A compacted batch keeps its span: clients continue after its last offset.
                       last_offset_delta=meta.last_offset_delta)


def now_ms() -> int:
    return int(time.time() * 1000)
