"""Primary-key tables in the broker: KV tablets per bucket, the write path, lookups and the Kafka views.

A table created with `fluvial.primary.key` keeps, beside each bucket's log tablet (its
changelog and write-ahead log), a KV tablet with the current row of every key. Writes
from Kafka producers and from the table API go through `write_rows`: merge off the event
loop, changelog appended on it, then RocksDB. The companion topic `<table>.changelog`
serves the same log tablets read-only with -U rows; the table's own topic serves the
upsert stream.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.broker import kafka_batches
from fluvial.progress import ProgressLog
from fluvial.broker.broker import on_start, on_stop
from fluvial.broker.log import BatchMeta, FlushPolicy, StoredBatch
from fluvial.broker.log_table import stored_batches
from fluvial.broker.table_kind import CHANGELOG_SUFFIX, PRIMARY_KEY as PRIMARY_KEY_KIND, TableKind
from fluvial.broker.tables import Bucket, Table
from fluvial.errors import InvalidConfigError, InvalidRecordError, InvalidRequestError, InvalidTableError, StorageError
from fluvial.kv import ChangeType, KeyLayout, KvTablet, KvTabletError, MergeSpec, SnapshotInfo, SnapshotStore
from fluvial.kv.bucketing import FEW_KEYS, BucketFunction, _murmur2_one, buckets_of
from fluvial.kv.batch_io import murmur2_reheaded, take_binary
from fluvial.kv.durable_view import DurableView
from fluvial.kv.row_codec import DATA_PREFIX
from fluvial.kv.change_types import FIRST_HIDDEN, parse_changes
from fluvial.kv.rowmerger.aggregate import AGG_PREFIX, aggregates_from_configs
from fluvial.kv.rowmerger.retract import RetractStats
from fluvial.kv.tablet import CHANGE_COLUMN, SOURCE_COLUMN, cast_column
from fluvial.protocol.records import BatchHeader, RecordColumns, build_batch, decode_records
from fluvial.tiering.kv_snapshots import RemoteKvSnapshot, RemoteKvSnapshots, bucket_prefix

log = logging.getLogger(__name__)

PRIMARY_KEY = "fluvial.primary.key"
BUCKET_KEY = "fluvial.bucket.key"
BUCKET_FUNCTION = "fluvial.bucket.function"
KEY_FORMAT = "fluvial.key.format"
MERGE_ENGINE = "fluvial.merge.engine"
VERSION_COLUMN = "fluvial.version.column"
VALUE_FORMAT = "fluvial.value.format"
VALUE_SCHEMA = "fluvial.value.schema"
UPSERT_KEY = "fluvial.upsert.key"
RETRACT_STATE_TTL = "fluvial.retract.state.ttl.ms"
CHANGE_HEADER = "fluvial.change"

# Snapshots: every SNAPSHOT_INTERVAL_S seconds for buckets that changed, keeping SNAPSHOT_RETAIN.
SNAPSHOT_INTERVAL_S = float(os.environ.get("FLUVIAL_KV_SNAPSHOT_INTERVAL_S", "600"))
SNAPSHOT_RETAIN = int(os.environ.get("FLUVIAL_KV_SNAPSHOT_RETAIN", "3"))
# Snapshots kept in the object store per bucket (tables with remote storage on).
REMOTE_SNAPSHOT_RETAIN = int(os.environ.get("FLUVIAL_KV_REMOTE_SNAPSHOT_RETAIN", "2"))
# Writes smaller than this many rows merge on the event loop: a thread hop costs more.
INLINE_ROWS = 256
_REPLAY_CHUNK_BYTES = 16 << 20
# The former read path, kept only to measure against (benchmarks/bench_pk_lookup_fence.py):
# lookups then wait for the fsync of what they read instead of reading the durable state.
LOOKUPS_WAIT_FOR_FSYNC = os.environ.get("FLUVIAL_KV_LOOKUPS_WAIT_FOR_FSYNC") == "1"
_LABELS = [c.label.encode() for c in ChangeType]
_KEY_SETTINGS = (PRIMARY_KEY, BUCKET_KEY, BUCKET_FUNCTION, KEY_FORMAT, MERGE_ENGINE, VERSION_COLUMN, UPSERT_KEY, RETRACT_STATE_TTL)


def _columns(text: str | None) -> list[str]:
    return [c.strip() for c in (text or "").split(",") if c.strip()]


def is_primary_key(table: Table) -> bool:
    """A primary-key table (not its changelog view)."""
    return bool(table.configs.get(PRIMARY_KEY)) and not isinstance(table, ChangelogTable)


def pk_state(table: Table) -> "PkTable":
    """The primary-key state of a table (InvalidRequestError for other tables)."""
    return _state(table)


def _state(table: Table) -> "PkTable":
    pk = getattr(table, "pk", None)
    if pk is None:
        if getattr(table, "pk_error", None):
            raise StorageError(f"primary-key table {table.name!r} is unavailable: {table.pk_error}")
        raise InvalidRequestError(f"table {table.name!r} has no primary key")
    pk.follow_schema()
    return pk


class ReadOnlyTableError(InvalidTableError):
    """A write to the read-only changelog view of a primary-key table."""


# ---------------------------------------------------------------- key formats

class KeyFormat:
    """The Kafka key of a row: its primary-key columns in the table's key format. The
    canonical encoding is what the broker stores in `_key` and hashes for the bucket."""

    def __init__(self, name: str, codec, schema_id: int):
        self.name = name
        self.codec = codec
        self.schema_id = schema_id

    def encode(self, key_rows: pa.StructArray) -> pa.Array:
        return self.codec.encode(key_rows, np.full(len(key_rows), self.schema_id, np.int32))

    def decode(self, keys: pa.Array) -> pa.StructArray:
        columns, _ = self.codec.decode(keys)
        return columns


def key_avro_schema(table_name: str, key_schema: pa.Schema) -> dict:
    from fluvial.schema.arrow_mapping import arrow_to_avro
    name = "".join(ch if ch.isalnum() else "_" for ch in table_name)
    return arrow_to_avro(key_schema, f"{name}_key")


# ---------------------------------------------------------------- per-table state

@dataclass
class BucketKv:
    """One bucket's KV tablet, its write lock and its snapshots."""

    bucket: Bucket
    tablet: KvTablet
    snapshots: SnapshotStore
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    snapshot_offset: int = -1
    remote: "RemoteKvSnapshots | None" = None  # the table's remote storage is on
    remote_offset: int | None = None  # offset of the newest snapshot in the object store (None: not looked up)
    # Before-images of the writes not yet durable: lookups read the durable state without
    # waiting for an fsync (kv/durable_view.py).
    durable: DurableView | None = None


class PkTable:
    """What a primary-key table has beside its log tablets."""

    def __init__(self, table: Table, schema: pa.Schema, layout: KeyLayout, spec: MergeSpec,
                 key_format: KeyFormat, bucket_key_format: KeyFormat, schema_id: int):
        self.table = table
        self.schema = schema
        self.layout = layout
        self.spec = spec
        self.key_format = key_format
        self.bucket_key_format = bucket_key_format
        self.schema_id = schema_id
        self.buckets: list[BucketKv] = []
        self.changelog: ChangelogTable | None = None
        self._seen_schema = schema
        self._kafka_header: bytes | None = None  # see bucket_ids_of_keys; b"": not derivable
        # Lookup requests and keys asked for (metrics; approximate under concurrent readers).
        self.lookups = 0
        self.lookup_keys = 0

    def follow_schema(self) -> None:
        """After a schema evolution of the table, rows are merged, stored and read in the new columns."""
        codec = getattr(self.table.value_format, "codec", None)
        if codec is None:
            return
        schema = codec.table_schema
        if schema is self._seen_schema:
            return
        self._seen_schema = schema
        if schema.equals(self.schema):
            return
        self.schema = schema
        self.schema_id = _SERVICE["service"]._value_schema_id(self.table) if "service" in _SERVICE else self.schema_id
        for kv in self.buckets:
            kv.tablet.evolve(schema)

    def kafka_keys(self, rows: pa.RecordBatch | pa.StructArray) -> pa.Array:
        return self.key_format.encode(_select(rows, in_schema_order(self.schema, self.layout.primary_key),
                                              self.schema))

    def bucket_ids(self, rows: pa.RecordBatch | pa.Table) -> np.ndarray:
        """The bucket of each row (or key row), from its canonical bucket-key bytes."""
        if self.layout.bucket_key == self.layout.primary_key:
            keys = self.kafka_keys(rows)
        else:
            keys = self.bucket_key_format.encode(
                _select(rows, in_schema_order(self.schema, self.layout.bucket_key), self.schema))
        return buckets_of(keys, len(self.table.buckets), self.bucket_function)

    def row_bucket_ids(self, rows: pa.RecordBatch | pa.Table) -> np.ndarray:
        """`bucket_ids` of written rows: integer primary keys are hashed off their storage
        keys (one compiled pass each, kv/batch_io.py) instead of through Avro-encoded Kafka keys."""
        if self.layout._long_key and rows.num_rows > FEW_KEYS:
            return self.bucket_ids_of_keys(rows, self.layout.storage_keys(rows))
        return self.bucket_ids(rows)

    def bucket_ids_of_keys(self, keys: pa.Table, storage_keys: pa.Array) -> np.ndarray:
        """`bucket_ids` of lookup keys whose storage keys are known: with an Avro key format
        and the primary key in schema order (the bucket key), a row's Kafka key is its
        storage key's Avro body behind the 5-byte schema header, so the key columns are
        encoded once, not twice (a third of a point lookup's broker time otherwise)."""
        if not self.kafka_key_header():
            return self.bucket_ids(keys)
        if self.bucket_function == BucketFunction.MURMUR2 and len(storage_keys) > FEW_KEYS:
            # Hashed straight off the storage keys (kv/batch_io.py): no Kafka keys built.
            h = murmur2_reheaded(storage_keys, len(DATA_PREFIX), self._kafka_header)
            if h is not None:
                return ((h & np.uint32(0x7FFFFFFF)) % np.uint32(len(self.table.buckets))).astype(np.int32)
        kafka = reheaded(storage_keys, len(DATA_PREFIX), self._kafka_header)
        return buckets_of(kafka, len(self.table.buckets), self.bucket_function)

    def kafka_key_header(self) -> bytes:
        """The Avro header that turns a storage key's body into the row's Kafka key (see
        `bucket_ids_of_keys`); b"" where the Kafka key is not derivable that way."""
        if self._kafka_header is None:
            self._kafka_header = b""
            layout = self.layout
            if (self.key_format.name == "avro" and layout.bucket_key == layout.primary_key
                    and layout.storage_order == in_schema_order(self.schema, layout.primary_key)):
                self._kafka_header = bytes([0]) + int(self.key_format.schema_id).to_bytes(4, "big")
        return self._kafka_header

    def bucket_of_key(self, keys: pa.Table | pa.RecordBatch, storage_key: bytes) -> int:
        """`bucket_ids_of_keys` of one key row: murmur2 of its Kafka key hashed in Python
        when derivable from the storage key (no arrays), the array path otherwise."""
        header = self.kafka_key_header()
        if header and self.bucket_function == BucketFunction.MURMUR2:
            return (_murmur2_one(header + storage_key[len(DATA_PREFIX):]) & 0x7FFFFFFF) % len(self.table.buckets)
        return int(self.bucket_ids_of_keys(keys, pa.array([storage_key], pa.binary()))[0])

    @property
    def bucket_function(self) -> str:
        return BucketFunction.normalize(self.table.configs.get(BUCKET_FUNCTION))


