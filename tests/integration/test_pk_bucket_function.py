"""A primary-key table chooses how keys pick buckets, so producers with default settings fit it:
crc32 for librdkafka's default partitioner (confluent-kafka), murmur2 for Java and kafka-python."""
from __future__ import annotations

import zlib

import pytest
from confluent_kafka import KafkaError, Producer
from kafka import KafkaProducer

from fluvial.client import connect
from fluvial.kv.bucketing import bucket_of
from fluvial.protocol.messages import ApiKey, request_class
from tests.integration.test_idempotence import RawClient, batch
from tests.integration.test_pk_kafka import Writer, create, read_all

PARTITIONS = 4


def default_writer(broker, topic: str) -> Writer:
    """The table's Avro serializers with a producer left at librdkafka's defaults."""
    w = Writer(broker, topic)
    w.producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all"})
    return w


def test_confluent_kafka_default_partitioner_writes_a_crc32_table(broker, topic_name):
    create(broker, topic_name, PARTITIONS, **{"fluvial.bucket.function": "crc32"})
    w = default_writer(broker, topic_name)
    for i in range(40):
        w.send(i, {"id": i, "owner": f"o{i}", "balance": i})
    assert w.errors == []
    got = read_all(broker, topic_name, PARTITIONS, 40)
    assert len(got) == 40
    assert all(m.partition() == zlib.crc32(m.key()) % PARTITIONS for m in got)
    assert len({m.partition() for m in got}) == PARTITIONS
    with connect(broker.flight_url) as client:
        t = client.table(topic_name)
        assert t.info.configs["fluvial.bucket.function"] == "crc32"
        # Lookups find every key in its crc32 bucket; native upserts land where Kafka producers put them.
        rows = t.lookup([{"id": i} for i in range(45)]).to_pylist()
        assert sorted(r["id"] for r in rows) == list(range(40))
        t.upsert([{"id": 100 + i, "owner": "native", "balance": None} for i in range(20)])
    native = [m for m in read_all(broker, topic_name, PARTITIONS, 60) if m.key() not in {w.key(i) for i in range(40)}]
    assert len(native) == 20
    assert all(m.partition() == zlib.crc32(m.key()) % PARTITIONS for m in native)
    assert sorted(native, key=lambda m: m.offset())[0].key() in {w.key(100 + i) for i in range(20)}


def test_murmur2_table_takes_kafka_python_and_refuses_crc32_placement(broker, topic_name):
    create(broker, topic_name, PARTITIONS)  # murmur2 by default, as the Java client
    w = Writer(broker, topic_name)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for i in range(30):
        value = w.value_ser({"id": i, "owner": "kp", "balance": 1}, w_ctx(topic_name))
        p.send(topic_name, key=w.key(i), value=value).get(15)
    p.close()
    got = read_all(broker, topic_name, PARTITIONS, 30)
    assert len(got) == 30 and all(m.partition() == bucket_of(m.key(), PARTITIONS) for m in got)

    # librdkafka's default partitioner picks other partitions for some keys: refused, saying where.
    d = default_writer(broker, topic_name)
    wrong = next(i for i in range(100) if zlib.crc32(d.key(i)) % PARTITIONS != bucket_of(d.key(i), PARTITIONS))
    d.send(wrong, {"id": wrong, "owner": "x", "balance": 1})
    assert [e.code() for e in d.errors] == [KafkaError.INVALID_RECORD]
    # The Produce response names the expected partition and the bucket function (KIP-467).
    key = d.key(wrong)
    c = RawClient(broker.bootstrap)
    Topic = request_class(ApiKey.PRODUCE).TopicProduceData
    records = batch(-1, -1, -1, [d.value_ser({"id": wrong, "owner": "x", "balance": 1}, w_ctx(topic_name))], [key])
    r = c.call(ApiKey.PRODUCE, 9, dict(transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
        Topic(name=topic_name, partition_data=[Topic.PartitionProduceData(
            index=zlib.crc32(key) % PARTITIONS, records=records)])]))
    part = r.responses[0].partition_responses[0]
    assert part.error_code == KafkaError.INVALID_RECORD
    expected = bucket_of(key, PARTITIONS)
    assert f"belongs to partition {expected}" in part.error_message
    assert "fluvial.bucket.function=murmur2" in part.error_message
    assert part.record_errors[0].batch_index == 0
    c.close()


@pytest.mark.parametrize("configs", [{"fluvial.bucket.function": "md5"},
                                     {"fluvial.bucket.function": "crc32", "fluvial.primary.key": None}])
def test_unknown_bucket_functions_and_log_tables_are_refused(broker, topic_name, configs):
    from confluent_kafka import KafkaException
    with pytest.raises(KafkaException) as info:
        create(broker, topic_name, 2, **configs)
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG


def w_ctx(topic: str):
    from confluent_kafka.serialization import MessageField, SerializationContext
    return SerializationContext(topic, MessageField.VALUE)
