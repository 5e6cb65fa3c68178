"""`fluvial user add|list|delete`: users and their SCRAM credentials.

Online (the usual way), the tool is a Kafka admin client (confluent-kafka's) speaking
Kafka's DescribeUserScramCredentials / AlterUserScramCredentials, so it works against
Fluvial and Apache Kafka alike; the password is salted and hashed by the tool, never sent.
It connects as any client does: `--bootstrap`, then `--security-protocol`,
`--sasl-mechanism`, `--username` (its password from $FLUVIAL_PASSWORD or
`--password-file`), `--ssl-ca-location`, ... or client properties from
`--command-config FILE` / `-X key=value` (librdkafka names).

Offline, `--data-dir DIR` edits the users file of a stopped broker directly (e.g. the
first administrator of a new cluster; `fluvial broker --user NAME=PASSWORD` does the same
at start).

The new user's password is never an argument (it would show in `ps` and shell history):
it comes from `--new-password-file`, $FLUVIAL_NEW_PASSWORD, or a prompt.

    FLUVIAL_PASSWORD=... fluvial user add alice --bootstrap host:9093 --security-protocol SASL_SSL \\
        --sasl-mechanism SCRAM-SHA-512 --username admin --ssl-ca-location ca.pem
    fluvial user list --bootstrap host:9093 --command-config admin.properties
    fluvial user delete alice --mechanism SCRAM-SHA-256 --command-config admin.properties
    fluvial user add admin --data-dir /var/lib/fluvial     # offline
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path

from fluvial.broker.cli import subcommand
from fluvial.security import scram

NEW_PASSWORD_ENV = "FLUVIAL_NEW_PASSWORD"
PASSWORD_ENV = "FLUVIAL_PASSWORD"


def _client_config(args) -> dict[str, str]:
    from fluvial.broker.acl_cli import client_config
    return client_config(args, "fluvial-user")


def _offline_store(data_dir: Path):
    from fluvial.security.users import UserStore
    store = UserStore.in_data_dir(data_dir)
    if not store.hold_lock():
        raise SystemExit(f"error: a broker is running on {data_dir}: change users through it (--bootstrap ...), "
                         f"or stop it first")
    return store


def _read_password(path: Path | None, env: str, prompt: str | None) -> str | None:
    if path is not None:
        text = Path(path).read_text()
        return text.splitlines()[0] if text else ""
    if os.environ.get(env) is not None:
        return os.environ[env]
    if prompt and sys.stdin.isatty():
        first = getpass.getpass(prompt)
        if getpass.getpass("again: ") != first:
            raise SystemExit("error: the passwords differ")
        return first
    return None


def _mechanisms(args) -> list[str]:
    return args.mechanism or list(scram.MECHANISMS)


def _admin(args):
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        raise SystemExit("error: fluvial user needs confluent-kafka to reach a broker (pip install confluent-kafka); "
                         "--data-dir works without it") from None
    return AdminClient(_client_config(args))


def _result(futures: dict, what: str, timeout: float) -> int:
    failed = 0
    for user, fut in futures.items():
        try:
            fut.result(timeout=timeout)
            print(f"{what} {user}")
        except Exception as exc:  # noqa: BLE001 - a KafkaException carrying the broker's error
            err = exc.args[0] if exc.args else exc
            print(f"error: {user}: {getattr(err, 'str', lambda: str(err))()}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def user_add(args) -> int:
    if not scram.MIN_ITERATIONS <= args.iterations <= scram.MAX_ITERATIONS:
        raise SystemExit(f"error: --iterations must be {scram.MIN_ITERATIONS} to {scram.MAX_ITERATIONS}")
    password = _read_password(args.new_password_file, NEW_PASSWORD_ENV, f"password of {args.name}: ")
    if not password:
        raise SystemExit(f"error: no password for {args.name}: use --new-password-file or ${NEW_PASSWORD_ENV}")
    if args.data_dir:
        try:
            _offline_store(args.data_dir).set_password(args.name, password, tuple(_mechanisms(args)),
                                                              args.iterations)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
        print(f"set {args.name}")
        return 0
    admin = _admin(args)  # kept referenced until the answers are in
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
    upserts = [UserScramCredentialUpsertion(args.name, ScramCredentialInfo(
        ScramMechanism[m.replace("-", "_")], args.iterations), password.encode())
        for m in _mechanisms(args)]
    return _result(admin.alter_user_scram_credentials(upserts, request_timeout=args.timeout), "set", args.timeout)


def user_delete(args) -> int:
    if args.data_dir:
        store = _offline_store(args.data_dir)
        if args.mechanism:
            store.apply(deletions=[(args.name, m) for m in args.mechanism])
            found = True
        else:
            found = store.delete_user(args.name)
        if not found:
            print(f"error: {args.name}: no such user", file=sys.stderr)
            return 1
        print(f"deleted {args.name}")
        return 0
    admin = _admin(args)
    from confluent_kafka.admin import ScramMechanism, UserScramCredentialDeletion
    mechanisms = args.mechanism
    if not mechanisms:
        described = _describe(admin, [args.name], args.timeout)
        mechanisms = [c["mechanism"] for c in described.get(args.name, {}).get("credentials", [])] or \
            list(scram.MECHANISMS)[:1]  # none: the broker says RESOURCE_NOT_FOUND
    deletions = [UserScramCredentialDeletion(args.name, ScramMechanism[m.replace("-", "_")]) for m in mechanisms]
    return _result(admin.alter_user_scram_credentials(deletions, request_timeout=args.timeout), "deleted",
                   args.timeout)


def _describe(admin, users: list[str] | None, timeout: float) -> dict:
    futures = admin.describe_user_scram_credentials(users or None, request_timeout=timeout)
    if not isinstance(futures, dict):   # all users: one future for the whole answer
        described = futures.result(timeout=timeout)
    else:
        described = {}
        for user, fut in futures.items():
            try:
                described[user] = fut.result(timeout=timeout)
            except Exception as exc:  # noqa: BLE001
                err = exc.args[0] if exc.args else exc
                described[user] = {"error": getattr(err, "str", lambda: str(err))()}
    out = {}
    for user, desc in described.items():
        if isinstance(desc, dict):
            out[user] = desc
        else:
            out[user] = {"credentials": [{"mechanism": info.mechanism.name.replace("_", "-"),
                                          "iterations": info.iterations}
                                         for info in desc.scram_credential_infos]}
    return out


def user_list(args) -> int:
    if args.data_dir:
        from fluvial.security.users import UserStore
        store = UserStore.in_data_dir(args.data_dir)
        names = args.names or store.names()
        out = {n: {"credentials": [{"mechanism": m, "iterations": c.iterations}
                                   for m, c in sorted(store.credentials(n).items())]}
               if n in store else {"error": "no such user"} for n in names}
    else:
        admin = _admin(args)
        out = _describe(admin, args.names, args.timeout)
    print(json.dumps(out, indent=2))
    return 1 if any("error" in v for v in out.values()) else 0


def _common(q: argparse.ArgumentParser) -> None:
    g = q.add_argument_group("connection (a running broker)")
    g.add_argument("--bootstrap", default="127.0.0.1:9092", help="broker address host:port")
    g.add_argument("--security-protocol", choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"), default=None)
    g.add_argument("--sasl-mechanism", choices=("PLAIN", *scram.MECHANISMS), default=None)
    g.add_argument("--username", default=None, help=f"who the tool logs in as (password: ${PASSWORD_ENV} or "
                                                    f"--password-file)")
    g.add_argument("--password-file", type=Path, default=None)
    g.add_argument("--ssl-ca-location", type=Path, default=None, help="CA the broker's certificate is checked against")
    g.add_argument("--ssl-certificate-location", type=Path, default=None, help="client certificate (mTLS)")
    g.add_argument("--ssl-key-location", type=Path, default=None, help="its private key")
    g.add_argument("--command-config", default=None, metavar="FILE",
                   help="client properties (librdkafka names), key=value lines")
    g.add_argument("-X", action="append", metavar="KEY=VALUE", help="one client property")
    g.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the broker's answer")
    q.add_argument("--data-dir", type=Path, default=None,
                   help="offline: edit the users file of a stopped broker instead of connecting")


@subcommand
def register_user(sub) -> None:
    p = sub.add_parser("user", help="add, list and delete users (SCRAM credentials)")
    acts = p.add_subparsers(dest="user_command", required=True)
    q = acts.add_parser("add", help="create a user or set its password")
    q.add_argument("name")
    q.add_argument("--mechanism", action="append", choices=list(scram.MECHANISMS),
                   help="SCRAM mechanism (repeatable; default: both)")
    q.add_argument("--iterations", type=int, default=scram.DEFAULT_ITERATIONS,
                   help=f"PBKDF2 iterations ({scram.MIN_ITERATIONS} to {scram.MAX_ITERATIONS})")
    q.add_argument("--new-password-file", type=Path, default=None,
                   help=f"file whose first line is the new user's password (default: ${NEW_PASSWORD_ENV} or a prompt)")
    _common(q)
    q.set_defaults(run=user_add)
    q = acts.add_parser("list", help="users and their SCRAM mechanisms (all, or the named ones)")
    q.add_argument("names", nargs="*")
    _common(q)
    q.set_defaults(run=user_list)
    q = acts.add_parser("delete", help="delete a user (or only some of its credentials)")
    q.add_argument("name")
    q.add_argument("--mechanism", action="append", choices=list(scram.MECHANISMS),
                   help="delete only this mechanism's credential (repeatable)")
    _common(q)
    q.set_defaults(run=user_delete)
