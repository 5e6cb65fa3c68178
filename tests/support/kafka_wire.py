"""Kafka requests over a plain socket, for tests that check exact answers (error codes per
API), optionally after a SASL PLAIN login as a given user."""
from __future__ import annotations

import itertools
import socket
import struct

from fluvial.protocol.messages import decode_response, encode_request

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


class WireClient:
    """One connection; `request()` sends one request and returns the decoded response."""

    def __init__(self, bootstrap: str, user: str | None = None, password: str | None = None,
                 timeout: float = 15.0):
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._ids = itertools.count(1)
        if user is not None:
            hs = self.request(SASL_HANDSHAKE, 1, dict(mechanism="PLAIN"))
            if hs.error_code:
                raise ConnectionError(f"SaslHandshake failed: error {hs.error_code}")
            auth = self.request(SASL_AUTHENTICATE, 2,
                                dict(auth_bytes=b"\0" + user.encode() + b"\0" + (password or "").encode()))
            if auth.error_code:
                raise ConnectionError(f"SaslAuthenticate failed: error {auth.error_code} {auth.error_message}")

    def request(self, api_key: int, version: int, body: dict):
        cid = next(self._ids)
        self.sock.sendall(encode_request(api_key, version, cid, body))
        (size,) = struct.unpack(">i", _read(self.sock, 4))
        got, message = decode_response(api_key, version, _read(self.sock, size))
        assert got == cid
        return message

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "WireClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def call(bootstrap: str, api_key: int, version: int, body: dict, timeout: float = 15.0):
    """Send one request on a new connection and return the decoded response message."""
    with WireClient(bootstrap, timeout=timeout) as c:
        return c.request(api_key, version, body)
