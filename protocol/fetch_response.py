"""Fetch responses (v4-17) framed by hand, the record batches passed through without copies.

Every other message goes through kafka-python's classes (docs/architecture.md, "Protocol
codec"); Fetch is answered several hundred times a second by tailing consumers and carries
megabytes to catching-up ones, so its body is written here: about ten times cheaper than
building and encoding the message objects, and the batches are never joined or copied
into an encode buffer. The bytes are exactly kafka-python's encoding of the same response.
"""
from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field

from fluvial.protocol.messages import RequestHeader

# Fetch v12+ is flexible: compact arrays/strings/bytes and tagged-field sections.
FIRST_FLEXIBLE = 12
FIRST_TOPIC_ID = 13

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION = struct.Struct(">ihq")  # index, error code, high watermark
_I64 = struct.Struct(">q")


@dataclass(slots=True)
class FetchedPartition:
    """One partition's answer; `records` are whole v2 batches, sent back to back."""

    partition_index: int
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: list[bytes] = field(default_factory=list)
    # read_committed: (producer id, first offset) of aborted transactions in the range.
    aborted: list[tuple[int, int]] | None = None


@dataclass(slots=True)
class EncodedResponse:
    """A response already framed (size prefix and header included), as chunks to write in order."""

    chunks: list[bytes | bytearray]

    def to_bytes(self) -> bytes:
        return b"".join(self.chunks)


def _uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def encode_fetch_response(header: RequestHeader, *, throttle_time_ms: int, error_code: int, session_id: int,
                          topics: list[tuple[str | uuid.UUID, list[FetchedPartition]]]) -> EncodedResponse:
    """Frame a Fetch response for the request `header` (its version and correlation id).

    `topics` pairs each topic's name (v4-12) or id (v13+) with its partitions. Aborted
    transactions are always null (no transactions), the preferred read replica -1, and
    no tagged fields are set.
    """
    version = header.api_version
    flexible = version >= FIRST_FLEXIBLE
    by_id = version >= FIRST_TOPIC_ID
    chunks: list[bytes | bytearray] = []
    # Room for the size prefix, patched at the end.
    buf = bytearray(4)
    buf += _I32.pack(header.correlation_id)
    if flexible:
        buf.append(0)  # response header v1: no tagged fields
    buf += _I32.pack(throttle_time_ms)
    if version >= 7:
        buf += _I16.pack(error_code)
        buf += _I32.pack(session_id)
    if flexible:
        _uvarint(buf, len(topics) + 1)
    else:
        buf += _I32.pack(len(topics))
    size = 0
    for topic, partitions in topics:
        if by_id:
            buf += topic.bytes
        else:
            name = topic.encode()
            if flexible:
                _uvarint(buf, len(name) + 1)
            else:
                buf += _I16.pack(len(name))
            buf += name
        if flexible:
            _uvarint(buf, len(partitions) + 1)
        else:
            buf += _I32.pack(len(partitions))
        for p in partitions:
            buf += _PARTITION.pack(p.partition_index, p.error_code, p.high_watermark)
            buf += _I64.pack(p.last_stable_offset)
            if version >= 5:
                buf += _I64.pack(p.log_start_offset)
            aborted = p.aborted
            if aborted is None:
                if flexible:
                    buf.append(0)
                else:
                    buf += _I32.pack(-1)
            else:
                if flexible:
                    _uvarint(buf, len(aborted) + 1)
                else:
                    buf += _I32.pack(len(aborted))
                for producer_id, first_offset in aborted:
                    buf += _I64.pack(producer_id)
                    buf += _I64.pack(first_offset)
                    if flexible:
                        buf.append(0)
            if version >= 11:
                buf += _I32.pack(-1)  # preferred read replica
            length = sum(map(len, p.records))
            if flexible:
                _uvarint(buf, length + 1)
            else:
                buf += _I32.pack(length)
            if length:
                chunks.append(buf)
                size += len(buf)
                chunks.extend(p.records)
                size += length
                buf = bytearray()
            if flexible:
                buf.append(0)  # partition tagged fields
        if flexible:
            buf.append(0)  # topic tagged fields
    if flexible:
        buf.append(0)  # response tagged fields
    chunks.append(buf)
    size += len(buf)
    first = chunks[0]
    first[0:4] = _I32.pack(size - 4)
    return EncodedResponse(chunks)
