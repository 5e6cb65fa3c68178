"""Kafka transactions: markers are the broker's alone, and what clients see of them."""
from __future__ import annotations

import struct

import crc32c
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, request_class
from tests.integration.test_bad_input import RawClient, make_batch, produce_body

CONTROL = 0x20
TRANSACTIONAL = 0x10


def with_attributes(batch: bytes, bits: int, pid: int = -1, epoch: int = -1) -> bytes:
    """The batch with attribute bits (and producer) set and its CRC-32C recomputed."""
    b = bytearray(batch)
    (attrs,) = struct.unpack_from(">h", b, 21)
    struct.pack_into(">h", b, 21, attrs | bits)
    if pid >= 0:
        struct.pack_into(">qh", b, 43, pid, epoch)
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))
    return bytes(b)


def end_offset(client: RawClient, topic: str) -> int:
    R = request_class(ApiKey.LIST_OFFSETS)
    r = client.request(ApiKey.LIST_OFFSETS, 5, dict(replica_id=-1, isolation_level=0, topics=[R.ListOffsetsTopic(
        name=topic, partitions=[R.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=-1)])]))
    return r.topics[0].partitions[0].offset


@pytest.fixture
def topic(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    return topic_name


def test_client_control_batches_are_refused(broker, topic):
    c = RawClient(broker.bootstrap)
    # A forged commit marker (and a forged transactional one), nothing is stored.
    for bits in (CONTROL, CONTROL | TRANSACTIONAL):
        r = c.request(ApiKey.PRODUCE, 9, produce_body(topic, with_attributes(make_batch(1), bits)))
        part = r.responses[0].partition_responses[0]
        assert part.error_code == ErrorCode.INVALID_RECORD, part
    assert end_offset(c, topic) == 0
    # Ordinary batches still go in.
    r = c.request(ApiKey.PRODUCE, 9, produce_body(topic, make_batch(2)))
    assert r.responses[0].partition_responses[0].error_code == 0
    assert end_offset(c, topic) == 2
    c.close()


# -- real clients ---------------------------------------------------------------------------


def _producer(bootstrap: str, tid: str, **extra) -> "Producer":
    from confluent_kafka import Producer
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5,
                     "transaction.timeout.ms": 60000, **extra})


def _consume(bootstrap: str, topic: str, isolation: str, expect: int | None = None, timeout: float = 10.0
             ) -> list[bytes]:
    import time as _time
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{isolation}-{_time.time_ns()}",
                  "isolation.level": isolation, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = _time.monotonic() + timeout
    idle = 0
    while _time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            idle += 1
            if expect is not None and len(out) >= expect and idle >= 2:
                break
            continue
        idle = 0
        if m.error():
            continue
        out.append(m.value())
    c.close()
    return out


def test_commit_abort_and_isolation(broker, topic):
    from confluent_kafka import Consumer, TopicPartition
    p = _producer(broker.bootstrap, f"tx-{topic}")
    p.init_transactions(15)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=b"c1-%d" % i)
    p.commit_transaction(15)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=b"a-%d" % i)
    p.flush(10)
    p.abort_transaction(15)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=b"c2-%d" % i)
    # send_offsets_to_transaction: the group's offset appears only with the commit.
    group = f"g-{topic}"
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], consumer.consumer_group_metadata(), 15)
    committed = consumer.committed([TopicPartition(topic, 0)], 10)
    assert committed[0].offset < 0  # held by the open transaction
    p.commit_transaction(15)
    committed = consumer.committed([TopicPartition(topic, 0)], 10)
    assert committed[0].offset == 7
    consumer.close()

    values = _consume(broker.bootstrap, topic, "read_committed", expect=20)
    assert values == [b"c1-%d" % i for i in range(10)] + [b"c2-%d" % i for i in range(10)]
    values = _consume(broker.bootstrap, topic, "read_uncommitted", expect=25)
    assert sorted(values) == sorted([b"c1-%d" % i for i in range(10)] + [b"a-%d" % i for i in range(5)]
                                    + [b"c2-%d" % i for i in range(10)])

    # An open transaction holds read_committed readers at its first offset.
    p.begin_transaction()
    p.produce(topic, value=b"open")
    p.flush(10)
    c = RawClient(broker.bootstrap)
    R = request_class(ApiKey.LIST_OFFSETS)
    r = c.request(ApiKey.LIST_OFFSETS, 5, dict(replica_id=-1, isolation_level=1, topics=[R.ListOffsetsTopic(
        name=topic, partitions=[R.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=-1)])]))
    lso = r.topics[0].partitions[0].offset
    assert lso < end_offset(c, topic)
    assert b"open" not in _consume(broker.bootstrap, topic, "read_committed", expect=20, timeout=4)
    p.abort_transaction(15)
    c.close()


