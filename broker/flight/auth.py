"""Authentication on the table API: the Flight basic-auth handshake, bearer tokens, and the
principal of every call.

A client sends `authorization: Basic <name:password>` (pyarrow's
`FlightClient.authenticate_basic_token`, Java's `ClientIncomingAuthHeaderMiddleware`); the
broker checks the password against its user store and answers with `authorization: Bearer
<token>`, which the client sends on every later call. Basic credentials are also accepted on
any call (answered with a token too), for clients that do no handshake.

A token is `<payload>.<signature>`: the payload (base64url JSON) names the user and the
expiry, the signature is an HMAC-SHA256 under a key drawn at broker start, compared in
constant time. Tokens need no storage and die with the broker; a client whose token expired
or whose broker restarted gets UNAUTHENTICATED and authenticates again (the native client
renews its token before it expires). The expiry is readable by clients on purpose.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from typing import Callable

import pyarrow.flight as flight

from fluvial.security.basic_auth import BasicCredentials, CredentialsError, PasswordChecker, parse_basic
from fluvial.security.principal import ANONYMOUS, Principal


MIDDLEWARE_KEY = "fluvial-auth"
# Tokens last an hour: long enough that renewals cost nothing measurable, short enough that a
# leaked token, or one issued before a password change, does not live long.
TOKEN_LIFETIME_S = 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    """Issues and checks bearer tokens signed with a per-process key."""

    def __init__(self, lifetime_s: float = TOKEN_LIFETIME_S, clock: Callable[[], float] = time.time):
        self._key = secrets.token_bytes(32)
        self.lifetime_s = lifetime_s
        self._clock = clock

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def issue(self, principal: Principal) -> str:
        body = {"user": principal.name, "exp": int(self._clock() + self.lifetime_s)}
        if principal.type != "User":
            body["type"] = principal.type
        payload = _b64(json.dumps(body, separators=(",", ":")).encode())
        return f"{payload}.{self._sign(payload)}"

    def check(self, token: str) -> Principal:
        payload, sep, signature = token.partition(".")
        if not sep or not hmac.compare_digest(self._sign(payload).encode(), signature.encode()):
            raise CredentialsError("invalid token: authenticate again")
        body = json.loads(_unb64(payload))
        if body["exp"] <= self._clock():
            raise CredentialsError("token expired: authenticate again")
        return Principal(body.get("type", "User"), body["user"])


class CallPrincipal(flight.ServerMiddleware):
    """Who makes a call; on a call that brought Basic credentials, also the token it gets."""

    def __init__(self, principal: Principal, token: str | None = None):
        self.principal = principal
        self.token = token

    def sending_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token else {}


class BasicTokenAuthFactory(flight.ServerMiddlewareFactory):
    """Authenticates every call (the handshake included) before the server sees it."""

    def __init__(self, checker: PasswordChecker, signer: TokenSigner):
        self.checker = checker
        self.signer = signer

    def start_call(self, info, headers) -> CallPrincipal:
        values = headers.get("authorization") or headers.get("Authorization")
        if not values:
            raise flight.FlightUnauthenticatedError(
                "authentication required: the table API needs a user name and password "
                "(FlightClient.authenticate_basic_token, or username=/password= in fluvial.client.connect)")
        scheme, _, value = values[0].strip().partition(" ")
        try:
            if scheme.lower() == "bearer":
                principal = self.signer.check(value.strip())
                # A deleted user's tokens die with it.
                if principal.type == "User" and not self.checker.still_exists(principal.name):
                    raise CredentialsError(f"user {principal.name!r} no longer exists")
                return CallPrincipal(principal)
            principal = self.checker.check(parse_basic(values[0]))
        except CredentialsError as exc:
            raise flight.FlightUnauthenticatedError(str(exc)) from None
        except (ValueError, KeyError, TypeError):  # a garbled token
            raise flight.FlightUnauthenticatedError("invalid token: authenticate again") from None
        return CallPrincipal(principal, self.signer.issue(principal))


class HandshakeAuthHandler(flight.ServerAuthHandler):
    """The handshake itself needs no messages: the middleware has already checked the
    credentials and sends the token in the response headers. Without a handler Flight
    would answer every handshake UNIMPLEMENTED."""

    def authenticate(self, outgoing, incoming) -> None:
        return None

    def is_valid(self, token: bytes) -> bytes:
        return b""


def principal_of(context) -> Principal:
    """The principal of a call (ANONYMOUS on a table API without authentication)."""
    middleware = context.get_middleware(MIDDLEWARE_KEY)
    return middleware.principal if middleware is not None else ANONYMOUS


def peer_host(context) -> str:
    """The client's address as ACLs name hosts ('ipv4:127.0.0.1:5123' -> '127.0.0.1')."""
    peer = context.peer() or ""
    if isinstance(peer, bytes):
        peer = peer.decode(errors="replace")
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        rest = rest.rpartition(":")[0]
        rest = rest.strip("[]")
        return rest.replace("%5B", "").replace("%5D", "")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return peer