def reheaded(values: pa.Array, old: int, header: bytes) -> pa.Array:
    """Binary values with their first `old` bytes replaced by `header`, in one pass."""
    n = len(values)
    if n <= FEW_KEYS:
        return pa.array([header + v[old:] for v in values.to_pylist()], pa.binary())
    _, obuf, dbuf = values.buffers()
    offsets = np.frombuffer(obuf, np.int32, n + 1, values.offset * 4).astype(np.int64)
    data = np.frombuffer(dbuf, np.uint8)
    body = np.diff(offsets) - old
    h = len(header)
    new_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(body + h, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), np.uint8)
    out[(new_offsets[:-1, None] + np.arange(h)).ravel()] = np.frombuffer(header, np.uint8)[None, :].repeat(n, 0).ravel()
    done = np.zeros(n + 1, np.int64)
    np.cumsum(body, out=done[1:])
    step = np.arange(int(done[-1]))
    out[step + np.repeat(new_offsets[:-1] + h - done[:-1], body)] = data[step + np.repeat(offsets[:-1] + old - done[:-1], body)]
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(new_offsets.astype(np.int32)), pa.py_buffer(out)])


def in_schema_order(schema: pa.Schema, columns: list[str]) -> list[str]:
    """Key columns as the Kafka key holds them: in the order of the table's schema."""
    return [c for c in schema.names if c in columns]


def _select(rows, columns: list[str], schema: pa.Schema) -> pa.StructArray:
    if isinstance(rows, pa.StructArray):
        names = [rows.type.field(i).name for i in range(rows.type.num_fields)]
        arrays = [rows.field(names.index(c)) for c in columns]
    else:
        arrays = [rows.column(c) for c in columns]
        arrays = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
    fields = [schema.field(c).with_nullable(False) for c in columns]
    out = [cast_column(a, f, "key column") for a, f in zip(arrays, fields)]
    return pa.StructArray.from_arrays(out, fields=fields)


# ---------------------------------------------------------------- the changelog view

class _ReadOnlyTablet:
    """The log tablet as the changelog topic sees it: readable, never written or removed
    through this name (the table owns it)."""

    def __init__(self, tablet):
        self._tablet = tablet

    def __getattr__(self, name):
        return getattr(self._tablet, name)

    def append(self, *args, **kwargs):
        raise ReadOnlyTableError("the changelog topic of a primary-key table is read-only")

    def advance_log_start(self, offset: int) -> int:
        raise ReadOnlyTableError("the changelog topic of a primary-key table is read-only")

    def close(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def maybe_flush(self, now_ms: int | None = None) -> bool:
        return False

    def enforce_retention(self, now_ms: int | None = None) -> int:
        return 0


class ChangelogBucket:
    """A bucket of the changelog topic: the table bucket's log, read-only."""

    def __init__(self, table: "ChangelogTable", source: Bucket):
        self.table = table
        self.index = source.index
        self.source = source
        self.tablet = _ReadOnlyTablet(source.tablet)
        self.group_commit = source.group_commit
        self.leader_epoch = source.leader_epoch
        # Sent to Kafka consumers of the changelog topic (metrics); table API scans of it
        # count for the table bucket.
        self.bytes_out = 0
        self.records_out = 0
        self.scan_records_out = 0
        self.scan_bytes_out = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.table.name, self.index)

    # The changelog is the table's log: its start, local or remote, is the table bucket's.
    @property
    def remote_log_start(self) -> int | None:
        return self.source.remote_log_start

    @property
    def log_start_offset(self) -> int:
        return self.source.log_start_offset

    def append(self, records, meta):
        raise ReadOnlyTableError(f"{self.table.name} is the read-only changelog of table {self.source.table.name}; "
                                 "write to the table itself")

    def data_arrived(self) -> asyncio.Event:
        return self.source.data_arrived()


@dataclass
class ChangelogTable(Table):
    """`<table>.changelog`: the full changelog (+I, -U, +U, -D) of a primary-key table."""

    source: Table | None = None

    def fixed_buckets_reason(self) -> str | None:
        return "it is the read-only changelog of a primary-key table"


def _changelog_view(table: Table) -> ChangelogTable:
    # The view is a plain (read-only) log of the table's changes: no key settings of its own.
    configs = {k: v for k, v in table.configs.items() if k not in _KEY_SETTINGS and not k.startswith(AGG_PREFIX)}
    view = ChangelogTable(table.name + CHANGELOG_SUFFIX, uuid.uuid5(table.topic_id, "changelog"),
                          configs, table.created_ms, source=table)
    view.value_format = table.value_format
    view.kind = CHANGELOG_VIEW
    view.buckets = [ChangelogBucket(view, b) for b in table.buckets]
    return view


# ---------------------------------------------------------------- the service

