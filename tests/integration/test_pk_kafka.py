"""Primary-key tables on the Kafka path: keyed upserts and tombstones with confluent-kafka,
the upsert stream on the topic, the full changelog on `<table>.changelog`, refusals."""
from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from fluvial.client import connect
from fluvial.kv.bucketing import bucket_of

VALUE_SCHEMA = {"type": "record", "name": "Account", "fields": [
    {"name": "id", "type": "long"}, {"name": "owner", "type": "string"},
    {"name": "balance", "type": ["null", "long"], "default": None}]}


def create(broker, name: str, partitions: int = 3, **configs) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    cfg = {"fluvial.value.format": "avro", "fluvial.value.schema": json.dumps(VALUE_SCHEMA),
           "fluvial.primary.key": "id", **configs}
    admin.create_topics([NewTopic(name, partitions, 1, config=cfg)])[name].result(10)


class Writer:
    """A confluent-kafka producer with the table's Avro key and value serializers."""

    def __init__(self, broker, topic: str):
        self.sr = SchemaRegistryClient({"url": broker.http_url})
        latest = {"auto.register.schemas": False, "use.latest.version": True}
        self.key_ser = AvroSerializer(self.sr, None, conf=latest)
        self.value_ser = AvroSerializer(self.sr, json.dumps(VALUE_SCHEMA), conf=latest)
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random",
                                  "linger.ms": 0, "acks": "all"})
        self.errors: list = []

    def key(self, i: int) -> bytes:
        return self.key_ser({"id": i}, SerializationContext(self.topic, MessageField.KEY))

    def send(self, i: int, row: dict | None, **kw) -> None:
        value = None if row is None else self.value_ser(row, SerializationContext(self.topic, MessageField.VALUE))
        self.producer.produce(self.topic, key=self.key(i), value=value,
                              on_delivery=lambda e, m: self.errors.append(e) if e else None, **kw)
        self.producer.flush(15)


def read_all(broker, topic: str, partitions: int, expect: int, timeout: float = 30) -> list:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        got += [m for m in c.consume(100, timeout=0.5) if m.error() is None]
    time.sleep(0.3)
    got += [m for m in c.consume(100, timeout=0.5) if m.error() is None]
    c.close()
    return got


def change(m) -> str:
    return dict(m.headers())["fluvial.change"].decode()


def test_upserts_and_tombstones_give_upsert_stream_changelog_and_lookups(broker, topic_name):
    create(broker, topic_name)
    w = Writer(broker, topic_name)
    w.send(1, {"id": 1, "owner": "ann", "balance": 10})
    w.send(2, {"id": 2, "owner": "bob", "balance": 20})
    w.send(1, {"id": 1, "owner": "ann", "balance": 15})
    w.send(1, None)
    w.send(3, {"id": 3, "owner": "cy", "balance": None})
    w.send(3, {"id": 3, "owner": "cy", "balance": None})  # the same row again: no change
    assert w.errors == []

    de = AvroDeserializer(w.sr)
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    upserts = read_all(broker, topic_name, 3, 5)
    by_key = {}
    for m in sorted(upserts, key=lambda m: (m.partition(), m.offset())):
        by_key.setdefault(m.key(), []).append((change(m), None if m.value() is None else de(m.value(), ctx)))
    assert by_key[w.key(1)] == [("+I", {"id": 1, "owner": "ann", "balance": 10}),
                                ("+U", {"id": 1, "owner": "ann", "balance": 15}), ("-D", None)]
    assert by_key[w.key(2)] == [("+I", {"id": 2, "owner": "bob", "balance": 20})]
    assert by_key[w.key(3)] == [("+I", {"id": 3, "owner": "cy", "balance": None})]
    # Each key sits in the partition the Java partitioner gives its key bytes.
    for m in upserts:
        assert m.partition() == bucket_of(m.key(), 3)

    changelog = read_all(broker, f"{topic_name}.changelog", 3, 7)
    k1 = sorted((m for m in changelog if m.key() == w.key(1)), key=lambda m: m.offset())
    assert [change(m) for m in k1] == ["+I", "-U", "+U", "-D"]
    assert [de(m.value(), ctx)["balance"] for m in k1] == [10, 10, 15, 15]
    assert len(changelog) == 6

    with connect(broker.flight_url) as client:
        t = client.table(topic_name)
        rows = t.lookup([{"id": 1}, {"id": 2}, {"id": 3}, {"id": 4}]).to_pylist()
        assert sorted(rows, key=lambda r: r["id"]) == [{"id": 2, "owner": "bob", "balance": 20},
                                                       {"id": 3, "owner": "cy", "balance": None}]


