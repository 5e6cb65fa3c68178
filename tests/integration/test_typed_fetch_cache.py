"""Fetches of a typed (Avro) table: batches re-encoded once are served again byte for byte."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

import fluvial.client as fc

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
                    pa.field("score", pa.float64())])


def rows(start: int, n: int) -> pa.Table:
    ids = range(start, start + n)
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [None if i % 5 == 0 else f"n{i}" for i in ids],
                     "score": [i / 3 for i in ids]}, schema=SCHEMA)


@pytest.fixture
def client(broker):
    with fc.connect(broker.flight_url) as c:
        yield c


def read(bootstrap: str, topic: str, start: int, n: int, timeout: float = 60) -> list[tuple[int, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "typed-fetch-cache", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, start)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got.extend((m.offset(), m.value()) for m in c.consume(5000, timeout=1) if m.error() is None)
    c.close()
    return got


def test_rereads_from_start_and_from_inside_a_batch_get_the_same_avro_bytes(broker, client, topic_name):
    t = client.create_table(topic_name, SCHEMA, buckets=1, kafka_format="avro")
    for start in range(0, 3000, 1000):  # three stored batches, never produced through Kafka
        t.append(rows(start, 1000))
    first = read(broker.bootstrap, topic_name, 0, 3000)   # re-encoded from the columns
    second = read(broker.bootstrap, topic_name, 0, 3000)  # the same batches again
    assert [o for o, _ in first] == list(range(3000))
    assert second == first
    # From inside the second batch: its records from there on, then the third batch.
    assert read(broker.bootstrap, topic_name, 1500, 1500) == first[1500:]
    de = AvroDeserializer(SchemaRegistryClient({"url": broker.http_url}))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    assert [de(v, ctx) for _, v in second] == rows(0, 3000).to_pylist()
