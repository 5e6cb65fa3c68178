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
