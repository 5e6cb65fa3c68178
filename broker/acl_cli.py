"""`fluvial acl add|list|remove`: ACLs of a running broker, through Kafka's ACL APIs.

The tool is a Kafka admin client (confluent-kafka's), so it works against Fluvial and Apache
Kafka alike, and it connects the way any client does: `--bootstrap`, then
`--security-protocol`, `--sasl-mechanism`, `--username` (its password from $FLUVIAL_PASSWORD
or `--password-file`, never an argument), `--ssl-ca-location`, ..., or client properties from
`--command-config FILE` (Kafka-style `key=value` lines, librdkafka names, as kafka-acls.sh
takes them) and `-X key=value`.

    fluvial acl add --principal User:alice --operation read --operation describe \\
        --topic orders --bootstrap host:9092 --command-config admin.properties
    fluvial acl add --principal User:etl --operation write --topic sales. --pattern prefixed
    fluvial acl add --principal User:bob --deny --operation write --topic orders
    fluvial acl list --topic orders                   # the ACLs naming this topic
    fluvial acl list --topic orders --pattern match   # every ACL that applies to it
    fluvial acl remove --principal User:bob --topic orders
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from fluvial.broker.cli import subcommand

_RESOURCES = (("topic", "TOPIC"), ("group", "GROUP"), ("transactional_id", "TRANSACTIONAL_ID"))


def read_properties(path: str) -> dict[str, str]:
    """Kafka-style properties: key=value lines; '#' and '!' start comments."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line[0] in "#!":
                continue
            key, sep, value = line.partition("=")
            if not sep:
                key, sep, value = line.partition(":")
            if not sep or not key.strip():
                raise SystemExit(f"{path}:{n}: expected key=value, got {line!r}")
            out[key.strip()] = value.strip()
    return out


PASSWORD_ENV = "FLUVIAL_PASSWORD"


def _password(args) -> str:
    if args.password_file:
        with open(args.password_file, encoding="utf-8") as f:
            return f.read().rstrip("\r\n")
    password = os.environ.get(PASSWORD_ENV)
    if password is None:
        raise SystemExit(f"--username {args.username} needs a password: set ${PASSWORD_ENV} or --password-file")
    return password


def client_config(args, client_id: str = "fluvial-acl") -> dict[str, str]:
    """librdkafka settings of the admin tools (`fluvial acl`, `fluvial user`) from their options."""
    conf = {"bootstrap.servers": args.bootstrap, "client.id": client_id}
    if args.security_protocol:
        conf["security.protocol"] = args.security_protocol
    if args.sasl_mechanism:
        conf["sasl.mechanism"] = args.sasl_mechanism
    if args.username:
        conf["sasl.username"] = args.username
        conf["sasl.password"] = _password(args)
    for key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
        value = getattr(args, key.replace(".", "_"))
        if value:
            conf[key] = str(value)
    if args.command_config:
        conf.update(read_properties(args.command_config))
    for item in args.X or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"-X takes key=value, not {item!r}")
        conf[key] = value
    return conf


def _admin(args):
    from confluent_kafka.admin import AdminClient
    return AdminClient(client_config(args))


def _enum(cls, name: str, what: str):
    try:
        return cls[name.upper().replace("-", "_")]
    except KeyError:
        choices = ", ".join(m.name.lower() for m in cls if m.name not in ("UNKNOWN",))
        raise SystemExit(f"unknown {what} {name!r} (one of: {choices})") from None


def _resource(args, *, required: bool):
    """(ResourceType, name) chosen by --topic/--group/--transactional-id/--cluster."""
    from confluent_kafka.admin import ResourceType
    chosen = [(kind, getattr(args, attr)) for attr, kind in _RESOURCES if getattr(args, attr) is not None]
    if args.cluster:
        chosen.append(("BROKER", "kafka-cluster"))
    if len(chosen) > 1:
        raise SystemExit("name one resource: --topic, --group, --transactional-id or --cluster")
    if not chosen:
        if required:
            raise SystemExit("name the resource: --topic, --group, --transactional-id or --cluster")
        return ResourceType.ANY, None
    kind, name = chosen[0]
    return ResourceType[kind], name


