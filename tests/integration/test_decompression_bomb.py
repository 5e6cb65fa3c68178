"""A produced batch whose records decompress past the limit is refused; the broker keeps serving."""
from __future__ import annotations

import socket
import struct

import cramjam
import crc32c
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.record.default_records import DefaultRecordBatchBuilder

from fluvial.protocol.compression import MAX_DECOMPRESSED_BYTES
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, decode_response, encode_request, request_class

HEADER_SIZE = 61
CRC_START = 21


def zstd_bomb_batch() -> bytes:
    """A one-record v2 batch, zstd-compressed, whose records section expands past the limit."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=1_700_000_000_000, key=None, value=b"v", headers=[])
    header = bytearray(bytes(b.build())[:HEADER_SIZE])
    compressor = cramjam.zstd.Compressor()
    zeros = bytes(1 << 20)
    for _ in range(MAX_DECOMPRESSED_BYTES // len(zeros) + 8):
        compressor.compress(zeros)
    records = bytes(compressor.finish())
    batch = header + records
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    (attributes,) = struct.unpack_from(">h", batch, CRC_START)
    struct.pack_into(">h", batch, CRC_START, (attributes & ~0x07) | 4)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[CRC_START:])))
    return bytes(batch)


def request(sock: socket.socket, api_key: int, version: int, body: dict):
    sock.sendall(encode_request(api_key, version, 1, body))
    (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
    return decode_response(api_key, version, sock.recv(size, socket.MSG_WAITALL))[1]


def test_decompression_bomb_is_message_too_large(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    host, port = broker.bootstrap.split(":")
    R = request_class(ApiKey.PRODUCE)
    bomb = zstd_bomb_batch()
    assert len(bomb) < 100_000
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        body = dict(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[R.TopicProduceData(
            name=topic_name, partition_data=[R.TopicProduceData.PartitionProduceData(index=0, records=bomb)])])
        pr = request(sock, ApiKey.PRODUCE, 9, body).responses[0].partition_responses[0]
        assert pr.error_code == ErrorCode.MESSAGE_TOO_LARGE
        # Nothing was written, and the same connection is still answered.
        L = request_class(ApiKey.LIST_OFFSETS)
        r = request(sock, ApiKey.LIST_OFFSETS, 7, dict(replica_id=-1, isolation_level=0, topics=[
            L.ListOffsetsTopic(name=topic_name, partitions=[L.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=-1)])]))
        assert r.topics[0].partitions[0].offset == 0
