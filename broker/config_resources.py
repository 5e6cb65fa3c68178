"""Broker and group config resources: what DescribeConfigs shows for them and what
IncrementalAlterConfigs / AlterConfigs may change at runtime.

Broker configs come from the command line; those Kafka lets an operator change on a
running broker (its "dynamic" configs) and that Fluvial acts on can be set per broker
(resource name = node id) or cluster-wide (resource name ""), are kept in the metadata
store and applied again at every start. The others are read-only: altering them is
refused with INVALID_REQUEST, as Kafka does. Group configs (resource type 32, KIP-848)
are kept per group with Kafka's defaults and bounds.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fluvial.broker.config import TOPIC_CONFIGS
from fluvial.errors import FluvialError, InvalidConfigError
from fluvial.protocol.errors import ErrorCode

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_GROUP = 32

_DDL = """
CREATE TABLE IF NOT EXISTS config_overrides (
    resource_type INTEGER NOT NULL,
    resource_name TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (resource_type, resource_name, name)
);
"""


@dataclass(frozen=True)
class BrokerConfigDef:
    name: str
    kind: str  # as TopicConfigDef.kind
    doc: str
    read: Callable  # broker -> str: the value from the command line
    # The topic config this broker config is the default of (Kafka's log.* names), or a
    # BrokerConfig field to set; neither: read-only.
    topic_default: str | None = None
    field: str | None = None

    @property
    def dynamic(self) -> bool:
        return self.topic_default is not None or self.field is not None


def _cfg(attr: str, fmt=str) -> Callable:
    return lambda broker: fmt(getattr(broker.config, attr))


def _topic_default(name: str) -> Callable:
    return lambda broker: broker.config.topic_defaults.get(name, TOPIC_CONFIGS[name].default)


def _flag(value) -> str:
    return str(bool(value)).lower()


BROKER_CONFIGS: dict[str, BrokerConfigDef] = {d.name: d for d in [
    BrokerConfigDef("broker.id", "int", "This broker's id.", _cfg("node_id")),
    BrokerConfigDef("node.id", "int", "This broker's id.", _cfg("node_id")),
    BrokerConfigDef("auto.create.topics.enable", "bool", "Create unknown topics on first use.",
                    _cfg("auto_create_topics", _flag)),
    BrokerConfigDef("num.partitions", "int", "Partitions of an auto-created topic.", _cfg("default_partitions")),
    BrokerConfigDef("socket.request.max.bytes", "int", "Largest request accepted.", _cfg("max_request_bytes")),
    BrokerConfigDef("connections.max.idle.ms", "long", "Idle connections are closed after this.",
                    _cfg("connections_max_idle_ms")),
    BrokerConfigDef("log.dirs", "string", "Where the logs are.", lambda b: str(b.data_dir / "log")),
    BrokerConfigDef("log.retention.check.interval.ms", "long", "How often retention runs.",
                    _cfg("retention_check_interval_ms")),
    BrokerConfigDef("group.initial.rebalance.delay.ms", "int", "Delay of a new group's first rebalance.",
                    _cfg("group_initial_rebalance_delay_ms")),
    BrokerConfigDef("group.min.session.timeout.ms", "int", "Smallest session timeout of a member.",
                    _cfg("group_min_session_timeout_ms")),
    BrokerConfigDef("group.max.session.timeout.ms", "int", "Largest session timeout of a member.",
                    _cfg("group_max_session_timeout_ms")),
    BrokerConfigDef("offsets.retention.minutes", "int", "How long committed offsets of an empty group live.",
                    _cfg("offsets_retention_minutes")),
    BrokerConfigDef("remote.log.storage.system.enable", "bool", "Remote storage available on this broker.",
                    lambda b: "true"),
    BrokerConfigDef("remote.storage.enable", "bool", "Default of the topic config remote.storage.enable.",
                    _cfg("remote_storage_enable", _flag)),
    BrokerConfigDef("remote.fetch.max.wait.ms", "int", "Longest wait of a fetch for remote data.",
                    _cfg("remote_fetch_max_wait_ms")),
    BrokerConfigDef("fluvial.flush.policy", "string", "When appends are fsynced (ack, interval, none).",
                    _cfg("flush_policy")),
    BrokerConfigDef("fluvial.object.store", "string", "Where tiered segments go.",
                    lambda b: b.object_store.url),
    # Dynamic (Kafka lets them change at runtime; so does Fluvial).
    BrokerConfigDef("log.cleaner.backoff.ms", "long", "How often compacted topics are checked for cleaning.",
                    _cfg("log_cleaner_backoff_ms"), field="log_cleaner_backoff_ms"),
    BrokerConfigDef("log.cleaner.dedupe.buffer.size", "long", "Bytes of keys one cleaning pass may hold.",
                    _cfg("log_cleaner_dedupe_buffer_size"), field="log_cleaner_dedupe_buffer_size"),
    BrokerConfigDef("log.cleaner.delete.retention.ms", "long", "Default of delete.retention.ms.",
                    _topic_default("delete.retention.ms"), topic_default="delete.retention.ms"),
    BrokerConfigDef("log.cleaner.min.cleanable.ratio", "double", "Default of min.cleanable.dirty.ratio.",
                    _topic_default("min.cleanable.dirty.ratio"), topic_default="min.cleanable.dirty.ratio"),
    BrokerConfigDef("log.cleaner.min.compaction.lag.ms", "long", "Default of min.compaction.lag.ms.",
                    _topic_default("min.compaction.lag.ms"), topic_default="min.compaction.lag.ms"),
    BrokerConfigDef("log.cleaner.max.compaction.lag.ms", "long", "Default of max.compaction.lag.ms.",
                    _topic_default("max.compaction.lag.ms"), topic_default="max.compaction.lag.ms"),
]}


@dataclass(frozen=True)
class GroupConfigDef:
    name: str
    default: int
    low: int
    high: int
    doc: str


# Kafka's group configs with the broker defaults and bounds (group.consumer.* / group.share.*).
GROUP_CONFIGS: dict[str, GroupConfigDef] = {d.name: d for d in [
    GroupConfigDef("consumer.session.timeout.ms", 45_000, 45_000, 60_000,
                   "Session timeout of members of a consumer-protocol group (KIP-848)."),
    GroupConfigDef("consumer.heartbeat.interval.ms", 5_000, 5_000, 15_000,
                   "Heartbeat interval of members of a consumer-protocol group (KIP-848)."),
    GroupConfigDef("share.session.timeout.ms", 45_000, 45_000, 60_000, "Session timeout of share-group members."),
    GroupConfigDef("share.heartbeat.interval.ms", 5_000, 5_000, 15_000, "Heartbeat interval of share-group members."),
    GroupConfigDef("share.record.lock.duration.ms", 30_000, 15_000, 60_000, "Lock duration of share-group records."),
]}


def _check_value(kind: str, name: str, value: str) -> None:
    try:
        number = float(value) if kind == "double" else int(value)
    except ValueError:
        raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: not a number") from None
    if kind == "double" and not 0.0 <= number <= 1.0:
        raise InvalidConfigError(f"Invalid value {value} for configuration {name}: must be in [0, 1]")
    if kind in ("long", "int") and number < 0:
        raise InvalidConfigError(f"Invalid value {value} for configuration {name}: must be >= 0")


class ConfigResources:
    """Dynamic broker configs and group configs, persisted in the metadata store."""

    def __init__(self, broker):
        self.broker = broker
        # Every override, kept in memory so that describing never waits for SQLite.
        self._overrides: dict[tuple[int, str], dict[str, str]] = {}

    def load(self) -> None:
        """Read the stored overrides (blocking; at start, on the I/O executor)."""
        self.broker.store.ensure_schema(_DDL)
        for r in self.broker.store.query("SELECT resource_type, resource_name, name, value FROM config_overrides"):
            self._overrides.setdefault((r["resource_type"], r["resource_name"]), {})[r["name"]] = r["value"]

    def stored(self, resource_type: int, resource_name: str) -> dict[str, str]:
        return dict(self._overrides.get((resource_type, resource_name), {}))

    def _store(self, resource_type: int, resource_name: str, overrides: dict[str, str]) -> None:
        """Replace one resource's overrides (blocking: callers on the loop use an executor)."""
        with self.broker.store.transaction() as conn:
            conn.execute("DELETE FROM config_overrides WHERE resource_type = ? AND resource_name = ?",
                         (resource_type, resource_name))
            conn.executemany("INSERT INTO config_overrides VALUES (?, ?, ?, ?)",
                             [(resource_type, resource_name, k, v) for k, v in overrides.items()])
        self._overrides[(resource_type, resource_name)] = dict(overrides)

    # -- broker ------------------------------------------------------------------------------

    def check_broker_name(self, name: str) -> None:
        if name not in ("", str(self.broker.config.node_id)):
            raise FluvialError(f"Unknown broker {name!r} (this is broker {self.broker.config.node_id})",
                               code=ErrorCode.INVALID_REQUEST)

    def broker_overrides(self) -> tuple[dict[str, str], dict[str, str]]:
        """(cluster-wide defaults, this broker's own) dynamic overrides."""
        return self.stored(RESOURCE_BROKER, ""), self.stored(RESOURCE_BROKER, str(self.broker.config.node_id))

    def validate_broker(self, overrides: dict[str, str]) -> None:
        for name, value in overrides.items():
            d = BROKER_CONFIGS.get(name)
            if d is None:
                raise InvalidConfigError(f"Unknown broker config {name}")
            if not d.dynamic:
                raise FluvialError(f"Cannot update these configs dynamically: {{{name}}} (it is read-only; set it on "
                                   f"the command line)", code=ErrorCode.INVALID_REQUEST)
            _check_value(d.kind, name, value)

    def alter_broker(self, resource_name: str, overrides: dict[str, str]) -> None:
        """Replace the dynamic overrides of one broker resource (blocking), then apply all."""
        self.check_broker_name(resource_name)
        self.validate_broker(overrides)
        self._store(RESOURCE_BROKER, resource_name, overrides)

    def apply_broker(self) -> None:
        """Put the stored dynamic configs into effect (per-broker over cluster-wide over static)."""
        cluster, own = self.broker_overrides()
        effective = {**cluster, **own}
        config = self.broker.config
        if not hasattr(self, "_static"):
            self._static = {d.field: getattr(config, d.field) for d in BROKER_CONFIGS.values() if d.field}
            self._static_topic_defaults = dict(config.topic_defaults)
        for field, value in self._static.items():
            setattr(config, field, value)
        topic_defaults = dict(self._static_topic_defaults)
        for name, value in effective.items():
            d = BROKER_CONFIGS.get(name)
            if d is None:
                continue
            if d.field:
                setattr(config, d.field, type(self._static[d.field])(value))
            if d.topic_default:
                topic_defaults[d.topic_default] = value
        config.topic_defaults.clear()
        config.topic_defaults.update(topic_defaults)
        for table in self.broker.tables.tables.values():
            for name in ("delete.retention.ms", "min.cleanable.dirty.ratio", "min.compaction.lag.ms",
                         "max.compaction.lag.ms"):
                if name in topic_defaults:
                    table.broker_defaults[name] = topic_defaults[name]
                else:
                    table.broker_defaults.pop(name, None)

    # -- groups ------------------------------------------------------------------------------

    def validate_group(self, group_id: str, overrides: dict[str, str]) -> None:
        if not group_id:
            raise FluvialError("A group config resource needs a group id", code=ErrorCode.INVALID_GROUP_ID)
        for name, value in overrides.items():
            d = GROUP_CONFIGS.get(name)
            if d is None:
                raise InvalidConfigError(f"Unknown group config name: {name}")
            try:
                number = int(value)
            except ValueError:
                raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: not a number") from None
            if not d.low <= number <= d.high:
                raise InvalidConfigError(f"Invalid value {value} for configuration {name}: must be in "
                                         f"[{d.low}, {d.high}]")
        session = int(overrides.get("consumer.session.timeout.ms", GROUP_CONFIGS["consumer.session.timeout.ms"].default))
        heartbeat = int(overrides.get("consumer.heartbeat.interval.ms",
                                      GROUP_CONFIGS["consumer.heartbeat.interval.ms"].default))
        if heartbeat >= session:
            raise InvalidConfigError("consumer.heartbeat.interval.ms must be less than consumer.session.timeout.ms")

    def alter_group(self, group_id: str, overrides: dict[str, str]) -> None:
        self.validate_group(group_id, overrides)
        self._store(RESOURCE_GROUP, group_id, overrides)