def server_options(broker) -> dict:
    """The FlightServerBase keyword arguments for the broker's security settings."""
    cfg = broker.config.security
    options: dict = {}
    if cfg.flight_auth == "basic":
        users = getattr(broker, "users", None)
        if users is None:
            raise RuntimeError("flight_auth=basic needs the broker's user store")
        signer = TokenSigner()
        factory = BasicTokenAuthFactory(PasswordChecker(users.verify_password, users.__contains__), signer)
        broker.extensions["flight_tokens"] = signer
        options["auth_handler"] = HandshakeAuthHandler()
        options["middleware"] = {MIDDLEWARE_KEY: factory}
    elif cfg.flight_auth != "none":
        raise ValueError(f"flight_auth must be none or basic, not {cfg.flight_auth!r}")
    if cfg.flight_tls:
        options["tls_certificates"] = [tls_certificate(cfg)]
    return options


# The broker's own services calling its table API (the in-broker lake tiering worker). Basic
# auth only ever yields `User:` principals, so no user can become this one; only a token
# signed by this broker carries it.
BROKER_PRINCIPAL_TYPE = "Broker"


def broker_principal(broker) -> Principal:
    return Principal(BROKER_PRINCIPAL_TYPE, f"node-{broker.config.node_id}")


def internal_connection(broker):
    """(url, ConnectionSecurity) for a service of this broker calling its own table API."""
    from fluvial.client.auth import ConnectionSecurity

    cfg = broker.config.security
    host = broker.config.host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    url = f"{'grpc+tls' if cfg.flight_tls else 'grpc'}://{host}:{broker.ports['flight_port']}"
    signer = broker.extensions.get("flight_tokens")
    provider = (lambda: signer.issue(broker_principal(broker))) if signer is not None else None
    if not cfg.flight_tls:
        return url, ConnectionSecurity(token_provider=provider)
    # The broker's own certificate need not chain to a CA it knows (ssl_cafile is for client
    # certificates): a call to its own listener trusts exactly that certificate, under the
    # name it carries (the address dialled may not be among its names).
    cert = open(cfg.ssl_certfile, "rb").read()
    return url, ConnectionSecurity(token_provider=provider, tls_root_certs=cert,
                                   tls_override_hostname=certificate_name(cert))


def certificate_name(pem: bytes) -> str | None:
    """The first DNS name (else the common name) a PEM certificate is issued to."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = names.get_values_for_type(x509.DNSName)
        if dns:
            return dns[0]
    except x509.ExtensionNotFound:
        pass
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(common[0].value) if common else None


def tls_certificate(cfg) -> flight.CertKeyPair:
    """The broker's certificate and key for gRPC, which takes PEM bytes and no key password:
    an encrypted key is decrypted in memory."""
    if cfg.ssl_certfile is None or cfg.ssl_keyfile is None:
        raise ValueError("flight_tls needs ssl_certfile and ssl_keyfile (PEM)")
    cert = open(cfg.ssl_certfile, "rb").read()
    key = open(cfg.ssl_keyfile, "rb").read()
    if cfg.ssl_key_password:
        from cryptography.hazmat.primitives import serialization

        private = serialization.load_pem_private_key(key, cfg.ssl_key_password.encode())
        key = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    return flight.CertKeyPair(cert, key)


__all__ = ["BasicCredentials", "BasicTokenAuthFactory", "CallPrincipal", "HandshakeAuthHandler", "TokenSigner",
           "peer_host", "principal_of", "server_options"]
