"""Kafka request/response bodies, and the framing and headers around them.

Message bodies are encoded and decoded by kafka-python 3's classes, which are generated
from Apache Kafka's JSON message specs (every API, every version, tagged fields); the
frame, the request header and the response header are ours, because they are on every
request and cheap to do by hand (see docs/architecture.md, "Protocol codec").
"""
from __future__ import annotations

import importlib
import pkgutil
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from kafka.protocol.api_message import ApiMessage

from fluvial.errors import CorruptRecordError, InvalidRequestError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.nullability import check_non_nullable


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    DESCRIBE_TOPIC_PARTITIONS = 75
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79


def _define_own_messages() -> None:
    """Classes for APIs kafka-python does not ship, built from the schemas in protocol/specs
    by the same machinery (a class named like its schema file loads it)."""
    from fluvial.protocol import specs

    for name in _OWN_MESSAGES:
        if name not in _OWN_CLASSES:
            _OWN_CLASSES[name] = type(name, (ApiMessage,), {"__module__": __name__}, load_json=specs)


_OWN_MESSAGES = (
    "ConsumerGroupHeartbeatRequest", "ConsumerGroupHeartbeatResponse",
    "ConsumerGroupDescribeRequest", "ConsumerGroupDescribeResponse",
    "ShareGroupHeartbeatRequest", "ShareGroupHeartbeatResponse",
    "ShareGroupDescribeRequest", "ShareGroupDescribeResponse",
    "ShareFetchRequest", "ShareFetchResponse",
    "ShareAcknowledgeRequest", "ShareAcknowledgeResponse",
)
_OWN_CLASSES: dict[str, type[ApiMessage]] = {}