def test_zombie_is_fenced(broker, topic):
    from confluent_kafka import KafkaException
    tid = f"zombie-{topic}"
    old = _producer(broker.bootstrap, tid)
    old.init_transactions(15)
    old.begin_transaction()
    old.produce(topic, value=b"zombie")
    old.flush(10)
    new = _producer(broker.bootstrap, tid)
    new.init_transactions(15)   # aborts the old instance's transaction, bumps the epoch
    new.begin_transaction()
    new.produce(topic, value=b"live")
    new.commit_transaction(15)
    with pytest.raises(KafkaException) as raised:
        old.produce(topic, value=b"zombie-2")
        old.commit_transaction(15)
    assert raised.value.args[0].fatal() or "fenced" in str(raised.value).lower()
    assert _consume(broker.bootstrap, topic, "read_committed", expect=1) == [b"live"]


def _call(c: RawClient, key: int, version: int, **body):
    return c.request(key, version, body)


def test_bad_transactional_requests(broker, topic):
    c = RawClient(broker.bootstrap)
    tid = f"bad-{topic}"
    r = _call(c, ApiKey.INIT_PRODUCER_ID, 4, transactional_id=tid, transaction_timeout_ms=10 ** 9,
              producer_id=-1, producer_epoch=-1)
    assert r.error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    r = _call(c, ApiKey.INIT_PRODUCER_ID, 4, transactional_id=tid, transaction_timeout_ms=30000,
              producer_id=-1, producer_epoch=-1)
    assert r.error_code == 0
    pid, epoch = r.producer_id, r.producer_epoch
    # Unknown producer id, wrong epochs (PRODUCER_FENCED from v2 of EndTxn, INVALID_PRODUCER_EPOCH before).
    assert _call(c, ApiKey.END_TXN, 3, transactional_id=tid, producer_id=pid + 1000, producer_epoch=epoch,
                 committed=True).error_code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert _call(c, ApiKey.END_TXN, 3, transactional_id=tid, producer_id=pid, producer_epoch=epoch + 1,
                 committed=True).error_code == ErrorCode.PRODUCER_FENCED
    assert _call(c, ApiKey.END_TXN, 1, transactional_id=tid, producer_id=pid, producer_epoch=epoch + 1,
                 committed=True).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    # Committing nothing is an invalid state transition.
    assert _call(c, ApiKey.END_TXN, 3, transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                 committed=True).error_code == ErrorCode.INVALID_TXN_STATE
    # A transactional batch to a partition not added to the transaction: refused, nothing stored.
    batch = with_attributes(make_batch(2), TRANSACTIONAL, pid, epoch)
    body = produce_body(topic, batch)
    body["transactional_id"] = tid
    part = c.request(ApiKey.PRODUCE, 9, body).responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.INVALID_TXN_STATE
    assert end_offset(c, topic) == 0
    # TxnOffsetCommit: to a group the transaction did not add, and to an unknown group with a generation.
    TR = request_class(ApiKey.TXN_OFFSET_COMMIT)
    topics = [TR.TxnOffsetCommitRequestTopic(name=topic, partitions=[
        TR.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
            partition_index=0, committed_offset=5, committed_leader_epoch=-1, committed_metadata="")])]
    r = _call(c, ApiKey.TXN_OFFSET_COMMIT, 3, transactional_id=tid, group_id="nogroup", producer_id=pid,
              producer_epoch=epoch, generation_id=3, member_id="m", group_instance_id=None, topics=topics)
    assert r.topics[0].partitions[0].error_code == ErrorCode.INVALID_TXN_STATE
    assert _call(c, ApiKey.ADD_OFFSETS_TO_TXN, 3, transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                 group_id="nogroup").error_code == 0
    r = _call(c, ApiKey.TXN_OFFSET_COMMIT, 3, transactional_id=tid, group_id="nogroup", producer_id=pid,
              producer_epoch=epoch, generation_id=3, member_id="m", group_instance_id=None, topics=topics)
    assert r.topics[0].partitions[0].error_code == ErrorCode.ILLEGAL_GENERATION
    r = _call(c, ApiKey.TXN_OFFSET_COMMIT, 3, transactional_id=tid, group_id="nogroup", producer_id=pid,
              producer_epoch=epoch + 1, generation_id=-1, member_id="", group_instance_id=None, topics=topics)
    assert r.topics[0].partitions[0].error_code == ErrorCode.PRODUCER_FENCED
    # Describe / List show the open transaction; the abort applies nothing.
    d = _call(c, ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=[tid, "missing"])
    assert d.transaction_states[0].transaction_state == "Ongoing"
    assert d.transaction_states[1].error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    ls = _call(c, ApiKey.LIST_TRANSACTIONS, 1, state_filters=["Ongoing"], producer_id_filters=[pid],
               duration_filter=-1)
    assert [s.transactional_id for s in ls.transaction_states] == [tid]
    assert _call(c, ApiKey.END_TXN, 3, transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                 committed=False).error_code == 0
    OF = request_class(ApiKey.OFFSET_FETCH)
    r = _call(c, ApiKey.OFFSET_FETCH, 5, group_id="nogroup", topics=None, require_stable=False)
    assert all(p.committed_offset < 0 for t in r.topics for p in t.partitions)
    c.close()


