"""The broker's authorizer options (Kafka's authorizer.class.name, super.users,
allow.everyone.if.no.acl.found) as `fluvial broker` flags."""
from __future__ import annotations

import argparse
import dataclasses

from fluvial.security.config import SecurityConfig
from fluvial.security.principal import Principal


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds the flags a parser does not define yet (the listener security flags may)."""
    known = p._option_string_actions
    g = p.add_argument_group("authorization (ACLs)")
    if "--authorizer-enabled" not in known:
        g.add_argument("--authorizer-enabled", choices=["true", "false"], default=None,
                       help="enforce ACLs on every Kafka API and the table API (default: false)")
    if "--super-users" not in known:
        g.add_argument("--super-users", default=None, metavar="User:a;User:b",
                       help="principals that bypass ACLs, ';'-separated as in Kafka's super.users")
    if "--allow-everyone-if-no-acl-found" not in known:
        g.add_argument("--allow-everyone-if-no-acl-found", choices=["true", "false"], default=None,
                       help="allow an operation on a resource that has no ACL at all (default: false)")


def apply(args: argparse.Namespace, security: SecurityConfig) -> SecurityConfig:
    """The settings given on the command line override those already in `security`."""
    changes: dict = {}
    if getattr(args, "authorizer_enabled", None) is not None:
        changes["authorizer"] = args.authorizer_enabled == "true"
    if getattr(args, "super_users", None) is not None:
        users = tuple(u.strip() for u in args.super_users.split(";") if u.strip())
        for u in users:
            try:
                Principal.parse(u)
            except ValueError as exc:
                raise SystemExit(f"--super-users: {exc}") from None
        changes["super_users"] = users
    if getattr(args, "allow_everyone_if_no_acl_found", None) is not None:
        changes["allow_everyone_if_no_acl_found"] = args.allow_everyone_if_no_acl_found == "true"
    return dataclasses.replace(security, **changes) if changes else security
