"""Command-line options of the tools that talk to the table API: user and TLS trust.

The password is never an argument (it would show in `ps` and shell history): it comes from
the environment (`FLUVIAL_PASSWORD`) or a file (`--password-file`, first line).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from fluvial.client.auth import ConnectionSecurity

PASSWORD_ENV = "FLUVIAL_PASSWORD"
USERNAME_ENV = "FLUVIAL_USERNAME"
TLS_ROOT_CERTS_ENV = "FLUVIAL_TLS_ROOT_CERTS"


def add_connection_arguments(p: argparse.ArgumentParser,
                             title: str = "table API security (a grpc+tls:// url for TLS)") -> None:
    g = p.add_argument_group(title)
    g.add_argument("--username", default=None,
                   help=f"user of the broker, when it authenticates clients (default: ${USERNAME_ENV})")
    g.add_argument("--password-file", type=Path, default=None,
                   help=f"file whose first line is the password (default: ${PASSWORD_ENV})")
    g.add_argument("--tls-root-certs", default=None, metavar="PEM",
                   help=f"CA certificate(s) the broker's certificate is checked against (default: "
                        f"${TLS_ROOT_CERTS_ENV}, else the system's trust store)")


def security_from_args(args: argparse.Namespace) -> ConnectionSecurity:
    username = getattr(args, "username", None) or os.environ.get(USERNAME_ENV) or None
    password_file = getattr(args, "password_file", None)
    if password_file is not None:
        password = password_file.read_text().splitlines()[0] if password_file.read_text() else ""
    else:
        password = os.environ.get(PASSWORD_ENV)
    if username is not None and password is None:
        raise SystemExit(f"error: --username {username} needs a password: set ${PASSWORD_ENV} or --password-file")
    roots = getattr(args, "tls_root_certs", None) or os.environ.get(TLS_ROOT_CERTS_ENV) or None
    return ConnectionSecurity(username, password, roots)
