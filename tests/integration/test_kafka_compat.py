"""Kafka behaviours real clients rely on: commits past the log end, fetch size limits."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest
import pyarrow.flight as flight
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from kafka.admin import KafkaAdminClient, NewTopic

from fluvial.client.wire import AppendRequest
from fluvial.protocol.messages import ApiKey, request_class
from tests.integration.test_idempotence import RawClient

F = request_class(ApiKey.FETCH)


def raw_fetch(bootstrap: str, topic: str, partitions: list[int], *, max_bytes: int, partition_max_bytes: int,
              offset: int = 0) -> list[tuple[int, int]]:
    """(partition, bytes of records) of one Fetch v11 answer."""
    body = dict(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[F.FetchTopic(topic=topic, partitions=[F.FetchTopic.FetchPartition(
                    partition=i, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
                    partition_max_bytes=partition_max_bytes) for i in partitions])],
                forgotten_topics_data=[], rack_id="")
    c = RawClient(bootstrap)
    try:
        r = c.call(ApiKey.FETCH, 11, body)
    finally:
        c.close()
    assert all(p.error_code == 0 for p in r.responses[0].partitions)
    return [(p.partition_index, len(p.records or b"")) for p in r.responses[0].partitions]


def test_offset_commit_past_the_log_end_is_accepted(broker, topic_name):
    """Kafka accepts commits ahead of the data (tools reset groups to planned positions)."""
    KafkaAdminClient(bootstrap_servers=broker.bootstrap).create_topics([NewTopic(topic_name, 1, 1)])
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic_name}", "enable.auto.commit": False})
    try:
        tp = TopicPartition(topic_name, 0, 1_000_000)
        done = c.commit(offsets=[tp], asynchronous=False)
        assert done[0].error is None
        (got,) = c.committed([TopicPartition(topic_name, 0)], timeout=10)
        assert got.offset == 1_000_000
    finally:
        c.close()
    k = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=f"k-{topic_name}", enable_auto_commit=False)
    try:
        from kafka.structs import OffsetAndMetadata
        k.commit({KTP(topic_name, 0): OffsetAndMetadata(5000, "", -1)})
        assert k.committed(KTP(topic_name, 0)) == 5000
    finally:
        k.close()


def test_fetch_obeys_max_bytes_and_partition_max_bytes(broker, topic_name):
    partitions = 12
    KafkaAdminClient(bootstrap_servers=broker.bootstrap).create_topics([NewTopic(topic_name, partitions, 1)])
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, batch_size=1500, linger_ms=5)
    n = 1200
    for i in range(n):
        p.send(topic_name, value=b"%06d" % i + b"x" * 200, partition=i % partitions)
    p.flush()
    p.close()
    # Batches are ~1.5 kB: 4 kB per partition, 10 kB per response.
    sizes = raw_fetch(broker.bootstrap, topic_name, list(range(partitions)), max_bytes=10_000,
                      partition_max_bytes=4_000)
    assert sum(s for _, s in sizes) <= 10_000, sizes
    assert all(s <= 4_000 for _, s in sizes), sizes
    assert sum(1 for _, s in sizes if s) >= 2
    # Smaller limits than one batch: only the first partition returns one (larger) batch.
    sizes = raw_fetch(broker.bootstrap, topic_name, list(range(partitions)), max_bytes=500, partition_max_bytes=300)
    with_data = [s for _, s in sizes if s]
    assert len(with_data) == 1 and sizes[0][1] > 300, sizes

    # Real clients with small limits still read everything, in order.
    k = KafkaConsumer(bootstrap_servers=broker.bootstrap, fetch_max_bytes=3000, max_partition_fetch_bytes=1000,
                      auto_offset_reset="earliest", consumer_timeout_ms=15_000)
    k.assign([KTP(topic_name, i) for i in range(partitions)])
    k.seek_to_beginning()
    got = [m.value[:6] for m in k if True]
    k.close()
    assert sorted(got) == [b"%06d" % i for i in range(n)]
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"c-{topic_name}", "fetch.max.bytes": 3000,
                  "max.partition.fetch.bytes": 1000, "message.max.bytes": 3000,
                  "receive.message.max.bytes": 3000 + 512,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, i, 0) for i in range(partitions)])
    seen = []
    deadline = time.monotonic() + 60
    while len(seen) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            seen.append(m.value()[:6])
    c.close()
    assert sorted(seen) == [b"%06d" % i for i in range(n)]


def test_a_huge_appended_batch_is_fetched_in_bounded_slices(broker, topic_name):
    """One 6 MB Arrow batch appended through Flight (bypassing the client's own chunking) is
    served in slices no larger than the fetch limits, and every record arrives once."""
    KafkaAdminClient(bootstrap_servers=broker.bootstrap).create_topics([NewTopic(topic_name, 1, 1)])
    n = 6000
    values = pa.array([b"%06d" % i + b"v" * 1000 for i in range(n)], pa.binary())
    batch = pa.record_batch([values], names=["value"])
    f = flight.connect(broker.flight_url)
    writer, acks = f.do_put(flight.FlightDescriptor.for_command(AppendRequest(topic_name, 0).to_bytes()), batch.schema)
    writer.write_batch(batch)
    writer.done_writing()
    while acks.read() is not None:
        pass
    writer.close()
    f.close()
    sizes = raw_fetch(broker.bootstrap, topic_name, [0], max_bytes=1 << 20, partition_max_bytes=1 << 20)
    assert 0 < sizes[0][1] <= 1 << 20
    sizes = raw_fetch(broker.bootstrap, topic_name, [0], max_bytes=1 << 20, partition_max_bytes=1 << 20, offset=4321)
    assert 0 < sizes[0][1] <= 1 << 20
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"c-{topic_name}", "fetch.max.bytes": 1 << 20,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, 0, 0)])
    seen = []
    deadline = time.monotonic() + 60
    while len(seen) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            seen.append((m.offset(), m.value()[:6]))
    c.close()
    assert seen == [(i, b"%06d" % i) for i in range(n)]


def test_json_table_created_through_kafka_configs(broker, topic_name):
    """fluvial.value.format=json takes a JSON Schema; an Avro schema there is refused saying so."""
    import json

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin import NewTopic as CNewTopic
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
              "properties": {"id": {"type": "integer"}, "item": {"type": "string"}, "qty": {"type": ["integer", "null"]}},
              "required": ["id", "item"]}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    avro = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    bad = admin.create_topics([CNewTopic(topic_name, 1, 1, config={
        "fluvial.value.format": "json", "fluvial.value.schema": json.dumps(avro)})])[topic_name]
    with pytest.raises(Exception) as info:
        bad.result(10)
    assert "INVALID_CONFIG" in str(info.value) or "InvalidConfig" in repr(info.value)
    assert "JSON Schema" in str(info.value) and "fluvial.value.format=avro" in str(info.value)

    admin.create_topics([CNewTopic(topic_name, 1, 1, config={
        "fluvial.value.format": "json", "fluvial.value.schema": json.dumps(schema)})])[topic_name].result(10)
    sr = SchemaRegistryClient({"url": broker.http_url})
    latest = sr.get_latest_version(f"{topic_name}-value")
    assert latest.schema.schema_type == "JSON"
    ser = JSONSerializer(json.dumps(schema), sr, conf={"auto.register.schemas": False, "use.latest.version": True})
    de = JSONDeserializer(json.dumps(schema))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    docs = [{"id": i, "item": f"i{i}", "qty": None if i % 3 else i} for i in range(50)]
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for d in docs:
        p.produce(topic_name, value=ser(d, ctx), partition=0)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"j-{topic_name}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, 0, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < len(docs) and time.monotonic() < deadline:
        got.extend(de(m.value(), ctx) for m in c.consume(100, timeout=1) if m.error() is None)
    c.close()
    assert [{k: v for k, v in g.items() if v is not None} for g in got] == \
        [{k: v for k, v in d.items() if v is not None} for d in docs]
    import fluvial.client as fc
    with fc.connect(broker.flight_url) as client:
        assert client.table(topic_name).schema.names[-3:] == ["id", "item", "qty"]
