"""The broker's security flags and its `--config FILE` of Kafka-style properties.

A config file holds `key=value` lines (`#` and `!` start comments, as in Java properties).
Every key is a broker flag written with dots: `security.protocol=SASL_SSL` is
`--security-protocol SASL_SSL`, `kafka.port=9093` is `--kafka-port 9093`. The file's
settings come first and flags given on the command line win. A key that names no flag,
or a bad value, stops the broker with a message (exit status 2).

Security settings (Kafka's names where Kafka has one; the TLS file names are librdkafka's):

  security.protocol                 PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL (Kafka listener)
  sasl.enabled.mechanisms           comma separated: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
  ssl.certificate.location          server certificate (PEM, may hold the chain)
  ssl.key.location                  its private key (PEM)
  ssl.key.password                  password of an encrypted key
  ssl.ca.location                   CA bundle (PEM) client certificates are verified against
  ssl.client.auth                   none | requested | required (mTLS on SSL listeners)
  ssl.handshake.timeout.ms          a TLS handshake not done by then is dropped (default 10000)
  connections.max.reauth.ms         KIP-368 session lifetime of SASL connections (0: none)
  authorizer.enabled                true | false: enforce ACLs
  super.users                       User:admin;User:ops (semicolon separated, as Kafka)
  allow.everyone.if.no.acl.found    true | false
  http.auth / flight.auth           none | basic (HTTP port, table API)
  http.tls / flight.tls             true | false (the same certificate as the Kafka listener)
  user                              NAME=PASSWORD, repeatable: users created at start
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
from pathlib import Path

from fluvial.security.config import SASL_MECHANISMS, SECURITY_PROTOCOLS, SecurityConfig
from fluvial.security.principal import Principal

log = logging.getLogger("fluvial.security")

_BOOL = ("true", "false")


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    d = SecurityConfig()
    g = p.add_argument_group("security (docs/security.md)")
    g.add_argument("--security-protocol", choices=SECURITY_PROTOCOLS, default=d.security_protocol,
                   help="Kafka listener: PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL")
    g.add_argument("--sasl-enabled-mechanisms", default=",".join(d.sasl_enabled_mechanisms),
                   help="SASL mechanisms offered, comma separated (default: PLAIN,SCRAM-SHA-256,SCRAM-SHA-512)")
    g.add_argument("--ssl-certificate-location", type=Path, default=None, help="server certificate (PEM)")
    g.add_argument("--ssl-key-location", type=Path, default=None, help="server private key (PEM)")
    g.add_argument("--ssl-key-password", default=None, help="password of an encrypted private key")
    g.add_argument("--ssl-ca-location", type=Path, default=None,
                   help="CA bundle (PEM) that client certificates are verified against")
    g.add_argument("--ssl-client-auth", choices=("none", "requested", "required"), default=d.ssl_client_auth,
                   help="client certificates: none, requested or required (mTLS)")
    g.add_argument("--ssl-handshake-timeout-ms", type=int, default=d.ssl_handshake_timeout_ms,
                   help="a client that has not completed the TLS handshake by then is disconnected")
    g.add_argument("--connections-max-reauth-ms", type=int, default=d.connections_max_reauth_ms,
                   help="SASL sessions last this long; clients re-authenticate (KIP-368); 0 = no limit")
    g.add_argument("--authorizer-enabled", choices=_BOOL, default=str(d.authorizer).lower(),
                   help="enforce ACLs on every listener")
    g.add_argument("--super-users", default=";".join(d.super_users),
                   help="principals that bypass ACLs, semicolon separated (User:admin;User:ops)")
    g.add_argument("--allow-everyone-if-no-acl-found", choices=_BOOL,
                   default=str(d.allow_everyone_if_no_acl_found).lower())
    g.add_argument("--http-auth", choices=("none", "basic"), default=d.http_auth,
                   help="HTTP port (schema registry, console): none or basic")
    g.add_argument("--http-tls", choices=_BOOL, default=str(d.http_tls).lower())
    g.add_argument("--flight-auth", choices=("none", "basic"), default=d.flight_auth,
                   help="table API (Arrow Flight): none or basic")
    g.add_argument("--flight-tls", choices=_BOOL, default=str(d.flight_tls).lower())
    g.add_argument("--user", action="append", default=[], metavar="NAME=PASSWORD",
                   help="create this user at start (repeatable); stored as salted SCRAM credentials")


def security_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> SecurityConfig:
    """The SecurityConfig of parsed flags; parser.error (exit 2) for a value that cannot work."""
    mechanisms = tuple(m.strip() for m in args.sasl_enabled_mechanisms.split(",") if m.strip())
    for m in mechanisms:
        if m not in SASL_MECHANISMS:
            parser.error(f"sasl.enabled.mechanisms: unknown mechanism {m!r} (known: {', '.join(SASL_MECHANISMS)})")
    if args.security_protocol.startswith("SASL") and not mechanisms:
        parser.error(f"security.protocol={args.security_protocol} needs at least one SASL mechanism")
    supers = tuple(s.strip() for s in args.super_users.split(";") if s.strip())
    for s in supers:
        try:
            Principal.parse(s)
        except ValueError as exc:
            parser.error(f"super.users: {exc}")
    if args.ssl_handshake_timeout_ms <= 0:
        parser.error("ssl.handshake.timeout.ms must be more than 0")
    if args.connections_max_reauth_ms < 0:
        parser.error("connections.max.reauth.ms must be 0 or more")
    users = {}
    for item in args.user:
        name, sep, password = item.partition("=")
        if not sep or not name or not password:
            parser.error(f"--user takes NAME=PASSWORD, not {item.split('=')[0]!r}...")
        users[name] = password
    cfg = SecurityConfig(
        security_protocol=args.security_protocol, sasl_enabled_mechanisms=mechanisms,
        ssl_certfile=args.ssl_certificate_location, ssl_keyfile=args.ssl_key_location,
        ssl_key_password=args.ssl_key_password, ssl_cafile=args.ssl_ca_location,
        ssl_client_auth=args.ssl_client_auth, ssl_handshake_timeout_ms=args.ssl_handshake_timeout_ms,
        connections_max_reauth_ms=args.connections_max_reauth_ms,
        authorizer=args.authorizer_enabled == "true", super_users=supers,
        allow_everyone_if_no_acl_found=args.allow_everyone_if_no_acl_found == "true",
        http_auth=args.http_auth, http_tls=args.http_tls == "true",
        flight_auth=args.flight_auth, flight_tls=args.flight_tls == "true",
        bootstrap_users=users)
    if cfg.kafka_tls or cfg.http_tls or cfg.flight_tls:
        from fluvial.security.tls import TlsConfigError, server_context
        try:
            server_context(cfg)
        except TlsConfigError as exc:
            parser.error(str(exc))
    return cfg


def config_file_flags(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """The flags a properties file stands for (they go before the command line's own)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        parser.error(f"--config {path}: {exc.strerror or exc}")
    known = {opt for action in parser._actions for opt in action.option_strings}
    flags: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            parser.error(f"{path}:{n}: expected key=value, not {line[:60]!r}")
        flag = "--" + key.replace(".", "-").replace("_", "-")
        if flag not in known or flag in ("--config", "--help"):
            parser.error(f"{path}:{n}: unknown setting {key!r}")
        flags += [flag, value]
    return flags


def expand_config_file(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`broker ... --config FILE ...` -> `broker <flags of FILE> ...` (flags given later win)."""
    out, file_flags, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                parser.error("--config needs a file")
            file_flags += config_file_flags(argv[i + 1], parser)
            i += 2
            continue
        if arg.startswith("--config="):
            file_flags += config_file_flags(arg.split("=", 1)[1], parser)
        else:
            out.append(arg)
        i += 1
    return out[:1] + file_flags + out[1:]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_open(host: str, cfg: SecurityConfig) -> bool:
    """A loud warning when anyone on the network can reach a broker with no authentication."""
    if is_loopback(host) or cfg.any_authentication:
        return False
    log.warning("!!! SECURITY WARNING: the broker listens on %s with no authentication on any listener: "
                "anyone who reaches it can read, write and delete every table. Set security.protocol "
                "(SASL_SSL, or SSL with ssl.client.auth=required), http.auth and flight.auth, or bind "
                "to 127.0.0.1 (see docs/security.md). !!!", host or "all addresses")
    return True
