"""`fluvial topic ...` and `fluvial group ...`: administration over the Kafka protocol.

These tools speak to a running broker as any Kafka admin client does (kafka-python's
KafkaAdminClient), so they work against Fluvial and Apache Kafka alike.
"""
from __future__ import annotations

import argparse
import json
import sys

from fluvial.broker.cli import subcommand
from fluvial.client.cli_options import add_connection_arguments


def _admin(args):
    from kafka.admin import KafkaAdminClient
    return KafkaAdminClient(bootstrap_servers=args.bootstrap, client_id="fluvial-cli", request_timeout_ms=15000)


def _add_bootstrap(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default="127.0.0.1:9092", help="broker address host:port")


def _print(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _parse_configs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"config {item!r} must look like name=value")
        k, v = item.split("=", 1)
        out[k] = v
    return out


# ---- topics -----------------------------------------------------------------

def topic_list(args) -> int:
    admin = _admin(args)
    for name in sorted(admin.list_topics()):
        print(name)
    admin.close()
    return 0


def topic_describe(args) -> int:
    from kafka.admin import ConfigResource, ConfigResourceType
    admin = _admin(args)
    described = admin.describe_topics([args.topic])
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, args.topic)], config_filter="all")
    admin.close()
    topic = described[0]
    if topic.get("error_code"):
        print(f"error: topic {args.topic}: error code {topic['error_code']}", file=sys.stderr)
        return 1
    entries = {name: c["value"] for name, c in configs.get("topic", {}).get(args.topic, {}).items()}
    partitions = [p["partition_index"] for p in topic["partitions"]]
    out = {"topic": args.topic, "topic_id": str(topic.get("topic_id")), "partitions": partitions,
           "configs": entries, "offsets": _partition_offsets(args, partitions)}
    if args.table_api:
        # Bytes and segment counts of the local and the remote log are not in the Kafka
        # protocol: the table API's status action has them.
        from fluvial.client import Client
        from fluvial.client.cli_options import security_from_args
        with Client(args.table_api, security=security_from_args(args)) as client:
            out["storage"] = client.storage_status(args.topic)["buckets"]
    _print(out)
    return 0


def _partition_offsets(args, partitions: list[int]) -> list[dict]:
    """Per partition: log start (remote included), local log start, last tiered offset, high watermark."""
    from kafka import TopicPartition
    from kafka.protocol.consumer.offsets import OffsetSpec

    admin = _admin(args)
    try:
        specs = {"log_start": OffsetSpec.EARLIEST, "local_log_start": OffsetSpec.EARLIEST_LOCAL,
                 "last_tiered": OffsetSpec.LATEST_TIERED, "high_watermark": OffsetSpec.LATEST}
        rows = {p: {"partition": p} for p in partitions}
        for name, spec in specs.items():
            try:
                found = admin.list_partition_offsets({TopicPartition(args.topic, p): spec for p in partitions})
            except Exception:  # noqa: BLE001 - a broker without tiered storage may not know the spec
                continue
            for tp, value in found.items():
                rows[tp.partition][name] = value.offset
        return [rows[p] for p in partitions]
    finally:
        admin.close()


def topic_create(args) -> int:
    from kafka.admin import NewTopic
    configs = _parse_configs(args.config)
    if getattr(args, "format", None):
        configs["fluvial.value.format"] = args.format
    if getattr(args, "schema", None):
        with open(args.schema) as f:
            configs["fluvial.value.schema"] = f.read()
    admin = _admin(args)
    admin.create_topics([NewTopic(args.topic, args.partitions, 1, topic_configs=configs)])
    admin.close()
    print(f"created {args.topic}")
    return 0


def topic_alter(args) -> int:
    admin = _admin(args)
    if args.partitions:
        from kafka.admin import NewPartitions
        admin.create_partitions({args.topic: NewPartitions(args.partitions)})
    configs = _parse_configs(args.config)
    if configs:
        from kafka.admin import ConfigResource, ConfigResourceType
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, args.topic, configs=configs)])
    admin.close()
    print(f"altered {args.topic}")
    return 0


