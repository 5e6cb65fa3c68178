"""Read-only views of the broker's state, shared by the metrics and the web console.

Everything here reads in-memory state (and, for lake tables, one SQLite row): safe on
any thread, never blocking on the disk or the object store. Collections the event loop
mutates are copied (`list(...)`, `dict(...)`, atomic under the GIL) before iterating.
"""
from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from fluvial.broker.broker import Broker
    from fluvial.broker.tables import Bucket, Table


@dataclass(frozen=True)
class PartitionLag:
    """A consumer group's position on one bucket."""

    group: str
    table: str
    bucket: int
    committed: int
    high_watermark: int

    @property
    def lag(self) -> int:
        return max(0, self.high_watermark - self.committed)


def tables(broker: "Broker") -> list["Table"]:
    return sorted(list(broker.tables.tables.values()), key=lambda t: t.name)


def table_kind(table: "Table") -> str:
    """How a table is shown: primary-key, typed (avro/json) or raw log table."""
    if table.configs.get("fluvial.primary.key"):
        return "primary-key"
    fmt = getattr(table.value_format, "name", "raw")
    return f"log ({fmt})"


def group_coordinator(broker: "Broker"):
    return broker.extensions.get("groups")


def group_lags(broker: "Broker", group_id: str | None = None) -> list[PartitionLag]:
    """Committed offsets against the high watermark, per group and bucket (sorted)."""
    coord = group_coordinator(broker)
    if coord is None:
        return []
    out = []
    by_group = coord.committed_by_group()
    for gid in sorted(by_group) if group_id is None else [group_id]:
        for (topic, index), committed in sorted(by_group.get(gid, {}).items()):
            if committed is None:
                continue
            table = broker.tables.tables.get(topic)
            if table is None or not 0 <= index < len(table.buckets):
                continue
            out.append(PartitionLag(gid, topic, index, committed.offset, table.buckets[index].tablet.high_watermark))
    return out


def groups(broker: "Broker") -> list[dict]:
    """Every known group: id, state, protocol and members."""
    coord = group_coordinator(broker)
    if coord is None:
        return []
    for attempt in range(5):
        try:
            # Read from a worker thread while the loop may be changing a group's members:
            # a description caught mid-change is simply taken again.
            descriptions = coord.describe_groups(coord.group_ids())
            break
        except RuntimeError:  # "dictionary changed size during iteration"
            if attempt == 4:
                raise
    out = []
    modern = broker.extensions.get("consumer_groups")
    for description in descriptions:
        if modern is not None and modern.owns(description.group_id):
            continue  # a KIP-848 consumer group: described below
        out.append({"group": description.group_id, "state": description.state,
                    "protocol_type": description.protocol_type, "protocol": description.protocol_name,
                    "members": [{"member_id": m.member_id, "instance_id": m.group_instance_id,
                                 "client_id": m.client_id, "host": m.client_host,
                                 "partitions": assigned_partitions(m.assignment)}
                                for m in description.members]})
    if modern is not None:
        out += _consumer_groups(broker, modern)
    share = broker.extensions.get("share_groups")
    if share is not None:
        out += _share_groups(broker, share)
    return sorted(out, key=lambda g: g["group"])


def _share_groups(broker: "Broker", share) -> list[dict]:
    """Share groups (KIP-932): every member is assigned every partition of its topics."""
    by_id = broker.tables.by_id
    out = []
    for group_id, state in list(share.listings()):
        group = share.group(group_id)
        if group is None:
            continue
        members = []
        for m in list(group.members.values()):
            parts = share.assignment_of(m)
            members.append({"member_id": m.member_id, "instance_id": None, "client_id": m.client_id,
                            "host": m.client_host,
                            "partitions": sorted((by_id[t].name, p) for t, ps in parts.items() if t in by_id
                                                 for p in ps)})
        out.append({"group": group_id, "state": state, "protocol_type": "share", "protocol": "simple",
                    "members": members})
    return out


def _consumer_groups(broker: "Broker", modern) -> list[dict]:
    """KIP-848 consumer groups, in the same shape (the protocol is the server-side assignor)."""
    by_id = broker.tables.by_id
    for attempt in range(5):
        try:
            views = [modern.describe(group_id) for group_id, _ in modern.listings()]
            break
        except RuntimeError:  # changed while read from this thread: read again
            if attempt == 4:
                raise
    return [{"group": v.group_id, "state": v.state, "protocol_type": "consumer", "protocol": v.assignor_name,
             "members": [{"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
                          "host": m.client_host,
                          "partitions": sorted((by_id[t].name, p) for t, ps in m.assignment.items()
                                               if t in by_id for p in ps)}
                         for m in v.members]}
            for v in views if v.error == 0]


