"""Everything acknowledged survives restarts and kill -9 of the broker."""
from __future__ import annotations

import random
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker_process import BrokerProcess


def read_all(bootstrap: str, topic: str, partitions: int, end_offsets: dict[int, int]) -> dict[tuple[int, int], bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[tuple[int, int], bytes] = {}
    want = sum(end_offsets.values())
    deadline = time.monotonic() + 60
    while len(got) < want and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=1):
            if m.error() is None:
                got[(m.partition(), m.offset())] = m.value()
    c.close()
    return got


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    out = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    c.close()
    return out


def test_restart_keeps_everything(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(5000):
        p.produce("restart", value=f"r{i}".encode(), key=str(i).encode(), partition=0)
    assert p.flush(30) == 0
    b.restart()
    got = read_all(b.bootstrap, "restart", 1, {0: 5000})
    assert [got[(0, i)] for i in range(5000)] == [f"r{i}".encode() for i in range(5000)]
    # A restarted broker appends after what it recovered.
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    offsets = []
    p.produce("restart", value=b"after", partition=0, on_delivery=lambda e, m: offsets.append(m.offset()))
    p.flush(10)
    assert offsets == [5000]
    b.stop()


def test_kill9_during_acks_all_produce_loses_nothing_acknowledged(tmp_path):
    rng = random.Random(7)
    b = BrokerProcess(tmp_path / "data").start()
    topic, partitions = "crash", 3
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(10)
    acked: dict[tuple[int, int], bytes] = {}
    seq = 0
    for round_ in range(4):
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 1,
                      "message.send.max.retries": 0, "message.timeout.ms": 5000,
                      "batch.num.messages": 200, "topic.metadata.refresh.interval.ms": 1000})

        def on_delivery(err, msg):
            if err is None:
                key = (msg.partition(), msg.offset())
                assert key not in acked, f"offset {key} acknowledged twice"
                acked[key] = msg.value()

        killer = threading.Timer(rng.uniform(0.8, 2.0), b.kill9)
        killer.start()
        stop_at = time.monotonic() + 3
        while time.monotonic() < stop_at:
            try:
                p.produce(topic, value=f"m{seq}".encode(), partition=seq % partitions, on_delivery=on_delivery)
                seq += 1
            except BufferError:
                pass
            p.poll(0)
        killer.join()
        p.flush(10)
        b.start()
    ends = end_offsets(b.bootstrap, topic, partitions)
    got = read_all(b.bootstrap, topic, partitions, ends)
    b.stop()
    assert acked, "nothing was acknowledged; the test did not exercise the broker"
    missing = [k for k, v in acked.items() if got.get(k) != v]
    assert not missing, f"{len(missing)} acknowledged records lost or changed, e.g. {missing[:5]}"
    values = list(got.values())
    assert len(values) == len(set(values)), "a record is stored twice"
    for part in range(partitions):
        offs = sorted(o for (pp, o) in got if pp == part)
        assert offs == list(range(len(offs)))