def _load_message_classes() -> tuple[dict[int, type[ApiMessage]], dict[int, type[ApiMessage]]]:
    for family in ("metadata", "producer", "consumer", "admin"):
        pkg = importlib.import_module(f"kafka.protocol.{family}")
        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"kafka.protocol.{family}.{info.name}")
    importlib.import_module("kafka.protocol.sasl")  # SaslHandshake, SaslAuthenticate
    _define_own_messages()

    def walk(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    requests: dict[int, type[ApiMessage]] = {}
    responses: dict[int, type[ApiMessage]] = {}
    for cls in walk(ApiMessage):
        if getattr(cls, "_class_version", None) is not None or cls._json is None:
            continue
        (requests if cls.type == "request" else responses)[cls.API_KEY] = cls
    return requests, responses


REQUEST_CLASSES, RESPONSE_CLASSES = _load_message_classes()

_HEADER = struct.Struct(">hhi")
_INT32 = struct.Struct(">i")


def request_class(api_key: int) -> type[ApiMessage]:
    return REQUEST_CLASSES[api_key]


def response_class(api_key: int) -> type[ApiMessage]:
    return RESPONSE_CLASSES[api_key]


def is_flexible(api_key: int, version: int) -> bool:
    cls = REQUEST_CLASSES.get(api_key)
    return cls is not None and cls.flexible_version_q(version)


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_size: int  # bytes of the frame body taken by the header


def _read_uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise InvalidRequestError("truncated varint in request header")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise InvalidRequestError("varint too long in request header")


def _skip_tagged_fields(buf: memoryview, pos: int) -> int:
    count, pos = _read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = _read_uvarint(buf, pos)
        size, pos = _read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise InvalidRequestError("truncated tagged field in request header")
    return pos


def decode_request_header(frame: memoryview) -> RequestHeader:
    """Read the request header (v1, or v2 with tagged fields for flexible versions).

    The API key, version and correlation id come first and are read even when the rest
    is unusable, so that an error response can still be addressed.
    """
    if len(frame) < 8:
        raise InvalidRequestError("request shorter than its header")
    api_key, api_version, correlation_id = _HEADER.unpack_from(frame, 0)
    pos = 8
    if len(frame) < pos + 2:
        raise InvalidRequestError("request header without client id")
    (n,) = struct.unpack_from(">h", frame, pos)
    pos += 2
    client_id = None
    if n >= 0:
        if pos + n > len(frame):
            raise InvalidRequestError("client id past the end of the request")
        client_id = bytes(frame[pos:pos + n]).decode("utf-8", "replace")
        pos += n
    if api_key == ApiKey.API_VERSIONS:
        # ApiVersions v3+ requests carry header v2; an unknown higher version is
        # assumed flexible too (KIP-511), and the body is not needed to answer it.
        if api_version >= 3:
            pos = _skip_tagged_fields(frame, pos)
    elif is_flexible(api_key, api_version):
        pos = _skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


def decode_request_body(header: RequestHeader, frame: memoryview) -> ApiMessage:
    """Decode a request body; InvalidRequestError for anything malformed.

    Whatever the decoder raises on garbage (truncation, lengths past the end, varints near
    2**64 that overflow, invalid UTF-8, ...) means the same: the request is malformed. A
    null in a field the message spec does not allow to be null is refused here too, once
    for every API (see protocol/nullability.py).
    """
    cls = REQUEST_CLASSES[header.api_key]
    try:
        message = cls.decode(frame[header.header_size:], version=header.api_version)
    except Exception as exc:  # noqa: BLE001 - every decoder failure is a malformed request
        raise InvalidRequestError(f"malformed {cls.name} v{header.api_version}: {type(exc).__name__}: {exc}") from None
    check_non_nullable(message, header.api_version)
    return message


def error_response(header: RequestHeader, code: int) -> bytes | None:
    """A response carrying `code` in its top-level error field, or None when the API's
    response at that version has none (the only answer left is closing the connection,
    as Kafka does for a request it cannot parse)."""
    cls = RESPONSE_CLASSES.get(header.api_key)
    if cls is None:
        return None
    field = cls._struct.fields.get("error_code")
    if field is None or not field.for_version_q(header.api_version):
        return None
    return encode_response(header, cls(version=header.api_version, error_code=code))


def encode_response(header: RequestHeader, body: ApiMessage) -> bytes:
    """Frame a response: size, correlation id, tagged fields (header v1) when flexible.

    ApiVersions responses always use response header v0 so that a client can read the
    answer before it knows which versions the broker speaks.
    """
    payload = body.encode(version=header.api_version)
    flexible = header.api_key != ApiKey.API_VERSIONS and is_flexible(header.api_key, header.api_version)
    head = _INT32.pack(header.correlation_id) + (b"\x00" if flexible else b"")
    return _INT32.pack(len(head) + len(payload)) + head + payload


def encode_api_versions_unsupported(header: RequestHeader, ranges: dict[int, tuple[int, int]]) -> bytes:
    """KIP-511: an unknown ApiVersions version is answered with a v0 body, error 35,
    listing the ApiVersions range, so the client can retry with a version we speak."""
    cls = RESPONSE_CLASSES[ApiKey.API_VERSIONS]
    lo, hi = ranges[ApiKey.API_VERSIONS]
    body = cls(version=0, error_code=ErrorCode.UNSUPPORTED_VERSION, api_keys=[(ApiKey.API_VERSIONS, lo, hi)])
    payload = body.encode(version=0)
    head = _INT32.pack(header.correlation_id)
    return _INT32.pack(len(head) + len(payload)) + head + payload


def encode_request(api_key: int, version: int, correlation_id: int, body: Any, client_id: str = "fluvial") -> bytes:
    """Frame a request (used by tests and tools that speak to a broker directly)."""
    cls = REQUEST_CLASSES[api_key]
    if not isinstance(body, ApiMessage):
        body = cls(version=version, **body)
    payload = body.encode(version=version)
    cid = client_id.encode()
    head = _HEADER.pack(api_key, version, correlation_id) + struct.pack(">h", len(cid)) + cid
    if is_flexible(api_key, version):
        head += b"\x00"
    return _INT32.pack(len(head) + len(payload)) + head + payload


def decode_response(api_key: int, version: int, frame: memoryview | bytes) -> tuple[int, ApiMessage]:
    """Read a response frame body (without the size prefix): correlation id and message."""
    frame = memoryview(frame)
    (correlation_id,) = _INT32.unpack_from(frame, 0)
    pos = 4
    if api_key != ApiKey.API_VERSIONS and is_flexible(api_key, version):
        pos = _skip_tagged_fields(frame, pos)
    return correlation_id, RESPONSE_CLASSES[api_key].decode(frame[pos:], version=version)


__all__ = [
    "ApiKey", "RequestHeader", "REQUEST_CLASSES", "RESPONSE_CLASSES",
    "decode_request_header", "decode_request_body", "encode_response",
    "encode_api_versions_unsupported", "encode_request", "decode_response",
    "request_class", "response_class", "is_flexible", "CorruptRecordError", "error_response",
]
