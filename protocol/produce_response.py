"""Produce responses (v3-11) framed by hand.

Many small producers send thousands of single-batch produce requests per second, and
building and encoding kafka-python's message objects for each answer cost about as much as
appending the record. The bytes written here are exactly kafka-python's encoding of the
same response (tests/unit/test_produce_response.py checks that for every version).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from fluvial.protocol.messages import RequestHeader

FIRST_VERSION = 3
LAST_VERSION = 12  # v12 (KIP-890): the v11 layout; a transactional batch may add its partition
# Produce v9+ is flexible: compact arrays/strings and tagged-field sections.
FIRST_FLEXIBLE = 9

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_PARTITION = struct.Struct(">ihqq")  # index, error code, base offset, log append time


@dataclass(slots=True)
class ProducedPartition:
    """One partition's answer to a produce request."""

    index: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    # (batch index, message) of the records that made the batch fail (v8+).
    record_errors: list[tuple[int, str | None]] = field(default_factory=list)
    error_message: str | None = None


def _uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _string(out: bytearray, text: str | None, flexible: bool, nullable: bool) -> None:
    if text is None:
        if not nullable:
            raise ValueError("a null string where the protocol needs one")
        out += b"\x00" if flexible else b"\xff\xff"
        return
    data = text.encode("utf-8")
    if flexible:
        _uvarint(out, len(data) + 1)
    else:
        out += _I16.pack(len(data))
    out += data


def _array_length(out: bytearray, n: int, flexible: bool) -> None:
    if flexible:
        _uvarint(out, n + 1)
    else:
        out += _I32.pack(n)


# (version, topic) -> (a Struct packing a whole one-partition answer: size, correlation id,
# the bytes before the partition's fields, its fields, the bytes after them; those bytes).
_ONE_PARTITION: dict[tuple[int, str], tuple[struct.Struct, bytes, bytes]] = {}
_ONE_PARTITION_LIMIT = 4096


def _one_partition_struct(version: int, topic: str) -> tuple[struct.Struct, bytes, bytes]:
    flexible = version >= FIRST_FLEXIBLE
    head = bytearray()
    if flexible:
        head.append(0)
    _array_length(head, 1, flexible)
    _string(head, topic, flexible, nullable=False)
    _array_length(head, 1, flexible)
    tail = bytearray()
    if version >= 8:
        _array_length(tail, 0, flexible)  # no record errors
        _string(tail, None, flexible, nullable=True)  # no error message
    if flexible:
        tail += b"\x00\x00"  # partition and topic tags
    tail += _I32.pack(0)  # throttle time
    if flexible:
        tail.append(0)
    fields = "ihqq" + ("q" if version >= 5 else "")
    return struct.Struct(f">ii{len(head)}s{fields}{len(tail)}s"), bytes(head), bytes(tail)


def _encode_one_partition(version: int, correlation_id: int, topic: str, p: ProducedPartition) -> bytes:
    """The common answer of a small producer (one topic, one partition, no record errors,
    no message): one struct pack with the constant parts built once per (version, topic)."""
    key = (version, topic)
    hit = _ONE_PARTITION.get(key)
    if hit is None:
        if len(_ONE_PARTITION) >= _ONE_PARTITION_LIMIT:
            _ONE_PARTITION.clear()
        hit = _ONE_PARTITION[key] = _one_partition_struct(version, topic)
    packer, head, tail = hit
    if version >= 5:
        return packer.pack(packer.size - 4, correlation_id, head, p.index, p.error_code, p.base_offset,
                           p.log_append_time_ms, p.log_start_offset, tail)
    return packer.pack(packer.size - 4, correlation_id, head, p.index, p.error_code, p.base_offset,
                       p.log_append_time_ms, tail)


def encode_accepted(header: RequestHeader, topic: str, p: ProducedPartition) -> bytes:
    """`encode_produce_response` of one topic's one partition accepted (no error code,
    record errors or message: asserted by the caller), at a Produce v3-12 request's version."""
    return _encode_one_partition(header.api_version, header.correlation_id, topic, p)


def encode_produce_response(header: RequestHeader, topics: list[tuple[str, list[ProducedPartition]]],
                            throttle_time_ms: int = 0) -> bytes:
    """The framed response (size, correlation id, header tags, body) for the request `header`."""
    version = header.api_version
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Produce v{version} responses are not encoded here")
    if len(topics) == 1 and throttle_time_ms == 0:
        name, partitions = topics[0]
        if len(partitions) == 1:
            p = partitions[0]
            if not p.record_errors and p.error_message is None:
                return _encode_one_partition(version, header.correlation_id, name, p)
    flexible = version >= FIRST_FLEXIBLE
    out = bytearray(8)  # size and correlation id, filled below
    if flexible:
        out.append(0)  # response header v1: no tagged fields
    _array_length(out, len(topics), flexible)
    for name, partitions in topics:
        _string(out, name, flexible, nullable=False)
        _array_length(out, len(partitions), flexible)
        for p in partitions:
            out += _PARTITION.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms)
            if version >= 5:
                out += _I64.pack(p.log_start_offset)
            if version >= 8:
                _array_length(out, len(p.record_errors), flexible)
                for batch_index, message in p.record_errors:
                    out += _I32.pack(batch_index)
                    _string(out, message, flexible, nullable=True)
                    if flexible:
                        out.append(0)
                _string(out, p.error_message, flexible, nullable=True)
            if flexible:
                out.append(0)  # partition tags (current leader is sent only with NOT_LEADER)
        if flexible:
            out.append(0)
    out += _I32.pack(throttle_time_ms)
    if flexible:
        out.append(0)
    struct.pack_into(">ii", out, 0, len(out) - 4, header.correlation_id)
    return bytes(out)
