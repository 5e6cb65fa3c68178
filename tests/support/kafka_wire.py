"""One Kafka request over a plain socket, for tests that check an exact answer."""
from __future__ import annotations

import socket
import struct

from fluvial.protocol.messages import decode_response, encode_request


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def call(bootstrap: str, api_key: int, version: int, body: dict, timeout: float = 15.0):
    """Send one request on a new connection and return the decoded response message."""
    host, _, port = bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(encode_request(api_key, version, 7, body))
        (size,) = struct.unpack(">i", _read(sock, 4))
        _cid, message = decode_response(api_key, version, _read(sock, size))
        return message
