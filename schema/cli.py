"""`fluvial schema ...`: register, get, list, check and configure schemas over the registry's REST API."""
from __future__ import annotations

import argparse
import base64
import json
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from fluvial.broker.cli import subcommand
from fluvial.client.cli_options import add_connection_arguments, security_from_args
from fluvial.client.auth import ConnectionSecurity

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryCallError(Exception):
    def __init__(self, status: int, body: Any):
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


@dataclass(frozen=True)
class RegistryTarget:
    """Where the registry is, and how to reach a secured one (HTTPS trust, basic credentials)."""

    url: str
    security: ConnectionSecurity = ConnectionSecurity()


def _target(args) -> RegistryTarget:
    return RegistryTarget(args.url, security_from_args(args))


def call(target: str | RegistryTarget, path: str, method: str = "GET", body: Any = None) -> Any:
    """One request to the registry; RegistryCallError carries its error body."""
    if isinstance(target, str):
        target = RegistryTarget(target)
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE}
    sec = target.security
    if sec.username is not None:
        token = base64.b64encode(f"{sec.username}:{sec.password or ''}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    roots = sec.root_certs_pem()
    context = ssl.create_default_context(cadata=roots.decode()) if roots else None
    req = urllib.request.Request(target.url.rstrip("/") + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            detail = json.loads(raw)
        except ValueError:
            detail = raw.decode(errors="replace")
        raise RegistryCallError(e.code, detail) from None


def _quote(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def _fail(exc: RegistryCallError) -> int:
    body = exc.body
    if isinstance(body, dict) and "message" in body:
        print(f"error {body.get('error_code')}: {body['message']}", file=sys.stderr)
    else:
        print(f"error: {exc}", file=sys.stderr)
    return 1


def _schema_body(args) -> dict:
    path = args.file or args.schema_file
    if not path:
        raise SystemExit("error: give the schema file")
    with open(path) as f:
        text = f.read()
    body: dict[str, Any] = {"schema": text}
    if args.type.upper() != "AVRO":
        body["schemaType"] = args.type.upper()
    return body


def schema_register(args) -> int:
    try:
        out = call(_target(args), f"/subjects/{_quote(args.subject)}/versions", "POST", _schema_body(args))
        version = call(_target(args), f"/subjects/{_quote(args.subject)}", "POST", _schema_body(args))["version"]
    except RegistryCallError as exc:
        return _fail(exc)
    _print({"subject": args.subject, "id": out["id"], "version": version})
    return 0


def schema_get(args) -> int:
    try:
        if args.id is not None:
            out = call(_target(args), f"/schemas/ids/{args.id}")
        elif args.subject:
            out = call(_target(args), f"/subjects/{_quote(args.subject)}/versions/{args.version}")
        else:
            print("error: give a subject or --id", file=sys.stderr)
            return 2
    except RegistryCallError as exc:
        return _fail(exc)
    if args.schema_only:
        print(out["schema"])
    else:
        _print(out)
    return 0


def schema_list(args) -> int:
    try:
        if args.subject:
            out = call(_target(args), f"/subjects/{_quote(args.subject)}/versions")
        else:
            out = call(_target(args), "/subjects")
    except RegistryCallError as exc:
        return _fail(exc)
    if args.subject:
        print(json.dumps(out))
    else:
        for item in out:
            print(item)
    return 0


def schema_check(args) -> int:
    try:
        out = call(_target(args), f"/compatibility/subjects/{_quote(args.subject)}/versions/{args.version}?verbose=true",
                   "POST", _schema_body(args))
    except RegistryCallError as exc:
        return _fail(exc)
    _print(out)
    return 0 if out.get("is_compatible") else 1


def schema_config(args) -> int:
    path = f"/config/{_quote(args.subject)}" if args.subject else "/config"
    try:
        if args.set:
            out = call(_target(args), path, "PUT", {"compatibility": args.set.upper()})
        else:
            out = call(_target(args), path + ("?defaultToGlobal=true" if args.subject else ""))
    except RegistryCallError as exc:
        return _fail(exc)
    _print(out)
    return 0


def schema_delete(args) -> int:
    path = f"/subjects/{_quote(args.subject)}" + (f"/versions/{args.version}" if args.version else "")
    if args.permanent:
        path += "?permanent=true"
    try:
        out = call(_target(args), path, "DELETE")
    except RegistryCallError as exc:
        return _fail(exc)
    _print(out)
    return 0


@subcommand
def register_schema(sub) -> None:
    p = sub.add_parser("schema", help="register, get, list and check schemas in the schema registry")
    ss = p.add_subparsers(dest="action", required=True)

    def parser(name: str, help: str) -> argparse.ArgumentParser:
        q = ss.add_parser(name, help=help)
        q.add_argument("--registry", "--url", dest="url", default="http://127.0.0.1:8081",
                       help="schema registry URL (the broker's HTTP port; https:// when it uses TLS)")
        add_connection_arguments(q, "security of the HTTP port (an https:// url for TLS)")
        return q

    q = parser("register", "register a schema under a subject (<topic>-value for a table's values)")
    q.add_argument("subject")
    q.add_argument("schema_file", nargs="?", help="file holding the schema (Avro JSON or JSON Schema)")
    q.add_argument("--file", help="the same, as an option")
    q.add_argument("--type", default="AVRO", choices=["AVRO", "JSON", "avro", "json"])
    q.set_defaults(run=schema_register)

    q = parser("get", "print a schema by subject and version, or by id")
    q.add_argument("subject", nargs="?")
    q.add_argument("--version", default="latest")
    q.add_argument("--id", type=int)
    q.add_argument("--schema-only", action="store_true", help="print only the schema text")
    q.set_defaults(run=schema_get)

    q = parser("list", "list subjects, or the versions of one subject")
    q.add_argument("subject", nargs="?")
    q.set_defaults(run=schema_list)

    q = parser("check", "test a schema's compatibility with a subject's version (exit 1 when incompatible)")
    q.add_argument("subject")
    q.add_argument("schema_file", nargs="?")
    q.add_argument("--file")
    q.add_argument("--type", default="AVRO", choices=["AVRO", "JSON", "avro", "json"])
    q.add_argument("--version", default="latest")
    q.set_defaults(run=schema_check)

    q = parser("config", "show or set the compatibility level (global, or of a subject)")
    q.add_argument("subject", nargs="?")
    q.add_argument("--set", help="NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL, FULL_TRANSITIVE")
    q.set_defaults(run=schema_config)

    q = parser("delete", "delete a subject, or one of its versions")
    q.add_argument("subject")
    q.add_argument("--version")
    q.add_argument("--permanent", action="store_true")
    q.set_defaults(run=schema_delete)
