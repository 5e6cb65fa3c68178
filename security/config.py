"""Security settings of the broker's three listeners (Kafka, HTTP, Flight)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass
class SecurityConfig:
    # Kafka listener: Kafka's security.protocol names.
    security_protocol: str = "PLAINTEXT"
    sasl_enabled_mechanisms: tuple[str, ...] = SASL_MECHANISMS
    # TLS (PEM files), used by every listener that has TLS on.
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: str | None = None
    # CA bundle that client certificates are checked against (mTLS).
    ssl_cafile: Path | None = None
    # Kafka's ssl.client.auth: none | requested | required. A verified client certificate's
    # subject becomes the principal on an SSL listener.
    ssl_client_auth: str = "none"
    # Longest a client may take to complete the TLS handshake before it is disconnected.
    ssl_handshake_timeout_ms: int = 10_000
    # KIP-368: longest an authenticated SASL session lasts before the client must
    # re-authenticate (0: no limit; Kafka's connections.max.reauth.ms).
    connections_max_reauth_ms: int = 0
    # ACLs: enforced when on (Kafka's authorizer.class.name set); super users bypass them.
    authorizer: bool = False
    super_users: tuple[str, ...] = ()
    allow_everyone_if_no_acl_found: bool = False
    # HTTP port (schema registry, console, metrics) and table API (Flight).
    http_auth: str = "none"      # none | basic
    http_tls: bool = False
    flight_auth: str = "none"    # none | basic
    flight_tls: bool = False
    # Users created at start (name -> password), e.g. the first admin of a new cluster;
    # stored like any other user (salted SCRAM credentials), never kept in clear.
    bootstrap_users: dict[str, str] = field(default_factory=dict)

    @property
    def kafka_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def kafka_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def any_authentication(self) -> bool:
        return (self.kafka_sasl or (self.kafka_tls and self.ssl_client_auth == "required")
                or self.http_auth != "none" or self.flight_auth != "none")
