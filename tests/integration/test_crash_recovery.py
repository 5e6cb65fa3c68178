"""Everything acknowledged survives restarts and kill -9 of the broker."""
from __future__ import annotations

import collections
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


def test_kill9_under_librdkafka_idempotent_producer_into_pk_table(fresh_broker):
    """One idempotent confluent-kafka producer keeps writing upserts (each an update of one
    of 40 keys, so the changelog has more rows than the batches records) while the broker is
    killed with SIGKILL and restarted three times; the producer's in-flight batches are
    retried into the new process. No fatal error (an OUT_OF_ORDER_SEQUENCE_NUMBER answer to
    a retry would be one), every acknowledged change is in the changelog exactly once, and
    each key ends at its last acknowledged value."""
    import json

    import pyarrow as pa

    from fluvial.client import connect

    rng = random.Random(11)
    b = fresh_broker()  # stopped by the fixture, also when the test fails
    table, keys = "accounts", 40
    with connect(b.flight_url) as client:
        client.create_table(table, pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.int64())]),
                            buckets=3, kafka_format="json", primary_key=["id"])
    errors, acked, failed = [], [], []

    def on_delivery(err, msg):
        (failed if err is not None else acked).append(json.loads(msg.value()))

    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "partitioner": "murmur2_random",
                  "linger.ms": 2, "batch.num.messages": 40, "message.timeout.ms": 120_000,
                  "retry.backoff.ms": 50, "reconnect.backoff.max.ms": 200, "log_level": 2,
                  "error_cb": errors.append})
    seq = 0

    def send(n: int) -> None:
        nonlocal seq
        for _ in range(n):
            k = seq % keys
            p.produce(table, key=json.dumps({"id": k}, separators=(",", ":")).encode(),
                      value=json.dumps({"id": k, "v": seq}, separators=(",", ":")).encode(), on_delivery=on_delivery)
            seq += 1
        p.poll(0)

    for _ in range(3):
        stop_at = time.monotonic() + rng.uniform(1.0, 2.0)
        while time.monotonic() < stop_at:
            send(20)
            time.sleep(0.002)
        b.kill9()  # batches are in flight: written or not, unanswered
        send(200)  # queued while the broker is down
        b.start()
    send(100)
    assert p.flush(120) == 0
    fatal = [e for e in errors if e.fatal()]
    assert not fatal, fatal
    assert not failed, f"{len(failed)} records not delivered"
    assert len(acked) == seq

    with connect(b.flight_url) as client:
        t = client.table(table)
        log = t.scan(columns=["_change", "id", "v"]).to_arrow()
        state = {r["id"]: r["v"] for r in t.full_read().rows.to_pylist()}
    b.stop()
    changes = [(i, v) for c, i, v in zip(log["_change"].to_pylist(), log["id"].to_pylist(), log["v"].to_pylist())
               if c in (1, 3)]  # +I, +U
    counts = collections.Counter(changes)
    doubled = [c for c, n in counts.items() if n > 1]
    assert not doubled, f"{len(doubled)} changes written twice, e.g. {doubled[:5]}"
    assert set(counts) == {(r["id"], r["v"]) for r in acked}
    last = {}
    for r in acked:
        last[r["id"]] = max(last.get(r["id"], -1), r["v"])
    assert state == last