class PkTableService:
    """Opens KV tablets for primary-key tables, validates their creation, takes snapshots."""

    def __init__(self, broker):
        self.broker = broker
        self.kv_dir = Path(broker.config.data_dir) / "kv"
        self.snapshot_dir = Path(broker.config.data_dir) / "kv-snapshots"
        self.kv_dir.mkdir(parents=True, exist_ok=True)
        self.tables: dict[str, PkTable] = {}

    @property
    def registry(self):
        return self.broker.extensions.get("registry")

    # -- creation ------------------------------------------------------------------------
    def before_create(self, name: str, configs: dict[str, str], validate_only: bool) -> None:
        """Create hook (on the I/O executor): check the definition, clear stale files, register the key schema."""
        if name.endswith(CHANGELOG_SUFFIX):
            raise InvalidTableError(f"Topic name {name!r} ends with the reserved suffix {CHANGELOG_SUFFIX!r} "
                                    "(the changelog topics of primary-key tables)")
        if not validate_only:
            for d in (self.kv_dir, self.snapshot_dir):
                for stale in d.glob(f"{name}-*"):
                    if stale.name[len(name) + 1:].isdigit():
                        shutil.rmtree(stale, ignore_errors=True)
        pk_cols = _columns(configs.get(PRIMARY_KEY))
        others = [c for c in configs if configs.get(c) and (c in _KEY_SETTINGS[1:] or c.startswith(AGG_PREFIX))]
        if not pk_cols:
            if others:
                raise InvalidConfigError(f"{others} need a primary key ({PRIMARY_KEY})")
            return
        fmt = configs.get(VALUE_FORMAT, "raw")
        if fmt not in ("avro", "json"):
            raise InvalidConfigError(f"a primary-key table needs typed values: set {VALUE_FORMAT} avro or json "
                                     f"and {VALUE_SCHEMA}")
        schema = self._value_schema(name, configs)
        table_spec(schema, configs)  # raises InvalidConfigError
        key_fmt = configs.get(KEY_FORMAT) or fmt
        if key_fmt not in ("avro", "json"):
            raise InvalidConfigError(f"Invalid value {key_fmt!r} for {KEY_FORMAT}: must be avro or json")
        # The changelog is the write-ahead log and the source of restores: kept unless told.
        configs.setdefault("retention.ms", "-1")
        if key_fmt == "avro" and not validate_only:
            self._register_key_schema(name, schema, configs)

    def _value_schema(self, name: str, configs: dict[str, str]) -> pa.Schema:
        from fluvial.schema.registry import parse_schema
        text = configs.get(VALUE_SCHEMA)
        if text:
            fmt = configs.get(VALUE_FORMAT, "raw")
            try:
                # The schema's language follows the value format: Avro for avro, JSON Schema for json.
                return parse_schema(text, "JSON" if fmt == "json" else "AVRO").arrow_schema
            except Exception as exc:  # noqa: BLE001 - reported as a config error
                raise InvalidConfigError(f"Invalid {VALUE_SCHEMA} for {VALUE_FORMAT}={fmt}: {exc}") from None
        latest = self.registry.latest(f"{name}-value") if self.registry else None
        if latest is None:
            raise InvalidConfigError(f"a primary-key table needs a value schema ({VALUE_SCHEMA})")
        return latest[1].arrow_schema

    def _register_key_schema(self, name: str, schema: pa.Schema, configs: dict[str, str]) -> int:
        from fluvial.schema.registry import parse_schema
        layout = KeyLayout(schema, _columns(configs.get(PRIMARY_KEY)), _columns(configs.get(BUCKET_KEY)) or None)
        key_schema = pa.schema([schema.field(c).with_nullable(False)
                                for c in in_schema_order(schema, layout.primary_key)])
        parsed = parse_schema(json.dumps(key_avro_schema(name, key_schema)), "AVRO")
        subject = f"{name}-key"
        try:
            return self.registry.lookup(subject, parsed).schema_id
        except Exception:  # noqa: BLE001 - not registered yet
            return self.registry.register(subject, parsed)[0]

    # -- opening -------------------------------------------------------------------------
    def attach(self, table: Table):
        """Open hook (blocking, before the table is visible): open its KV tablets (recovering
        them); returns what publishes the table's state and changelog view on the loop."""
        if isinstance(table, ChangelogTable) or not table.configs.get(PRIMARY_KEY):
            return None
        # Served as a primary-key table even when its KV tablets cannot open: writes and
        # reads then fail with the reason, never reach its log as a log table's would.
        table.kind = PRIMARY_KEY_TABLE
        fmt = table.value_format
        codec = getattr(fmt, "codec", None)
        if codec is None:
            log.error("primary-key table %s has no typed value format; its KV tablets stay closed", table.name)
            return None
        schema = codec.table_schema
        layout, spec = table_spec(schema, table.configs)
        key_name = table.configs.get(KEY_FORMAT) or fmt.name
        key_format = self._key_format(table.name, key_name, schema, layout.primary_key)
        bucket_key_format = self._key_format(table.name, key_name, schema, layout.bucket_key, bucket=True)
        schema_id = self._value_schema_id(table)
        pk = PkTable(table, schema, layout, spec, key_format, bucket_key_format, schema_id)
        try:
            for bucket in table.buckets:
                pk.buckets.append(self._open_bucket(pk, bucket))
        except KvTabletError as exc:
            # One unrecoverable table must not keep the broker (and every other table) down.
            log.error("primary-key table %s stays unavailable: %s", table.name, exc)
            for kv in pk.buckets:
                kv.tablet.close()
            table.pk_error = str(exc)
            return None
        table.pk = pk
        view = _changelog_view(table)
        pk.changelog = view

        def publish() -> None:
            self.tables[table.name] = pk
            manager = self.broker.tables
            manager.tables[view.name] = view
            manager.by_id[view.topic_id] = view
        return publish

    def _value_schema_id(self, table: Table) -> int:
        if table.value_format.name != "avro":
            return 0  # plain JSON values
        latest = self.registry.latest(f"{table.name}-value")
        return latest[0].schema_id if latest else 0

    def _key_format(self, name: str, fmt: str, schema: pa.Schema, columns: list[str], bucket: bool = False) -> KeyFormat:
        from fluvial.schema.codecs import AvroValueCodec, JsonValueCodec
        key_schema = pa.schema([schema.field(c).with_nullable(False) for c in in_schema_order(schema, columns)])
        if fmt == "json":
            return KeyFormat("json", JsonValueCodec(self.registry, f"{name}-key", key_schema), 0)
        if bucket:
            # A bucket key shorter than the primary key is hashed in its canonical JSON form
            # (no schema id to agree on): only the native client computes it.
            return KeyFormat("json", JsonValueCodec(self.registry, f"{name}-key", key_schema), 0)
        from fluvial.schema.registry import parse_schema
        parsed = parse_schema(json.dumps(key_avro_schema(name, key_schema)), "AVRO")
        subject = f"{name}-key"
        try:
            schema_id = self.registry.lookup(subject, parsed).schema_id
        except Exception:  # noqa: BLE001 - a table created before its key schema was registered
            schema_id = self.registry.register(subject, parsed)[0]
        return KeyFormat("avro", AvroValueCodec(self.registry, subject, key_schema), schema_id)

    def remote_snapshots(self, table: Table, index: int) -> RemoteKvSnapshots | None:
        """The bucket's snapshots in the object store, when the table's remote storage is on."""
        store = getattr(self.broker, "object_store", None)
        if store is None or not remote_storage_enabled(table):
            return None
        return RemoteKvSnapshots(store, bucket_prefix(table.name, table.topic_id, index), REMOTE_SNAPSHOT_RETAIN)

    def _open_bucket(self, pk: PkTable, bucket: Bucket) -> BucketKv:
        path = self.kv_dir / f"{pk.table.name}-{bucket.index}"
        snapshots = SnapshotStore(self.snapshot_dir / f"{pk.table.name}-{bucket.index}", SNAPSHOT_RETAIN)
        remote = self.remote_snapshots(pk.table, bucket.index)
        tablet = open_kv_tablet(path, pk, bucket, snapshots, remote)
        kv = BucketKv(bucket, tablet, snapshots, remote=remote,
                      durable=DurableView(lambda: bucket.group_commit.durable_offset, tablet.applied_offset))
        latest = snapshots.latest()
        kv.snapshot_offset = latest.log_offset if latest else -1
        return kv

    # -- snapshots -----------------------------------------------------------------------
    async def snapshot(self, table: Table, *, only_changed: bool = False) -> list[SnapshotInfo]:
        """Checkpoint every bucket's KV tablet (on demand, or periodically when changed); with
        remote storage on, the snapshot and its rows then go to the object store."""
        pk = _state(table)
        loop = asyncio.get_running_loop()
        out = []
        for kv in pk.buckets:
            if kv.remote is None:
                kv.remote = self.remote_snapshots(table, kv.bucket.index)  # remote storage turned on since
            if kv.remote is not None and kv.remote_offset is None:
                kv.remote_offset = await loop.run_in_executor(self.broker.io_executor, _newest_offset, kv)
            # A snapshot covers only changes that are durable in the changelog: a power loss
            # could otherwise take back offsets the snapshot holds (and hand them to other
            # changes). Most of the wait happens before the lock, so writes go on meanwhile;
            # under the lock at most the appends since then are waited for.
            if only_changed and kv.bucket.tablet.failure is not None:
                continue  # offline (logged when it failed): the periodic round goes on with the others
            group_commit = kv.bucket.group_commit
            await group_commit.wait_durable(kv.tablet.applied_offset)
            async with kv.lock:
                unchanged = kv.tablet.applied_offset == kv.snapshot_offset
                if only_changed and unchanged and (kv.remote is None or kv.remote_offset == kv.snapshot_offset):
                    continue
                await group_commit.wait_durable(kv.tablet.applied_offset)
                info = await loop.run_in_executor(self.broker.io_executor, kv.snapshots.take, kv.tablet)
                kv.snapshot_offset = info.log_offset
                # Taken under the same lock as the checkpoint: the same rows, the same offset.
                view = kv.tablet.snapshot()[0] if kv.remote is not None else None
            if view is not None:
                try:
                    snap = await loop.run_in_executor(self.broker.io_executor, self._upload, kv, info, view)
                    kv.remote_offset = snap.log_offset
                    info = dataclasses.replace(info, remote=snap.to_json())
                except Exception as exc:  # noqa: BLE001 - the local snapshot stands; the next round retries
                    log.warning("uploading KV snapshot %d of %s bucket %d failed: %s", info.snapshot_id,
                                table.name, kv.bucket.index, exc)
            out.append(info)
        return out

    def _upload(self, kv: BucketKv, info: SnapshotInfo, view) -> RemoteKvSnapshot:
        rows = kv.tablet.scan(view=view)
        snap = kv.remote.upload(info.path / "db", info.log_offset, rows, kv.tablet.schema, self.snapshot_dir)
        log.info("KV snapshot of %s bucket %d at offset %d stored remotely as %s (%d rows)",
                 kv.bucket.table.name, kv.bucket.index, info.log_offset, snap.prefix, snap.rows)
        return snap

    async def snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)
            await self.forget_deleted()
            for pk in list(self.tables.values()):
                try:
                    await self.snapshot(pk.table, only_changed=True)
                except Exception:
                    log.exception("KV snapshot of %s failed", pk.table.name)

    async def forget_deleted(self) -> None:
        """Tables deleted since: drop their state and views (on the loop), then close their
        KV tablets and remove their files (on the I/O executor)."""
        manager = self.broker.tables
        gone = []
        for name, pk in list(self.tables.items()):
            if manager.tables.get(name) is pk.table:
                continue
            del self.tables[name]
            view = pk.changelog
            if view is not None and manager.tables.get(view.name) is view:
                del manager.tables[view.name]
                manager.by_id.pop(view.topic_id, None)
            gone.append(pk)
        if gone:
            await asyncio.get_running_loop().run_in_executor(self.broker.io_executor, _remove_kv_files, gone)

    def close(self) -> None:
        for pk in self.tables.values():
            for kv in pk.buckets:
                try:
                    kv.tablet.close()
                except Exception as exc:  # noqa: BLE001 - e.g. a full disk: RocksDB cannot flush
                    # What RocksDB could not write is replayed from the changelog on the next start.
                    log.error("closing KV tablet %s failed: %s; it catches up from its changelog on the "
                              "next start", kv.tablet.path, exc)


