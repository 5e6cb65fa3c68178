"""Broker settings (command line) and the topic configs Fluvial understands."""
from __future__ import annotations

import functools

import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from fluvial.security.config import SecurityConfig

DAY_MS = 24 * 3600 * 1000


@dataclass
class BrokerConfig:
    data_dir: Path = Path("./fluvial-data")
    host: str = "127.0.0.1"
    kafka_port: int = 9092
    http_port: int = 8081
    flight_port: int = 8815
    node_id: int = 1
    auto_create_topics: bool = True
    default_partitions: int = 1
    max_request_bytes: int = 100 * 1024 * 1024
    # connections.max.idle.ms: a connection with no request or response for this long is
    # closed (Kafka's name and default, 10 minutes).
    connections_max_idle_ms: int = 600_000
    # > 0: asyncio debug mode, logging every event-loop step that runs longer than this
    # (with the task or callback that ran), to find what blocks the loop. Slows the broker.
    slow_callback_ms: int = 0
    # The event loop: "asyncio", "uvloop" or "auto" (uvloop when installed and no listener
    # uses TLS); see broker/event_loop.py for why asyncio's stays the default.
    event_loop: str = "asyncio"
    # The PLAINTEXT Kafka listener's socket I/O: "thread" (a compiled I/O thread, broker/netio.py;
    # the asyncio path when it is not built) or "asyncio". TLS and SASL listeners always use asyncio.
    kafka_io: str = "thread"
    # fsync policy of log tablets: "ack" (acks=all produce is fsynced before it is
    # acknowledged), "interval" (every flush_interval_ms), "none" (left to the OS).
    flush_policy: str = "ack"
    flush_interval_ms: int = 1000
    retention_check_interval_ms: int = 30_000
    # Log compaction: how often compacted tables are checked for cleaning (log.cleaner.backoff.ms).
    log_cleaner_backoff_ms: int = 15_000
    # Bytes of keys one cleaning pass may hold in memory (log.cleaner.dedupe.buffer.size).
    log_cleaner_dedupe_buffer_size: int = 128 * 1024 * 1024
    # Topic config defaults set at runtime through dynamic broker configs (log.cleaner.*).
    topic_defaults: dict[str, str] = field(default_factory=dict)
    wire_cache_bytes: int = 64 * 1024 * 1024
    # Large fetches of a raw table's segments read the next batches ahead while their
    # response travels (broker/read_ahead.py PreparedReads); False: each fetch reads for itself.
    fetch_read_ahead: bool = True
    advertised_host: str | None = None
    # Group coordinator (Kafka's names: group.initial.rebalance.delay.ms, ...).
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    # KIP-848 consumer groups (group.consumer.session.timeout.ms, .heartbeat.interval.ms, .assignors).
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_assignors: str = "uniform,range"
    # Share groups (KIP-932): group.share.* settings; share.auto.offset.reset is a per-group
    # config in Kafka, here the broker's default for every share group.
    group_share_session_timeout_ms: int = 45_000
    group_share_heartbeat_interval_ms: int = 5_000
    group_share_record_lock_duration_ms: int = 30_000
    group_share_delivery_count_limit: int = 5
    share_auto_offset_reset: str = "latest"
    offsets_retention_minutes: int = 7 * 24 * 60
    # Transactions (Kafka's transaction.max.timeout.ms and transactional.id.expiration.ms).
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    # Lake tiering: pyiceberg catalog properties (empty: the embedded SQLite catalog under
    # the data dir), whether the broker tiers lake tables itself, and a job's lease.
    lake_catalog_options: dict[str, str] = field(default_factory=dict)
    lake_tiering: bool = False
    lake_lease_ms: int = 30_000
    # Internal tiering: where closed segments go ("file://..." or "s3://bucket/prefix"; None:
    # <data-dir>/remote), the store's options, and the default of `remote.storage.enable`.
    object_store_url: str | None = None
    object_store_options: dict[str, str] = field(default_factory=dict)
    remote_storage_enable: bool = False
    # How often the remote log manager looks for segments to upload or expire.
    remote_log_manager_interval_ms: int = 5_000
    remote_upload_concurrency: int = 2
    # Bounded cache of remote data (footers and row groups) for Kafka reads of tiered offsets.
    remote_read_cache_bytes: int = 64 * 1024 * 1024
    # How long a Fetch waits for remote data (Kafka's remote.fetch.max.wait.ms) before it
    # answers that partition with no records, as Kafka does: the read goes on, the client's
    # next fetch of the offset joins it, so a slow or frozen store never holds a request.
    remote_fetch_max_wait_ms: int = 500
    # How often the metrics history behind the console's charts takes a sample.
    metrics_sample_interval_ms: int = 5_000
    # TLS, SASL and ACLs of the Kafka, HTTP and Flight listeners (docs/security.md).
    security: SecurityConfig = field(default_factory=SecurityConfig)

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host


