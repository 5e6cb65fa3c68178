"""Bad input gets the right Kafka error or a closed connection; the broker keeps serving."""
from __future__ import annotations

import socket
import struct

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.record.default_records import DefaultRecordBatchBuilder

from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, decode_response, encode_request, request_class


class RawClient:
    """Speaks the Kafka protocol over a plain socket, frame by frame."""

    def __init__(self, bootstrap: str):
        host, port = bootstrap.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.correlation = 0

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytes | None:
        head = self._read(4)
        if head is None:
            return None
        (size,) = struct.unpack(">i", head)
        return self._read(size)

    def _read(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def request(self, api_key: int, version: int, body: dict):
        self.correlation += 1
        self.send_raw(encode_request(api_key, version, self.correlation, body))
        frame = self.read_frame()
        assert frame is not None, "connection closed"
        cid, response = decode_response(api_key, version, frame)
        assert cid == self.correlation
        return response

    def is_closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def produce_body(topic: str, batch: bytes, version: int = 9) -> dict:
    R = request_class(ApiKey.PRODUCE)
    return dict(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[R.TopicProduceData(
        name=topic, partition_data=[R.TopicProduceData.PartitionProduceData(index=0, records=batch)])])


def make_batch(n: int = 3) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000 + i, key=None, value=f"v{i}".encode(), headers=[])
    return bytes(b.build())


def assert_still_serving(broker) -> None:
    c = RawClient(broker.bootstrap)
    r = c.request(ApiKey.API_VERSIONS, 3, dict(client_software_name="t", client_software_version="1"))
    assert r.error_code == 0
    c.close()


