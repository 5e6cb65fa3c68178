"""Consumer groups with kafka-python and aiokafka: share partitions, commit, resume."""
from __future__ import annotations

import asyncio
import threading
import time

from aiokafka import AIOKafkaConsumer
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for v in values:
        p.send(topic, key=v.encode(), value=v.encode())
    p.flush(30)
    p.close()


def test_kafka_python_group_shares_partitions_and_resumes_from_commits(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 4)
    group = f"g-{topic_name}"
    first = [f"a-{i}" for i in range(400)]
    produce(broker.bootstrap, topic_name, first)

    seen: dict[str, list[str]] = {"m0": [], "m1": []}
    assignments: dict[str, set] = {}
    stop = threading.Event()

    def member(name: str) -> None:
        c = KafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=group,
                          auto_offset_reset="earliest", enable_auto_commit=False,
                          session_timeout_ms=10_000, heartbeat_interval_ms=500)
        while not stop.is_set():
            batch = c.poll(timeout_ms=200)
            for records in batch.values():
                seen[name].extend(r.value.decode() for r in records)
            if batch:
                c.commit()
            assignments[name] = {tp.partition for tp in c.assignment()}
        c.close()

    threads = [threading.Thread(target=member, args=(n,)) for n in seen]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (len(seen["m0"]) + len(seen["m1"]) < 400
                                           or len(assignments) < 2 or not all(assignments.values())):
        time.sleep(0.2)
    # Settled: both members hold two partitions each.
    time.sleep(1)
    stop.set()
    for t in threads:
        t.join(30)
    assert set(seen["m0"]) | set(seen["m1"]) == set(first)
    assert sorted(assignments["m0"] | assignments["m1"]) == [0, 1, 2, 3]
    assert not assignments["m0"] & assignments["m1"]

    # A later member of the same group starts from the committed offsets: only new records.
    second = [f"b-{i}" for i in range(100)]
    produce(broker.bootstrap, topic_name, second)
    c = KafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=group,
                      auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=8000)
    got = [r.value.decode() for r in c]
    committed = {p: c.committed(TopicPartition(topic_name, p)) for p in range(4)}
    c.close()
    assert sorted(got) == sorted(second)
    assert sum(v for v in committed.values()) == 400  # nothing committed by the last reader


def test_aiokafka_group_consumes_commits_and_resumes(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 3)
    group = f"g-{topic_name}"
    values = [f"x-{i}" for i in range(300)]
    produce(broker.bootstrap, topic_name, values)

    async def consume_until(count: int, members: int) -> list[str]:
        consumers = [AIOKafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=group,
                                      auto_offset_reset="earliest", enable_auto_commit=False,
                                      session_timeout_ms=10_000, heartbeat_interval_ms=500)
                     for _ in range(members)]
        got: list[str] = []
        for c in consumers:
            await c.start()
        try:
            deadline = time.monotonic() + 60
            while len(got) < count and time.monotonic() < deadline:
                for c in consumers:
                    batch = await c.getmany(timeout_ms=200)
                    for records in batch.values():
                        got.extend(r.value.decode() for r in records)
                    if batch:
                        await c.commit()
            await asyncio.sleep(0.5)
            for c in consumers:
                batch = await c.getmany(timeout_ms=200)
                got.extend(r.value.decode() for records in batch.values() for r in records)
        finally:
            for c in consumers:
                await c.stop()
        return got

    got = asyncio.run(consume_until(300, 2))
    assert sorted(got) == sorted(values)
    more = [f"y-{i}" for i in range(50)]
    produce(broker.bootstrap, topic_name, more)
    again = asyncio.run(consume_until(50, 1))
    assert sorted(again) == sorted(more)
