"""A null where the Kafka message spec forbids one is refused, for every API we serve.

Each non-nullable string, bytes or array field (at the top level and one struct below it)
is sent as null, for every version the broker advertises: the answer is INVALID_REQUEST
where the response has a top-level error code, else the connection is closed; the broker
logs no traceback and keeps serving.
"""
from __future__ import annotations

import socket
import struct

from fluvial.broker.handlers import HANDLERS, load_all
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, decode_response, encode_request, request_class

load_all()


def _frame(sock: socket.socket) -> bytes | None:
    def read(n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf
    head = read(4)
    return None if head is None else read(struct.unpack(">i", head)[0])


def _nullable_paths(struct_field, version: int, depth: int = 0):
    """(path, field) for every string/bytes/array field that may not be null at `version`."""
    for field in struct_field._fields:
        if not field.for_version_q(version) or field.tagged_field_q(version):
            continue
        if field.is_array() or field.type_str in ("string", "bytes"):
            if not field.nullable_for_version_q(version):
                yield (field.name,), field
        if depth == 0 and field.is_struct_array():
            for sub_path, sub in _nullable_paths(field.array_of, version, depth + 1):
                yield (field.name,) + sub_path, sub


def _request_with_null(api_key: int, version: int, path: tuple[str, ...]):
    cls = request_class(api_key)
    body = cls(version=version)
    if len(path) == 1:
        setattr(body, path[0], None)
    else:
        element_field = cls._struct.fields[path[0]].array_of
        element = element_field.data_class(version=version)
        setattr(element, path[1], None)
        setattr(body, path[0], [element])
    return body


def _encodes_a_null(api_key: int, version: int, path: tuple[str, ...]) -> bool:
    """kafka-python writes some nulls as empty (Metadata v0 topics): those cases test nothing."""
    cls = request_class(api_key)
    value = cls.decode(_request_with_null(api_key, version, path).encode(version=version), version=version)
    for name in path:
        value = getattr(value, name)
        if isinstance(value, list):
            if not value:
                return False
            value = value[0]
    return value is None


def _cases():
    for api_key, reg in sorted(HANDLERS.items()):
        if api_key == ApiKey.API_VERSIONS:
            continue  # answered from its header alone
        cls = request_class(api_key)
        for version in range(reg.rejected_below, reg.max_version + 1):
            for path, _ in _nullable_paths(cls._struct, version):
                if _encodes_a_null(api_key, version, path):
                    yield api_key, version, path


def test_every_non_nullable_field_sent_as_null_is_refused(broker):
    log_start = broker.log_path.stat().st_size
    cases = list(_cases())
    assert len(cases) > 200  # every API, every version
    answered = closed = 0
    sock = None
    for i, (api_key, version, path) in enumerate(cases):
        if sock is None:
            sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        sock.sendall(encode_request(api_key, version, i, _request_with_null(api_key, version, path)))
        frame = _frame(sock)
        if frame is None:
            closed += 1
            sock.close()
            sock = None
            continue
        cid, response = decode_response(api_key, version, frame)
        assert cid == i
        assert response.error_code == ErrorCode.INVALID_REQUEST, (ApiKey(api_key).name, version, path, response)
        answered += 1
    if sock is not None:
        sock.close()
    assert answered and closed
    log = broker.log_path.read_bytes()[log_start:].decode(errors="replace")
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
    assert "non-nullable field" in log


def test_list_offsets_with_null_partitions_closes_quietly_and_others_are_served(broker, topic_name):
    from kafka import KafkaAdminClient
    R = request_class(ApiKey.LIST_OFFSETS)
    body = R(version=2, replica_id=-1, isolation_level=0,
             topics=[R.ListOffsetsTopic(version=2, name=topic_name, partitions=None)])
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(encode_request(ApiKey.LIST_OFFSETS, 2, 1, body))
        assert _frame(sock) is None
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert isinstance(admin.list_topics(), list)
    finally:
        admin.close()


def test_list_groups_v5_null_states_filter_answers_invalid_request(broker):
    R = request_class(ApiKey.LIST_GROUPS)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(encode_request(ApiKey.LIST_GROUPS, 5, 7, R(version=5, states_filter=None, types_filter=[])))
        cid, response = decode_response(ApiKey.LIST_GROUPS, 5, _frame(sock))
        assert cid == 7 and response.error_code == ErrorCode.INVALID_REQUEST
        # The same connection goes on serving.
        sock.sendall(encode_request(ApiKey.LIST_GROUPS, 5, 8, R(version=5, states_filter=[], types_filter=[])))
        cid, response = decode_response(ApiKey.LIST_GROUPS, 5, _frame(sock))
        assert cid == 8 and response.error_code == 0


def test_varint_length_near_2_63_is_invalid_request_not_a_crash(broker):
    """Heartbeat v4: a compact string whose length varint is about 2**63."""
    log_start = broker.log_path.stat().st_size
    head = struct.pack(">hhih", ApiKey.HEARTBEAT, 4, 3, 1) + b"c" + b"\x00"
    huge_length = b"\xff" * 8 + b"\x7f"  # an unsigned varint of 2**63 - 1
    body = huge_length + b"g" * 8 + struct.pack(">i", 1) + b"\x01" + b"\x01\x00"
    frame = head + body
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        reply = _frame(sock)
        assert reply is not None
        cid, response = decode_response(ApiKey.HEARTBEAT, 4, reply)
        assert cid == 3 and response.error_code == ErrorCode.INVALID_REQUEST
    log = broker.log_path.read_bytes()[log_start:].decode(errors="replace")
    assert "Traceback" not in log and "Unhandled exception" not in log, log
