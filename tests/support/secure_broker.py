"""A Fluvial broker with security on, for the client tests: users written into its data
directory before it starts (as `fluvial user` does), and the command-line flags of a
TLS/SASL Kafka listener."""
from __future__ import annotations

from pathlib import Path

from fluvial.security.users import UserStore
from tests.support.certs import TestPki


def add_users(data_dir: Path, users: dict[str, str]) -> None:
    """Users with SCRAM-SHA-256/512 credentials (PLAIN checks the password against them too)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    store = UserStore.in_data_dir(data_dir)
    for name, password in users.items():
        store.set_password(name, password)


def kafka_listener_args(pki: TestPki, protocol: str = "SASL_SSL",
                        mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")) -> list[str]:
    """`fluvial broker` flags for the Kafka listener's security protocol, its TLS files and mechanisms."""
    args = ["--security-protocol", protocol, "--sasl-enabled-mechanisms", ",".join(mechanisms)]
    if protocol in ("SSL", "SASL_SSL"):
        args += ["--ssl-certificate-location", str(pki.server.cert), "--ssl-key-location", str(pki.server.key)]
    return args


def authorizer_args(super_users: tuple[str, ...] = ("User:admin",)) -> list[str]:
    """Flags that turn ACL enforcement on, with super users."""
    return ["--authorizer-enabled", "true", "--super-users", ";".join(super_users)]
