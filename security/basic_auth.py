"""HTTP Basic credentials (RFC 7617) checked against the broker's user store, for the HTTP port
and the table API's handshake.

A user's password is checked the SCRAM way (thousands of PBKDF2 rounds), far too slow to
repeat on every HTTP request of a browser or a schema registry client. A successful check is
remembered for a short while, keyed by a keyed hash of name and password: no password is
kept in memory in clear, and a changed or deleted user stops being accepted at the latest
`REMEMBER_S` later.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable

from fluvial.security.principal import Principal

# How long a verified name and password are accepted without checking the user store again.
REMEMBER_S = 30.0
# Bound on remembered credentials: a flood of distinct valid logins cannot grow memory.
MAX_REMEMBERED = 10_000


class CredentialsError(Exception):
    """Missing, malformed or wrong credentials; the message is safe to show the client."""


@dataclass(frozen=True, slots=True)
class BasicCredentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never print a password, also not in tracebacks
        return f"BasicCredentials(username={self.username!r}, password=***)"


def parse_basic(header: str | None) -> BasicCredentials:
    """The name and password of an `Authorization: Basic ...` header value."""
    if not header:
        raise CredentialsError("authentication required: send HTTP basic credentials")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise CredentialsError(f"unsupported authorization scheme {scheme[:20]!r}: use Basic")
    try:
        text = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise CredentialsError("malformed basic credentials") from None
    name, sep, password = text.partition(":")
    if not sep or not name:
        raise CredentialsError("malformed basic credentials: expected name:password")
    return BasicCredentials(name, password)


class PasswordChecker:
    """Checks names and passwords with `verify(name, password) -> bool` (the user store's
    `verify_password`), remembering successes for `remember_s` seconds. Thread-safe."""

    def __init__(self, verify: Callable[[str, str], bool], remember_s: float = REMEMBER_S):
        self._verify = verify
        self._remember_s = remember_s
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._until: dict[bytes, float] = {}

    def _digest(self, creds: BasicCredentials) -> bytes:
        # Length-prefixed so that ("a:b", "c") and ("a", "b:c") differ.
        name = creds.username.encode()
        return hmac.new(self._key, len(name).to_bytes(4, "big") + name + creds.password.encode(),
                        hashlib.sha256).digest()

    def remembered(self, creds: BasicCredentials) -> Principal | None:
        """The principal of credentials verified less than `remember_s` ago (cheap: no PBKDF2),
        else None."""
        digest = self._digest(creds)
        with self._lock:
            until = self._until.get(digest)
        if until is not None and until > time.monotonic():
            return Principal.user(creds.username)
        return None

    def check(self, creds: BasicCredentials) -> Principal:
        """The principal of valid credentials; CredentialsError otherwise (one message for an
        unknown user and a wrong password, so that names cannot be probed). May take
        milliseconds (PBKDF2): event-loop code calls `remembered` first and this off the loop."""
        principal = self.remembered(creds)
        if principal is not None:
            return principal
        digest = self._digest(creds)
        now = time.monotonic()
        if not self._verify(creds.username, creds.password):
            raise CredentialsError("authentication failed: invalid username or password")
        with self._lock:
            if len(self._until) >= MAX_REMEMBERED:
                self._until = {k: v for k, v in self._until.items() if v > now}
                if len(self._until) >= MAX_REMEMBERED:
                    self._until.clear()
            self._until[digest] = now + self._remember_s
        return Principal.user(creds.username)
