"""The table API's wire contract on Arrow Flight, shared by the broker's Flight server and the client.

Actions carry one JSON object each way. A scan is one `DoGet` per bucket whose ticket is a
JSON `ScanRequest`; its last message is metadata only (`ScanStats` as JSON). An append is a
`DoPut` whose descriptor command is a JSON `AppendRequest`; the server answers each batch
it appended with JSON `{"appended": [{"bucket", "base_offset", "record_count"}, ...]}`.
Errors are `FlightServerError`s whose `extra_info` is JSON `{"error": <kind>, "message": ...}`.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

# Action types.
LIST_TABLES = "list-tables"
DESCRIBE = "describe"
CREATE_TABLE = "create-table"
DROP_TABLE = "drop-table"
OFFSETS = "offsets"

# Columns every stored batch has before the user columns; `_schema_id` only in typed tables.
SYSTEM_COLUMNS = ("_offset", "_timestamp", "_change", "_key", "_headers", "_schema_id", "_bucket")

# Filter operators: each filter is (column, op, value), all AND-ed.
COMPARISONS = ("=", "!=", "<", "<=", ">", ">=")
FILTER_OPS = (*COMPARISONS, "in", "not in", "is_null", "not_null")

# Kafka value formats of a table created with an Arrow schema.
KAFKA_FORMATS = ("json", "avro")


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def encode_value(value: Any) -> Any:
    """A filter value as JSON: bytes and datetimes are tagged so they come back typed."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return {"$timestamp_ms": int(value.timestamp() * 1000)}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [encode_value(v) for v in value]
    if hasattr(value, "item"):  # NumPy scalars
        return value.item()
    return value


def decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if "$bytes" in value:
            return base64.b64decode(value["$bytes"])
        if "$timestamp_ms" in value:
            return dt.datetime.fromtimestamp(value["$timestamp_ms"] / 1000, dt.timezone.utc)
        if "$date" in value:
            return dt.date.fromisoformat(value["$date"])
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    return value


@dataclass
class ScanRequest:
    """One bucket's scan. `start`: "earliest", "latest", an offset, or {"timestamp": ms}.
    `end`: exclusive end offset, None = the high watermark when the scan starts."""

    table: str
    bucket: int
    columns: list[str] | None = None
    start: Any = "earliest"
    end: int | None = None
    filter: list[list[Any]] = field(default_factory=list)
    follow: bool = False
    # Whether the broker serves offsets that are only in the object store; a client that
    # reads them itself says False, and gets OffsetOutOfRange there instead.
    tiered: bool = True
    # "read_committed" (the default): rows of open transactions are not read yet (the scan
    # stops at the last stable offset), aborted ones never; "read_uncommitted": every row.
    # Transaction markers are never rows.
    isolation: str = "read_committed"

    def to_bytes(self) -> bytes:
        body = asdict(self)
        body["filter"] = [[c, op, encode_value(v)] for c, op, v in self.filter]
        return json.dumps(body).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "ScanRequest":
        body = json.loads(data)
        body["filter"] = [[c, op, decode_value(v)] for c, op, v in body.get("filter") or []]
        return cls(**body)


@dataclass
class ScanStats:
    """What the server did for a scan: the figures tests and users can assert on."""

    batches_read: int = 0
    batches_skipped: int = 0
    rows_read: int = 0
    rows_sent: int = 0
    bytes_sent: int = 0
    end_offset: int = -1
    # What the client read itself from remote segments in the object store (client-side
    # stitching; the broker's figures above cover only what it served).
    remote_segments: int = 0
    remote_batches_read: int = 0
    remote_batches_skipped: int = 0
    remote_rows_read: int = 0
    remote_rows_sent: int = 0
    remote_bytes_read: int = 0

    def add(self, other: "ScanStats") -> None:
        self.batches_read += other.batches_read
        self.batches_skipped += other.batches_skipped
        self.rows_read += other.rows_read
        self.rows_sent += other.rows_sent
        self.bytes_sent += other.bytes_sent
        self.remote_segments += other.remote_segments
        self.remote_batches_read += other.remote_batches_read
        self.remote_batches_skipped += other.remote_batches_skipped
        self.remote_rows_read += other.remote_rows_read
        self.remote_rows_sent += other.remote_rows_sent
        self.remote_bytes_read += other.remote_bytes_read

    def to_bytes(self) -> bytes:
        return json.dumps({"scan_stats": asdict(self)}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "ScanStats | None":
        body = json.loads(data)
        stats = body.get("scan_stats") if isinstance(body, dict) else None
        if stats is None:
            return None
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in stats.items() if k in known})


@dataclass
class AppendRequest:
    """Where a DoPut goes: a table, and a bucket (None = spread batches over the buckets)."""

    table: str
    bucket: int | None = None

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "AppendRequest":
        return cls(**json.loads(data))


@dataclass(frozen=True)
class Appended:
    """Offsets given to one appended batch (a large batch is stored as several)."""

    bucket: int
    base_offset: int
    record_count: int
