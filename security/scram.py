"""SCRAM (RFC 5802, RFC 7677) as Kafka uses it: credentials and the server side of the exchange.

A credential is what the broker keeps of a password: salt, iteration count, StoredKey and
ServerKey. StoredKey lets the server check a client's proof; ServerKey lets it prove to the
client that it holds the credential. Neither gives back the password, nor lets anyone who
reads the file log in (the ClientKey is needed for that).

Kafka's profile of SCRAM: channel binding is not used (the client's GS2 header is 'n,,'),
the user name is the SASL authorization identity, and a client-first message may carry
extensions (Kafka's 'tokenauth' for delegation tokens, which Fluvial does not serve).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass

# Kafka's ScramMechanism codes (DescribeUserScramCredentials, AlterUserScramCredentials).
MECHANISMS: dict[str, tuple[str, int]] = {
    "SCRAM-SHA-256": ("sha256", 1),
    "SCRAM-SHA-512": ("sha512", 2),
}
MECHANISM_BY_CODE = {code: name for name, (_, code) in MECHANISMS.items()}
# Kafka's floor (ScramMechanism.minIterations) and its usual default; at most 16384 (Kafka).
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 8192


class ScramError(Exception):
    """The exchange failed; `error` is the RFC 5802 server-error value ('e=' attribute) and the
    message says why in words, for the client's error message and the broker's log."""

    def __init__(self, message: str, error: str = "other-error"):
        super().__init__(message)
        self.error = error


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict:
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return {"salt": b64(self.salt), "iterations": self.iterations,
                "stored_key": b64(self.stored_key), "server_key": b64(self.server_key)}

    @classmethod
    def from_json(cls, mechanism: str, doc: dict) -> "ScramCredential":
        d = base64.b64decode
        return cls(mechanism, d(doc["salt"]), int(doc["iterations"]), d(doc["stored_key"]), d(doc["server_key"]))


def _digest(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism][0]
    except KeyError:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r} (known: {', '.join(MECHANISMS)})") from None


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    # RFC 5802 Hi() is PBKDF2 with HMAC; SASLprep of the password is left out, as Kafka does.
    return hashlib.pbkdf2_hmac(_digest(mechanism), password.encode("utf-8"), salt, iterations)


def credential_from_salted(mechanism: str, salt: bytes, salted: bytes, iterations: int) -> ScramCredential:
    """The credential for a salted password (what AlterUserScramCredentials carries)."""
    digest = _digest(mechanism)
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    return ScramCredential(mechanism, salt, iterations, stored_key, server_key)


def credential_from_password(mechanism: str, password: str, *, iterations: int = DEFAULT_ITERATIONS,
                             salt: bytes | None = None) -> ScramCredential:
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"SCRAM iterations must be at least {MIN_ITERATIONS}, not {iterations}")
    salt = salt if salt is not None else os.urandom(32)
    return credential_from_salted(mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations)


def check_password(credential: ScramCredential, password: str) -> bool:
    """Whether `password` is the one the credential was made from (constant-time compare)."""
    salted = salted_password(credential.mechanism, password, credential.salt, credential.iterations)
    digest = _digest(credential.mechanism)
    stored = hashlib.new(digest, hmac.new(salted, b"Client Key", digest).digest()).digest()
    return hmac.compare_digest(stored, credential.stored_key)


def _parse_attributes(text: str, what: str) -> list[tuple[str, str]]:
    out = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise ScramError(f"malformed {what}: attribute {part[:40]!r}", "invalid-encoding")
        out.append((part[0], part[2:]))
    return out


def decode_saslname(name: str) -> str:
    """RFC 5802: ',' and '=' in a user name travel as '=2C' and '=3D'; any other '=' is invalid."""
    out, i = [], 0
    while i < len(name):
        if name[i] == "=":
            code = name[i + 1:i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                raise ScramError("invalid user name encoding", "invalid-username-encoding")
            i += 3
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


def encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramServer:
    """The server side of one SCRAM exchange: client-first -> server-first, client-final ->
    server-final. `lookup(user)` gives the user's credential for this mechanism or None; an
    unknown user gets a made-up salt and fails at the proof, like a wrong password, so that
    the exchange does not tell which user names exist."""

    def __init__(self, mechanism: str, lookup, *, secret: bytes, server_nonce: str | None = None):
        self.mechanism = mechanism
        self.digest = _digest(mechanism)
        self._lookup = lookup
        self._secret = secret
        # The server's part of the nonce: random (fixed only to replay RFC test vectors).
        self._server_nonce = server_nonce
        self.user: str | None = None
        self._credential: ScramCredential | None = None
        self._known = False
        self._nonce = ""
        self._client_first_bare = ""
        self._server_first = ""
        self.complete = False

    def first(self, message: bytes) -> bytes:
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("client-first message is not UTF-8", "invalid-encoding") from None
        # GS2 header: 'n' (no channel binding; 'y' also accepted: the client could have used
        # it but thinks the server cannot), optional authzid, then the bare message.
        cbind, sep, rest = text.partition(",")
        if not sep:
            raise ScramError("malformed client-first message", "invalid-encoding")
        if cbind.startswith("p="):
            raise ScramError("channel binding is not supported", "channel-binding-not-supported")
        if cbind not in ("n", "y"):
            raise ScramError("malformed GS2 header in client-first message", "invalid-encoding")
        authzid, sep, bare = rest.partition(",")
        if not sep:
            raise ScramError("malformed client-first message", "invalid-encoding")
        parts = bare.split(",")
        attrs = _parse_attributes(",".join(parts[:2]), "client-first message")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            raise ScramError("client-first message must start with n=<user>,r=<nonce>", "invalid-encoding")
        if attrs[0][1] == "" or attrs[1][1] == "":
            raise ScramError("empty user name or nonce", "invalid-encoding")
        user = decode_saslname(attrs[0][1])
        if authzid:
            if not authzid.startswith("a=") or decode_saslname(authzid[2:]) != user:
                # Kafka: the authorization id, when given, must be the authenticated user.
                raise ScramError("authorization id differs from the user name", "other-error")
        # Then extensions, key=value (Kafka's are named by words, e.g. tokenauth=true).
        for ext in parts[2:]:
            key, eq, _value = ext.partition("=")
            if not eq or not key:
                raise ScramError(f"malformed extension {ext[:40]!r}", "invalid-encoding")
            if key == "m" or key == "tokenauth":
                # 'm' is RFC 5802's mandatory extension; tokenauth asks for delegation tokens.
                raise ScramError(f"extension {key!r} not supported", "extensions-not-supported")
        self.user = user
        credential = self._lookup(user)
        self._known = credential is not None and credential.mechanism == self.mechanism
        if not self._known:
            salt = hmac.new(self._secret, user.encode(), "sha256").digest()
            credential = ScramCredential(self.mechanism, salt, DEFAULT_ITERATIONS, b"", b"")
        self._credential = credential
        self._nonce = attrs[1][1] + (self._server_nonce or secrets.token_urlsafe(24))
        self._client_first_bare = bare
        self._server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                              f"i={credential.iterations}")
        return self._server_first.encode()

    def final(self, message: bytes) -> bytes:
        if self._credential is None:
            raise ScramError("client-final message before client-first", "other-error")
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("client-final message is not UTF-8", "invalid-encoding") from None
        attrs = _parse_attributes(text, "client-final message")
        if len(attrs) < 3 or attrs[0][0] != "c" or attrs[1][0] != "r" or attrs[-1][0] != "p":
            raise ScramError("client-final message must be c=...,r=...,...,p=...", "invalid-encoding")
        if attrs[0][1] not in ("biws", "eSws"):  # base64 of 'n,,' and 'y,,'
            raise ScramError("channel binding data does not match the GS2 header", "channel-bindings-dont-match")
        if not hmac.compare_digest(attrs[1][1].encode(), self._nonce.encode()):
            raise ScramError("nonce does not match", "other-error")
        try:
            proof = base64.b64decode(attrs[-1][1], validate=True)
        except ValueError:
            raise ScramError("proof is not base64", "invalid-encoding") from None
        without_proof = text[:text.rindex(",p=")]
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        cred = self._credential
        signature = hmac.new(cred.stored_key, auth_message, self.digest).digest()
        if len(proof) != len(signature):
            raise ScramError("invalid credentials", "invalid-proof")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        computed = hashlib.new(self.digest, client_key).digest()
        if not (hmac.compare_digest(computed, cred.stored_key) and self._known):
            raise ScramError("invalid credentials", "invalid-proof")
        server_signature = hmac.new(cred.server_key, auth_message, self.digest).digest()
        self.complete = True
        return b"v=" + base64.b64encode(server_signature)


def error_message(exc: ScramError) -> bytes:
    """The server-final message that reports a failure to the client."""
    return f"e={exc.error}".encode()
