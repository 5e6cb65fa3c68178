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