@dataclass(frozen=True)
class TopicConfigDef:
    name: str
    default: str
    kind: str  # "long" | "int" | "string" | "list" | "bool" | "duration"
    doc: str
    valid: tuple[str, ...] = ()
    # Fixed at creation: what the stored data means depends on it.
    immutable: bool = False
    # A standard Kafka config Fluvial knows but does not act on: only its default is accepted
    # (a setting that would be silently ignored is refused), and this says why.
    default_only: str = ""


# `fluvial.agg.<column>`: the aggregate function of a column (merge engine 'aggregation').
AGG_CONFIG_PREFIX = "fluvial.agg."
_AGG_CONFIG = TopicConfigDef(AGG_CONFIG_PREFIX + "<column>", "", "string",
                             "Merge engine 'aggregation': the aggregate function of a column.", immutable=True)


def config_def(name: str) -> "TopicConfigDef | None":
    """The definition of a topic config name (per-column aggregate functions share one)."""
    d = TOPIC_CONFIGS.get(name)
    if d is None and name.startswith(AGG_CONFIG_PREFIX) and len(name) > len(AGG_CONFIG_PREFIX):
        return _AGG_CONFIG
    return d


CLEANUP_POLICIES = ("delete", "compact")


@functools.lru_cache(maxsize=64)
def cleanup_policies(value: str) -> frozenset[str]:
    # Cached: a compacted-topic check runs for every produced batch, on the event loop.
    return frozenset(p.strip() for p in str(value).split(",") if p.strip())