@pytest.fixture
def topic(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    return topic_name


def test_garbage_bytes_close_the_connection(broker):
    c = RawClient(broker.bootstrap)
    c.send_raw(struct.pack(">i", 12) + b"\xff" * 12)
    assert c.read_frame() is None
    assert_still_serving(broker)


def test_truncated_frame_then_disconnect(broker):
    c = RawClient(broker.bootstrap)
    full = encode_request(ApiKey.METADATA, 9, 1, dict(topics=None, allow_auto_topic_creation=False,
                                                      include_topic_authorized_operations=False))
    c.send_raw(full[: len(full) // 2])
    c.close()
    assert_still_serving(broker)


def test_oversized_frame_closes_connection(broker):
    c = RawClient(broker.bootstrap)
    c.send_raw(struct.pack(">i", 2_000_000_000))
    assert c.read_frame() is None
    assert_still_serving(broker)


def test_unknown_api_key_closes_connection(broker):
    c = RawClient(broker.bootstrap)
    c.send_raw(struct.pack(">ihhih", 10, 9999, 0, 1, -1))
    assert c.read_frame() is None
    assert_still_serving(broker)


def test_unknown_api_versions_version_answers_kip511(broker):
    c = RawClient(broker.bootstrap)
    c.send_raw(struct.pack(">ihhihb", 11, ApiKey.API_VERSIONS, 99, 5, -1, 0))
    frame = c.read_frame()
    cid, r = decode_response(ApiKey.API_VERSIONS, 0, frame)
    assert cid == 5
    assert r.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in r.api_keys] == [(18, 0, 4)]


def test_api_versions_lists_kip896_minimums(broker):
    c = RawClient(broker.bootstrap)
    r = c.request(ApiKey.API_VERSIONS, 3, dict(client_software_name="t", client_software_version="1"))
    ranges = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert ranges[ApiKey.PRODUCE][0] == 0
    assert ranges[ApiKey.FETCH][0] == 4
    assert ranges[ApiKey.LIST_OFFSETS][0] == 1
    assert ranges[ApiKey.CREATE_TOPICS][0] == 2


def test_produce_v2_is_unsupported_version(broker, topic):
    c = RawClient(broker.bootstrap)
    R = request_class(ApiKey.PRODUCE)
    body = dict(acks=1, timeout_ms=1000, topic_data=[R.TopicProduceData(
        name=topic, partition_data=[R.TopicProduceData.PartitionProduceData(index=0, records=b"")])])
    r = c.request(ApiKey.PRODUCE, 2, body)
    assert r.responses[0].partition_responses[0].error_code == ErrorCode.UNSUPPORTED_VERSION


def test_unsupported_fetch_version_closes_connection(broker):
    c = RawClient(broker.bootstrap)
    c.send_raw(struct.pack(">ihhih", 10, ApiKey.FETCH, 2, 1, -1))
    assert c.read_frame() is None
    assert_still_serving(broker)


@pytest.mark.parametrize("records", [3, 5_000])  # converted on the loop; on the executor (over 16 KiB)
def test_wrong_crc_is_corrupt_message_and_nothing_written(broker, topic, records):
    c = RawClient(broker.bootstrap)
    batch = bytearray(make_batch(records))
    batch[-1] ^= 0xFF  # flip a byte inside the CRC-covered part
    r = c.request(ApiKey.PRODUCE, 9, produce_body(topic, bytes(batch)))
    assert r.responses[0].partition_responses[0].error_code == ErrorCode.CORRUPT_MESSAGE
    good = c.request(ApiKey.PRODUCE, 9, produce_body(topic, make_batch(records)))
    pr = good.responses[0].partition_responses[0]
    assert (pr.error_code, pr.base_offset) == (0, 0)


def test_truncated_batch_is_corrupt(broker, topic):
    c = RawClient(broker.bootstrap)
    r = c.request(ApiKey.PRODUCE, 9, produce_body(topic, make_batch()[:40]))
    assert r.responses[0].partition_responses[0].error_code == ErrorCode.CORRUPT_MESSAGE
    assert_still_serving(broker)


def test_fetch_past_log_end_is_offset_out_of_range(broker, topic):
    c = RawClient(broker.bootstrap)
    c.request(ApiKey.PRODUCE, 9, produce_body(topic, make_batch()))
    F = request_class(ApiKey.FETCH)
    body = dict(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[F.FetchTopic(topic=topic, partitions=[F.FetchTopic.FetchPartition(
                    partition=0, current_leader_epoch=-1, fetch_offset=1000, log_start_offset=-1,
                    partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id="")
    r = c.request(ApiKey.FETCH, 11, body)
    pd = r.responses[0].partitions[0]
    assert pd.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert pd.high_watermark == 3


def test_unknown_topic_without_auto_creation(fresh_broker):
    b = fresh_broker("--auto-create-topics", "false")
    c = RawClient(b.bootstrap)
    r = c.request(ApiKey.PRODUCE, 9, produce_body("nope", make_batch()))
    assert r.responses[0].partition_responses[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    md = c.request(ApiKey.METADATA, 9, dict(topics=[request_class(ApiKey.METADATA).MetadataRequestTopic(name="nope")],
                                            allow_auto_topic_creation=True, include_topic_authorized_operations=False))
    assert md.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 3000})
    errors = []
    p.produce("nope", value=b"x", on_delivery=lambda err, msg: errors.append(err))
    p.flush(10)
    assert errors and errors[0] is not None


def test_invalid_topic_name_rejected(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(Exception) as info:
        admin.create_topics([NewTopic("bad/name", 1, 1)])["bad/name"].result(10)
    assert "illegal" in str(info.value).lower() or "INVALID_TOPIC" in str(info.value)


def test_describe_topic_partitions_answers_like_kafka(broker, topic):
    """Java clients (Spark's Kafka source) read the ELR lists as non-null."""
    c = RawClient(broker.bootstrap)
    R = request_class(ApiKey.DESCRIBE_TOPIC_PARTITIONS)
    r = c.request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, dict(topics=[R.TopicRequest(name=topic)],
                                                             response_partition_limit=100, cursor=None))
    part = r.topics[0].partitions[0]
    assert r.topics[0].error_code == 0 and part.leader_id == 1
    assert part.eligible_leader_replicas == [] and part.last_known_elr == []


# Offsets in a v2 batch header: attributes (int16) at 21, producer id (int64) at 43, producer
# epoch (int16) at 51, base sequence (int32) at 53. All lie inside the CRC-covered part.
def _attribute_bits(bits: int):
    return lambda batch: struct.pack_into(">h", batch, 21, struct.unpack_from(">h", batch, 21)[0] | bits)


@pytest.mark.parametrize("field,damage", [
    ("transactional bit", _attribute_bits(0x10)),
    ("unknown compression codec", _attribute_bits(0x07)),
    ("log-append-time bit", _attribute_bits(0x08)),
    ("producer id", lambda batch: struct.pack_into(">q", batch, 43, 12345)),
    ("producer id, epoch and sequence", lambda batch: struct.pack_into(">qhi", batch, 43, 777, 3, 5)),
])
@pytest.mark.parametrize("records", [3, 5_000])
def test_header_damaged_inside_the_crc_is_corrupt_message(broker, topic, records, field, damage):
    """A header field damaged on the way (inside what the CRC covers) is refused as a damaged
    batch, whatever the field would have made the broker do: CORRUPT_MESSAGE, nothing written."""
    c = RawClient(broker.bootstrap)
    batch = bytearray(make_batch(records))
    damage(batch)
    r = c.request(ApiKey.PRODUCE, 9, produce_body(topic, bytes(batch)))
    assert r.responses[0].partition_responses[0].error_code == ErrorCode.CORRUPT_MESSAGE, field
    good = c.request(ApiKey.PRODUCE, 9, produce_body(topic, make_batch(records)))
    pr = good.responses[0].partition_responses[0]
    assert (pr.error_code, pr.base_offset) == (0, 0)
    c.close()
