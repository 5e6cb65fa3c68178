"""Every reader of a log of coalesced messages, through real Kafka clients.

Several idempotent producers (each with its own codec: none, gzip, snappy, lz4, zstd)
send small acks=all batches with headers at once, so their batches share flush windows and
are stored as coalesced messages (several Kafka batches in one Arrow IPC message). After a
restart (no produced bytes cached: every fetch re-encodes from the columns) the log must
read as Kafka's would: every record as sent from any start offset (also inside a coalesced
message) and under any size limit, timestamp lookups naming the first record at or after
the time, DeleteRecords to an offset inside a coalesced message, and read_committed
consumers seeing exactly the committed transactions when transactional batches are
coalesced with others.
"""
from __future__ import annotations

import json
import random
import threading
import time

import pyarrow.flight as flight
import pyarrow.ipc as ipc
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from fluvial.broker.log.segment_format import PARTS_KEY
from tests.integration.test_clients_produce_consume import create_topic

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PER_PRODUCER = 80
BASE_TS = 1_700_000_000_000


def _coalesced_messages(broker, topic: str) -> int:
    """How many stored messages of the topic's bucket 0 hold more than one Kafka batch."""
    count = 0
    for segment in sorted((broker.data_dir / "log").glob(f"{topic}-0/*.arrows")):
        with ipc.open_stream(segment) as reader:
            for m in reader.iter_batches_with_custom_metadata():
                if (m.custom_metadata or {}).get(PARTS_KEY, b"").count(b"\n") >= 1:
                    count += 1
    return count


def _produce(bootstrap: str, topic: str, codec: str, n: int, sent: list, start: threading.Barrier) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "acks": "all",
                  "enable.idempotence": True, "linger.ms": 0, "batch.num.messages": 2})
    rng = random.Random(codec)
    start.wait()
    for i in range(n):
        key = None if i % 9 == 0 else f"{codec}-k{i % 13}".encode()
        value = f"{codec}-value-{i}-".encode() * (1 + i % 4)
        headers = [("codec", codec.encode()), ("i", str(i).encode())] if i % 2 else []
        ts = BASE_TS + rng.randrange(0, 100_000)
        sent.append((key, value, headers, ts))
        p.produce(topic, key=key, value=value, headers=headers, timestamp=ts, partition=0)
        p.poll(0)
    assert p.flush(30) == 0


def _consume(bootstrap: str, topic: str, offset: int, until: int, **config) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False,
                  **config})
    c.assign([TopicPartition(topic, 0, offset)])
    got = []
    deadline = time.monotonic() + 20
    while (not got or got[-1].offset() < until - 1) and time.monotonic() < deadline:
        for m in c.consume(500, timeout=0.5):
            assert m.error() is None, m.error()
            got.append(m)
    c.close()
    return got


def _row(m) -> tuple:
    return (m.key(), m.value(), [(k, v) for k, v in (m.headers() or [])], m.timestamp()[1])


