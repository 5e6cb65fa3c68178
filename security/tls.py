"""TLS for the broker's listeners: one `ssl.SSLContext` built from the security settings.

Settings (Kafka's names; see `SecurityConfig`): `ssl.certificate.location` and
`ssl.key.location` (PEM), `ssl.key.password` (if the key is encrypted), `ssl.ca.location`
(CA bundle that client certificates are verified against) and `ssl.client.auth`
(none | requested | required).
"""
from __future__ import annotations

import ssl
from pathlib import Path

from fluvial.security.config import SecurityConfig
from fluvial.security.principal import Principal

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsConfigError(ValueError):
    """The TLS settings cannot make a context (missing file, wrong password, ...)."""


def server_context(cfg: SecurityConfig) -> ssl.SSLContext:
    """The server-side context every TLS listener uses (TLS 1.2 or newer)."""
    if cfg.ssl_certfile is None:
        raise TlsConfigError("TLS needs a server certificate: set ssl.certificate.location (and ssl.key.location)")
    if cfg.ssl_client_auth not in CLIENT_AUTH:
        raise TlsConfigError(f"ssl.client.auth must be one of {', '.join(CLIENT_AUTH)}, not {cfg.ssl_client_auth!r}")
    if cfg.ssl_client_auth != "none" and cfg.ssl_cafile is None:
        raise TlsConfigError("ssl.client.auth=%s needs ssl.ca.location (the CA client certificates are checked "
                             "against)" % cfg.ssl_client_auth)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cfg.ssl_certfile), str(cfg.ssl_keyfile) if cfg.ssl_keyfile else None,
                            password=cfg.ssl_key_password)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load the server certificate {cfg.ssl_certfile} / key {cfg.ssl_keyfile}: "
                             f"{exc}") from None
    if cfg.ssl_cafile is not None:
        try:
            ctx.load_verify_locations(cafile=str(cfg.ssl_cafile))
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot load the CA bundle {cfg.ssl_cafile}: {exc}") from None
    ctx.verify_mode = CLIENT_AUTH[cfg.ssl_client_auth]
    return ctx


def client_context(cafile: Path | str | None = None, certfile: Path | str | None = None,
                   keyfile: Path | str | None = None, key_password: str | None = None,
                   check_hostname: bool = True) -> ssl.SSLContext:
    """A client-side context for Fluvial's own tools (`fluvial user`, ...)."""
    ctx = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    ctx.check_hostname = check_hostname
    if not check_hostname:
        ctx.verify_mode = ssl.CERT_REQUIRED
    if certfile:
        ctx.load_cert_chain(str(certfile), str(keyfile) if keyfile else None, password=key_password)
    return ctx


def certificate_principal(der: bytes | None) -> Principal | None:
    """The principal of a verified client certificate, as Kafka's default principal builder
    names it: User:<subject distinguished name in RFC 2253 form>, e.g. User:CN=alice,O=acme."""
    if not der:
        return None
    from cryptography import x509  # imported here: only TLS listeners with client certificates need it
    cert = x509.load_der_x509_certificate(der)
    return Principal.user(cert.subject.rfc4514_string())