def _describe(binding) -> dict:
    rtype = binding.restype.name
    return {"resource_type": "CLUSTER" if rtype == "BROKER" else rtype, "name": binding.name,
            "pattern": binding.resource_pattern_type.name, "principal": binding.principal, "host": binding.host,
            "operation": binding.operation.name, "permission": binding.permission_type.name}


def acl_add(args) -> int:
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType
    rtype, name = _resource(args, required=True)
    pattern = _enum(ResourcePatternType, args.pattern or "literal", "pattern")
    permission = AclPermissionType.DENY if args.deny else AclPermissionType.ALLOW
    if not args.principal or not args.operation:
        raise SystemExit("acl add needs --principal and --operation")
    bindings = [AclBinding(rtype, name, pattern, principal, args.host or "*", _enum(AclOperation, op, "operation"),
                           permission)
                for principal in args.principal for op in args.operation]
    admin = _admin(args)
    failed = 0
    for binding, fut in admin.create_acls(bindings, request_timeout=args.timeout).items():
        try:
            fut.result()
            print(json.dumps({"added": _describe(binding)}))
        except Exception as exc:  # noqa: BLE001 - reported per ACL
            failed += 1
            print(f"error: {_describe(binding)}: {exc}", file=sys.stderr)
    return 1 if failed else 0


def _filter(args):
    from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType
    rtype, name = _resource(args, required=False)
    default_pattern = "any"
    pattern = _enum(ResourcePatternType, args.pattern or default_pattern, "pattern")
    permission = AclPermissionType.ANY
    if getattr(args, "deny", False):
        permission = AclPermissionType.DENY
    elif getattr(args, "allow", False):
        permission = AclPermissionType.ALLOW
    ops = [_enum(AclOperation, op, "operation") for op in (args.operation or [])] or [AclOperation.ANY]
    principals = args.principal or [None]
    return [AclBindingFilter(rtype, name, pattern, principal, args.host, op, permission)
            for principal in principals for op in ops]


# librdkafka (confluent-kafka) drops DescribeAcls' top-level error and returns an empty list,
# which would show a refused listing as "no ACLs": listing goes through kafka-python, whose
# admin client raises the broker's error. Client properties map to its settings.
_KAFKA_PYTHON_SETTINGS = {
    "security.protocol": "security_protocol", "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "sasl_plain_username", "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile", "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile", "ssl.key.password": "ssl_password",
}
_IGNORED_FOR_LISTING = {"client.id", "bootstrap.servers"}


def _listing_admin(args):
    from kafka.admin import KafkaAdminClient
    conf = client_config(args)
    settings: dict = {"bootstrap_servers": conf["bootstrap.servers"], "client_id": "fluvial-acl",
                      "request_timeout_ms": int(args.timeout * 1000)}
    for key, value in conf.items():
        if key in _IGNORED_FOR_LISTING:
            continue
        if key == "ssl.endpoint.identification.algorithm":
            settings["ssl_check_hostname"] = value.lower() == "https"
        elif key in _KAFKA_PYTHON_SETTINGS:
            settings[_KAFKA_PYTHON_SETTINGS[key]] = value
        else:
            raise SystemExit(f"acl list does not support the client property {key!r} "
                             f"(supported: {', '.join(sorted(_KAFKA_PYTHON_SETTINGS))})")
    return KafkaAdminClient(**settings)


def _kafka_python_filter(flt):
    from kafka.admin import (ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType,
                             ResourcePatternFilter, ResourceType)
    rtype = 4 if flt.restype.name == "BROKER" else int(flt.restype.value)
    return ACLFilter(principal=flt.principal, host=flt.host, operation=ACLOperation(int(flt.operation.value)),
                     permission_type=ACLPermissionType(int(flt.permission_type.value)),
                     resource_pattern=ResourcePatternFilter(ResourceType(rtype), flt.name,
                                                            ACLResourcePatternType(
                                                                int(flt.resource_pattern_type.value))))