def _consume_all(bootstrap: str, topic: str, isolation: str, partitions: int, settle: float = 3.0) -> list[bytes]:
    import time as _time
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"k-{_time.time_ns()}", "isolation.level": isolation,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
    out, eof, quiet_since = [], set(), _time.monotonic()
    deadline = _time.monotonic() + 20
    while _time.monotonic() < deadline:
        m = c.poll(0.3)
        if m is None:
            if len(eof) == partitions and _time.monotonic() - quiet_since > settle:
                break
            continue
        if m.error():
            eof.add(m.partition())
            continue
        quiet_since = _time.monotonic()
        out.append(m.value())
    c.close()
    return out


def test_kill9_mid_transaction_and_mid_commit(fresh_broker, monkeypatch):
    """Rounds of: a commit killed after its prepare or after its first marker (completed after
    restart), and an open transaction killed before its commit (aborted by its timeout)."""
    from confluent_kafka import KafkaException
    b = fresh_broker("--transaction-max-timeout-ms", "60000")
    topic = "txcrash"
    c = RawClient(b.bootstrap)
    r = c.request(ApiKey.INIT_PRODUCER_ID, 4, dict(transactional_id="long", transaction_timeout_ms=60001,
                                                   producer_id=-1, producer_epoch=-1))
    assert r.error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT   # transaction.max.timeout.ms
    c.close()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(10)
    rounds = [("commit-prepared", 0), ("commit-marker", 1), ("commit-marker", 2)]
    for point, i in rounds:
        # An open transaction that never commits; then a commit killed at `point`.
        open_p = _producer(b.bootstrap, f"open-{i}", **{"transaction.timeout.ms": 3000})
        open_p.init_transactions(15)
        open_p.begin_transaction()
        for k in range(6):
            open_p.produce(topic, value=b"x%d-%d" % (i, k), partition=k % 2)
        open_p.flush(10)
        b.kill9()
        monkeypatch.setenv("FLUVIAL_TXN_CRASH_AT", point)
        b.start()
        monkeypatch.delenv("FLUVIAL_TXN_CRASH_AT")
        p = _producer(b.bootstrap, "committer", **{"message.timeout.ms": 8000})
        p.init_transactions(15)
        p.begin_transaction()
        for k in range(10):
            p.produce(topic, value=b"r%d-%d" % (i, k), partition=k % 2)
        p.flush(10)
        with pytest.raises(KafkaException):
            p.commit_transaction(4)   # the broker dies in the middle of it
        b.proc.wait(10)
        b.proc = None
        b.start()
        del p, open_p
    import time as _time
    _time.sleep(4)  # the last open transaction's timeout passes
    committed = _consume_all(b.bootstrap, topic, "read_committed", 2)
    # Every commit that was prepared is completed after the restart, whole; no aborted record shows.
    assert sorted(committed) == sorted(b"r%d-%d" % (i, k) for _, i in rounds for k in range(10))
    everything = _consume_all(b.bootstrap, topic, "read_uncommitted", 2)
    assert {v for v in everything if v.startswith(b"x")} == {b"x%d-%d" % (i, k) for _, i in rounds for k in range(6)}


