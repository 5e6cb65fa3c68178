"""Real Kafka clients produce to and consume from Fluvial unchanged."""
from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KPTopicPartition
from kafka.admin import KafkaAdminClient, NewTopic as KPNewTopic

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def records(n: int, prefix: str = "") -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    out = []
    for i in range(n):
        key = None if i % 7 == 0 else f"{prefix}key-{i}".encode()
        # A null value only with a key: kafka-python refuses records with neither.
        value = None if i % 11 == 5 and key is not None else (f"{prefix}value-{i}-".encode() * (1 + i % 5))
        headers = [("h1", f"v{i}".encode()), ("empty", b"")] if i % 3 == 0 else []
        out.append((key, value, headers))
    return out


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])
    fs[name].result(15)


def confluent_consume_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 30) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=1.0):
            assert m.error() is None, m.error()
            got.append(m)
    c.close()
    return got


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_confluent_kafka_round_trip(broker, topic_name, codec, acks):
    create_topic(broker.bootstrap, topic_name)
    sent = records(500, prefix=codec)
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec, "acks": acks,
                  "linger.ms": 5, "batch.num.messages": 100})
    base_ts = 1_700_000_000_000
    for i, (k, v, h) in enumerate(sent):
        p.produce(topic_name, key=k, value=v, headers=h, timestamp=base_ts + i, partition=0)
    assert p.flush(30) == 0
    got = confluent_consume_all(broker.bootstrap, topic_name, 1, len(sent))
    assert len(got) == len(sent)
    for i, m in enumerate(got):
        k, v, h = sent[i]
        assert m.offset() == i
        assert m.key() == k
        assert m.value() == v
        assert (m.headers() or []) == h
        assert m.timestamp()[1] == base_ts + i


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_round_trip(broker, topic_name, codec):
    prod = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec, acks="all", linger_ms=5)
    sent = records(300, prefix=str(codec))
    futures = [prod.send(topic_name, key=k, value=v, headers=h, partition=0, timestamp_ms=1_600_000_000_000 + i)
               for i, (k, v, h) in enumerate(sent)]
    prod.flush()
    offsets = [f.get(10).offset for f in futures]
    assert offsets == list(range(len(sent)))
    prod.close()
    cons = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    tp = KPTopicPartition(topic_name, 0)
    cons.assign([tp])
    cons.seek_to_beginning(tp)
    got = [m for m in cons][: len(sent)]
    cons.close()
    assert [(m.key, m.value, list(m.headers)) for m in got] == [(k, v, h) for k, v, h in sent]
    assert [m.timestamp for m in got] == [1_600_000_000_000 + i for i in range(len(sent))]


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_aiokafka_round_trip(broker, topic_name, codec):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATP

    sent = records(300, prefix=f"aio{codec}")

    async def run():
        prod = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec, acks="all")
        await prod.start()
        try:
            for i, (k, v, h) in enumerate(sent):
                await prod.send(topic_name, key=k, value=v, headers=h, partition=0, timestamp_ms=1_650_000_000_000 + i)
            await prod.flush()
        finally:
            await prod.stop()
        cons = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
        await cons.start()
        try:
            tp = ATP(topic_name, 0)
            cons.assign([tp])
            await cons.seek_to_beginning(tp)
            got = []
            while len(got) < len(sent):
                batch = await asyncio.wait_for(cons.getmany(tp, timeout_ms=1000), 20)
                got.extend(batch.get(tp, []))
            return got
        finally:
            await cons.stop()

    got = asyncio.run(run())
    assert [(m.key, m.value, list(m.headers)) for m in got] == [(k, v, h) for k, v, h in sent]
    assert [m.offset for m in got] == list(range(len(sent)))


def test_seek_by_offset_and_timestamp(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, partitions=3)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(300):
        p.produce(topic_name, value=f"v{i}".encode(), partition=i % 3, timestamp=2_000_000_000_000 + i * 10)
        if i % 50 == 0:
            p.flush()
    p.flush()
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "seek", "enable.auto.commit": False})
    # Timestamp lookup: the first record at or after the timestamp, per partition.
    wanted = [TopicPartition(topic_name, part, 2_000_000_000_000 + 1505) for part in range(3)]
    found = c.offsets_for_times(wanted, timeout=10)
    for tp in found:
        # records i with i % 3 == part and i*10 >= 1505 -> i >= 151
        first_i = next(i for i in range(151, 300) if i % 3 == tp.partition)
        assert tp.offset == first_i // 3
    # Past every timestamp: no such offset (-1 from the broker -> end).
    late = c.offsets_for_times([TopicPartition(topic_name, 0, 3_000_000_000_000)], timeout=10)
    assert late[0].offset in (-1,)
    lo, hi = c.get_watermark_offsets(TopicPartition(topic_name, 1), timeout=10)
    assert (lo, hi) == (0, 100)
    c.assign([TopicPartition(topic_name, 1, 42)])
    msgs = []
    while len(msgs) < 5:
        msgs.extend(m for m in c.consume(5, timeout=2) if m.error() is None)
    c.close()
    assert msgs[0].offset() == 42
    assert msgs[0].value() == f"v{42 * 3 + 1}".encode()


def test_many_partitions_and_several_clients(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, partitions=24)
    producers = [Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2}) for _ in range(3)]
    for n, p in enumerate(producers):
        for i in range(2400):
            p.produce(topic_name, value=f"p{n}-{i}".encode(), partition=i % 24)
    for p in producers:
        assert p.flush(30) == 0
    got = confluent_consume_all(broker.bootstrap, topic_name, 24, 3 * 2400)
    values = sorted(m.value() for m in got)
    assert values == sorted(f"p{n}-{i}".encode() for n in range(3) for i in range(2400))
    per_partition = {}
    for m in got:
        per_partition.setdefault(m.partition(), []).append(m.offset())
    assert all(offs == list(range(len(offs))) for offs in per_partition.values())


def test_admin_create_describe_delete(broker, topic_name):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([KPNewTopic(topic_name, 4, 1, topic_configs={"retention.ms": "3600000"})])
    assert topic_name in admin.list_topics()
    described = admin.describe_topics([topic_name])
    assert len(described[0]["partitions"]) == 4
    admin.delete_topics([topic_name])
    assert topic_name not in admin.list_topics()
    admin.close()
    ca = AdminClient({"bootstrap.servers": broker.bootstrap})
    md = ca.list_topics(timeout=10)
    assert topic_name not in md.topics
    assert md.cluster_id