# Topic configs a client may set, with the defaults a topic gets when it sets none.
TOPIC_CONFIGS: dict[str, TopicConfigDef] = {c.name: c for c in [
    TopicConfigDef("retention.ms", str(7 * DAY_MS), "long", "Delete closed segments older than this (-1: keep forever)."),
    TopicConfigDef("retention.bytes", "-1", "long", "Delete the oldest segments while a bucket is larger (-1: no limit)."),
    TopicConfigDef("segment.bytes", str(1024 * 1024 * 1024), "int", "Roll a segment once it is this large."),
    TopicConfigDef("segment.ms", str(7 * DAY_MS), "long", "Roll a segment once it is this old."),
    TopicConfigDef("segment.index.bytes", str(10 * 1024 * 1024), "int",
                   "Size bound of a segment's offset index: the segment rolls when its index is full."),
    TopicConfigDef("index.interval.bytes", "4096", "int", "Bytes between sparse offset index entries."),
    TopicConfigDef("cleanup.policy", "delete", "list",
                   "delete (retention by time and size), compact (keep the latest record per key) or both "
                   "(compact,delete).", CLEANUP_POLICIES),
    TopicConfigDef("delete.retention.ms", str(DAY_MS), "long",
                   "Compacted topics: how long a tombstone is kept after the cleaning that first kept it."),
    TopicConfigDef("min.cleanable.dirty.ratio", "0.5", "double",
                   "Compacted topics: clean when the uncleaned part is at least this share of the cleanable log."),
    TopicConfigDef("min.compaction.lag.ms", "0", "long",
                   "Compacted topics: a record stays uncompacted for at least this long."),
    TopicConfigDef("max.compaction.lag.ms", "9223372036854775807", "long",
                   "Compacted topics: a record is eligible for compaction after at most this long."),
    TopicConfigDef("compression.type", "producer", "string",
                   "Codec of fetched batches: 'producer' keeps the producer's codec.",
                   ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")),
    TopicConfigDef("message.timestamp.type", "CreateTime", "string", "CreateTime or LogAppendTime.",
                   ("CreateTime", "LogAppendTime")),
    TopicConfigDef("max.message.bytes", str(1024 * 1024 + 12), "int", "Largest record batch accepted."),
    TopicConfigDef("min.insync.replicas", "1", "int", "Single-node broker: always 1."),
    TopicConfigDef("flush.messages", "9223372036854775807", "long",
                   "Accepted when the broker's flush policy meets it (ack: every batch is fsynced); refused otherwise."),
    TopicConfigDef("flush.ms", "9223372036854775807", "long",
                   "Accepted when the broker's flush policy meets it (ack, or interval at most this); refused otherwise."),
    TopicConfigDef("compression.gzip.level", "-1", "int", "gzip level of re-compressed fetched batches.",
                   default_only="fetched batches are compressed at the codec's default level"),
    TopicConfigDef("compression.lz4.level", "9", "int", "lz4 level of re-compressed fetched batches.",
                   default_only="fetched batches are compressed at the codec's default level"),
    TopicConfigDef("compression.zstd.level", "3", "int", "zstd level of re-compressed fetched batches.",
                   default_only="fetched batches are compressed at the codec's default level"),
    TopicConfigDef("file.delete.delay.ms", "60000", "long", "Delay before deleted segment files are removed.",
                   default_only="files leave at once (readers keep the segments they have mapped)"),
    TopicConfigDef("message.timestamp.before.max.ms", "9223372036854775807", "long",
                   "How far in the past a record's timestamp may be.",
                   default_only="record timestamps are not bounded"),
    TopicConfigDef("message.timestamp.after.max.ms", "9223372036854775807", "long",
                   "How far in the future a record's timestamp may be.",
                   default_only="record timestamps are not bounded"),
    TopicConfigDef("preallocate", "false", "bool", "Preallocate segment files.",
                   default_only="segment files grow as they are written"),
    TopicConfigDef("segment.jitter.ms", "0", "long", "Random jitter subtracted from segment.ms.",
                   default_only="segments roll at segment.ms exactly"),
    TopicConfigDef("unclean.leader.election.enable", "false", "bool",
                   "Single-node broker: each partition has one replica, so there is no other to elect."),
    TopicConfigDef("leader.replication.throttled.replicas", "", "list",
                   "Single-node broker: no replication to throttle."),
    TopicConfigDef("follower.replication.throttled.replicas", "", "list",
                   "Single-node broker: no replication to throttle."),
    TopicConfigDef("remote.log.copy.disable", "false", "bool", "Stop copying segments to remote storage.",
                   default_only="use remote.storage.enable"),
    TopicConfigDef("remote.log.delete.on.disable", "false", "bool",
                   "Delete remote segments when remote storage is disabled.",
                   default_only="remote storage cannot be disabled on a topic once enabled"),
    TopicConfigDef("remote.storage.enable", "false", "bool",
                   "Upload closed segments to the object store; local copies go after local.retention.*."),
    TopicConfigDef("local.retention.ms", "-2", "long",
                   "With remote storage: keep local copies of uploaded segments this long (-2: retention.ms)."),
    TopicConfigDef("local.retention.bytes", "-2", "long",
                   "With remote storage: keep at most this many bytes of local copies per bucket (-2: retention.bytes)."),
    TopicConfigDef("fluvial.value.format", "raw", "string", "Value format on the Kafka path.", ("raw", "avro", "json"), immutable=True),
    TopicConfigDef("fluvial.value.schema", "", "string",
                   "Schema of the values: an Avro schema for value format avro, a JSON Schema for value format json."),
    TopicConfigDef("fluvial.primary.key", "", "string",
                   "Primary-key columns, comma-separated: the table keeps the latest row per key and a changelog.", immutable=True),
    TopicConfigDef("fluvial.bucket.key", "", "string",
                   "Bucket-key columns (a prefix of the primary key; default the whole key), for prefix lookups.", immutable=True),
    TopicConfigDef("fluvial.bucket.function", "murmur2", "string",
                   "Primary-key tables: how a key picks its bucket, matching the producers' default partitioner: "
                   "murmur2 (Java clients; librdkafka murmur2_random) or crc32 (librdkafka's default "
                   "consistent_random: confluent-kafka, kcat, Go/.NET/Node clients).",
                   ("murmur2", "murmur2_random", "crc32", "consistent_random", "consistent"), immutable=True),
    TopicConfigDef("fluvial.key.format", "", "string", "Format of the Kafka key of a primary-key table "
                   "(default: the value format).", ("", "avro", "json"), immutable=True),
    TopicConfigDef("fluvial.merge.engine", "last_row", "string", "How a write merges with the current row of its key.",
                   ("last_row", "first_row", "versioned", "retract", "aggregation"), immutable=True),
    TopicConfigDef("fluvial.version.column", "", "string", "Version column of merge engine 'versioned'.", immutable=True),
    TopicConfigDef("fluvial.upsert.key", "", "string", "Merge engine 'retract': the columns identifying a row among "
                   "the live rows of its key (default: all columns).", immutable=True),
    TopicConfigDef("fluvial.retract.state.ttl.ms", "", "string", "Merge engine 'retract': live rows (but the "
                   "visible one) older than this are dropped (default: kept until retracted).", immutable=True),
    TopicConfigDef("fluvial.lake.enable", "false", "bool",
                   "Materialize the table into a lake table (Apache Iceberg), kept up to date by tiering jobs."),
    TopicConfigDef("fluvial.storage.compression", "auto", "string",
                   "Compression of stored column buffers (Arrow IPC): auto (zstd for typed tables, none for a raw "
                   "table's value bytes), none, lz4, zstd, or zstd-delta (zstd with the offsets of strings, binaries, "
                   "lists and maps stored as their differences: smaller, but only Fluvial reads such segments). "
                   "Recorded per batch: a change applies to new appends. "
                   "Independent of compression.type, which is what Kafka fetches return.",
                   ("auto", "none", "lz4", "zstd", "zstd-delta")),
    TopicConfigDef("fluvial.lake.freshness", "30s", "duration",
                   "Target lag of the lake table behind the table (e.g. 30s, 500ms, 2min; a plain number is ms)."),
]}


_DURATION_UNITS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def parse_duration_ms(text: str) -> int:
    """'30s', '500ms', '2min', '1h' or a plain number of milliseconds. Raises ValueError."""
    value = str(text).strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    if not match or match.group(2) not in ("", *_DURATION_UNITS):
        raise ValueError(f"{text!r} is not a duration (e.g. 30s, 500ms, 2min)")
    return int(float(match.group(1)) * _DURATION_UNITS.get(match.group(2), 1))


def config_flag(value: str) -> bool:
    return str(value).strip().lower() == "true"


def validate_topic_configs(configs: dict[str, str | None]) -> dict[str, str]:
    """Check names and values; returns the non-null overrides. Raises InvalidConfigError."""
    from fluvial.errors import InvalidConfigError

    out: dict[str, str] = {}
    for name, value in configs.items():
        d = config_def(name)
        if d is None:
            raise InvalidConfigError(f"Unknown topic config name: {name}")
        if value is None:
            continue
        if d.kind in ("long", "int"):
            try:
                int(value)
            except ValueError:
                raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: not a number") from None
        if d.kind == "bool" and str(value).strip().lower() not in ("true", "false"):
            raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: must be true or false")
        if d.kind == "duration":
            try:
                parse_duration_ms(value)
            except ValueError as exc:
                raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: {exc}") from None
        if d.default_only and str(value) != d.default:
            raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: only the default "
                                     f"{d.default!r} is supported ({d.default_only})")
        if d.kind == "double":
            try:
                number = float(value)
            except ValueError:
                raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: not a number") from None
            if not 0.0 <= number <= 1.0:
                raise InvalidConfigError(f"Invalid value {value} for configuration {name}: must be in [0, 1]")
        if d.kind == "list" and d.valid:
            unknown = cleanup_policies(value) - set(d.valid)
            if unknown or not cleanup_policies(value):
                raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: "
                                         f"a comma-separated list of {list(d.valid)}")
        elif d.valid and value not in d.valid:
            raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: must be one of {list(d.valid)}")
        out[name] = value
    _check_local_retention(out)
    _check_compaction(out)
    return out