def _newest_offset(kv: BucketKv) -> int | None:
    """The offset of the bucket's newest remote snapshot (-1: none; None: the store cannot be asked)."""
    try:
        newest = kv.remote.latest()
    except Exception as exc:  # noqa: BLE001 - a store that is down: the upload retries later
        log.warning("KV snapshots of %s bucket %d in the object store cannot be listed: %s",
                    kv.bucket.table.name, kv.bucket.index, exc)
        return None
    return newest.log_offset if newest else -1


def table_spec(schema: pa.Schema, configs: dict[str, str]) -> tuple[KeyLayout, MergeSpec]:
    """The key layout and merge settings of a table, or InvalidConfigError naming what is wrong."""
    pk_cols = _columns(configs.get(PRIMARY_KEY))
    missing = [c for c in pk_cols if c not in schema.names]
    if missing:
        raise InvalidConfigError(f"primary-key column(s) {missing} are not columns of the table {schema.names}")
    if len(set(pk_cols)) != len(pk_cols):
        raise InvalidConfigError(f"primary key {pk_cols} names a column twice")
    for c in pk_cols:
        t = schema.field(c).type
        if pa.types.is_nested(t) or pa.types.is_floating(t) or pa.types.is_dictionary(t):
            raise InvalidConfigError(f"primary-key column {c!r} has type {t}: keys must be integers, strings, "
                                     "bytes, booleans, decimals, dates or timestamps")
    bucket_key = _columns(configs.get(BUCKET_KEY)) or pk_cols
    if bucket_key != pk_cols[:len(bucket_key)] or not bucket_key:
        raise InvalidConfigError(f"bucket key {bucket_key} must be a prefix of the primary key {pk_cols}")
    spec = MergeSpec.of(schema, pk_cols, configs.get(MERGE_ENGINE), configs.get(VERSION_COLUMN),
                        upsert_key=_columns(configs.get(UPSERT_KEY)) or None,
                        state_ttl_ms=configs.get(RETRACT_STATE_TTL), aggregates=aggregates_from_configs(configs))
    return KeyLayout(schema, pk_cols, bucket_key), spec


def open_kv_tablet(path: Path, pk: PkTable, bucket: Bucket, snapshots: SnapshotStore,
                   remote: RemoteKvSnapshots | None = None) -> KvTablet:
    """The bucket's KV tablet in line with its log: opened and caught up, or restored from
    the newest usable snapshot, local or in the object store (or rebuilt from the whole log)
    when missing, corrupt or ahead."""
    log_tablet = bucket.tablet
    end = log_tablet.log_end_offset
    start = changelog_start(bucket)
    for stale in snapshots.discard_after(end):
        log.warning("KV snapshot %s covers offset %d past the log end %d (lost with unsynced log data); "
                    "deleted", stale.path, stale.log_offset, end)
    # A bucket created just now (no log, no KV tablet yet) has nothing remote: no store call.
    if remote is not None and (end > 0 or path.exists()):
        try:
            for stale in remote.discard_after(end):
                log.warning("remote KV snapshot %s covers offset %d past the log end %d (lost with unsynced log "
                            "data); deleted", stale.prefix, stale.log_offset, end)
        except Exception as exc:  # noqa: BLE001 - a store that is down: reads stay bounded by the log end
            log.warning("KV snapshots of %s in the object store cannot be checked against the log end %d: %s; "
                        "the next upload drops any past it", path, end, exc)
    tablet = None
    if path.exists():
        try:
            tablet = KvTablet.open(path, pk.schema, pk.layout, pk.spec, create=False)
        except KvTabletError as exc:
            log.warning("KV tablet %s cannot be opened (%s); restoring it", path, exc)
        if tablet is not None and tablet.applied_offset > end:
            log.warning("KV tablet %s is ahead of its log (%d > %d); restoring it", path, tablet.applied_offset, end)
            tablet.close()
            tablet = None
        if tablet is not None and tablet.applied_offset < start:
            log.warning("KV tablet %s is behind the changelog's start (%d < %d); restoring it", path,
                        tablet.applied_offset, start)
            tablet.close()
            tablet = None
    if tablet is None:
        shutil.rmtree(path, ignore_errors=True)
        local = snapshots.latest(max_offset=end)
        if local is not None and local.log_offset < start:
            local = None  # retention removed changes it would need
        far = None
        if remote is not None and end > 0:  # a new bucket has nothing to restore: no store call
            try:
                far = remote.latest(max_offset=end, min_offset=start)
            except Exception as exc:  # noqa: BLE001 - then only what is local can restore it
                log.warning("KV snapshots of %s in the object store cannot be listed: %s", path, exc)
        if far is not None and (local is None or far.log_offset > local.log_offset):
            remote.download(far, path)
            log.info("KV tablet %s restored from remote snapshot %s (offset %d)", path, far.prefix, far.log_offset)
        elif local is not None:
            snapshots.restore(local, path)
            log.info("KV tablet %s restored from snapshot %d (offset %d)", path, local.snapshot_id, local.log_offset)
        elif start > 0 and end > 0:
            raise KvTabletError(f"KV tablet {path} is missing, no snapshot covers it and the changelog "
                                f"starts at {start}: it cannot be rebuilt")
        tablet = KvTablet.open(path, pk.schema, pk.layout, pk.spec, create=True)
    catch_up(tablet, bucket)
    return tablet


def changelog_start(bucket: Bucket) -> int:
    """The first changelog offset still readable, local or remote."""
    tiered = _remote_log(bucket)
    local = bucket.tablet.log_start_offset
    return min(local, tiered.start) if tiered is not None else local


def remote_storage_enabled(table: Table) -> bool:
    """The table's remote storage is on (its topic config, else the broker's default)."""
    return bool(getattr(table, "remote_storage_enabled", False))


@dataclass
class TieredChangelog:
    """The part of a bucket's changelog that is in the object store (its committed manifest)."""

    manager: object  # the broker's RemoteLogManager
    bucket: Bucket
    start: int

    def read(self, offset: int, max_bytes: int) -> list[StoredBatch]:
        return self.manager.read_batches(self.bucket, offset, max_bytes)


def _remote_log(bucket: Bucket) -> TieredChangelog | None:
    """The bucket's tiered changelog, when part of it is in the object store."""
    svc = _SERVICE.get("service")
    manager = getattr(svc.broker, "remote_log", None) if svc is not None else None
    if manager is None:
        return None
    manifest = manager.manifest(bucket)
    return TieredChangelog(manager, bucket, manifest.log_start_offset) if manifest.segments else None


def catch_up(tablet: KvTablet, bucket: Bucket) -> int:
    """Replay the changelog after the tablet's applied offset (from remote segments while
    it is below the local log's start)."""
    log_tablet = bucket.tablet
    applied = 0
    started = time.monotonic()
    first = tablet.applied_offset
    # A long replay (a KV tablet rebuilt from the whole changelog) says how far it is.
    progress = ProgressLog(log, f"KV tablet {tablet.path}: replaying the changelog",
                           max(0, log_tablet.log_end_offset - first), "offsets")
    while tablet.applied_offset < log_tablet.log_end_offset:
        batches = _changelog_from(bucket, tablet.applied_offset)
        if not batches:
            break
        before = tablet.applied_offset
        applied += tablet.replay(s.batch for s in batches)
        if tablet.applied_offset == before:
            # Batches without rows past the applied offset: step over them.
            tablet.applied_offset = batches[-1].meta.next_offset
        progress.update(tablet.applied_offset - first)
    if applied:
        log.info("KV tablet %s: replayed %d changelog rows in %.2fs", tablet.path, applied,
                 time.monotonic() - started)
    return applied


def _changelog_from(bucket: Bucket, offset: int) -> list[StoredBatch]:
    """Changelog batches from the one holding `offset`, about _REPLAY_CHUNK_BYTES of them."""
    log_tablet = bucket.tablet
    # The KV tablet follows the whole log, fsynced or not (readers of the log do not).
    if offset >= log_tablet.log_start_offset:
        return log_tablet.read(offset, _REPLAY_CHUNK_BYTES, uncommitted=True)
    tiered = _remote_log(bucket)
    if tiered is None or offset < tiered.start:
        return log_tablet.read(log_tablet.log_start_offset, _REPLAY_CHUNK_BYTES, uncommitted=True)
    return tiered.read(offset, _REPLAY_CHUNK_BYTES)


# ---------------------------------------------------------------- writes

def _service() -> PkTableService:
    svc = _SERVICE.get("service")
    if svc is None:
        raise InvalidRequestError("primary-key tables are not enabled in this broker")
    return svc


_SERVICE: dict[str, PkTableService] = {}


@dataclass
class WriteRows:
    """The rows of one write to one bucket, as decoded from Kafka or given by the table API."""

    rows: pa.RecordBatch
    deletes: np.ndarray | None = None
    partial_columns: list[str] | None = None
    timestamps: np.ndarray | None = None  # int64 ms per row
    headers: pa.Array | None = None  # Kafka record headers per row
    changes: np.ndarray | None = None  # int8 change type per row (+I/-U/+U/-D); None: every row an ADD