def test_record_in_the_wrong_partition_is_refused(broker, topic_name):
    create(broker, topic_name)
    w = Writer(broker, topic_name)
    right = bucket_of(w.key(7), 3)
    w.send(7, {"id": 7, "owner": "x", "balance": 1}, partition=(right + 1) % 3)
    assert [e.code() for e in w.errors] == [KafkaError.INVALID_RECORD]
    w.errors.clear()
    w.send(7, {"id": 7, "owner": "x", "balance": 1}, partition=right)
    assert w.errors == []
    with connect(broker.flight_url) as client:
        assert [o.high_watermark for o in client.table(topic_name).offsets()] == [
            1 if b == right else 0 for b in range(3)]


def test_bad_records_are_refused_and_nothing_is_applied(broker, topic_name):
    create(broker, topic_name, partitions=1)
    w = Writer(broker, topic_name)
    row = w.value_ser({"id": 5, "owner": "e", "balance": 1}, SerializationContext(topic_name, MessageField.VALUE))
    p = w.producer
    errors = []

    def send(**kw):
        p.produce(topic_name, on_delivery=lambda e, m: errors.append(e), **kw)
        p.flush(15)

    send(key=None, value=row)  # no key
    send(key=w.key(6), value=row)  # the key names another row than the value
    send(key=b'{"id": 5}', value=row)  # not the table's key format
    assert [e.code() if e else None for e in errors] == [KafkaError.INVALID_RECORD] * 3
    with connect(broker.flight_url) as client:
        t = client.table(topic_name)
        assert [o.high_watermark for o in t.offsets()] == [0]
        assert t.lookup([{"id": 5}]).num_rows == 0


def test_changelog_topic_is_read_only_and_buckets_fixed(broker, topic_name):
    create(broker, topic_name, partitions=2)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    errors = []
    p.produce(f"{topic_name}.changelog", key=b"k", value=b"v", on_delivery=lambda e, m: errors.append(e))
    p.flush(15)
    assert errors[0] is not None and errors[0].code() == KafkaError.TOPIC_EXCEPTION
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(Exception, match="cannot change its bucket count"):
        admin.create_partitions([NewPartitions(topic_name, 4)])[topic_name].result(10)
    with pytest.raises(Exception, match="reserved suffix"):
        admin.create_topics([NewTopic("other.changelog", 1, 1)])["other.changelog"].result(10)


@pytest.mark.parametrize("configs, message", [
    ({"fluvial.primary.key": "nope"}, "not columns of the table"),
    ({"fluvial.merge.engine": "versioned"}, "needs a version column"),
    ({"fluvial.merge.engine": "versioned", "fluvial.version.column": "owner"}, "must be an integer"),
    ({"fluvial.primary.key": "id", "fluvial.bucket.key": "owner"}, "prefix of the primary key"),
    ({"fluvial.value.format": "raw", "fluvial.value.schema": None}, "needs typed values"),
])
def test_bad_table_definitions_are_refused(broker, topic_name, configs, message):
    cfg = {"fluvial.value.format": "avro", "fluvial.value.schema": json.dumps(VALUE_SCHEMA),
           "fluvial.primary.key": "id", **configs}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(Exception, match=message):
        admin.create_topics([NewTopic(topic_name, 1, 1, config=cfg)])[topic_name].result(10)


def test_json_key_is_the_compact_object_of_key_columns_in_schema_order(broker, topic_name):
    schema = {"type": "record", "name": "Line", "fields": [
        {"name": "order", "type": "long"}, {"name": "note", "type": "string"}, {"name": "line", "type": "int"}]}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 2, 1, config={
        "fluvial.value.format": "avro", "fluvial.value.schema": json.dumps(schema), "fluvial.key.format": "json",
        "fluvial.primary.key": "line,order"})])[topic_name].result(10)
    with connect(broker.flight_url) as client:
        client.table(topic_name).upsert([{"order": 7, "note": "x", "line": 2}])
    got = read_all(broker, topic_name, 2, 1)
    assert [m.key() for m in got] == [b'{"order":7,"line":2}']
    assert got[0].partition() == bucket_of(b'{"order":7,"line":2}', 2)
