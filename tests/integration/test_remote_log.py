"""Internal tiering end to end: closed segments go to the object store (a local folder, or a
real moto_server S3 process), local copies are deleted, and Kafka clients still read every
offset from 0, byte-identical; timestamps, DeleteRecords, faults and crashes."""
from __future__ import annotations

import json
import time

import pyarrow.flight as flight
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

TIERED_CONFIGS = {"segment.bytes": "16384", "local.retention.ms": "0", "remote.storage.enable": "true"}
FAST = ["--remote-log-manager-interval-ms", "150", "--retention-check-interval-ms", "150"]


@pytest.fixture(params=["local", "s3"])
def store_args(request):
    """Broker arguments naming the object store: the default local folder, or moto_server S3."""
    if request.param == "local":
        return []
    server = request.getfixturevalue("moto_s3")
    return server.broker_args(server.create_bucket())


def action(broker, kind: str, body: dict):
    client = flight.FlightClient(broker.flight_url)
    try:
        [result] = list(client.do_action(flight.Action(kind, json.dumps(body).encode())))
        return json.loads(result.body.to_pybytes())
    finally:
        client.close()


def create(broker, topic: str, partitions: int = 1, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config={**TIERED_CONFIGS, **configs})])[topic].result(10)


# Recent timestamps: retention.ms (7 days by default) covers the remote log too.
BASE_TS = (int(time.time()) - 3600) * 1000


def produce(broker, topic: str, n: int, *, partition: int = 0, start: int = 0, base_ts: int = BASE_TS,
            **extra) -> list[tuple]:
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2, "acks": "all", **extra})
    sent = []
    for i in range(start, start + n):
        key, value = f"k{i}".encode(), (f"value-{i}-" + "x" * (i % 50)).encode()
        headers = [("h", f"{i}".encode())] if i % 3 == 0 else None
        p.produce(topic, key=key, value=value, headers=headers, partition=partition, timestamp=base_ts + i * 10)
        sent.append((key, value, headers, base_ts + i * 10))
    assert p.flush(30) == 0
    return sent


def wait_tiered(broker, topic: str, *, bucket: int = 0, local_start_above: int = 0, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = action(broker, "status", {"name": topic})["buckets"][bucket]
        if status["remote"]["segments"] and status["local"]["start_offset"] > local_start_above:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing was tiered: {status}")
        time.sleep(0.1)


def consume_confluent(broker, topic: str, partition: int, start, count: int) -> list:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g", "enable.auto.commit": False,
                  "max.partition.fetch.bytes": 16384})
    c.assign([TopicPartition(topic, partition, start)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append((m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]))
    c.close()
    return got


def consume_kafka_python(broker, topic: str, partition: int, count: int) -> list:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=16384)
    tp = KTP(topic, partition)
    c.assign([tp])
    c.seek_to_beginning(tp)
    got = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        for records in c.poll(500).values():
            got.extend((r.offset, r.key, r.value, r.headers or None, r.timestamp) for r in records)
    c.close()
    return got


def expected(sent: list, first: int = 0) -> list:
    return [(i, k, v, h, ts) for i, (k, v, h, ts) in enumerate(sent) if i >= first]


def test_kafka_clients_read_tiered_offsets_byte_identical(fresh_broker, store_args, topic_name):
    broker = fresh_broker(*store_args, *FAST)
    create(broker, topic_name)
    sent = produce(broker, topic_name, 3000, **{"compression.type": "lz4"})
    status = wait_tiered(broker, topic_name, local_start_above=1000)
    assert status["log_start_offset"] == 0 and status["high_watermark"] == 3000
    assert status["remote"]["start_offset"] == 0 and status["remote"]["end_offset"] >= status["local"]["start_offset"]
    want = expected(sent)
    assert consume_confluent(broker, topic_name, 0, 0, 3000) == want
    assert [(o, k, v, list(h) if h else None, ts) for o, k, v, h, ts in consume_kafka_python(broker, topic_name, 0, 3000)] \
        == [(o, k, v, h, ts) for o, k, v, h, ts in want]

    # Earliest is the remote log start; a timestamp seek lands in remote data.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ts"})
    low, high = c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)
    assert (low, high) == (0, 3000)
    [found] = c.offsets_for_times([TopicPartition(topic_name, 0, BASE_TS + 123 * 10 - 5)], timeout=10)
    assert found.offset == 123
    c.close()
    assert consume_confluent(broker, topic_name, 0, 123, 5) == want[123:128]

    # The remote-segments action tells a native reader where the data is.
    body = action(broker, "remote-segments", {"name": topic_name, "bucket": 0, "start": 0})
    assert body["segments"][0]["base_offset"] == 0 and body["local_start_offset"] == status["local"]["start_offset"] \
        or body["local_start_offset"] >= status["local"]["start_offset"]
    assert "secret_access_key" not in json.dumps(body)