async def write_rows(bucket: Bucket, rows: pa.RecordBatch, *, deletes: np.ndarray | None = None,
                     partial_columns: list[str] | None = None, meta: BatchMeta | None = None,
                     timestamps: np.ndarray | None = None, headers: pa.Array | None = None,
                     check_bucket: bool = True, on_append: Callable[[BatchMeta], None] | None = None,
                     changes: np.ndarray | None = None,
                     before: Callable[[], Awaitable[None]] | None = None) -> BatchMeta:
    """Upsert/delete rows of one bucket: merge (off the loop when large), append the
    changelog to the log tablet, then apply to RocksDB. Returns the changelog's meta
    (record_count 0 when nothing changed). Raises InvalidRecordError; then nothing is written.
    `on_append(meta)` runs right after the append (or the decision that nothing changed),
    before anything else on the loop: the idempotent-producer state is recorded there.
    `before()` runs first, holding the bucket's lock: no other write of the bucket comes
    between it and this one (transactional applies record their progress there)."""
    pk = _state(bucket.table)
    kv = pk.buckets[bucket.index]
    async with kv.lock:
        if before is not None:
            await before()
        write, stored = await _prepare(pk, bucket, rows, deletes, partial_columns, timestamps, headers, check_bucket,
                                       changes)
        written, apply = _append(pk, bucket, write, stored, meta)
        if on_append is not None:
            on_append(written)
        if apply is not None:
            await apply
        return written


async def _prepare(pk: PkTable, bucket: Bucket, rows: pa.RecordBatch, deletes, partial_columns, timestamps,
                   headers, check_bucket: bool, changes: np.ndarray | None = None):
    """Merge one bucket's write (the caller holds the bucket's lock): (KvWrite, stored changelog | None)."""
    kv = pk.buckets[bucket.index]
    if timestamps is None and pk.spec.keeps_state_rows:
        # The merge state's TTL dates rows by the time stored with them: replay sees the same.
        timestamps = np.full(rows.num_rows, kafka_batches.now_ms(), np.int64)

    def prepare():
        if check_bucket:
            _check_bucket(pk, rows, bucket.index)
        write = kv.tablet.prepare(rows, deletes=deletes, partial_columns=partial_columns, changes=changes,
                                  timestamps=timestamps)
        if write.empty:
            return write, None
        return write, _stored_changelog(pk, write.changelog, timestamps, headers)

    if rows.num_rows > INLINE_ROWS:
        return await asyncio.get_running_loop().run_in_executor(_service().broker.cpu_executor, prepare)
    return prepare()


