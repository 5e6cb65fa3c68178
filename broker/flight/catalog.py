"""Tables as the table API shows them: schemas, descriptions, offsets; creation with an Arrow schema."""
from __future__ import annotations

import asyncio
import json

import pyarrow as pa

from fluvial.broker.kafka_batches import HEADERS_TYPE, RAW, TIMESTAMP_TYPE
from fluvial.broker.tables import Table, validate_table_name
from fluvial.client.wire import KAFKA_FORMATS, schema_to_b64
from fluvial.errors import InvalidConfigError, InvalidTableError

SCHEMA_ID = "_schema_id"
BUCKET = "_bucket"
FORMAT_CONFIG = "fluvial.value.format"
SCHEMA_CONFIG = "fluvial.value.schema"
FIELD_ID = b"fluvial.field_id"

SYSTEM_FIELDS = {f.name: f for f in (
    pa.field("_offset", pa.int64(), nullable=False),
    pa.field("_timestamp", TIMESTAMP_TYPE, nullable=False),
    pa.field("_change", pa.int8(), nullable=False),
    pa.field("_key", pa.binary()),
    pa.field("_headers", HEADERS_TYPE),
    pa.field(SCHEMA_ID, pa.int32(), nullable=False),
    # Not stored: the bucket a row was read from, for readers of several buckets.
    pa.field(BUCKET, pa.int32(), nullable=False),
)}


def value_format_of(table: Table):
    return getattr(table, "value_format", RAW) or RAW


def user_schema(table: Table) -> pa.Schema:
    """The table's user columns (what a scan returns by default), without `_schema_id`."""
    return pa.schema([f for f in value_format_of(table).user_fields if f.name != SCHEMA_ID])


def is_typed(table: Table) -> bool:
    return value_format_of(table) is not RAW


def column_field(table: Table, name: str, schema: pa.Schema | None = None) -> pa.Field | None:
    """The field of a user or system column, None when the table has no such column."""
    schema = schema if schema is not None else user_schema(table)
    index = schema.get_field_index(name)
    if index >= 0:
        return schema.field(index)
    if name == SCHEMA_ID and not is_typed(table):
        return None
    return SYSTEM_FIELDS.get(name)


def schema_with_field_ids(schema: pa.Schema) -> pa.Schema:
    """Field ids are positions in the table's schema; they let readers match columns across evolution."""
    return pa.schema([f.with_metadata({**(f.metadata or {}), FIELD_ID: str(i).encode()})
                      for i, f in enumerate(schema)], metadata=schema.metadata)


def bucket_offsets(table: Table, txn_index=None) -> list[dict]:
    """The log start is the first offset a scan can read: the remote log's, when data is
    tiered. The end given is what a read_committed scan (the default) reads up to: the last
    stable offset when a Kafka transaction is open in the bucket, else the high watermark;
    so readers that plan ranges (Spark) never step over rows of a transaction still open."""
    return [{"bucket": b.index, "log_start": getattr(b, "source", b).log_start_offset,
             "high_watermark": _readable_end(b, txn_index)} for b in table.buckets]


def _readable_end(bucket, txn_index) -> int:
    hwm = bucket.tablet.high_watermark
    state = txn_index.get(bucket) if txn_index is not None else None
    return hwm if state is None else state.last_stable_offset(hwm)


def describe(table: Table) -> dict:
    fmt = value_format_of(table)
    return {
        "name": table.name,
        "buckets": len(table.buckets),
        "kafka_format": fmt.name,
        "schema": schema_to_b64(schema_with_field_ids(user_schema(table))),
        "offsets": bucket_offsets(table),
        "configs": dict(table.configs),
        "created_ms": table.created_ms,
        # kind, primary_key, kv_stats
        **table.kind.describe(table),
    }


async def create_table(broker, name: str, schema: pa.Schema | None, buckets: int, kafka_format: str | None,
                 configs: dict[str, str] | None) -> Table:
    """Create a log table. With an Arrow schema it is typed: its Kafka values are JSON objects
    (default) or Avro under a schema derived from the Arrow one, registered as `<name>-value`.
    Must run on the event loop thread (like CreateTopics)."""
    configs = dict(configs or {})
    if FORMAT_CONFIG in configs or SCHEMA_CONFIG in configs:
        raise InvalidConfigError(f"{FORMAT_CONFIG}/{SCHEMA_CONFIG} follow from the schema and kafka_format")
    if schema is None:
        if kafka_format not in (None, "raw"):
            raise InvalidConfigError(f"a table without a schema is raw on the Kafka path, not {kafka_format}")
        return await broker.tables.create(name, buckets, configs)
    _check_schema(schema)
    kafka_format = kafka_format or "json"
    if kafka_format not in KAFKA_FORMATS:
        raise InvalidConfigError(f"kafka_format must be one of {list(KAFKA_FORMATS)}, not {kafka_format!r}")
    registry = broker.extensions.get("registry")
    if registry is None:
        raise InvalidConfigError("tables with a schema need the schema registry, which this broker does not run")
    from fluvial.schema.arrow_mapping import arrow_to_avro, arrow_to_json_schema
    from fluvial.schema.registry import parse_schema

    plain = pa.schema([f.remove_metadata() for f in schema])
    if kafka_format == "avro":
        configs[FORMAT_CONFIG] = "avro"
        configs[SCHEMA_CONFIG] = json.dumps(arrow_to_avro(plain, _avro_name(name)))
    else:
        configs[FORMAT_CONFIG] = "json"
        # Refuse what create would refuse before the subject is touched.
        validate_table_name(name)
        if name in broker.tables.tables or buckets <= 0:
            return await broker.tables.create(name, buckets, configs)
        text = json.dumps(arrow_to_json_schema(plain, title=name))
        # The registry commits to SQLite: off the event loop.
        await asyncio.get_running_loop().run_in_executor(
            broker.io_executor, registry.register, f"{name}-value", parse_schema(text, "JSON"))
    return await broker.tables.create(name, buckets, configs)


def _avro_name(table: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in table)
    return cleaned if cleaned[:1].isalpha() or cleaned[:1] == "_" else f"t_{cleaned}"


def _check_schema(schema: pa.Schema) -> None:
    if len(schema) == 0:
        raise InvalidTableError("a table schema needs at least one column")
    names = schema.names
    if len(set(names)) != len(names):
        raise InvalidTableError(f"duplicate column names in {names}")
    reserved = [n for n in names if n.startswith("_")]
    if reserved:
        raise InvalidTableError(f"column names starting with '_' are reserved for system columns: {reserved}")
