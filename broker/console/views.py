"""What each console page shows, gathered from the broker's state.

Functions here may read SQLite (registry, lake state rows), RocksDB properties and the
remote log manifests: the console calls them on worker threads, never on the event loop.
"""
from __future__ import annotations

import difflib
import json
import os
import resource
import time
from typing import Any

import pyarrow as pa

from fluvial.broker import status
from fluvial.broker.config import TOPIC_CONFIGS
from fluvial.broker.flight.catalog import user_schema
from fluvial.broker.table_cli import cell_text


class NotFound(LookupError):
    """An unknown table, subject, version or group: answered with HTTP 404."""


def table_or_404(broker, name: str):
    table = broker.tables.tables.get(name)
    if table is None:
        raise NotFound(f"There is no table {name!r}.")
    return table


def memory_bytes() -> int:
    """Resident memory of the broker process (Linux /proc; elsewhere the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def store_url(broker) -> str:
    """Where tiered data goes, without credentials (the store's public description)."""
    description = broker.object_store.public_description()
    return str(description.get("url", description)) if isinstance(description, dict) else str(description)


def overview(broker) -> dict:
    tables = status.tables(broker)
    buckets = [b for t in tables for b in list(t.buckets)]
    offline = [f"{b.table.name}-{b.index}: {b.tablet.failure}" for b in buckets if b.tablet.failure is not None]
    metrics = broker.extensions.get("metrics")
    return {
        "cluster_id": broker.cluster_id, "uptime_s": int(time.time() - broker.started_ms / 1000),
        "ports": {"kafka": broker.kafka_port, **broker.ports}, "data_dir": str(broker.data_dir),
        "flush_policy": broker.config.flush_policy, "connections": broker.kafka.connection_count,
        "tables": len(tables), "buckets": len(buckets), "offline": offline,
        "bytes_local": sum(b.tablet.size_bytes for b in buckets),
        "groups": len(status.groups(broker)), "memory_bytes": memory_bytes(),
        "loop_lag_ms": round(metrics.loop_lag.last * 1000, 2) if metrics else None,
        "object_store": store_url(broker),
        "healthy": not offline,
    }


def table_rows(broker) -> list[dict]:
    out = []
    for t in status.tables(broker):
        buckets = [status.bucket_status(broker, b) for b in list(t.buckets)]
        out.append({"name": t.name, "kind": status.table_kind(t), "buckets": len(buckets),
                    "records": sum(b["high_watermark"] - b["log_start_offset"] for b in buckets),
                    "bytes": sum(b["bytes"] for b in buckets),
                    "remote_bytes": sum((b["remote"] or {}).get("bytes", 0) for b in buckets),
                    "online": all(b["online"] for b in buckets)})
    return out


def table_detail(broker, name: str) -> dict:
    table = table_or_404(broker, name)
    schema = user_schema(table)
    pk_columns = [c.strip() for c in table.configs.get("fluvial.primary.key", "").split(",") if c.strip()]
    configs = []
    for key in sorted(set(TOPIC_CONFIGS) | set(table.configs)):
        if key in table.configs:
            configs.append({"name": key, "value": table.configs[key], "source": "table"})
        elif key in TOPIC_CONFIGS:
            configs.append({"name": key, "value": table.config(key), "source": "default"})
    return {
        "name": table.name, "kind": status.table_kind(table), "topic_id": str(table.topic_id),
        "created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(table.created_ms / 1000)),
        "columns": [{"name": f.name, "type": str(f.type), "nullable": f.nullable, "key": f.name in pk_columns}
                    for f in schema],
        "primary_key": pk_columns, "configs": configs,
        "buckets": [status.bucket_status(broker, b) for b in list(table.buckets)],
        "kv": status.kv_status(table), "lake": status.lake_status(broker, table),
        "remote_storage": table.remote_storage_enabled,
    }


def lookup(broker, loop, name: str, raw_keys: dict[str, str]) -> tuple[list[str], list[list[str]]]:
    """Rows of a primary-key table by key (blocking: RocksDB reads, then a wait on the loop
    for the rows' durability). ValueError for keys that do not fit the key columns."""
    import asyncio

    from fluvial.kv import pk_tables
    table = table_or_404(broker, name)
    if not pk_tables.is_primary_key(table):
        raise ValueError(f"table {name!r} has no primary key: look rows up in a primary-key table")
    pk = pk_tables.pk_state(table)
    key = {}
    for column in pk.layout.primary_key:
        text = raw_keys.get(column)
        if text is None or text == "":
            raise ValueError(f"give a value for every key column: {column!r} is missing")
        field = pk.schema.field(column)
        try:
            key[column] = pa.array([_typed(text, field.type)], field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, OverflowError) as exc:
            raise ValueError(f"{text!r} is not a {field.type} value for key column {column!r}: {exc}") from None

    def wait_durable(t, fence):
        asyncio.run_coroutine_threadsafe(pk_tables.await_fence(t, fence), loop).result()

    rows = pk_tables.lookup(table, pa.table(key), wait_durable=wait_durable)
    names = rows.column_names
    columns = [rows.column(n).to_pylist() for n in names]
    return names, [[cell_text(c[i], 200) for c in columns] for i in range(rows.num_rows)]


def _typed(text: str, arrow_type: pa.DataType) -> Any:
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return text
    if pa.types.is_binary(arrow_type):
        return text.encode()
    if pa.types.is_boolean(arrow_type):
        if text.lower() not in ("true", "false"):
            raise ValueError("use true or false")
        return text.lower() == "true"
    if pa.types.is_integer(arrow_type):
        return int(text)
    if pa.types.is_floating(arrow_type):
        return float(text)
    return pa.scalar(text).cast(arrow_type).as_py()


# -- schemas ------------------------------------------------------------------------------

def subjects(registry) -> list[dict]:
    out = []
    for subject in registry.subjects():
        latest = registry.latest(subject)
        if latest is None:
            continue
        version, schema = latest
        out.append({"subject": subject, "versions": len(registry.versions(subject)), "latest": version.version,
                    "id": version.schema_id, "type": schema.schema_type.value,
                    "compatibility": registry.compatibility(subject).value})
    return out


def pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, sort_keys=False)
    except ValueError:
        return text