def _append(pk: PkTable, bucket: Bucket, write, stored: pa.RecordBatch | None, meta: BatchMeta | None):
    """Append a prepared changelog (on the loop: the commit point), and start applying it to
    RocksDB: (written meta, awaitable of the apply or None when done or nothing to do)."""
    kv = pk.buckets[bucket.index]
    # The changelog has m rows for the producer's n records (-U/+U per update, none for a
    # no-op): the batch keeps the producer's own sequence span, so that producer state
    # rebuilt from the log recognises an identical retry after a restart.
    produced = meta.record_count if meta is not None and meta.producer_id >= 0 else -1
    if stored is None:
        end = bucket.tablet.log_end_offset
        noop = BatchMeta(base_offset=end, last_offset_delta=-1, record_count=0, base_timestamp=-1, max_timestamp=-1)
        if produced >= 0:
            noop = dataclasses.replace(noop, producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
                                       base_sequence=meta.base_sequence, producer_record_count=produced)
        return noop, None
    ts = stored.column("_timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)
    m = stored.num_rows
    base = meta or BatchMeta(base_offset=-1, last_offset_delta=0, record_count=0, base_timestamp=0,
                             max_timestamp=0)
    out_meta = dataclasses.replace(base, base_offset=-1, last_offset_delta=m - 1, record_count=m,
                                   base_timestamp=int(ts.min()), max_timestamp=int(ts.max()),
                                   producer_record_count=produced if produced != m else -1,
                                   schema_id=pk.schema_id if pk.table.value_format.name == "avro" else base.schema_id)
    written = bucket.append(stored, out_meta)

    def apply():
        try:
            if kv.durable is not None:
                if bucket.tablet.config.flush_policy is FlushPolicy.ACK:
                    # Before RocksDB has them: a lookup that sees these rows finds what they replace.
                    before = write.before.to_pylist() if write.before is not None else kv.tablet.db.get(write.keys)
                    kv.durable.add(written.next_offset, write.keys, before)
                else:
                    kv.durable.clear()
            kv.tablet.apply(write, written.next_offset)
        except Exception:
            # The changelog holds the write; RocksDB catches up from it.
            log.exception("applying a write to KV tablet %s failed; replaying the changelog", kv.tablet.path)
            catch_up(kv.tablet, bucket)

    if len(write.keys) > INLINE_ROWS:
        return written, asyncio.get_running_loop().run_in_executor(_service().broker.io_executor, apply)
    apply()
    return written, None


def _check_bucket(pk: PkTable, rows: pa.RecordBatch, index: int) -> None:
    pk.layout.check_keys(rows)
    expected = pk.row_bucket_ids(rows)
    wrong = np.flatnonzero(expected != index)
    if wrong.size:
        i = int(wrong[0])
        fn = pk.bucket_function
        other = "consistent_random" if fn == BucketFunction.CRC32 else "murmur2_random"
        msg = (f"the key of record {i} belongs to partition {int(expected[i])}, not {index}: table "
               f"{pk.table.name} places keys by {BucketFunction.describe(fn)}, mod {len(pk.table.buckets)} "
               f"({BUCKET_FUNCTION}={fn}; librdkafka-based producers set partitioner={other})")
        raise InvalidRecordError(msg, record_errors=[
            (int(j), f"the key belongs to partition {int(expected[j])} ({BUCKET_FUNCTION}={fn}), not {index}")
            for j in wrong[:100]])


def _stored_changelog(pk: PkTable, changelog: pa.RecordBatch, timestamps: np.ndarray | None,
                      headers: pa.Array | None) -> pa.RecordBatch:
    """The changelog rows as the log tablet stores them (system columns, then the user ones)."""
    m = changelog.num_rows
    src = changelog.column(SOURCE_COLUMN).to_numpy(zero_copy_only=False)
    if timestamps is None:
        ts = np.full(m, kafka_batches.now_ms(), np.int64)
    else:
        ts = np.asarray(timestamps, np.int64)[src]
    hdrs = headers.take(pa.array(src)) if headers is not None else pa.nulls(m, kafka_batches.HEADERS_TYPE)
    user = pa.RecordBatch.from_arrays([changelog.column(f.name) for f in pk.schema], schema=pk.schema)
    keys = pk.kafka_keys(user)
    schema = kafka_batches.stored_schema(pk.table.value_format)
    by_name = {
        "_timestamp": pa.array(ts, kafka_batches.TIMESTAMP_TYPE),
        "_change": changelog.column(CHANGE_COLUMN),
        "_key": keys,
        "_headers": hdrs,
        "_schema_id": pa.array(np.full(m, pk.schema_id, np.int32)),
    }
    arrays = []
    for f in schema:
        col = by_name[f.name] if f.name in by_name else user.column(f.name)
        arrays.append(col if col.type == f.type else col.cast(f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


async def write_table_rows(table: Table, rows: pa.RecordBatch | pa.Table, *, deletes: np.ndarray | None = None,
                           partial_columns: list[str] | None = None) -> list[tuple[int, BatchMeta]]:
    """Table API writes: rows of any buckets, split by their key's bucket. Every bucket's
    write is merged (in parallel) before any is appended, so a refused row leaves every
    bucket untouched. Durable per the broker's flush policy when this returns. Returns
    (bucket, meta) pairs. A `_change` column gives each row's change type (+I, -U, +U, -D)."""
    pk = _state(table)
    if isinstance(rows, pa.Table):
        rows = rows.combine_chunks()
        rows = rows.to_batches()[0] if rows.num_rows else pa.RecordBatch.from_pylist([], rows.schema)
    n = rows.num_rows
    if n == 0:
        return []
    changes = None
    if CHANGE_COLUMN in rows.schema.names:
        changes = parse_changes(rows.column(CHANGE_COLUMN), CHANGE_COLUMN)
        rows = rows.drop_columns([CHANGE_COLUMN])
    pk.layout.check_keys(rows)
    retracting = changes is not None and bool(((changes == ChangeType.UPDATE_BEFORE)
                                               | (changes == ChangeType.DELETE)).any())
    pk.spec.check_write(rows.schema.names, deletes=deletes is not None and bool(np.asarray(deletes).any()),
                        partial_columns=partial_columns, retractions=retracting)
    ids = pk.row_bucket_ids(rows)
    parts = []
    for b in np.unique(ids).tolist():
        sel = np.flatnonzero(ids == b)
        part = rows if sel.size == n else rows.take(pa.array(sel))
        dels = None if deletes is None else np.asarray(deletes, bool)[sel]
        chg = None if changes is None else changes[sel]
        parts.append((table.buckets[b], part, dels, chg))
    locks = [pk.buckets[bucket.index].lock for bucket, _, _, _ in parts]  # ascending bucket order
    for lock in locks:
        await lock.acquire()
    try:
        prepared = await asyncio.gather(*(
            _prepare(pk, bucket, part, dels, partial_columns, None, None, False, chg)
            for bucket, part, dels, chg in parts))
        out, applies, durable = [], [], []
        for (bucket, _, _, _), (write, stored) in zip(parts, prepared):
            written, apply = _append(pk, bucket, write, stored, None)
            out.append((bucket.index, written))
            if apply is not None:
                applies.append(apply)
            if written.record_count and _service().broker.config.flush_policy == "ack":
                durable.append(bucket.group_commit.wait_durable(written.next_offset))
        await asyncio.gather(*applies)
    finally:
        for lock in locks:
            lock.release()
    if durable:
        await asyncio.gather(*durable)
    return out


# ---------------------------------------------------------------- the Kafka produce path

def check_producible(table: Table) -> None:
    """Refuse produce requests to a changelog topic (ReadOnlyTableError)."""
    if isinstance(table, ChangelogTable):
        raise ReadOnlyTableError(f"{table.name} is the read-only changelog of table {table.source.name}; "
                                 "produce to the table itself")


def check_records_deletable(table: Table) -> None:
    """Refuse DeleteRecords on a changelog topic (ReadOnlyTableError): its log is the table's,
    local and remote, and a view must not move the table's log start."""
    if isinstance(table, ChangelogTable):
        raise ReadOnlyTableError(f"{table.name} is the read-only changelog of table {table.source.name}; "
                                 "records cannot be deleted through it")


def to_write(bucket: Bucket, wire: memoryview, header: BatchHeader, *,
             log_append_time_ms: int | None = None) -> tuple[WriteRows, BatchMeta]:
    """Decode a produced v2 batch of a primary-key table into rows to write: the key is the
    primary key, the value the row, a null value deletes. Raises InvalidRecordError."""
    pk = _state(bucket.table)
    cols: RecordColumns = decode_records(wire, header)
    n = len(cols.offset_delta)
    if n != header.records_count or n == 0:
        raise InvalidRecordError(f"batch declares {header.records_count} records but holds {n}")
    if not np.array_equal(cols.offset_delta, np.arange(n, dtype=cols.offset_delta.dtype)):
        raise InvalidRecordError("record offset deltas of a produced batch must be 0..n-1")
    keys, values = cols.keys, cols.values
    if keys.null_count:
        bad = np.flatnonzero(keys.is_null().to_numpy(zero_copy_only=False))
        raise InvalidRecordError(
            f"record {int(bad[0])} has no key: records of a primary-key table carry the primary key as their key",
            record_errors=[(int(i), "record has no key (the primary key)") for i in bad])
    tombstone = values.is_null().to_numpy(zero_copy_only=False)
    try:
        key_rows = pk.key_format.decode(keys)
    except InvalidRecordError as exc:
        raise InvalidRecordError(f"record keys are not primary keys in the table's key format "
                                 f"({pk.key_format.name}): {exc.message}", record_errors=exc.record_errors) from None
    upserts = np.flatnonzero(~tombstone)
    schema = pk.schema
    columns: dict[str, pa.Array] = {}
    if upserts.size:
        value_rows, ids = bucket.table.value_format.codec.decode(values.take(pa.array(upserts)))
        # Keys and values must name the same row.
        value_keys = pk.kafka_keys(value_rows)
        sent_keys = pk.key_format.encode(key_rows.take(pa.array(upserts)))
        differ = np.flatnonzero(~pc.fill_null(pc.equal(value_keys, sent_keys), False).to_numpy(zero_copy_only=False))
        if differ.size:
            i = int(upserts[differ[0]])
            raise InvalidRecordError(
                f"record {i}: its key does not match the primary-key columns {pk.layout.primary_key} of its value",
                record_errors=[(int(upserts[j]), "key does not match the value's primary-key columns") for j in differ])
        scatter = np.full(n, -1, np.int64)
        scatter[upserts] = np.arange(upserts.size)
        idx = pa.array(scatter, mask=scatter < 0)
        names = [value_rows.type.field(i).name for i in range(value_rows.type.num_fields)]
        for f in schema:
            columns[f.name] = value_rows.field(names.index(f.name)).take(idx)
    key_names = [key_rows.type.field(i).name for i in range(key_rows.type.num_fields)]
    for c in pk.layout.primary_key:
        columns[c] = key_rows.field(key_names.index(c)).cast(schema.field(c).type)
    arrays = [columns.get(f.name, pa.nulls(n, f.type)) for f in schema]
    rows = pa.RecordBatch.from_arrays(arrays, schema=pa.schema([f.with_nullable(True) for f in schema]))
    _check_bucket(pk, rows, bucket.index)
    if log_append_time_ms is not None:
        ts = np.full(n, log_append_time_ms, np.int64)
        base_ts = max_ts = log_append_time_ms
        attributes = (header.attributes & 0x07) | kafka_batches.ATTR_LOG_APPEND_TIME
    else:
        ts = np.asarray(cols.timestamp_delta, np.int64) + header.base_timestamp
        base_ts, max_ts = header.base_timestamp, header.max_timestamp
        attributes = header.attributes & 0x07
    meta = BatchMeta(base_offset=-1, last_offset_delta=n - 1, record_count=n, base_timestamp=base_ts,
                     max_timestamp=max_ts, producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                     base_sequence=header.base_sequence, attributes=attributes,
                     partition_leader_epoch=header.partition_leader_epoch)
    changes, headers = changes_from_headers(cols.headers, tombstone)
    return WriteRows(rows, tombstone if tombstone.any() else None, None, ts, headers, changes), meta


def changes_from_headers(headers: pa.Array | None, tombstone: np.ndarray) -> tuple[np.ndarray | None, pa.Array | None]:
    """Each record's change type from its `fluvial.change` header (+I/+U when absent, -D for
    a tombstone), and the headers without it (the changelog adds its own). None when no
    record carries one. Raises InvalidRecordError naming every invalid record."""
    if headers is None or len(headers) == 0:
        return None, headers
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    flat = headers.flatten()
    if len(flat) == 0:
        return None, headers
    hit = pc.fill_null(pc.equal(flat.field("key"), CHANGE_HEADER), False).to_numpy(zero_copy_only=False)
    if not hit.any():
        return None, headers
    parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
    at = np.flatnonzero(hit)
    rows = parents[at]
    n = len(headers)
    try:
        parsed = parse_changes(flat.field("value").take(pa.array(at)), f"header {CHANGE_HEADER!r}")
    except InvalidRecordError as exc:
        errors = [(int(rows[i]), msg) for i, msg in exc.record_errors]
        raise InvalidRecordError(f"record {errors[0][0]}: {errors[0][1]} ({len(errors)} invalid record(s); "
                                 "nothing of the batch was written)", record_errors=errors) from None
    changes = np.where(tombstone, ChangeType.DELETE, ChangeType.INSERT).astype(np.int8)
    # The last header of a record decides (headers keep their order).
    last = np.full(n, -1, np.int64)
    np.maximum.at(last, rows, np.arange(at.size))
    has = last >= 0
    changes[has] = parsed[last[has]]
    adds = np.flatnonzero(tombstone & ((changes == ChangeType.INSERT) | (changes == ChangeType.UPDATE_AFTER)))
    if adds.size:
        msg = "a record without a value (a tombstone) can only be a -D or -U, not an ADD (+I/+U)"
        raise InvalidRecordError(f"record {int(adds[0])}: {msg}; nothing of the batch was written",
                                 record_errors=[(int(i), msg) for i in adds[:100]])
    keep = ~hit
    lengths = np.diff(headers.offsets.to_numpy(zero_copy_only=False).astype(np.int64))
    lengths = lengths - np.bincount(rows, minlength=n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    stripped = pa.ListArray.from_arrays(pa.array(offsets), flat.filter(pa.array(keep)), type=headers.type,
                                        mask=headers.is_null() if headers.null_count else None)
    return changes, stripped


async def produce(bucket: Bucket, write: WriteRows, meta: BatchMeta,
                  on_append: Callable[[BatchMeta], None] | None = None,
                  before: Callable[[], Awaitable[None]] | None = None) -> BatchMeta:
    """Produce path: write what `to_write` decoded (the bucket was checked there)."""
    return await write_rows(bucket, write.rows, deletes=write.deletes, partial_columns=write.partial_columns,
                            meta=meta, timestamps=write.timestamps, headers=write.headers, check_bucket=False,
                            on_append=on_append, changes=write.changes, before=before)


# ---------------------------------------------------------------- the Kafka fetch views

def kafka_view(table: Table):
    """How fetch encodes the stored batches of `table`, or None for a log table:
    `view(stored, compression_type=..., leader_epoch=...) -> bytes | None` (None: nothing
    of the batch is shown; skip it). The table's topic shows the upsert stream (+I/+U rows,
    -D as tombstones, no -U); `<table>.changelog` every change. Both carry the change type
    in the record header `fluvial.change`."""
    if isinstance(table, ChangelogTable):
        return lambda stored, **kw: changelog_wire(table.source, stored, full=True, **kw)
    if is_primary_key(table):
        return lambda stored, **kw: changelog_wire(table, stored, full=False, **kw)
    return None


def changelog_wire(table: Table, stored: StoredBatch, *, full: bool, compression_type: str = "producer",
                   leader_epoch: int = 0) -> bytes | None:
    """A stored changelog batch as a Kafka v2 batch, in the upsert or the full view."""
    meta, batch = stored.meta, stored.batch
    change = batch.column("_change").to_numpy(zero_copy_only=False)
    shown = change < FIRST_HIDDEN  # the merge state's logged input rows are never shown
    if not full:
        shown &= change != ChangeType.UPDATE_BEFORE
    if not shown.all():
        keep = np.flatnonzero(shown)
        if keep.size == 0:
            # Nothing to show (only state rows): an empty batch still moves consumers past its
            # offsets, as the empty batches compaction leaves in Kafka do.
            return build_batch(base_offset=meta.base_offset, partition_leader_epoch=leader_epoch,
                               attributes=meta.attributes & ~kafka_batches.ATTR_CODEC_MASK,
                               base_timestamp=meta.base_timestamp, max_timestamp=meta.max_timestamp,
                               producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
                               base_sequence=meta.base_sequence, columns=_NO_RECORDS,
                               compression=kafka_batches.fetch_codec("uncompressed", meta),
                               last_offset_delta=meta.last_offset_delta)
        batch = batch.take(pa.array(keep))
        change = change[keep]
    fmt = kafka_batches.format_of(StoredBatch(meta, batch), table.value_format)
    values = fmt.to_values(batch, meta.schema_id)
    if not full:
        deleted = change == ChangeType.DELETE
        if deleted.any():
            values = pc.if_else(pa.array(deleted), pa.scalar(None, pa.binary()), values)
    timestamp_delta, offset_delta = kafka_batches.record_deltas(meta, batch)
    cols = RecordColumns(
        timestamp_delta=timestamp_delta,
        offset_delta=offset_delta,
        keys=batch.column("_key"),
        values=values,
        headers=with_change_header(batch.column("_headers"), change),
    )
    return build_batch(base_offset=meta.base_offset, partition_leader_epoch=leader_epoch,
                       attributes=meta.attributes & ~kafka_batches.ATTR_CODEC_MASK,
                       base_timestamp=meta.base_timestamp, max_timestamp=meta.max_timestamp,
                       producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
                       base_sequence=meta.base_sequence, columns=cols,
                       compression=kafka_batches.fetch_codec(compression_type, meta),
                       last_offset_delta=meta.last_offset_delta)


_NO_RECORDS = RecordColumns(timestamp_delta=np.zeros(0, np.int64), offset_delta=np.zeros(0, np.int32),
                            keys=pa.array([], pa.binary()), values=pa.array([], pa.binary()),
                            headers=pa.array([], kafka_batches.HEADERS_TYPE))


def with_change_header(headers: pa.Array, change: np.ndarray) -> pa.Array:
    """Each row's headers plus `fluvial.change: <+I|-U|+U|-D>` at the end."""
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    n = len(headers)
    headers = headers.fill_null(pa.scalar([], kafka_batches.HEADERS_TYPE)) if headers.null_count else headers
    old_offsets = headers.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    old_offsets = old_offsets - old_offsets[0]
    old_values = headers.values.slice(headers.offsets[0].as_py(), int(old_offsets[-1]))
    lengths = np.diff(old_offsets)
    new_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths + 1, out=new_offsets[1:])
    total = int(new_offsets[-1])
    # Positions: old header j of row r moves to j + r; the change header of row r is last.
    take = np.empty(total, np.int64)
    rows_of_old = np.repeat(np.arange(n), lengths)
    take[np.arange(old_offsets[-1]) + rows_of_old] = np.arange(old_offsets[-1])
    take[new_offsets[1:] - 1] = old_offsets[-1] + change.astype(np.int64)
    labels = pa.StructArray.from_arrays(
        [pa.array([CHANGE_HEADER] * len(_LABELS), pa.string()), pa.array(_LABELS, pa.binary())],
        fields=list(kafka_batches.HEADERS_TYPE.value_type))
    values = pa.concat_arrays([old_values.cast(labels.type), labels]).take(pa.array(take))
    return pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), values, type=kafka_batches.HEADERS_TYPE)


# ---------------------------------------------------------------- reads

def lookup(table: Table, keys: pa.Table | pa.RecordBatch | list[dict], *,
           wait_durable: Callable[[Table, dict[int, int]], None]) -> pa.Table:
    """The current rows of the given primary keys (key columns; rows not found left out).

    Blocking (RocksDB reads): called off the event loop. `wait_durable(table, fence)` blocks
    until each bucket's changelog is durable up to its fence offset (see `read_fence`)."""
    pk = _state(table)
    keys = _as_table(keys, pk.layout.primary_key)
    pk.layout.check_keys(keys, "key")
    pk.lookups += 1
    pk.lookup_keys += keys.num_rows
    if keys.num_rows == 0:
        return pk.schema.empty_table()
    storage = pk.layout.storage_keys(keys)  # the key columns encoded once, a batch at a time
    found = _read_buckets(table, pk, storage, lambda tablet, part, durable: (tablet, tablet.values_of(part, durable)),
                          wait_durable, pk.bucket_ids_of_keys(keys, storage))
    return _decode_found(found)


def lookup_batch(table: Table, keys: pa.Table | pa.RecordBatch | list[dict], *,
                 wait_durable: Callable[[Table, dict[int, int]], None]) -> pa.RecordBatch:
    """`lookup` as one record batch (what a lookup session sends back). One key of integer,
    string or binary columns takes a direct path: its storage key built as bytes, its
    bucket hashed in Python, one RocksDB get and one row decoded, without the batch path's
    arrays (sort, take, concatenation, unique buckets) whose fixed costs were most of a
    point lookup's broker time. Same answers, same refusals (property-tested against
    the batch path)."""
    if not isinstance(keys, list) and keys.num_rows == 1:
        pk = _state(table)
        few = pk.layout.few_key_bytes(keys)  # None for keys `check_keys` refuses: the batch path raises
        if few is not None:
            return _lookup_one(table, pk, keys, few[0], wait_durable)
    return _one_batch(lookup(table, keys, wait_durable=wait_durable))


def _lookup_one(table: Table, pk: PkTable, keys, key: bytes, wait_durable) -> pa.RecordBatch:
    pk.lookups += 1
    pk.lookup_keys += 1
    b = pk.bucket_of_key(keys, key)
    table.buckets[b].tablet.check_online()
    durable, fenced = _durable_view(table, pk, b)
    kv = pk.buckets[b].tablet
    value = kv.value_at(key, durable)
    fence = read_fence(table, [b] if fenced else [])  # after the read, as in _read_buckets
    if fence:
        wait_durable(table, fence)
    return kv.row_batch(value)


def _one_batch(rows: pa.Table) -> pa.RecordBatch:
    """A lookup's answer as one record batch (also when nothing was found)."""
    batches = rows.to_batches()
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in rows.schema], schema=rows.schema)
    return rows.combine_chunks().to_batches()[0]