def test_table_scans_read_committed(broker, topic):
    """Native (Arrow Flight) scans: committed rows only, no markers, nothing past an open
    transaction; read_uncommitted on the wire shows aborted rows too."""
    from fluvial import client as fc
    from fluvial.client.wire import ScanRequest
    import pyarrow.flight as flight

    p = _producer(broker.bootstrap, f"scan-{topic}")
    p.init_transactions(15)
    for label, commit in (("c1", True), ("ab", False), ("c2", True)):
        p.begin_transaction()
        for i in range(4):
            p.produce(topic, value=f"{label}-{i}".encode())
        p.flush(10)
        (p.commit_transaction if commit else p.abort_transaction)(15)
    p.begin_transaction()
    p.produce(topic, value=b"open-0")
    p.flush(10)
    p2 = _producer(broker.bootstrap, f"scan2-{topic}")
    p2.init_transactions(15)
    p2.begin_transaction()
    p2.produce(topic, value=b"after-open")
    p2.commit_transaction(15)
    with fc.connect(broker.flight_url) as c:
        values = c.table(topic).scan(columns=["value"]).to_arrow().column("value").to_pylist()
    assert values == [f"c1-{i}".encode() for i in range(4)] + [f"c2-{i}".encode() for i in range(4)]
    raw = flight.connect(broker.flight_url)
    reader = raw.do_get(flight.Ticket(ScanRequest(topic, 0, ["value"], isolation="read_uncommitted").to_bytes()))
    every = reader.read_all().column("value").to_pylist()
    assert b"ab-0" in every and b"open-0" in every and b"after-open" in every
    assert all(v is None or not v.startswith(b"\x00\x00\x00") for v in every)  # no marker rows
    p.commit_transaction(15)
    with fc.connect(broker.flight_url) as c:
        values = c.table(topic).scan(columns=["value"]).to_arrow().column("value").to_pylist()
    assert values[-2:] == [b"open-0", b"after-open"]


def test_following_scan_started_before_the_first_transaction_reads_committed(broker, topic):
    """A follow() scan opened on a bucket that never held a transaction keeps read_committed
    when the bucket's first transaction begins meanwhile: aborted rows never reach it."""
    import threading

    from confluent_kafka import Producer

    from fluvial import client as fc
    from tests.integration.test_flight_follow import follow_in_background

    with fc.connect(broker.flight_url) as c:
        started = threading.Event()
        got, thread = follow_in_background(c.table(topic).scan(columns=["value"]), 5, started)
        assert started.wait(10)
        plain = Producer({"bootstrap.servers": broker.bootstrap})
        plain.produce(topic, value=b"plain-0")
        plain.flush(10)
        p = _producer(broker.bootstrap, f"follow-{topic}")
        p.init_transactions(15)
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, value=b"aborted-%d" % i)
        p.flush(10)
        import time as _time
        _time.sleep(1)                # the follower looks while the transaction is open
        p.abort_transaction(15)
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, value=b"committed-%d" % i)
        p.commit_transaction(15)
        plain.produce(topic, value=b"plain-1")
        plain.flush(10)
        thread.join(20)
    values = [r["value"] for r in got]
    assert values == [b"plain-0", b"committed-0", b"committed-1", b"committed-2", b"plain-1"]


