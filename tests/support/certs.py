"""Certificates made by the tests themselves: a CA, a server certificate for the loopback
listeners and client certificates (mTLS), written as PEM files."""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path


@dataclass(frozen=True)
class TestPki:
    ca: Path              # CA certificate (trust store of clients and of the broker for mTLS)
    ca_key: Path
    server: Pem           # for localhost / 127.0.0.1

    def client(self, common_name: str, directory: Path | None = None) -> Pem:
        """A client certificate signed by the CA; its subject is 'CN=<common_name>'."""
        directory = directory or self.ca.parent
        ca_cert = x509.load_pem_x509_certificate(self.ca.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
        return _issue(directory, f"client-{common_name}", x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
                      ca_cert.subject, ca_key, client=True)


def _write(directory: Path, stem: str, cert: x509.Certificate, key) -> Pem:
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Pem(cert_path, key_path)


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=30)))


def _issue(directory: Path, stem: str, subject: x509.Name, issuer: x509.Name, ca_key, *, client: bool) -> Pem:
    key = ec.generate_private_key(ec.SECP256R1())
    b = _builder(subject, issuer, key.public_key()).add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
    if client:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
    else:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
    return _write(directory, stem, b.sign(ca_key, hashes.SHA256()), key)


def make_pki(directory: Path) -> TestPki:
    """A fresh CA and a server certificate (localhost, 127.0.0.1) under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Fluvial test CA")])
    ca_cert = (_builder(name, name, ca_key.public_key())
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False, decipher_only=False), True)
               .sign(ca_key, hashes.SHA256()))
    ca = _write(directory, "ca", ca_cert, ca_key)
    server = _issue(directory, "server", x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]),
                    ca_cert.subject, ca_key, client=False)
    return TestPki(ca.cert, ca.key, server)