def test_coalesced_log_reads_as_kafka_would(fresh_broker, topic_name):
    broker = fresh_broker()
    create_topic(broker.bootstrap, topic_name)
    sent: dict[str, list] = {c: [] for c in CODECS}
    start = threading.Barrier(len(CODECS))
    threads = [threading.Thread(target=_produce, args=(broker.bootstrap, topic_name, c, PER_PRODUCER, sent[c], start))
               for c in CODECS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    total = PER_PRODUCER * len(CODECS)
    assert _coalesced_messages(broker, topic_name) > 0, "no coalesced message was written"
    broker.restart()  # fetches now re-encode every batch from its stored columns

    log = _consume(broker.bootstrap, topic_name, 0, total)
    assert [m.offset() for m in log] == list(range(total))
    # Each producer's records in its order, byte for byte (headers, keys, timestamps).
    for codec in CODECS:
        mine = [_row(m) for m in log if (m.value() or b"").startswith(codec.encode() + b"-")]
        assert mine == [(k, v, h, ts) for k, v, h, ts in sent[codec]], codec

    # From offsets inside coalesced messages, and with size limits cutting them.
    for offset in (7, total // 2 + 1, total - 2):
        got = _consume(broker.bootstrap, topic_name, offset, total)
        assert [m.offset() for m in got] == list(range(offset, total)), offset
        assert [_row(m) for m in got] == [_row(m) for m in log[offset:]]
    small = _consume(broker.bootstrap, topic_name, 5, total, **{"fetch.max.bytes": 1000, "message.max.bytes": 1000,
                                                                 "max.partition.fetch.bytes": 200})
    assert [_row(m) for m in small] == [_row(m) for m in log[5:]]

    # ListOffsets by timestamp: the first record (offset order) at or after the time.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "times", "enable.auto.commit": False})
    timestamps = [m.timestamp()[1] for m in log]
    for target in sorted(random.Random(7).sample(timestamps, 25)) + [BASE_TS, BASE_TS + 50_000]:
        [found] = c.offsets_for_times([TopicPartition(topic_name, 0, target)], timeout=10)
        expected = next(o for o, ts in enumerate(timestamps) if ts >= target)
        assert found.offset == expected, (target, found.offset, expected)
    assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (0, total)

    # Table API scans: projection, a filter on a column (batch statistics are shared by
    # the Kafka batches of a coalesced message) and a start inside a coalesced message.
    import pyarrow as pa
    import pyarrow.compute as pc

    import fluvial.client as fc
    mid = timestamps[total // 2]
    with fc.connect(broker.flight_url) as client:
        table = client.table(topic_name)
        for start_at, expr, want in (
                (0, pc.field("value") >= pa.scalar(b"lz4"), [m for m in log if m.value() >= b"lz4"]),
                (7, pc.field("_timestamp") >= pa.scalar(mid, pa.timestamp("ms", tz="UTC")),
                 [m for m in log[7:] if m.timestamp()[1] >= mid])):
            got = table.scan(columns=["_offset", "value"], filter=expr, start=start_at).to_arrow()
            assert got.column("_offset").to_pylist() == [m.offset() for m in want]
            assert got.column("value").to_pylist() == [m.value() for m in want]

    # DeleteRecords to an offset inside a coalesced message.
    cut = total // 3 + 1
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    result = admin.delete_records([TopicPartition(topic_name, 0, cut)])
    [deleted] = [f.result(10) for f in result.values()]
    assert deleted.low_watermark == cut
    assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (cut, total)
    c.close()
    after = _consume(broker.bootstrap, topic_name, cut, total)
    assert [m.offset() for m in after] == list(range(cut, total))
    broker.restart()
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "times", "enable.auto.commit": False})
    assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (cut, total)
    c.close()


def _transactions(bootstrap: str, topic: str, tid: str, rounds: int, committed: list, start: threading.Barrier
                  ) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 0,
                  "batch.num.messages": 2, "transaction.timeout.ms": 60000})
    p.init_transactions(15)
    start.wait()
    for r in range(rounds):
        p.begin_transaction()
        values = [f"{tid}-{r}-{i}".encode() for i in range(6)]
        for v in values:
            p.produce(topic, value=v, headers=[("t", tid.encode())], partition=0)
            p.poll(0)
        p.flush(15)  # the aborted ones too are in the log (abort would drop unsent ones)
        if r % 2:
            p.abort_transaction(15)
        else:
            p.commit_transaction(15)
            committed.extend(values)


def _plain(bootstrap: str, topic: str, name: str, n: int, sent: list, start: threading.Barrier) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0,
                  "batch.num.messages": 1, "compression.type": "lz4"})
    start.wait()
    for i in range(n):
        v = f"{name}-{i}".encode()
        sent.append(v)
        p.produce(topic, value=v, partition=0)
        p.poll(0)
    assert p.flush(30) == 0


def _values(bootstrap: str, topic: str, isolation: str, expect: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{isolation}", "enable.auto.commit": False,
                  "isolation.level": isolation})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline, idle = time.monotonic() + 20, 0
    while time.monotonic() < deadline and (len(out) < expect or idle < 2):
        msgs = c.consume(500, timeout=0.5)
        idle = 0 if msgs else idle + 1
        for m in msgs:
            assert m.error() is None, m.error()
            out.append(m.value())
    c.close()
    return out