def _check_compaction(configs: dict[str, str]) -> None:
    """Compaction needs keyed log records on local disk: not with remote storage (as in Kafka)
    nor on primary-key tables (their KV tablet keeps the latest row; the log is the changelog)."""
    from fluvial.errors import InvalidConfigError

    if "compact" not in cleanup_policies(configs.get("cleanup.policy", "delete")):
        return
    if config_flag(configs.get("remote.storage.enable", "false")):
        raise InvalidConfigError("Remote log storage is not supported for compacted topics "
                                 "(cleanup.policy=compact with remote.storage.enable=true)")
    if configs.get("fluvial.primary.key"):
        raise InvalidConfigError("cleanup.policy=compact is for log tables: a primary-key table keeps the latest "
                                 "row of each key already, and its log is the changelog")
    lag_min = int(configs.get("min.compaction.lag.ms", "0"))
    lag_max = int(configs.get("max.compaction.lag.ms", str((1 << 63) - 1)))
    if lag_min < 0 or lag_max < 1 or lag_min > lag_max:
        raise InvalidConfigError(f"min.compaction.lag.ms ({lag_min}) must be >= 0 and at most "
                                 f"max.compaction.lag.ms ({lag_max}), which must be > 0")


def _check_local_retention(configs: dict[str, str]) -> None:
    """Kafka's rules: local.retention.* is -2 (follow retention.*), -1 (unbounded, only with an
    unbounded total) or at most retention.*."""
    from fluvial.errors import InvalidConfigError

    for local_name, total_name in (("local.retention.ms", "retention.ms"), ("local.retention.bytes", "retention.bytes")):
        local = int(configs.get(local_name, TOPIC_CONFIGS[local_name].default))
        total = int(configs.get(total_name, TOPIC_CONFIGS[total_name].default))
        if local < -2:
            raise InvalidConfigError(f"Invalid value {local} for configuration {local_name}: must be -2, -1 or >= 0")
        if local == -2:
            continue
        if total >= 0 and (local == -1 or local > total):
            raise InvalidConfigError(f"Invalid value {local} for configuration {local_name}: it must not be "
                                     f"larger than {total_name} ({total})")


