"""follow() streams the rows appended after it started, in offset order per bucket."""
from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import fluvial.client as fc


@pytest.fixture
def client(broker):
    with fc.connect(broker.flight_url) as c:
        yield c


def follow_in_background(scan: fc.Scan, want: int, started: threading.Event) -> tuple[list, threading.Thread]:
    got: list[dict] = []

    def run():
        stream = scan.follow()
        try:
            started.set()
            for batch in stream:
                got.extend(batch.to_pylist())
                if len(got) >= want:
                    break
        finally:
            stream.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return got, thread


def test_follow_sees_kafka_records_produced_after_it_started_in_order_per_bucket(broker, client, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 3, 1)])[topic_name].result(10)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1})
    for i in range(30):  # before the follower starts: not part of what it sees
        p.produce(topic_name, key=b"old", value=f"old {i}".encode())
    assert p.flush(10) == 0

    table = client.table(topic_name)
    # Start where the log ends now, whenever the follower's streams open.
    scan = table.scan(columns=["_bucket", "_offset", "value"], start={o.bucket: o.high_watermark for o in table.offsets()})
    started = threading.Event()
    got, thread = follow_in_background(scan, 600, started)
    assert started.wait(10)
    delivered: list[tuple[int, int, bytes]] = []
    for i in range(600):
        p.produce(topic_name, key=f"k{i % 11}".encode(), value=f"new {i}".encode(),
                  on_delivery=lambda err, m: delivered.append((m.partition(), m.offset(), m.value())))
        if i % 50 == 0:
            p.flush(10)
            time.sleep(0.05)  # rows keep arriving while the follower waits
    assert p.flush(10) == 0
    thread.join(30)
    assert not thread.is_alive()
    seen = [(r["_bucket"], r["_offset"], r["value"]) for r in got]
    assert sorted(seen) == sorted(delivered)
    for bucket in range(3):
        offsets = [o for b, o, _ in seen if b == bucket]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert not any(v.startswith(b"old") for _, _, v in seen)


def test_follow_of_appended_rows_and_clean_stop(broker, client, topic_name):
    t = client.create_table(topic_name, pa.schema([("n", pa.int64())]), buckets=2)
    t.append(pa.table({"n": [-1, -2]}))
    started = threading.Event()
    start = {o.bucket: o.high_watermark for o in t.offsets()}
    got, thread = follow_in_background(t.scan(columns=["_bucket", "_offset", "n"], start=start), 100, started)
    assert started.wait(10)
    for k in range(10):
        t.append(pa.table({"n": list(range(k * 10, k * 10 + 10))}))
    thread.join(30)
    assert not thread.is_alive()
    assert sorted(r["n"] for r in got) == list(range(100))
    # The broker still serves after the follower went away.
    assert t.scan(columns=["n"]).to_arrow().num_rows == 102


def test_a_follower_learns_that_the_broker_stopped(fresh_broker):
    b = fresh_broker()
    with fc.connect(b.flight_url) as client:
        t = client.create_table("tail", pa.schema([("n", pa.int64())]))
        t.append(pa.table({"n": [1]}))
        outcome: list = []

        def run():
            try:
                for batch in t.scan(columns=["n"]).follow():
                    outcome.extend(batch.column("n").to_pylist())
            except fc.FluvialError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not outcome and time.monotonic() < deadline:
            time.sleep(0.05)
        assert outcome == [1]
        started = time.monotonic()
        assert b.stop() == 0
        assert time.monotonic() - started < 15  # the open follower does not hold the shutdown
        thread.join(10)
        assert isinstance(outcome[-1], fc.BrokerUnavailableError), outcome