@subcommand
def register_topic(sub) -> None:
    p = sub.add_parser("topic", help="list, describe, create and alter topics")
    ts = p.add_subparsers(dest="action", required=True)
    q = ts.add_parser("list")
    _add_bootstrap(q)
    q.set_defaults(run=topic_list)
    q = ts.add_parser("describe")
    _add_bootstrap(q)
    q.add_argument("topic")
    q.add_argument("--table-api", default=None, metavar="URL",
                   help="also show local/remote bytes and segment counts from the table API (grpc://host:port)")
    add_connection_arguments(q)
    q.set_defaults(run=topic_describe)
    q = ts.add_parser("create")
    _add_bootstrap(q)
    q.add_argument("topic")
    q.add_argument("--partitions", type=int, default=1)
    q.add_argument("--config", action="append", help="name=value (repeatable)")
    q.add_argument("--format", choices=["raw", "avro", "json"], help="value format of the table")
    q.add_argument("--schema", help="file holding the value schema (Avro)")
    q.set_defaults(run=topic_create)
    q = ts.add_parser("alter")
    _add_bootstrap(q)
    q.add_argument("topic")
    q.add_argument("--partitions", type=int, help="new total number of partitions")
    q.add_argument("--config", action="append", help="name=value to set (repeatable)")
    q.set_defaults(run=topic_alter)


# ---- groups -----------------------------------------------------------------

def group_list(args) -> int:
    admin = _admin(args)
    for group in sorted(admin.list_groups(), key=lambda g: g["group_id"]):
        print(group["group_id"])
    admin.close()
    return 0


def group_describe(args) -> int:
    admin = _admin(args)
    desc = admin.describe_groups([args.group])[args.group]
    offsets = admin.list_group_offsets({args.group: None}).get(args.group, {})
    admin.close()
    _print({"group": args.group, "state": desc["group_state"], "protocol": desc.get("protocol_data"),
            "members": [{k: str(v) for k, v in m.items() if k in ("member_id", "client_id", "client_host",
                                                                    "group_instance_id")}
                        for m in desc["members"]],
            "offsets": {f"{tp.topic}-{tp.partition}": om.offset for tp, om in sorted(offsets.items())}})
    return 0


def group_reset_offsets(args) -> int:
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec
    admin = _admin(args)
    described = admin.describe_topics([args.topic])[0]
    tps = [TopicPartition(args.topic, p["partition_index"]) for p in described["partitions"]]
    if args.to_earliest:
        target = OffsetSpec.EARLIEST
    elif args.to_latest:
        target = OffsetSpec.LATEST
    else:
        target = args.to_offset
    result = admin.reset_group_offsets(args.group, {tp: target for tp in tps})
    admin.close()
    failed = {str(tp): r["error"].__name__ for tp, r in result.items() if r["error"].errno != 0}
    _print({f"{tp.topic}-{tp.partition}": r["offset"] for tp, r in sorted(result.items())})
    if failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    return 0


@subcommand
def register_group(sub) -> None:
    p = sub.add_parser("group", help="list, describe and reset consumer groups")
    gs = p.add_subparsers(dest="action", required=True)
    q = gs.add_parser("list")
    _add_bootstrap(q)
    q.set_defaults(run=group_list)
    q = gs.add_parser("describe")
    _add_bootstrap(q)
    q.add_argument("group")
    q.set_defaults(run=group_describe)
    q = gs.add_parser("reset-offsets")
    _add_bootstrap(q)
    q.add_argument("group")
    q.add_argument("--topic", required=True)
    how = q.add_mutually_exclusive_group(required=True)
    how.add_argument("--to-earliest", action="store_true")
    how.add_argument("--to-latest", action="store_true")
    how.add_argument("--to-offset", type=int)
    q.set_defaults(run=group_reset_offsets)
