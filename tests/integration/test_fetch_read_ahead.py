"""A consumer catching up on a raw table read from its segments (the wire cache emptied by a
restart): every record comes back as produced, in order, while the broker reads each next
megabyte ahead of the consumer's fetch."""
from __future__ import annotations

import os
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.test_metrics import Scrape

RECORDS = 4000


def test_a_catching_up_consumer_reads_every_record_as_produced(fresh_broker, topic_name):
    broker = fresh_broker()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    sent = []
    for i in range(RECORDS):
        key = None if i % 7 == 0 else f"k{i}".encode()
        value = os.urandom(1000) if i % 11 else None
        headers = [("h", f"{i}".encode())] if i % 3 == 0 else None
        producer.produce(topic_name, value=value, key=key, headers=headers)
        sent.append((i, key, value, headers or []))
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    broker.restart()  # the wire cache starts empty: every fetch reads the segments

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "read-ahead", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < RECORDS and time.monotonic() < deadline:
        for m in consumer.consume(1000, timeout=1):
            assert m.error() is None, m.error()
            got.append((m.offset(), m.key(), m.value(), m.headers() or []))
    consumer.close()
    assert got == sent
    scrape = Scrape(broker.http_url)
    used = scrape.value("fluvial_fetch_reads_ahead_total", outcome="used")
    # About 4 MB in fetches of 1 MiB: the reads after the first were read ahead.
    assert used >= 2 and scrape.value("fluvial_fetch_reads_ahead_total", outcome="started") >= used