def test_primary_key_table_applies_only_committed_transactions(fresh_broker, topic_name):
    """Aborted upserts never reach lookups, scans or the changelog; committed ones do, also
    when the broker is killed (-9) between the produce and the commit."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from fluvial.client import connect
    from tests.integration.test_pk_kafka import Writer, create, read_all

    b = fresh_broker()
    create(b, topic_name, partitions=1)
    w = Writer(b, topic_name)
    w.producer = _producer(b.bootstrap, f"pk-{topic_name}", partitioner="murmur2_random")
    w.producer.init_transactions(15)

    def txn(rows: dict, commit: bool) -> None:
        w.producer.begin_transaction()
        for i, balance in rows.items():
            w.producer.produce(topic_name, key=w.key(i), value=None if balance is None else w.value_ser(
                {"id": i, "owner": f"o{i}", "balance": balance},
                SerializationContext(topic_name, MessageField.VALUE)))
        w.producer.flush(10)
        (w.producer.commit_transaction if commit else w.producer.abort_transaction)(15)

    txn({1: 10, 2: 20}, True)
    txn({1: 999, 3: 30, 2: None}, False)    # aborted: an update, an insert, a delete
    # Held across a kill -9: the transaction is open, then a new producer instance aborts it.
    w.producer.begin_transaction()
    w.producer.produce(topic_name, key=w.key(4), value=w.value_ser(
        {"id": 4, "owner": "o4", "balance": 40}, SerializationContext(topic_name, MessageField.VALUE)))
    w.producer.flush(10)
    b.kill9()
    b.start()
    w.producer = _producer(b.bootstrap, f"pk-{topic_name}", partitioner="murmur2_random")
    w.producer.init_transactions(15)
    txn({5: 50, 1: 11}, True)
    with connect(b.flight_url) as client:
        t = client.table(topic_name)
        rows = sorted(t.lookup([{"id": i} for i in range(1, 6)]).to_pylist(), key=lambda r: r["id"])
        assert [(r["id"], r["balance"]) for r in rows] == [(1, 11), (2, 20), (5, 50)]
        scanned = t.scan(columns=["id", "balance"]).to_arrow().to_pylist()
        assert {r["balance"] for r in scanned} <= {10, 20, 11, 50}
    changelog = read_all(b, f"{topic_name}.changelog", 1, 5, timeout=10)
    de = AvroDeserializer(SchemaRegistryClient({"url": b.http_url}))  # the restarted broker's registry
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    balances = [de(m.value(), ctx)["balance"] for m in changelog if m.value() is not None]
    assert 999 not in balances and 30 not in balances and 40 not in balances
    assert 11 in balances and 50 in balances


def test_committed_pk_transaction_applies_exactly_once_across_kill9_mid_apply(fresh_broker, topic_name,
                                                                             monkeypatch):
    """An aggregation table counts every applied write: a commit killed (-9) between applying
    two held batches of a bucket is completed after the restart without applying the first
    one again, and a later transaction of the same producer is not steered by that one's
    progress."""
    import json

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from fluvial.client import connect
    from tests.integration.test_pk_retract import create_topic, lookup_all
    from tests.support.changelog_join import T1_AVRO

    b = fresh_broker()
    create_topic(b, topic_name, **{"fluvial.merge.engine": "aggregation", "fluvial.agg.level": "sum"})
    sr = SchemaRegistryClient({"url": b.http_url})
    latest = {"auto.register.schemas": False, "use.latest.version": True}
    key_ser, value_ser = AvroSerializer(sr, None, conf=latest), AvroSerializer(sr, json.dumps(T1_AVRO), conf=latest)

    def send(p, i: int, level: int) -> None:
        p.produce(topic_name, key=key_ser({"id": i}, SerializationContext(topic_name, MessageField.KEY)),
                  value=value_ser({"id": i, "level": level, "attr": "a"},
                                  SerializationContext(topic_name, MessageField.VALUE)))

    def two_held_batches(p, first: int, second: int) -> None:
        p.begin_transaction()
        for i in (1, 2):
            send(p, i, first)
        p.flush(10)              # one held batch ...
        for i in (1, 2):
            send(p, i, second)
        p.flush(10)              # ... and a second one, in the same bucket

    p = _producer(b.bootstrap, f"agg-{topic_name}", partitioner="murmur2_random")
    p.init_transactions(15)
    two_held_batches(p, 1, 10)
    b.kill9()                       # restart with the crash point armed for the commit's apply
    monkeypatch.setenv("FLUVIAL_TXN_CRASH_AT", "pk-apply")
    b.start()
    monkeypatch.delenv("FLUVIAL_TXN_CRASH_AT")
    p = _producer(b.bootstrap, f"agg2-{topic_name}", partitioner="murmur2_random", **{"message.timeout.ms": 8000})
    p.init_transactions(15)
    two_held_batches(p, 100, 1000)
    with pytest.raises(Exception):
        p.commit_transaction(4)      # the broker dies after applying the first held batch
    b.proc.wait(10)
    b.proc = None
    b.start()                       # the prepared commit is completed: the second batch only
    import time as _time
    expected = {1: (1, 1100, "a"), 2: (2, 1100, "a")}
    with connect(b.flight_url) as client:
        deadline = _time.monotonic() + 15   # the restarted broker completes it in the background
        while (rows := lookup_all(client, topic_name, [1, 2])) != expected and _time.monotonic() < deadline:
            _time.sleep(0.2)
        assert rows == expected
        _time.sleep(1)
        assert lookup_all(client, topic_name, [1, 2]) == expected   # and not once more later
    # The same producer's next transaction applies whole.
    p = _producer(b.bootstrap, f"agg2-{topic_name}", partitioner="murmur2_random")
    p.init_transactions(15)
    two_held_batches(p, 5, 7)
    p.commit_transaction(15)
    with connect(b.flight_url) as client:
        assert lookup_all(client, topic_name, [1, 2]) == {1: (1, 1112, "a"), 2: (2, 1112, "a")}


def test_index_survives_restart_and_deleted_records_and_ids_expire(fresh_broker, topic_name):
    """The aborted-transaction index is rebuilt after kill -9, also once records before it are
    deleted; an idle transactional id is forgotten after transactional.id.expiration.ms."""
    import time as _time
    from confluent_kafka import TopicPartition as TP

    b = fresh_broker("--transactional-id-expiration-ms", "3000")
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    p = _producer(b.bootstrap, "expiring")
    p.init_transactions(15)
    for label, commit in (("old", True), ("ab1", False), ("mid", True), ("ab2", False), ("new", True)):
        p.begin_transaction()
        for i in range(3):
            p.produce(topic_name, value=f"{label}-{i}".encode())
        p.flush(10)
        (p.commit_transaction if commit else p.abort_transaction)(15)
    c = RawClient(b.bootstrap)
    assert c.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, dict(transactional_ids=["expiring"])
                     ).transaction_states[0].error_code == 0   # idle for less than the expiration
    c.close()
    # Delete the first committed and the first aborted transaction's records (offsets 0-7).
    admin.delete_records([TP(topic_name, 0, 8)])[TP(topic_name, 0, 8)].result(10)
    b.kill9()
    b.start()
    values = _consume(b.bootstrap, topic_name, "read_committed", expect=6)
    assert values == [b"mid-0", b"mid-1", b"mid-2", b"new-0", b"new-1", b"new-2"]
    assert b"ab2-0" in _consume(b.bootstrap, topic_name, "read_uncommitted", expect=9)
    c = RawClient(b.bootstrap)
    deadline = _time.monotonic() + 15
    while _time.monotonic() < deadline:
        state = c.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, dict(transactional_ids=["expiring"])).transaction_states[0]
        if state.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
            break
        _time.sleep(0.5)
    assert state.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    c.close()


def test_transactions_v2_implicit_adds_and_epoch_bump(broker, topic):
    """KIP-890 part 2 on the wire: ApiVersions finalizes transaction.version 2; Produce v12
    adds the partition itself; EndTxn v5 bumps the epoch (its retry gets the same answer)
    and the old epoch is fenced."""
    c = RawClient(broker.bootstrap)
    av = c.request(ApiKey.API_VERSIONS, 3, dict(client_software_name="t", client_software_version="1"))
    assert [(f.name, f.max_version_level) for f in av.finalized_features] == [("transaction.version", 2)]
    assert {k.api_key: k.max_version for k in av.api_keys}[ApiKey.PRODUCE] >= 12
    tid = f"v2-{topic}"
    r = c.request(ApiKey.INIT_PRODUCER_ID, 5, dict(transactional_id=tid, transaction_timeout_ms=30000,
                                                   producer_id=-1, producer_epoch=-1))
    pid, epoch = r.producer_id, r.producer_epoch
    body = produce_body(topic, with_attributes(make_batch(2), TRANSACTIONAL, pid, epoch))
    body["transactional_id"] = tid
    assert c.request(ApiKey.PRODUCE, 12, body).responses[0].partition_responses[0].error_code == 0
    d = c.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, dict(transactional_ids=[tid])).transaction_states[0]
    assert d.transaction_state == "Ongoing" and [t.topic for t in d.topics] == [topic]
    end = dict(transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=True)
    r = c.request(ApiKey.END_TXN, 5, end)
    assert (r.error_code, r.producer_id, r.producer_epoch) == (0, pid, epoch + 1)
    r = c.request(ApiKey.END_TXN, 5, end)          # the retry of a completed commit
    assert (r.error_code, r.producer_epoch) == (0, epoch + 1)
    # The old epoch is fenced; the new one starts a transaction with sequence 0.
    body = produce_body(topic, with_attributes(make_batch(1), TRANSACTIONAL, pid, epoch))
    body["transactional_id"] = tid
    assert c.request(ApiKey.PRODUCE, 12, body).responses[0].partition_responses[0].error_code in (
        ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED)
    assert _consume(broker.bootstrap, topic, "read_committed", expect=2) == [b"v0", b"v1"]
    c.close()


def test_compaction_drops_aborted_records_and_stops_at_open_transactions(fresh_broker, topic_name):
    from fluvial import client as fc

    b = fresh_broker()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1, config={
        "cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01"})]
    )[topic_name].result(10)
    pad = b"-" * 200

    def txn(p, label: bytes, commit: bool | None, keys=range(20)) -> None:
        p.begin_transaction()
        for k in keys:
            p.produce(topic_name, key=b"k%d" % k, value=label + pad)
        p.flush(10)
        if commit is not None:
            (p.commit_transaction if commit else p.abort_transaction)(15)

    p = _producer(b.bootstrap, "compact-a")
    p.init_transactions(15)
    txn(p, b"c", True)
    txn(p, b"a", False)
    opener = _producer(b.bootstrap, "compact-open")
    opener.init_transactions(15)
    txn(opener, b"open", None, keys=[0])          # left open while the table is compacted
    txn(p, b"later", True, keys=range(100, 140))  # closes the segments before it
    with fc.connect(b.flight_url) as c:
        c._action("compact", {"table": topic_name})
    opener.abort_transaction(15)
    with fc.connect(b.flight_url) as c:
        c._action("compact", {"table": topic_name})
    everything = _consume_all(b.bootstrap, topic_name, "read_uncommitted", 1)
    assert not any(v.startswith(b"a-") for v in everything)   # aborted records removed
    committed = _consume_all(b.bootstrap, topic_name, "read_committed", 1)
    assert sorted(v for v in committed if v.startswith(b"c-")) == [b"c" + pad] * 20  # every key's committed value
