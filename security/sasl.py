"""Authentication of Kafka connections: TLS client certificates and SASL (PLAIN, SCRAM).

Each connection of a listener with authentication gets a gate (`SaslSession` or
`CertificateIdentity`) through which all its requests pass; a PLAINTEXT connection has
none and pays nothing. A SASL connection goes through these states, as Kafka's
SaslServerAuthenticator does:

    HANDSHAKE      ApiVersions (any number) or SaslHandshake(mechanism) -> AUTHENTICATE
    AUTHENTICATE   SaslAuthenticate(token) until the mechanism completes -> AUTHENTICATED
                   (after SaslHandshake v0 the tokens come as bare frames instead)
    AUTHENTICATED  every API, as User:<name>; SaslHandshake + SaslAuthenticate again
                   re-authenticate (KIP-368), keeping the same principal

Anything else closes the connection: another API before authentication, a mechanism not
enabled (UNSUPPORTED_SASL_MECHANISM), a SASL request out of order (ILLEGAL_SASL_STATE), a
failed exchange (SASL_AUTHENTICATION_FAILED, with a message), or, with
connections.max.reauth.ms set, any request but re-authentication once the session expired.
The answer saying why is sent before the connection is closed.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from typing import TYPE_CHECKING

from fluvial.broker.handlers import HANDLERS
from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import (ApiKey, RequestHeader, decode_request_body, decode_request_header,
                                       encode_response, response_class)
from fluvial.security import scram
from fluvial.security.principal import Principal
from fluvial.security.tls import certificate_principal

if TYPE_CHECKING:
    from fluvial.broker.broker import Broker
    from fluvial.broker.server import Connection, KafkaServer

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
HANDSHAKE, AUTHENTICATE, AUTHENTICATED = "handshake", "authenticate", "authenticated"
# Largest request a connection may send before it is authenticated (Kafka's
# sasl.server.max.receive.size); afterwards only max.request.bytes applies.
SASL_SERVER_MAX_RECEIVE_SIZE = 524288
_UNLIMITED = 1 << 62


class AuthenticationFailed(Exception):
    """The client did not prove who it is. `reason` is for the broker's log only; the client
    is told `message` (the same for an unknown user and a wrong password)."""

    def __init__(self, reason: str, message: str, token: bytes = b""):
        super().__init__(reason)
        self.message = message
        self.token = token


def _failed(mechanism: str) -> str:
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"


class PlainExchange:
    """SASL/PLAIN (RFC 4616): one message, authzid NUL user NUL password."""

    def __init__(self, broker: "Broker"):
        self.broker = broker
        self.user: str | None = None

    async def step(self, token: bytes) -> tuple[bytes, bool]:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationFailed("malformed PLAIN message",
                                       "Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("PLAIN message is not UTF-8", "Invalid SASL/PLAIN response: not UTF-8") from None
        if not user or not password:
            raise AuthenticationFailed("empty user or password in PLAIN message",
                                       "Authentication failed: username and password are required")
        if authzid and authzid != user:
            raise AuthenticationFailed(f"PLAIN authorization id {authzid!r} is not the user {user!r}",
                                       "Authentication failed: Client requested an authorization id that is "
                                       "different from username")
        # PBKDF2 of the password (thousands of HMACs): off the event loop.
        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(self.broker.cpu_executor, self.broker.users.verify_password, user, password)
        if not ok:
            raise AuthenticationFailed(f"invalid password or unknown user {user!r} (PLAIN)",
                                       "Authentication failed: Invalid username or password")
        self.user = user
        return b"", True


class ScramExchange:
    """SASL/SCRAM-SHA-256 or -512: client-first, then client-final (see security/scram.py)."""

    def __init__(self, broker: "Broker", mechanism: str):
        users = broker.users
        self.mechanism = mechanism
        self.server = scram.ScramServer(mechanism, lambda name: users.credential(name, mechanism),
                                        secret=users.secret)
        self._steps = 0
        self.user: str | None = None

    async def step(self, token: bytes) -> tuple[bytes, bool]:
        self._steps += 1
        try:
            if self._steps == 1:
                return self.server.first(token), False
            if self._steps == 2:
                out = self.server.final(token)
                self.user = self.server.user
                return out, True
            raise scram.ScramError("SCRAM exchange already complete")
        except scram.ScramError as exc:
            who = f" of user {self.server.user!r}" if self.server.user else ""
            raise AuthenticationFailed(f"{self.mechanism}{who}: {exc} ({exc.error})", _failed(self.mechanism),
                                       scram.error_message(exc)) from None


class CertificateIdentity:
    """Gate of an SSL connection whose client presented a verified certificate: every
    request is served as the certificate's principal."""

    __slots__ = ()
    max_receive = _UNLIMITED

    async def dispatch(self, server: "KafkaServer", frame: memoryview, conn: "Connection", started: float):
        return await server._dispatch(frame, conn.peer, started, conn.principal)