def check_flush_configs(configs: dict[str, str], broker: BrokerConfig) -> None:
    """flush.messages / flush.ms ask for fsyncs at least that often. The broker's flush policy
    decides when data is fsynced: a value it already meets is accepted (under `ack` every
    batch is fsynced before it is acknowledged, so any value is), others are refused rather
    than silently ignored. Raises InvalidConfigError."""
    from fluvial.errors import InvalidConfigError

    never = (1 << 63) - 1
    for name in ("flush.messages", "flush.ms"):
        if name not in configs or int(configs[name]) == never or broker.flush_policy == "ack":
            continue
        if name == "flush.ms" and broker.flush_policy == "interval" and broker.flush_interval_ms <= int(configs[name]):
            continue
        raise InvalidConfigError(
            f"{name}={configs[name]} is not met by the broker's flush policy {broker.flush_policy!r} "
            f"(flush interval {broker.flush_interval_ms} ms); fsyncs are set per broker (--flush-policy ack fsyncs "
            f"every batch before acknowledging it)")


def check_alterable(current: dict[str, str], new: dict[str, str]) -> None:
    """Refuse changing a config that is fixed at creation. Raises InvalidConfigError."""
    from fluvial.errors import InvalidConfigError

    for name, d in TOPIC_CONFIGS.items():
        if d.immutable and current.get(name, d.default) != new.get(name, d.default):
            raise InvalidConfigError(f"{name} is fixed when a table is created and cannot be altered")
    for name in {*current, *new}:
        if name.startswith(AGG_CONFIG_PREFIX) and current.get(name, "") != new.get(name, ""):
            raise InvalidConfigError(f"{name} is fixed when a table is created and cannot be altered")


def new_cluster_id() -> str:
    import base64
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


__all__ = ["BrokerConfig", "TOPIC_CONFIGS", "TopicConfigDef", "validate_topic_configs", "new_cluster_id", "field"]