def _durable_view(table: Table, pk: PkTable, b: int) -> tuple[DurableView | None, bool]:
    """How bucket `b` is read: as of its durable changelog (its DurableView), or as
    RocksDB holds it with a fence to wait for after the read (None, True)."""
    durable = pk.buckets[b].durable
    if durable is not None and (LOOKUPS_WAIT_FOR_FSYNC or not (
            table.buckets[b].tablet.config.flush_policy is FlushPolicy.ACK and durable.usable())):
        return None, True
    return durable, False


def _decode_found(found: list[tuple[KvTablet, pa.Array]]) -> pa.Table:
    """The rows of the values read per bucket, decoded in one batch when the buckets'
    tablets number row schemas alike (always, short of a bucket that missed a schema
    change): the decoder's fixed cost is paid once per lookup, and the answer is one
    record batch."""
    first = found[0][0]
    if len(found) == 1 or all(first.same_codec(t) for t, _ in found[1:]):
        values = found[0][1] if len(found) == 1 else pa.concat_arrays([v for _, v in found])
        return first._rows_table(values)
    return pa.concat_tables([t._rows_table(v) for t, v in found])


def prefix_lookup(table: Table, prefixes: pa.Table | pa.RecordBatch | list[dict], *,
                  wait_durable: Callable[[Table, dict[int, int]], None]) -> pa.Table:
    """The current rows whose bucket-key columns (a prefix of the primary key) equal one of
    `prefixes`. Blocking, like `lookup`."""
    pk = _state(table)
    prefixes = _as_table(prefixes, pk.layout.bucket_key)
    pk.layout.check_keys(prefixes, "prefix", pk.layout.bucket_key)
    if prefixes.num_rows == 0:
        return pk.schema.empty_table()
    return _read_buckets(table, pk, prefixes, lambda tablet, part, durable: tablet.prefix_lookup(part, durable),
                         wait_durable)


def _read_buckets(table: Table, pk: PkTable, keys: pa.Table | pa.Array, read, wait_durable,
                  ids: np.ndarray | None = None) -> pa.Table:
    if ids is None:
        ids = pk.bucket_ids(keys)
    buckets = np.unique(ids).tolist()
    parts = []
    fenced = []
    for b in buckets:
        bucket = table.buckets[b]
        bucket.tablet.check_online()  # an offline bucket's KV may hold unacknowledged rows
        part = keys if len(buckets) == 1 else (
            take_binary(keys, np.flatnonzero(ids == b)) if isinstance(keys, pa.Array)
            else keys.take(pa.array(np.flatnonzero(ids == b))))
        # Under flush policy ack, rows as of the durable changelog: no wait for an fsync
        # under way. A bucket whose durable offset is still below what its KV tablet held
        # when it opened waits for it instead.
        durable, fence = _durable_view(table, pk, b)
        if fence:
            fenced.append(b)
        parts.append(read(pk.buckets[b].tablet, part, durable))
    # The fence is taken after the reads: every row they saw was appended before it.
    fence = read_fence(table, fenced)
    if fence:
        wait_durable(table, fence)
    if parts and isinstance(parts[0], tuple):
        return parts  # (tablet, values) per bucket: the caller decodes
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def read_fence(table: Table, buckets: list[int]) -> dict[int, int]:
    """What must be durable before rows just read from the buckets' KV tablets are given out.

    RocksDB is written right after the changelog append, before the append's fsync, so
    under flush policy ``ack`` a read may see rows a power loss would take back. The fence
    is each bucket's log end at the end of the read (the append of every row read precedes
    it; RocksDB's own applied offset is set after its rows are readable, so it cannot serve);
    buckets already durable that far are left out. Under ``none`` and ``interval`` readers
    see the log end, as in Kafka: no fence."""
    fence = {}
    for b in buckets:
        bucket = table.buckets[b]
        if bucket.tablet.config.flush_policy is not FlushPolicy.ACK:
            continue
        end = bucket.tablet.log_end_offset
        if bucket.group_commit.durable_offset < end:
            fence[b] = end
    return fence