class SaslSession:
    """Gate of a connection on a SASL listener (SASL_PLAINTEXT or SASL_SSL)."""

    def __init__(self, broker: "Broker"):
        self.broker = broker
        self.cfg = broker.config.security
        self.state = HANDSHAKE
        self.mechanism: str | None = None
        self.exchange: PlainExchange | ScramExchange | None = None
        self.raw_tokens = False          # SaslHandshake v0: tokens travel as bare frames
        self.reauthenticating = False
        self.expires_at: float | None = None  # loop time the session ends (KIP-368)
        self.max_receive = SASL_SERVER_MAX_RECEIVE_SIZE

    async def dispatch(self, server: "KafkaServer", frame: memoryview, conn: "Connection", started: float):
        from fluvial.broker.server import CloseConnection
        if self.raw_tokens:
            return await self._raw_token(bytes(frame), conn)
        try:
            header = decode_request_header(frame)
        except FluvialError:
            return await server._dispatch(frame, conn.peer, started)  # closes, as for any listener
        key = header.api_key
        if key == ApiKey.SASL_HANDSHAKE or key == ApiKey.SASL_AUTHENTICATE:
            reg = HANDLERS[key]
            if not reg.min_version <= header.api_version <= reg.max_version:
                return await server._dispatch(frame, conn.peer, started)
            try:
                request = decode_request_body(header, frame)
            except FluvialError as exc:
                raise CloseConnection(f"SASL request that cannot be read: {exc}") from None
            if key == ApiKey.SASL_HANDSHAKE:
                return self._handshake(header, request, conn)
            return await self._authenticate(header, request, conn)
        if self.state != AUTHENTICATED:
            if key == ApiKey.API_VERSIONS:
                return await server._dispatch(frame, conn.peer, started)
            raise CloseConnection(f"unexpected request (API key {key}) during SASL authentication")
        if self.expires_at is not None and asyncio.get_running_loop().time() >= self.expires_at:
            raise CloseConnection(f"SASL session of {conn.principal} expired (connections.max.reauth.ms="
                                  f"{self.cfg.connections_max_reauth_ms}) without re-authentication")
        return await server._dispatch(frame, conn.peer, started, conn.principal)

    # ---- SaslHandshake ----

    def _handshake(self, header: RequestHeader, request, conn: "Connection") -> bytes:
        from fluvial.broker.server import CloseConnection
        enabled = list(self.cfg.sasl_enabled_mechanisms)
        cls = response_class(ApiKey.SASL_HANDSHAKE)

        def answer(code: int) -> bytes:
            return encode_response(header, cls(version=header.api_version, error_code=code, mechanisms=enabled))

        mechanism = request.mechanism
        reauth = self.state == AUTHENTICATED and not self.reauthenticating
        if self.state == AUTHENTICATE or self.reauthenticating or (reauth and header.api_version == 0):
            raise CloseConnection(f"SaslHandshake in state {self.state}", answer(ErrorCode.ILLEGAL_SASL_STATE))
        if mechanism not in enabled:
            raise CloseConnection(f"SASL mechanism {mechanism!r} is not enabled (enabled: {', '.join(enabled)})",
                                  answer(ErrorCode.UNSUPPORTED_SASL_MECHANISM))
        if reauth and mechanism != self.mechanism:
            raise CloseConnection(f"re-authentication with {mechanism} after {self.mechanism}",
                                  answer(ErrorCode.ILLEGAL_SASL_STATE))
        self.mechanism = mechanism
        self.exchange = PlainExchange(self.broker) if mechanism == "PLAIN" else ScramExchange(self.broker, mechanism)
        if reauth:
            # Other requests go on being served while the client re-authenticates.
            self.reauthenticating = True
        else:
            self.state = AUTHENTICATE
            self.raw_tokens = header.api_version == 0
        return answer(ErrorCode.NONE)

    # ---- SaslAuthenticate ----

    async def _authenticate(self, header: RequestHeader, request, conn: "Connection") -> bytes:
        from fluvial.broker.server import CloseConnection
        cls = response_class(ApiKey.SASL_AUTHENTICATE)
        version = header.api_version

        def answer(code: int, message: str | None, token: bytes, lifetime: int = 0) -> bytes:
            fields = dict(error_code=code, error_message=message, auth_bytes=token)
            if version >= 1:
                fields["session_lifetime_ms"] = lifetime
            return encode_response(header, cls(version=version, **fields))

        if self.state != AUTHENTICATE and not self.reauthenticating:
            msg = ("SaslAuthenticate before SaslHandshake" if self.state == HANDSHAKE
                   else "SaslAuthenticate after authentication completed, without a new SaslHandshake")
            raise CloseConnection(msg, answer(ErrorCode.ILLEGAL_SASL_STATE, msg, b""))
        try:
            token, done = await self.exchange.step(bytes(request.auth_bytes))
            if done:
                principal = Principal.user(self.exchange.user)
                if self.reauthenticating and principal != conn.principal:
                    raise AuthenticationFailed(f"re-authentication as {principal} on a connection of "
                                               f"{conn.principal}",
                                               "Cannot change principals during re-authentication")
        except AuthenticationFailed as exc:
            self.broker.kafka.auth_counts[self.mechanism, "failed"] += 1
            log.info("SASL authentication from %s failed: %s", conn.peer, exc)
            raise CloseConnection(f"SASL authentication failed ({exc})",
                                  answer(ErrorCode.SASL_AUTHENTICATION_FAILED, exc.message, exc.token)) from None
        if not done:
            return answer(ErrorCode.NONE, None, token)
        lifetime = self._start_session(conn, principal)
        return answer(ErrorCode.NONE, None, token, lifetime)

    def _start_session(self, conn: "Connection", principal: Principal) -> int:
        outcome = "reauthenticated" if self.reauthenticating else "authenticated"
        self.broker.kafka.auth_counts[self.mechanism, outcome] += 1
        log.debug("%s %s as %s with %s", conn.peer, "re-authenticated" if self.reauthenticating else "authenticated",
                  principal, self.mechanism)
        conn.principal = principal
        self.state = AUTHENTICATED
        self.max_receive = _UNLIMITED
        self.reauthenticating = False
        self.exchange = None
        lifetime = self.cfg.connections_max_reauth_ms
        self.expires_at = asyncio.get_running_loop().time() + lifetime / 1000 if lifetime > 0 else None
        return lifetime

    async def _raw_token(self, token: bytes, conn: "Connection") -> bytes:
        """A SASL token after SaslHandshake v0: a bare frame, answered by a bare frame; a
        failure closes the connection without an answer (there is no error field)."""
        from fluvial.broker.server import CloseConnection
        try:
            out, done = await self.exchange.step(token)
            principal = Principal.user(self.exchange.user) if done else None
        except AuthenticationFailed as exc:
            self.broker.kafka.auth_counts[self.mechanism, "failed"] += 1
            log.info("SASL authentication from %s failed: %s", conn.peer, exc)
            raise CloseConnection(f"SASL authentication failed ({exc})") from None
        if done:
            self.raw_tokens = False
            self._start_session(conn, principal)
        return _SIZE.pack(len(out)) + out


async def secure_connection(server: "KafkaServer", conn: "Connection", tls: ssl.SSLContext | None) -> bool:
    """Set up a new connection's security: the TLS handshake (when the listener has TLS) and
    its gate. False when the connection must be dropped (the reason is logged)."""
    cfg = server.broker.config.security
    writer = conn.writer
    if tls is not None:
        try:
            await writer.start_tls(tls, ssl_handshake_timeout=cfg.ssl_handshake_timeout_ms / 1000)
        except Exception as exc:  # noqa: BLE001 - whatever the client did, it is logged and dropped
            server.tls_handshake_failures += 1
            log.info("TLS handshake with %s failed: %s", conn.peer, exc or type(exc).__name__)
            return False
        if not cfg.kafka_sasl:
            sslobj = writer.get_extra_info("ssl_object")
            try:
                principal = certificate_principal(sslobj.getpeercert(binary_form=True) if sslobj else None)
            except ValueError as exc:  # a verified certificate cryptography cannot read
                log.info("client certificate of %s unreadable, connection closed: %s", conn.peer, exc)
                return False
            if principal is not None:
                conn.principal = principal
                conn.auth = CertificateIdentity()
    if cfg.kafka_sasl:
        conn.auth = SaslSession(server.broker)
    return True
