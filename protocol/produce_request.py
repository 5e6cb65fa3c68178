"""Produce requests (v3-11) decoded by hand.

A produce request is the one message a broker reads thousands of times a second from
many small producers; kafka-python's generated decoder builds several objects per request
and copies the records. This reads the same fields (sans I/O, no copies: the records are
views of the request frame) and gives objects with the attribute names the handler uses.
tests/unit/test_produce_request.py checks it against kafka-python's decoder.

The most common request of all (one topic, one partition) is read, header included, by one
compiled call (protocol/_produce.c, `decode_common`); any other request, and any request
that call does not read to the end without fault, goes through the decoders here.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from fluvial.errors import InvalidRequestError
from fluvial.protocol.messages import RequestHeader

try:
    from fluvial.protocol._produce import read_one_partition as _read_one_partition
except ImportError:  # not built: every request is read by the Python decoders
    _read_one_partition = None

FIRST_VERSION = 3
LAST_VERSION = 12  # v12 (KIP-890): the v11 layout; a transactional batch may add its partition
FIRST_FLEXIBLE = 9

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hi")  # acks, timeout


@dataclass(slots=True)
class PartitionProduceData:
    index: int
    records: memoryview | None


@dataclass(slots=True)
class TopicProduceData:
    name: str
    partition_data: list[PartitionProduceData]


@dataclass(slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


class _Reader:
    __slots__ = ("buf", "pos", "flexible")

    def __init__(self, buf: memoryview, flexible: bool):
        self.buf = buf
        self.pos = 0
        self.flexible = flexible

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise InvalidRequestError("produce request truncated")
        view = self.buf[self.pos:end]
        self.pos = end
        return view

    def unpack(self, fmt: struct.Struct) -> tuple:
        if self.pos + fmt.size > len(self.buf):
            raise InvalidRequestError("produce request truncated")
        values = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return values

    def uvarint(self) -> int:
        buf, pos = self.buf, self.pos
        result = shift = 0
        while True:
            if pos >= len(buf):
                raise InvalidRequestError("produce request truncated inside a varint")
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                self.pos = pos
                return result
            shift += 7
            if shift > 28:
                raise InvalidRequestError("varint longer than 5 bytes in produce request")

    def length(self, wide: struct.Struct) -> int:
        """A length, -1 meaning null (compact lengths are stored plus one)."""
        return self.uvarint() - 1 if self.flexible else self.unpack(wide)[0]

    def string(self, nullable: bool) -> str | None:
        n = self.length(_I16)
        if n < 0:
            if nullable:
                return None
            raise InvalidRequestError("null string where the produce request needs one")
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequestError(f"produce request string is not UTF-8: {exc}") from None

    def array_length(self) -> int:
        n = self.length(_I32)
        if n < 0:
            raise InvalidRequestError("null array in produce request")
        # Every element takes at least one byte: a huge count is garbage, not a request.
        if n > len(self.buf) - self.pos:
            raise InvalidRequestError("produce request array longer than the request")
        return n

    def skip_tags(self) -> None:
        if not self.flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


def decode_produce_request(body: memoryview, version: int) -> ProduceRequest:
    """The request body (after the request header); InvalidRequestError when malformed."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Produce v{version} requests are not decoded here")
    r = _Reader(body, version >= FIRST_FLEXIBLE)
    transactional_id = r.string(nullable=True)
    acks, timeout_ms = r.unpack(_HEAD)
    topics = []
    for _ in range(r.array_length()):
        name = r.string(nullable=False)
        partitions = []
        for _ in range(r.array_length()):
            (index,) = r.unpack(_I32)
            size = r.length(_I32)
            partitions.append(PartitionProduceData(index, None if size < 0 else r.take(size)))
            r.skip_tags()
        topics.append(TopicProduceData(name, partitions))
        r.skip_tags()
    r.skip_tags()
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


def read_common(frame: memoryview) -> tuple | None:
    """`decode_common` as the compiled reader's values, no object made: (version,
    correlation_id, client_id, header_size, transactional_id, acks, timeout_ms, topic,
    partition, records_offset, records_size); None as for decode_common."""
    return None if _read_one_partition is None else _read_one_partition(frame)


def common_header(got: tuple) -> RequestHeader:
    """The request header of a request `read_common` read."""
    return RequestHeader(0, got[0], got[1], got[2], got[3])


def common_body(frame: memoryview, got: tuple) -> ProduceRequest:
    """The body of a request `read_common` read (the records a view of the frame)."""
    _, _, _, _, transactional_id, acks, timeout_ms, topic, index, at, size = got
    return ProduceRequest(transactional_id, acks, timeout_ms,
                          [TopicProduceData(topic, [PartitionProduceData(index, frame[at:at + size])])])


def decode_common(frame: memoryview) -> tuple[RequestHeader, ProduceRequest] | None:
    """The header and body of a Produce v3-12 request frame with one topic and one partition,
    read in one compiled pass (the records a view of the frame); None for any other request
    or anything unusual in it, which the general decoders then read (and refuse as they do)."""
    got = read_common(frame)
    if got is None:
        return None
    return common_header(got), common_body(frame, got)
