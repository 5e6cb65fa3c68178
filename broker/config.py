"""Broker settings (command line) and the topic configs Fluvial understands."""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

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
    # fsync policy of log tablets: "ack" (acks=all produce is fsynced before it is
    # acknowledged), "interval" (every flush_interval_ms), "none" (left to the OS).
    flush_policy: str = "ack"
    flush_interval_ms: int = 1000
    retention_check_interval_ms: int = 30_000
    wire_cache_bytes: int = 64 * 1024 * 1024
    advertised_host: str | None = None
    # Group coordinator (Kafka's names: group.initial.rebalance.delay.ms, ...).
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    offsets_retention_minutes: int = 7 * 24 * 60
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


# Topic configs a client may set, with the defaults a topic gets when it sets none.
TOPIC_CONFIGS: dict[str, TopicConfigDef] = {c.name: c for c in [
    TopicConfigDef("retention.ms", str(7 * DAY_MS), "long", "Delete closed segments older than this (-1: keep forever)."),
    TopicConfigDef("retention.bytes", "-1", "long", "Delete the oldest segments while a bucket is larger (-1: no limit)."),
    TopicConfigDef("segment.bytes", str(1024 * 1024 * 1024), "int", "Roll a segment once it is this large."),
    TopicConfigDef("segment.ms", str(7 * DAY_MS), "long", "Roll a segment once it is this old."),
    TopicConfigDef("segment.index.bytes", str(10 * 1024 * 1024), "int", "Size bound of an offset index."),
    TopicConfigDef("index.interval.bytes", "4096", "int", "Bytes between sparse offset index entries."),
    TopicConfigDef("cleanup.policy", "delete", "list", "Only 'delete' is supported.", ("delete",)),
    TopicConfigDef("compression.type", "producer", "string",
                   "Codec of fetched batches: 'producer' keeps the producer's codec.",
                   ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")),
    TopicConfigDef("message.timestamp.type", "CreateTime", "string", "CreateTime or LogAppendTime.",
                   ("CreateTime", "LogAppendTime")),
    TopicConfigDef("max.message.bytes", str(1024 * 1024 + 12), "int", "Largest record batch accepted."),
    TopicConfigDef("min.insync.replicas", "1", "int", "Single-node broker: always 1."),
    TopicConfigDef("flush.messages", "9223372036854775807", "long", "Informational; see the broker's flush policy."),
    TopicConfigDef("flush.ms", "9223372036854775807", "long", "Informational; see the broker's flush policy."),
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
        if d.valid and value not in d.valid:
            raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: must be one of {list(d.valid)}")
        out[name] = value
    _check_local_retention(out)
    return out


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
