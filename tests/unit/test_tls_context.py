"""The TLS context shared by the listeners: built from the security settings, clear errors."""
import ssl

import pytest

from fluvial.security.config import SecurityConfig
from fluvial.security.tls import TlsConfigError, certificate_principal, server_context
from tests.support.certs import make_pki


def test_context_modes(tmp_path):
    pki = make_pki(tmp_path)
    base = dict(ssl_certfile=pki.server.cert, ssl_keyfile=pki.server.key)
    assert server_context(SecurityConfig(**base)).verify_mode == ssl.CERT_NONE
    ctx = server_context(SecurityConfig(**base, ssl_cafile=pki.ca, ssl_client_auth="required"))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    ctx = server_context(SecurityConfig(**base, ssl_cafile=pki.ca, ssl_client_auth="requested"))
    assert ctx.verify_mode == ssl.CERT_OPTIONAL
    with pytest.raises(TlsConfigError, match="ssl.ca.location"):
        server_context(SecurityConfig(**base, ssl_client_auth="required"))
    with pytest.raises(TlsConfigError, match="ssl.client.auth"):
        server_context(SecurityConfig(**base, ssl_cafile=pki.ca, ssl_client_auth="maybe"))
    with pytest.raises(TlsConfigError, match="certificate"):
        server_context(SecurityConfig())
    with pytest.raises(TlsConfigError, match="cannot load"):
        server_context(SecurityConfig(ssl_certfile=tmp_path / "missing.pem", ssl_keyfile=pki.server.key))


def test_certificate_principal(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    pki = make_pki(tmp_path)
    client = pki.client("alice")
    der = x509.load_pem_x509_certificate(client.cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    assert str(certificate_principal(der)) == "User:CN=alice"
    assert certificate_principal(None) is None
