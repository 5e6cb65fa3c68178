"""How the native client reaches a secured table API: TLS trust and the basic-auth handshake
whose bearer token goes with every call.

The broker answers the handshake with a token that expires (an hour by default); the token
names its expiry, so the client authenticates again shortly before, and once more when the
broker says the token is no longer valid (a broker restart draws a new signing key).
"""
from __future__ import annotations

import base64
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

import pyarrow.flight as flight

from fluvial.client.grpc_io import inline_io

# Authenticate again when the token has less than this left, so no call races its expiry.
RENEW_BEFORE_S = 120.0
TLS_SCHEMES = ("grpc+tls",)
PLAIN_SCHEMES = ("grpc", "grpc+tcp")


@dataclass(frozen=True)
class ConnectionSecurity:
    """Credentials and TLS trust of a connection (the password is never shown in reprs)."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    # PEM CA certificate(s) the broker's certificate is checked against: a path or the PEM
    # text/bytes. None: the system's trust store.
    tls_root_certs: str | bytes | Path | None = None
    # The name the broker's certificate is checked against when it is not the url's host.
    tls_override_hostname: str | None = None
    # Services inside the broker: a bearer token made by the broker itself, no handshake.
    token_provider: Callable[[], str] | None = field(default=None, repr=False, compare=False)

    def root_certs_pem(self) -> bytes | None:
        certs = self.tls_root_certs
        if certs is None:
            return None
        if isinstance(certs, bytes):
            return certs
        text = str(certs)
        if "-----BEGIN" in text:
            return text.encode()
        return Path(os.path.expanduser(text)).read_bytes()


def flight_client(url: str, security: ConnectionSecurity) -> flight.FlightClient:
    """A FlightClient for `url` (grpc://, grpc+tcp:// or grpc+tls://) with the TLS trust set."""
    scheme = urlsplit(url).scheme
    if scheme not in TLS_SCHEMES + PLAIN_SCHEMES:
        raise ValueError(f"a table API address is grpc://host:port or grpc+tls://host:port, not {url!r}")
    inline_io()  # gRPC's socket I/O on the calling thread, if gRPC has not started yet (client/grpc_io.py)
    if scheme in TLS_SCHEMES:
        options: dict = {}
        roots = security.root_certs_pem()
        if roots:
            options["tls_root_certs"] = roots
        if security.tls_override_hostname:
            options["override_hostname"] = security.tls_override_hostname
        return flight.FlightClient(url, **options)
    if security.tls_root_certs is not None:
        raise ValueError(f"tls_root_certs is given but {url!r} is not a TLS address: use grpc+tls://")
    return flight.FlightClient(url)


def token_expiry(token: str) -> float:
    """The expiry (seconds since the epoch) a broker's bearer token names: its payload is
    base64url JSON `{"user", "exp"}` before the signature."""
    payload = token.partition(".")[0]
    return float(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"])


def _header_expiry(header_value: bytes) -> float:
    """The expiry of an `authorization: Bearer` value (0: unknown, renew on refusal only)."""
    try:
        return token_expiry(header_value.decode().partition(" ")[2])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return 0.0


class TokenSession:
    """The bearer token of one client: obtained by the handshake, renewed before it expires."""

    def __init__(self, client: flight.FlightClient, username: str | None, password: str | None,
                 token_provider: Callable[[], str] | None = None):
        self._client = client
        self._username = username
        self._password = password
        self._token_provider = token_provider
        self._lock = threading.Lock()
        self._header: tuple[bytes, bytes] | None = None
        self._expiry = 0.0

    def authenticate(self) -> tuple[bytes, bytes]:
        with self._lock:
            if self._token_provider is not None:
                self._header = (b"authorization", f"Bearer {self._token_provider()}".encode())
            else:
                self._header = self._client.authenticate_basic_token(self._username, self._password or "")
            self._expiry = _header_expiry(self._header[1])
            return self._header

    def header(self) -> tuple[bytes, bytes]:
        header, expiry = self._header, self._expiry
        if header is None or (expiry and expiry - time.time() < RENEW_BEFORE_S):
            return self.authenticate()
        return header

    def __repr__(self) -> str:
        return f"TokenSession(username={self._username!r})"
