"""A consumer catching up on a raw table read from its segments (the wire cache emptied by a
restart): every record comes back as produced, in order, while the broker reads each next
megabyte ahead of the consumer's fetch."""
from __future__ import annotations

import os
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from fluvial.broker.read_ahead import next_offset
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, request_class
from fluvial.protocol.records import split_batches
from tests.integration.test_metrics import Scrape
from tests.support.kafka_wire import WireClient

RECORDS = 4000


def _produce_then_restart(broker, topic: str) -> list:
    """About 4 MB of records (some without key or value, some with headers), then a restart:
    the wire cache starts empty, so every fetch reads the segments. The records sent."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    sent = []
    for i in range(RECORDS):
        key = None if i % 7 == 0 else f"k{i}".encode()
        value = os.urandom(1000) if i % 11 else None
        headers = [("h", f"{i}".encode())] if i % 3 == 0 else None
        producer.produce(topic, value=value, key=key, headers=headers)
        sent.append((i, key, value, headers or []))
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    broker.restart()
    return sent


def _consume_all(broker, topic: str) -> list:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "read-ahead", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < RECORDS and time.monotonic() < deadline:
        for m in consumer.consume(1000, timeout=1):
            assert m.error() is None, m.error()
            got.append((m.offset(), m.key(), m.value(), m.headers() or []))
    consumer.close()
    return got


def test_a_catching_up_consumer_reads_every_record_as_produced(fresh_broker, topic_name):
    broker = fresh_broker()
    sent = _produce_then_restart(broker, topic_name)
    got = _consume_all(broker, topic_name)
    assert got == sent
    scrape = Scrape(broker.http_url)
    used = scrape.value("fluvial_fetch_reads_ahead_total", outcome="used")
    # About 4 MB in fetches of 1 MiB: the reads after the first were read ahead.
    assert used >= 2 and scrape.value("fluvial_fetch_reads_ahead_total", outcome="started") >= used


def test_with_the_read_ahead_off_each_fetch_reads_for_itself(fresh_broker, topic_name):
    broker = fresh_broker("--fetch-read-ahead", "off")
    sent = _produce_then_restart(broker, topic_name)
    assert _consume_all(broker, topic_name) == sent
    assert Scrape(broker.http_url).value("fluvial_fetch_reads_ahead_total", outcome="started") == 0


def _fetch(client: WireClient, topic: str, offset: int, limit: int = 1 << 20):
    F = request_class(ApiKey.FETCH)
    body = dict(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=50 << 20, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[F.FetchTopic(topic=topic, partitions=[F.FetchTopic.FetchPartition(
                    partition=0, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
                    partition_max_bytes=limit)])], forgotten_topics_data=[], rack_id="")
    return client.request(ApiKey.FETCH, 11, body).responses[0].partitions[0]


def test_a_read_held_for_offsets_deleted_meanwhile_is_not_served(fresh_broker, topic_name):
    """DeleteRecords moves the log's start past the read held for a consumer's next fetch:
    that fetch gets OFFSET_OUT_OF_RANGE (as without the read-ahead), not the deleted records;
    fetches from the new start are served, and a fetch with another limit reads for itself."""
    broker = fresh_broker()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50, "batch.size": 400_000})
    for i in range(3000):
        producer.produce(topic_name, value=os.urandom(1000), key=f"k{i}".encode())
    assert producer.flush(60) == 0
    broker.restart()  # read from the segments

    with WireClient(broker.bootstrap) as client:
        first = _fetch(client, topic_name, 0)
        assert first.error_code == 0 and first.records
        after = next_offset(split_batches(first.records)[-1])
        assert after < first.high_watermark
        time.sleep(0.5)  # the read of `after` is held by now
        assert Scrape(broker.http_url).value("fluvial_fetch_reads_ahead_total", outcome="started") >= 1
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        deleted = admin.delete_records([TopicPartition(topic_name, 0, after + 1)])
        for future in deleted.values():
            assert future.result(timeout=30).low_watermark == after + 1
        stale = _fetch(client, topic_name, after)
        assert stale.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and not stale.records
        fresh = _fetch(client, topic_name, after + 1)
        assert fresh.error_code == 0 and fresh.log_start_offset == after + 1
        limited = _fetch(client, topic_name, after + 1, limit=512 * 1024)
        assert bytes(split_batches(limited.records)[0]) == bytes(split_batches(fresh.records)[0])
    assert Scrape(broker.http_url).value("fluvial_fetch_reads_ahead_total", outcome="used") == 0