async def await_fence(table: Table, fence: dict[int, int]) -> None:
    """On the loop: wait until every bucket of `fence` is durable up to its offset; the
    group commit already running for the appends gives it (StorageError when it fails:
    the bucket is then offline and the rows read are not given out)."""
    await asyncio.gather(*(table.buckets[b].group_commit.wait_durable(offset) for b, offset in fence.items()))


def _as_table(data, columns: list[str]) -> pa.Table:
    if isinstance(data, list):
        return pa.Table.from_pylist(data) if data else pa.table({c: pa.array([]) for c in columns})
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    return data


async def snapshot(table: Table) -> list[SnapshotInfo]:
    """Take a KV snapshot of every bucket of a primary-key table now."""
    return await _service().snapshot(table)


def remote_snapshot(bucket: Bucket) -> dict | None:
    """Where a client reads the bucket's newest remote snapshot: the store (URL and public
    options, never credentials) and the snapshot; None when the table keeps none remotely."""
    kv = _state(bucket.table).buckets[bucket.index]
    remote = kv.remote or _service().remote_snapshots(bucket.table, bucket.index)
    if remote is None:
        return None
    # Never one past what readers may see (a snapshot a power loss outdated whose discard
    # could not reach the store): its offsets may since belong to other changes.
    snap = remote.latest(max_offset=bucket.tablet.high_watermark)
    return {"store": remote.store.public_description(), "snapshot": snap.to_json() if snap else None}


def kv_stats(table: Table) -> dict | None:
    """Figures of a primary-key table's merge state (for table descriptions), or None: for a
    'retract' table the live rows kept per key (the state a reordered changelog needs, and
    what its TTL bounds), retractions that found no row, rows expired."""
    pk = getattr(table, "pk", None)
    if pk is None or not pk.spec.keeps_state_rows:
        return None
    total = RetractStats()
    for kv in pk.buckets:
        total.add(kv.tablet.retract_stats)
    return {"merge_engine": pk.spec.engine.value, "retract": total.to_json()}


def snapshots(table: Table) -> list[list[SnapshotInfo]]:
    """The snapshots kept for each bucket, oldest first."""
    return [kv.snapshots.list() for kv in _state(table).buckets]


async def full_read(bucket: Bucket) -> tuple[pa.Table, int]:
    """The bucket's current rows and the changelog offset they cover: reading the changelog
    from that offset on continues exactly where the rows end."""
    pk = _state(bucket.table)
    kv = pk.buckets[bucket.index]
    bucket.tablet.check_online()
    async with kv.lock:
        view, offset = kv.tablet.snapshot()
    if bucket.tablet.config.flush_policy is FlushPolicy.ACK:
        # RocksDB is applied a moment before the changelog's fsync returns: the rows are
        # given once the changelog they cover is durable, so the offset is within the high
        # watermark and reading the changelog on from it never runs ahead of its readers.
        await bucket.group_commit.wait_durable(offset)

    def read() -> pa.Table:
        batches = list(kv.tablet.scan(view=view))
        return pa.Table.from_batches(batches, schema=pk.schema) if batches else pk.schema.empty_table()

    return await asyncio.get_running_loop().run_in_executor(_service().broker.cpu_executor, read), offset


def deletion_refusal(table: Table) -> str | None:
    """Why DeleteTopics must refuse `table` (a changelog view: delete the table itself), or None."""
    if isinstance(table, ChangelogTable):
        return f"{table.name} is the changelog of table {table.source.name}; delete the table itself"
    return None


def _refuse_deletion(table: Table) -> None:
    reason = deletion_refusal(table)
    if reason:
        raise InvalidTableError(reason)


def _remove_kv_files(gone: list["PkTable"]) -> None:
    """Close and remove the KV tablets and snapshots (local and remote) of deleted tables."""
    for pk in gone:
        for kv in pk.buckets:
            kv.tablet.close()
            shutil.rmtree(kv.tablet.path, ignore_errors=True)
            kv.snapshots.delete_all()
            if kv.remote is not None:
                try:
                    kv.remote.delete_all()
                except Exception as exc:  # noqa: BLE001 - left for the operator; nothing reads them any more
                    log.warning("deleting KV snapshots under %s failed: %s", kv.remote.prefix, exc)


def table_deleted(table: Table):
    """After a table is deleted: drop its changelog view, close and remove its KV tablets and snapshots."""
    svc = _SERVICE.get("service")
    if svc is not None:
        return svc.forget_deleted()
    return None


# ---------------------------------------------------------------- the table kinds

def _read_kafka(table: Table, broker, bucket, offset: int, max_bytes: int, min_one: bool, *,
                full: bool) -> tuple[list[bytes], int]:
    """Stored changelog batches from `offset` as Kafka batches of the upsert (or full) view."""
    compression = bucket.table.config("compression.type")
    out: list[bytes] = []
    size = 0
    for stored in stored_batches(broker, bucket, offset, max_bytes):
        wire = changelog_wire(table, stored, full=full, compression_type=compression,
                              leader_epoch=bucket.leader_epoch)
        if wire is None:
            continue
        if (out or not min_one) and size + len(wire) > max_bytes:
            break
        out.append(wire)
        size += len(wire)
    return out, size


class PrimaryKeyTable(TableKind):
    """A table with a primary key: writes merge into its KV tablets, whose changelog is the
    log; Kafka consumers of the table read the upsert stream (+I/+U, -D as tombstones)."""

    name = PRIMARY_KEY_KIND

    def decode_produced(self, bucket, wire: memoryview, header, *, log_append_time_ms: int | None,
                        coalesced: bool = False):
        return to_write(bucket, wire, header, log_append_time_ms=log_append_time_ms)

    async def hold_transactional(self, broker, bucket, meta: BatchMeta, wire: bytes) -> bool:
        # Its writes reach the KV state only when the transaction commits: held (durably)
        # until then (kv/txn_pk.py).
        await broker.extensions["txn_pk"].hold(bucket, meta, wire)
        return True

    async def append_produced(self, broker, bucket, write, meta: BatchMeta, *, wire, acks: int,
                              on_append) -> BatchMeta:
        # The stored changelog is not the producer's batch: nothing for the wire cache.
        return await produce(bucket, write, meta, on_append)

    async def end_transaction(self, broker, bucket, producer_id: int, commit: bool) -> bool:
        await broker.extensions["txn_pk"].finish(broker, bucket, producer_id, commit)
        return True

    def read_kafka(self, broker, bucket, offset: int, max_bytes: int, min_one: bool = True):
        return _read_kafka(bucket.table, broker, bucket, offset, max_bytes, min_one, full=False)

    def check_appendable(self, table) -> None:
        # Plain appends would bypass the merge.
        raise InvalidRequestError(f"{table.name} is a primary-key table: write with upsert/delete, not append")

    def describe(self, table) -> dict:
        return {"kind": self.name, "primary_key": _columns(table.configs.get(PRIMARY_KEY)),
                "kv_stats": kv_stats(table)}

    async def write_rows(self, table, rows, *, deletes=None, partial_columns=None):
        return await write_table_rows(table, rows, deletes=deletes, partial_columns=partial_columns)

    def check_primary_key(self, table) -> None:
        _state(table)

    def lookup(self, table, keys, *, wait_durable):
        return lookup(table, keys, wait_durable=wait_durable)

    def lookup_batch(self, table, keys, *, wait_durable):
        return lookup_batch(table, keys, wait_durable=wait_durable)

    def prefix_lookup(self, table, prefixes, *, wait_durable):
        return prefix_lookup(table, prefixes, wait_durable=wait_durable)

    async def await_durable(self, table, fence: dict[int, int]) -> None:
        await await_fence(table, fence)

    async def kv_snapshot(self, table) -> list[SnapshotInfo]:
        return await snapshot(table)

    def kv_snapshots(self, table) -> list[list[SnapshotInfo]]:
        return snapshots(table)

    def remote_kv_snapshot(self, bucket) -> dict | None:
        return remote_snapshot(bucket)

    async def full_read(self, bucket) -> tuple[pa.Table, int]:
        return await full_read(bucket)


class ChangelogView(TableKind):
    """`<table>.changelog`: the table's log tablets read as the full changelog (+I, -U, +U,
    -D); described as a log table; written only through its table."""

    def check_producible(self, table) -> None:
        check_producible(table)

    def check_records_deletable(self, table) -> None:
        check_records_deletable(table)

    def read_kafka(self, broker, bucket, offset: int, max_bytes: int, min_one: bool = True):
        return _read_kafka(bucket.table.source, broker, bucket, offset, max_bytes, min_one, full=True)


PRIMARY_KEY_TABLE = PrimaryKeyTable()
CHANGELOG_VIEW = ChangelogView()


# ---------------------------------------------------------------- start / stop

@on_start
async def start_pk_tables(broker) -> None:
    # Runs after the registry service's start hook (broker.SERVICES order): value formats
    # are attached to the tables by then.
    if "pk_tables" in broker.extensions:
        return
    service = PkTableService(broker)
    _SERVICE["service"] = service
    broker.extensions["pk_tables"] = service
    broker.tables.create_hooks.append(service.before_create)
    broker.tables.open_hooks.append(service.attach)
    broker.tables.delete_hooks.append(_refuse_deletion)
    broker.tables.deleted_hooks.append(table_deleted)
    for table in list(broker.tables.tables.values()):
        publish = service.attach(table)  # before the listener opens: blocking is fine
        if publish is not None:
            publish()
    broker._background.append(asyncio.create_task(service.snapshot_loop(), name="kv-snapshots"))


@on_stop
async def stop_pk_tables(broker) -> None:
    service = broker.extensions.pop("pk_tables", None)
    if service is not None:
        service.close()
    _SERVICE.pop("service", None)