def test_read_committed_over_transactions_coalesced_with_other_producers(fresh_broker, topic_name):
    broker = fresh_broker()
    create_topic(broker.bootstrap, topic_name)
    committed: dict[str, list] = {"tx-a": [], "tx-b": []}
    plain: dict[str, list] = {"p1": [], "p2": [], "p3": []}
    start = threading.Barrier(len(committed) + len(plain))
    threads = [threading.Thread(target=_transactions, args=(broker.bootstrap, topic_name, t, 4, committed[t], start))
               for t in committed]
    threads += [threading.Thread(target=_plain, args=(broker.bootstrap, topic_name, n, 40, plain[n], start))
                for n in plain]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert _coalesced_messages(broker, topic_name) > 0, "no coalesced message was written"
    expected = sorted(v for vs in (*committed.values(), *plain.values()) for v in vs)
    everything = sum(len(v) for v in plain.values()) + 2 * 4 * 6
    assert sorted(_values(broker.bootstrap, topic_name, "read_committed", len(expected))) == expected
    broker.restart()  # the transaction index is rebuilt from the segments
    assert sorted(_values(broker.bootstrap, topic_name, "read_committed", len(expected))) == expected
    assert len(_values(broker.bootstrap, topic_name, "read_uncommitted", everything)) == everything


def test_no_coalescing_without_the_ack_flush_policy(fresh_broker, topic_name):
    """Under flush policy ``interval`` each Kafka batch stays a message of its own (nothing
    waits for a flush window), and the records read back as sent."""
    broker = fresh_broker("--flush-policy", "interval")
    create_topic(broker.bootstrap, topic_name)
    sent: dict[str, list] = {c: [] for c in CODECS[:3]}
    start = threading.Barrier(len(sent))
    threads = [threading.Thread(target=_produce, args=(broker.bootstrap, topic_name, c, 40, sent[c], start))
               for c in sent]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    log = _consume(broker.bootstrap, topic_name, 0, 40 * len(sent))
    for codec in sent:
        mine = [_row(m) for m in log if (m.value() or b"").startswith(codec.encode() + b"-")]
        assert mine == [(k, v, h, ts) for k, v, h, ts in sent[codec]], codec
    broker.stop()
    assert _coalesced_messages(broker, topic_name) == 0


def _updates(bootstrap: str, topic: str, name: str, keys: range, latest: dict, lock: threading.Lock,
             start: threading.Barrier) -> None:
    def done(err, msg):
        assert err is None, err
        with lock:
            latest[msg.key()] = (msg.offset(), msg.value())

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0,
                  "batch.num.messages": 2})
    start.wait()
    for r in range(4):
        for k in keys:
            # Every fourth key of the last round is deleted (a tombstone).
            value = None if r == 3 and k % 4 == 0 else b"%s-%d-%d" % (name.encode(), k, r)
            p.produce(topic, key=b"key-%03d" % k, value=value, partition=0, on_delivery=done)
            p.poll(0)
    assert p.flush(30) == 0


def _compact(broker, topic: str) -> dict:
    """One forced cleaning pass (the table API's compact action)."""
    client = flight.connect(broker.flight_url)
    try:
        [result] = client.do_action(flight.Action("compact", json.dumps({"table": topic}).encode()))
    finally:
        client.close()
    return json.loads(result.body.to_pybytes())


def test_compaction_of_coalesced_messages_with_tombstones(fresh_broker, topic_name):
    from tests.integration.test_compaction import create_compacted

    broker = fresh_broker("--log-cleaner-backoff-ms", "3600000")
    create_compacted(broker.bootstrap, topic_name, **{"delete.retention.ms": "3000"})
    latest: dict = {}
    lock = threading.Lock()
    start = threading.Barrier(3)
    threads = [threading.Thread(target=_updates, args=(broker.bootstrap, topic_name, f"p{n}",
                                                       range(n * 30, n * 30 + 30), latest, lock, start))
               for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert _coalesced_messages(broker, topic_name) > 0, "no coalesced message was written"
    end = 4 * 90

    def compacted() -> dict:
        got = _consume(broker.bootstrap, topic_name, 0, end)
        out: dict = {}
        for m in got:
            assert m.key() not in out, f"{m.key()} kept twice"
            out[m.key()] = (m.offset(), m.value())
        return out

    cleaned = time.monotonic()
    _compact(broker, topic_name)
    # One record per key, at its offset, tombstones kept (for delete.retention.ms).
    assert compacted() == latest
    time.sleep(max(0.0, cleaned + 3.2 - time.monotonic()))
    _compact(broker, topic_name)
    assert compacted() == {k: v for k, v in latest.items() if v[1] is not None}
