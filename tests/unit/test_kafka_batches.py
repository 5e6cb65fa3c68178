"""Kafka batches -> stored Arrow batches -> Kafka batches keep every record field."""
from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from fluvial.broker import kafka_batches
from fluvial.broker.log import StoredBatch
from fluvial.errors import InvalidRecordError
from fluvial.protocol.records import parse_batch_header, verify_crc

record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=40)),
    st.one_of(st.none(), st.binary(max_size=200)),
    st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=10))), max_size=3),
    st.integers(0, 10_000),
)


def build(records, codec: int, producer_id: int = -1) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                  producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                  base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 24)
    for i, (k, v, h, dt) in enumerate(records):
        b.append(i, timestamp=1_700_000_000_000 + dt, key=k, value=v, headers=h)
    return bytes(b.build())


def stored_from(wire: bytes, base_offset: int = 100) -> StoredBatch:
    view = memoryview(wire)
    header = parse_batch_header(view)
    verify_crc(view, header)
    records, meta = kafka_batches.to_arrow(view, header)
    meta = dataclasses.replace(meta, base_offset=base_offset)
    offsets = pa.array(range(base_offset, base_offset + records.num_rows), pa.int64())
    batch = pa.RecordBatch.from_arrays([offsets, *records.columns], names=["_offset", *records.schema.names])
    return StoredBatch(meta, batch)


@settings(max_examples=60, deadline=None)
@given(st.lists(record, min_size=1, max_size=40), st.sampled_from([0, 1, 2, 3, 4]))
def test_round_trip_keeps_records(records, codec):
    wire = build(records, codec, producer_id=7)
    stored = stored_from(wire)
    assert stored.batch.column("value").to_pylist() == [v for _, v, _, _ in records]
    again = kafka_batches.to_wire(stored)
    parsed = list(DefaultRecordBatch(again))
    assert [(r.key, r.value, r.headers, r.timestamp, r.offset) for r in parsed] == [
        (k, v, h, 1_700_000_000_000 + dt, 100 + i) for i, (k, v, h, dt) in enumerate(records)]
    batch = DefaultRecordBatch(again)
    assert batch.validate_crc()
    # The producer's codec is kept (the builder falls back to none when compression does not pay).
    assert (batch.producer_id, batch.base_sequence, batch.compression_type) == (
        7, 0, DefaultRecordBatch(wire).compression_type)


def test_compression_type_config_recompresses():
    stored = stored_from(build([(b"k", b"v" * 100, [], 0)] * 10, 1))
    plain = kafka_batches.to_wire(stored, compression_type="uncompressed")
    assert DefaultRecordBatch(plain).compression_type == 0
    zstd = kafka_batches.to_wire(stored, compression_type="zstd")
    assert DefaultRecordBatch(zstd).compression_type == 4
    assert [r.value for r in DefaultRecordBatch(zstd)] == [b"v" * 100] * 10


def test_log_append_time_overrides_timestamps():
    wire = build([(None, b"a", [], 5), (None, b"b", [], 9)], 0)
    view = memoryview(wire)
    records, meta = kafka_batches.to_arrow(view, parse_batch_header(view), log_append_time_ms=42)
    assert records.column("_timestamp").cast(pa.int64()).to_pylist() == [42, 42]
    assert meta.max_timestamp == 42 and meta.attributes & kafka_batches.ATTR_LOG_APPEND_TIME


def test_offset_deltas_must_be_consecutive():
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=1, key=None, value=b"a", headers=[])
    b.append(5, timestamp=1, key=None, value=b"b", headers=[])
    wire = memoryview(bytes(b.build()))
    with pytest.raises(InvalidRecordError):
        kafka_batches.to_arrow(wire, parse_batch_header(wire))


def test_stored_schema_has_system_columns_first():
    names = kafka_batches.stored_schema().names
    assert names == ["_timestamp", "_change", "_key", "_headers", "value"]