def subject_detail(registry, subject: str, left: str | None, right: str | None) -> dict:
    from fluvial.schema.errors import RegistryError
    try:
        versions = registry.versions(subject)
    except RegistryError:
        raise NotFound(f"There is no subject {subject!r} in the schema registry.") from None
    numbers = [v.version for v in versions]

    def pick(text: str | None, default: int) -> int:
        if text in (None, ""):
            return default
        try:
            n = int(text)
        except ValueError:
            raise ValueError(f"a version is a whole number, not {text!r}") from None
        if n not in numbers:
            raise NotFound(f"Subject {subject!r} has versions {numbers}, not {n}.")
        return n

    b = pick(right, numbers[-1])
    a = pick(left, numbers[-2] if len(numbers) > 1 else numbers[-1])
    by_number = {v.version: v for v in versions}
    text_a = pretty(registry.schema(by_number[a].schema_id).text)
    text_b = pretty(registry.schema(by_number[b].schema_id).text)
    diff = list(difflib.unified_diff(text_a.splitlines(), text_b.splitlines(), f"version {a}", f"version {b}",
                                     lineterm="", n=3))
    return {"subject": subject, "versions": [{"version": v.version, "id": v.schema_id,
                                              "type": registry.schema(v.schema_id).schema_type.value}
                                             for v in versions],
            "left": a, "right": b, "schema": text_b, "diff": [_diff_line(line) for line in diff]}


def _diff_line(line: str) -> tuple[str, str]:
    kind = "meta" if line.startswith(("---", "+++", "@@")) else "add" if line.startswith("+") \
        else "del" if line.startswith("-") else "same"
    return kind, line


# -- groups -------------------------------------------------------------------------------

def group_rows(broker) -> list[dict]:
    lags: dict[str, int] = {}
    for p in status.group_lags(broker):
        lags[p.group] = lags.get(p.group, 0) + p.lag
    return [{**g, "member_count": len(g["members"]), "lag": lags.get(g["group"], 0)} for g in status.groups(broker)]


def group_detail(broker, group_id: str) -> dict:
    found = [g for g in status.groups(broker) if g["group"] == group_id]
    if not found:
        raise NotFound(f"There is no consumer group {group_id!r}.")
    partitions = status.group_lags(broker, group_id)
    return {**found[0], "partitions": partitions, "lag": sum(p.lag for p in partitions)}


# -- tiering ------------------------------------------------------------------------------

def tiering(broker) -> dict:
    remote = []
    lake = []
    for t in status.tables(broker):
        for b in list(t.buckets):
            s = status.bucket_status(broker, b)
            if s["remote"] is not None:
                remote.append({"table": t.name, **s})
        try:
            ls = status.lake_status(broker, t)
        except Exception as exc:  # noqa: BLE001 - shown, not raised: one table must not hide the others
            ls = {"table": t.name, "state": "unknown", "error": str(exc), "lag_records": None, "lag_seconds": None,
                  "rounds": None, "snapshot_id": None, "buckets": [], "job": None}
        if ls is not None:
            lake.append(ls)
    return {"object_store": store_url(broker), "remote": remote, "lake": lake,
            "lake_enabled": broker.extensions.get("lake") is not None,
            "lake_in_broker": broker.extensions.get("lake_worker") is not None}
