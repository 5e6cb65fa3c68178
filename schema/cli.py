"""`fluvial schema register/get/list`: the registry's REST API from the command line."""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from fluvial.broker.cli import subcommand

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def _call(url: str, method: str = "GET", body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": CONTENT_TYPE})
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise SystemExit(f"error: HTTP {exc.code}: {detail}") from None


def schema_register(args) -> int:
    with open(args.file) as f:
        text = f.read()
    body = {"schema": text}
    if args.type != "AVRO":
        body["schemaType"] = args.type
    out = _call(f"{args.registry}/subjects/{args.subject}/versions", "POST", body)
    print(json.dumps(out))
    return 0


def schema_get(args) -> int:
    if args.id is not None:
        out = _call(f"{args.registry}/schemas/ids/{args.id}")
    else:
        out = _call(f"{args.registry}/subjects/{args.subject}/versions/{args.version}")
    print(json.dumps(out, indent=2))
    return 0


def schema_list(args) -> int:
    if args.subject:
        print(json.dumps(_call(f"{args.registry}/subjects/{args.subject}/versions")))
    else:
        for s in _call(f"{args.registry}/subjects"):
            print(s)
    return 0


@subcommand
def register_schema_cli(sub) -> None:
    p = sub.add_parser("schema", help="register, get and list schemas in the registry")
    ss = p.add_subparsers(dest="action", required=True)

    def common(q):
        q.add_argument("--registry", default="http://127.0.0.1:8081", help="registry base URL")

    q = ss.add_parser("register")
    common(q)
    q.add_argument("subject")
    q.add_argument("file", help="schema file (Avro JSON or JSON Schema)")
    q.add_argument("--type", choices=["AVRO", "JSON"], default="AVRO")
    q.set_defaults(run=schema_register)
    q = ss.add_parser("get")
    common(q)
    q.add_argument("subject", nargs="?")
    q.add_argument("--version", default="latest")
    q.add_argument("--id", type=int)
    q.set_defaults(run=schema_get)
    q = ss.add_parser("list")
    common(q)
    q.add_argument("subject", nargs="?")
    q.set_defaults(run=schema_list)


