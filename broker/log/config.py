"""Per-bucket log settings: segment rolling, retention, index density and fsync policy."""
from __future__ import annotations

import enum
from dataclasses import dataclass

GIB = 1 << 30
DAY_MS = 24 * 60 * 60 * 1000


class FlushPolicy(enum.Enum):
    """When appended data is forced to disk."""

    # An acks=all append is fsynced before it is acknowledged; concurrent appends share one fsync.
    ACK = "ack"
    # Flushed when flush_interval_ms has passed since the last flush (checked by the broker's ticker).
    INTERVAL = "interval"
    # Left to the operating system, as Kafka does by default.
    NONE = "none"


class TimestampType(enum.Enum):
    CREATE_TIME = "CreateTime"
    LOG_APPEND_TIME = "LogAppendTime"


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = GIB
    segment_ms: int = 7 * DAY_MS
    retention_ms: int = 7 * DAY_MS  # -1 keeps data forever
    retention_bytes: int = -1  # -1 means no size limit
    index_interval_bytes: int = 4096
    # segment.index.bytes: a segment rolls once its offset index holds this many bytes (16 an entry).
    segment_index_bytes: int = 10 * 1024 * 1024
    flush_policy: FlushPolicy = FlushPolicy.ACK
    flush_interval_ms: int = 1000
    message_timestamp_type: TimestampType = TimestampType.CREATE_TIME
    # Min/max/null count of numeric and temporal user columns, kept with each batch.
    batch_statistics: bool = True
    # Arrow IPC buffer compression of appended batches: none, lz4, zstd, or auto (zstd for
    # typed tables, none for a raw table's opaque value bytes). Recorded per batch, so a
    # change applies to the next append and older batches stay readable.
    compression: str = "none"
