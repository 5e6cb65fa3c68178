"""HTTP Basic credentials (RFC 7617) checked against the broker's user store, for the HTTP port
and the table API's handshake.

The user store checks a password the SCRAM way (thousands of PBKDF2 rounds) and remembers
a success until the user's credentials change, so a browser or registry client sending the
same credentials on every request pays the derivation once. A check that is not remembered
takes milliseconds: event-loop code runs `check` in a thread.
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Callable

from fluvial.security.principal import Principal


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
    """Checks names and passwords with the user store (`verify(name, password) -> bool`,
    `exists(name) -> bool`). Thread-safe as the store is."""

    def __init__(self, verify: Callable[[str, str], bool], exists: Callable[[str], bool] | None = None):
        self._verify = verify
        self._exists = exists

    def check(self, creds: BasicCredentials) -> Principal:
        """The principal of valid credentials; CredentialsError otherwise (one message for an
        unknown user and a wrong password, so that names cannot be probed)."""
        if not self._verify(creds.username, creds.password):
            raise CredentialsError("authentication failed: invalid username or password")
        return Principal.user(creds.username)

    def still_exists(self, name: str) -> bool:
        """Whether a user authenticated earlier (a token's) is still a user."""
        return self._exists(name) if self._exists is not None else True