def acl_list(args) -> int:
    filters = _filter(args)
    admin = _listing_admin(args)
    seen = {}
    try:
        for flt in filters:
            acls, _ = admin.describe_acls(_kafka_python_filter(flt))
            for acl in acls:
                d = {"resource_type": acl.resource_pattern.resource_type.name, "name": acl.resource_pattern.resource_name,
                     "pattern": acl.resource_pattern.pattern_type.name, "principal": acl.principal,
                     "host": acl.host, "operation": acl.operation.name, "permission": acl.permission_type.name}
                seen[str(d)] = d
    except Exception as exc:  # noqa: BLE001 - the broker's refusal, shown by name
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        admin.close()
    print(json.dumps(sorted(seen.values(), key=lambda d: (d["resource_type"], d["name"], d["principal"],
                                                         d["operation"])), indent=2))
    return 0


def acl_remove(args) -> int:
    filters = _filter(args)
    if not any([args.principal, args.operation, args.topic, args.group, args.transactional_id, args.cluster,
                args.host]) and not args.all:
        raise SystemExit("acl remove without any selector would remove every ACL: add --all to mean that")
    admin = _admin(args)
    removed = []
    for flt, fut in admin.delete_acls(filters, request_timeout=args.timeout).items():
        removed.extend(_describe(b) for b in fut.result())
    print(json.dumps({"removed": removed}, indent=2))
    return 0


def _common(q: argparse.ArgumentParser, *, filtering: bool) -> None:
    q.add_argument("--bootstrap", default="127.0.0.1:9092", help="broker address host:port")
    q.add_argument("--security-protocol", choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"))
    q.add_argument("--sasl-mechanism", choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))
    q.add_argument("--username", help=f"SASL user; the password comes from ${PASSWORD_ENV} or --password-file")
    q.add_argument("--password-file", help="file holding the SASL password")
    q.add_argument("--ssl-ca-location", help="CA bundle (PEM) the broker's certificate is checked against")
    q.add_argument("--ssl-certificate-location", help="client certificate (PEM) for mTLS")
    q.add_argument("--ssl-key-location", help="its private key (PEM)")
    q.add_argument("--command-config", help="client properties file (SASL/TLS settings, librdkafka names)")
    q.add_argument("-X", action="append", metavar="KEY=VALUE", help="one client property (repeatable)")
    q.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the broker")
    q.add_argument("--principal", action="append", help="User:NAME (repeatable); User:* is everyone")
    q.add_argument("--operation", action="append",
                   help="read, write, create, delete, alter, describe, cluster_action, describe_configs, "
                        "alter_configs, idempotent_write, all (repeatable)")
    q.add_argument("--host", default=None, help="client address the ACL applies to (default: any, '*')")
    q.add_argument("--topic")
    q.add_argument("--group")
    q.add_argument("--transactional-id")
    q.add_argument("--cluster", action="store_true", help="the cluster resource")
    q.add_argument("--pattern", help="literal (default for add) or prefixed; for list/remove also any (default) "
                                     "or match (every ACL that applies to the named resource)")
    q.add_argument("--deny", action="store_true", help="a DENY ACL (add) / only DENY ACLs (list, remove)")
    if filtering:
        q.add_argument("--allow", action="store_true", help="only ALLOW ACLs")


@subcommand
def register_acl(sub) -> None:
    p = sub.add_parser("acl", help="add, list and remove ACLs (Kafka's model)")
    acts = p.add_subparsers(dest="acl_command", required=True)
    q = acts.add_parser("add", help="add ALLOW (or --deny) ACLs: every --principal x every --operation")
    _common(q, filtering=False)
    q.set_defaults(run=acl_add)
    q = acts.add_parser("list", help="list the ACLs matching the options (all without options)")
    _common(q, filtering=True)
    q.set_defaults(run=acl_list)
    q = acts.add_parser("remove", help="remove the ACLs matching the options")
    _common(q, filtering=True)
    q.add_argument("--all", action="store_true", help="allow removing every ACL")
    q.set_defaults(run=acl_remove)
