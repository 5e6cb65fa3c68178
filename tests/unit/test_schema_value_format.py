"""A typed table's value format inside the broker's Kafka batch <-> stored Arrow batch conversion."""
from __future__ import annotations

import dataclasses
import json
import random

import pyarrow as pa
import pytest

from fluvial.broker import kafka_batches
from fluvial.broker.log import StoredBatch
from fluvial.broker.metadata import MetadataStore
from fluvial.errors import InvalidRecordError
from fluvial.protocol.records import Compression, RecordColumns, build_batch, parse_batch_header
from fluvial.schema.codecs import value_codec
from fluvial.schema.registry import SchemaRegistry, parse_schema
from fluvial.schema.value_format import MIXED_SCHEMA_IDS, TypedValueFormat
from tests.unit.test_schema_codecs import SCHEMA20, V1, V2, make_record, wire


def kafka_batch(values: list[bytes], compression=Compression.ZSTD) -> bytes:
    cols = RecordColumns.from_lists([f"k{i}".encode() for i in range(len(values))], values,
                                    headers=[[("h", b"v")]] * len(values))
    return build_batch(base_offset=0, partition_leader_epoch=0, attributes=0, base_timestamp=1_700_000_000_000,
                       max_timestamp=1_700_000_000_000, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                       columns=cols, compression=compression)


def store_and_fetch(raw: bytes, fmt: TypedValueFormat) -> tuple[pa.RecordBatch, bytes]:
    batch, meta = kafka_batches.to_arrow(memoryview(raw), parse_batch_header(raw), value_format=fmt)
    stored = batch.add_column(0, "_offset", pa.array(range(batch.num_rows), pa.int64()))
    wire_out = kafka_batches.to_wire(StoredBatch(dataclasses.replace(meta, base_offset=0), stored),
                                     value_format=fmt)
    return stored, wire_out


@pytest.fixture
def registry(tmp_path) -> SchemaRegistry:
    return SchemaRegistry(MetadataStore(tmp_path / "meta.db"))


def test_kafka_batch_round_trips_byte_identical_through_typed_columns(registry):
    sid = registry.register("orders-value", parse_schema(json.dumps(SCHEMA20)))[0]
    rng = random.Random(5)
    raw = kafka_batch(wire(SCHEMA20, sid, [make_record(rng, i) for i in range(200)]))
    fmt = TypedValueFormat(value_codec(registry, "orders"))
    stored, fetched = store_and_fetch(raw, fmt)
    assert stored.schema.names[:6] == ["_offset", "_timestamp", "_change", "_key", "_headers", "_schema_id"]
    assert stored.schema.field("amount").type == pa.decimal128(12, 2)
    assert fetched == raw


def test_mixed_writer_versions_and_old_batches_after_evolution(registry):
    id1 = registry.register("e-value", parse_schema(json.dumps(V1)))[0]
    fmt = TypedValueFormat(value_codec(registry, "e"))
    old_raw = kafka_batch(wire(V1, id1, [{"id": 1, "price": 0.5}]), Compression.NONE)
    old_stored, _ = store_and_fetch(old_raw, fmt)

    id2 = registry.register("e-value", parse_schema(json.dumps(V2)))[0]
    assert [f.name for f in fmt.user_fields] == ["_schema_id", "id", "price", "currency"]
    mixed = wire(V1, id1, [{"id": 2, "price": 1.5}]) + wire(V2, id2, [{"id": 3, "price": 2.5, "currency": "USD"}])
    raw = kafka_batch(mixed, Compression.NONE)
    batch, meta = kafka_batches.to_arrow(memoryview(raw), parse_batch_header(raw), value_format=fmt)
    assert meta.schema_id == MIXED_SCHEMA_IDS
    assert batch.column("_schema_id").to_pylist() == [id1, id2]
    _, fetched = store_and_fetch(raw, fmt)
    assert fetched == raw
    # a batch stored under v1 still fetches byte-identical once the table is at v2
    meta_old = kafka_batches.to_arrow(memoryview(old_raw), parse_batch_header(old_raw), value_format=fmt)[1]
    again = kafka_batches.to_wire(StoredBatch(dataclasses.replace(meta_old, base_offset=0), old_stored),
                                  value_format=fmt)
    assert again == old_raw


def test_a_bad_record_refuses_the_whole_batch(registry):
    sid = registry.register("s-value", parse_schema(json.dumps(V1)))[0]
    fmt = TypedValueFormat(value_codec(registry, "s"))
    good = wire(V1, sid, [{"id": 1, "price": 1.0}])[0]
    raw = kafka_batch([good, good[:-2], good])
    with pytest.raises(InvalidRecordError) as info:
        kafka_batches.to_arrow(memoryview(raw), parse_batch_header(raw), value_format=fmt)
    assert [i for i, _ in info.value.record_errors] == [1]
    assert "field 'price'" in info.value.record_errors[0][1]
