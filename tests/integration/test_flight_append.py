"""Rows appended through the native client are Kafka records: same offsets, equal values."""
from __future__ import annotations

import datetime as dt
import json
import time

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP

import fluvial.client as fc

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("name", pa.string()),
    pa.field("price", pa.float64()),
    pa.field("qty", pa.int32()),
    pa.field("paid", pa.bool_()),
])


def rows(start: int, n: int) -> pa.Table:
    ids = range(start, start + n)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "name": [None if i % 7 == 0 else f"item-{i}" for i in ids],
        "price": [i * 0.25 for i in ids],
        "qty": pa.array([i % 100 for i in ids], pa.int32()),
        "paid": [i % 2 == 0 for i in ids],
    }, schema=SCHEMA)


def confluent_records(bootstrap: str, topic: str, partitions: int, n: int, timeout: float = 60) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "flight-append", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got.extend(m for m in c.consume(5000, timeout=1) if m.error() is None)
    c.close()
    return got


def kafka_python_records(bootstrap: str, topic: str, partitions: int) -> list:
    kc = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000,
                       fetch_max_bytes=50 << 20, max_partition_fetch_bytes=50 << 20)
    tps = [KTP(topic, p) for p in range(partitions)]
    kc.assign(tps)
    kc.seek_to_beginning(*tps)
    got = list(kc)
    kc.close()
    return got


@pytest.fixture
def client(broker):
    with fc.connect(broker.flight_url) as c:
        yield c


def test_appended_rows_are_json_records_at_the_same_offsets(broker, client, topic_name):
    t = client.create_table(topic_name, SCHEMA, buckets=3)
    assert t.info.kafka_format == "json"
    appended = t.append(rows(0, 6000)) + t.append([b for b in rows(6000, 3000).to_batches(max_chunksize=1000)])
    assert sum(a.record_count for a in appended) == 9000
    where = {}  # id -> (bucket, offset) as the append answered
    i = 0
    for a in appended:
        for k in range(a.record_count):
            where[i] = (a.bucket, a.base_offset + k)
            i += 1

    expected = rows(0, 9000).to_pylist()
    confluent = [(m.partition(), m.offset(), m.value())
                 for m in confluent_records(broker.bootstrap, topic_name, 3, 9000)]
    kafka_python = [(m.partition, m.offset, m.value) for m in kafka_python_records(broker.bootstrap, topic_name, 3)]
    for records in (confluent, kafka_python):
        assert len(records) == 9000
        for partition, offset, value in records:
            doc = json.loads(value)
            assert where[doc["id"]] == (partition, offset)
            assert doc == expected[doc["id"]]
            assert b"\n" not in value and b": " not in value  # compact JSON objects

    # The native scan sees the same offsets.
    scanned = t.scan(columns=["_bucket", "_offset", "id"]).to_arrow().to_pydict()
    assert {i: (b, o) for b, o, i in zip(scanned["_bucket"], scanned["_offset"], scanned["id"])} == where


def test_appended_rows_read_back_with_the_avro_deserializer(broker, client, topic_name):
    t = client.create_table(topic_name, SCHEMA, buckets=1, kafka_format="avro")
    assert t.info.kafka_format == "avro"
    appended = t.append(rows(0, 2000))
    assert appended[0].base_offset == 0 and sum(a.record_count for a in appended) == 2000
    sr = SchemaRegistryClient({"url": broker.http_url})
    assert sr.get_latest_version(f"{topic_name}-value").schema.schema_type == "AVRO"
    de = AvroDeserializer(sr)
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    got = confluent_records(broker.bootstrap, topic_name, 1, 2000)
    assert [m.offset() for m in got] == list(range(2000))
    assert [de(m.value(), ctx) for m in got] == rows(0, 2000).to_pylist()


def test_raw_rows_with_keys_timestamps_and_headers(broker, client, topic_name):
    t = client.create_table(topic_name, buckets=1)
    assert t.schema.names == ["value"]
    when = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    headers = pa.array([[{"key": "h", "value": b"1"}], None, []],
                       pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])))
    t.append(pa.table({"value": [b"a", b"bb", None], "_key": [b"k1", None, b"k3"],
                       "_timestamp": pa.array([when] * 3, pa.timestamp("ms", tz="UTC")), "_headers": headers}))
    got = confluent_records(broker.bootstrap, topic_name, 1, 3)
    assert [(m.offset(), m.key(), m.value()) for m in got] == [(0, b"k1", b"a"), (1, None, b"bb"), (2, b"k3", None)]
    assert all(m.timestamp()[1] == int(when.timestamp() * 1000) for m in got)
    assert got[0].headers() == [("h", b"1")]