def assigned_partitions(assignment: bytes) -> list[tuple[str, int]]:
    """The (topic, partition) pairs of a consumer protocol assignment (empty if unreadable).

    The layout (any version): int16 version, int32 topic count, per topic an int16-length
    name and an int32 count of int32 partitions; user data follows and is ignored."""
    out: list[tuple[str, int]] = []
    try:
        view = memoryview(assignment)
        pos = 2
        (topics,) = struct.unpack_from(">i", view, pos)
        pos += 4
        for _ in range(max(topics, 0)):
            (length,) = struct.unpack_from(">h", view, pos)
            pos += 2
            topic = bytes(view[pos:pos + length]).decode()
            pos += length
            (count,) = struct.unpack_from(">i", view, pos)
            pos += 4
            for p in struct.unpack_from(f">{max(count, 0)}i", view, pos):
                out.append((topic, p))
            pos += 4 * max(count, 0)
    except (struct.error, UnicodeDecodeError):  # another protocol's bytes: shown without partitions
        return []
    return sorted(out)


def remote_status(broker: "Broker", bucket: "Bucket") -> dict | None:
    """The remote log of a bucket (None when the table has no remote storage and nothing tiered)."""
    state = broker.remote_log.known_state(bucket)
    if state is None:
        if not bucket.table.remote_storage_enabled:
            return None
        state = broker.remote_log.state(bucket)
    manifest = state.manifest
    if not bucket.table.remote_storage_enabled and manifest.version == 0:
        return None
    return {"start_offset": manifest.log_start_offset if manifest.version else None,
            "end_offset": manifest.end_offset if manifest.segments else None,
            "segments": len(manifest.segments), "bytes": manifest.size_bytes,
            "upload_failures": state.failures, "last_error": state.last_error}


def bucket_status(broker: "Broker", bucket: "Bucket") -> dict:
    tablet = bucket.tablet
    infos = tablet.segment_infos()
    remote = remote_status(broker, bucket)
    hwm = tablet.high_watermark
    return {"bucket": bucket.index, "log_start_offset": bucket.log_start_offset,
            "local_start_offset": tablet.log_start_offset, "log_end_offset": tablet.log_end_offset,
            "high_watermark": hwm, "segments": len(infos), "bytes": sum(i.size_bytes for i in infos),
            "online": tablet.failure is None, "failure": tablet.failure, "remote": remote,
            # Records not yet in the object store (closed segments wait for their upload).
            "tiering_lag": max(0, hwm - max(remote["end_offset"] or 0, bucket.log_start_offset))
            if remote is not None else None,
            "records_in": tablet.appended_records, "bytes_in": tablet.appended_bytes,
            "records_out": bucket.records_out, "bytes_out": bucket.bytes_out,
            "scan_records_out": bucket.scan_records_out, "scan_bytes_out": bucket.scan_bytes_out}


def kv_status(table: "Table") -> list[dict] | None:
    """Per bucket of a primary-key table: RocksDB sizes and the merge engine (None: not a PK table)."""
    pk = getattr(table, "pk", None)
    if pk is None:
        return None
    out = []
    for kv in list(pk.buckets):
        db = kv.tablet.db
        out.append({"bucket": kv.bucket.index, "engine": pk.spec.engine.value,
                    "keys": _rocksdb_int(db, "rocksdb.estimate-num-keys"),
                    "sst_bytes": _rocksdb_int(db, "rocksdb.total-sst-files-size"),
                    "live_bytes": _rocksdb_int(db, "rocksdb.estimate-live-data-size"),
                    "memtable_bytes": _rocksdb_int(db, "rocksdb.cur-size-all-mem-tables"),
                    "applied_offset": kv.tablet.applied_offset, "snapshot_offset": kv.snapshot_offset})
    return out


def _rocksdb_int(db, name: str) -> int:
    try:
        return int(db.property_int_value(name) or 0)
    except Exception:  # noqa: BLE001 - a closed tablet (table being dropped): nothing to report
        return 0


def lake_status(broker: "Broker", table: "Table") -> dict | None:
    """Lake tiering of a table from the coordinator's state row (no catalog I/O): None when
    the table is not a lake table."""
    coordinator = broker.extensions.get("lake")
    if coordinator is None:
        return None
    from fluvial.tiering.lake.coordinator import lake_enabled
    if not lake_enabled(table):
        return None
    rows = broker.store.query("SELECT state, offsets, tiered_ms, rounds, error, job, snapshot_id "
                              "FROM lake_tiering WHERE name = ?", (table.name,))
    row = rows[0] if rows else None
    offsets = {int(k): int(v) for k, v in json.loads(row["offsets"]).items()} if row else {}
    buckets = []
    for b in list(table.buckets):
        hwm = b.tablet.high_watermark
        tiered = offsets.get(b.index, 0)
        buckets.append({"bucket": b.index, "tiered": tiered, "high_watermark": hwm,
                        "lag_records": max(0, hwm - max(tiered, b.log_start_offset))})
    lag = sum(b["lag_records"] for b in buckets)
    tiered_ms = row["tiered_ms"] if row else None
    now = int(time.time() * 1000)
    return {"table": table.name, "state": row["state"] if row else "pending", "rounds": row["rounds"] if row else 0,
            "error": row["error"] if row else None, "job": row["job"] if row else None,
            "snapshot_id": row["snapshot_id"] if row else None, "tiered_ms": tiered_ms,
            "lag_records": lag, "buckets": buckets,
            "lag_seconds": round((now - (tiered_ms or table.created_ms)) / 1000, 3) if lag else 0.0}


def all_buckets(broker: "Broker") -> Iterator["Bucket"]:
    for table in tables(broker):
        yield from list(table.buckets)
