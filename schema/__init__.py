"""Schema registry, Avro/JSON <-> Arrow mapping, and the value codecs of typed tables."""
from __future__ import annotations

from fluvial.schema.codecs import NO_SCHEMA_ID, AvroValueCodec, JsonValueCodec, ValueCodec, value_codec
from fluvial.schema.evolution import evolve
from fluvial.schema.registry import (
    SchemaRegistered, SchemaRegistry, SchemaType, parse_schema, table_validator,
)
from fluvial.schema.rest import make_app, start_http
from fluvial.schema.value_format import MIXED_SCHEMA_IDS, SCHEMA_ID_FIELD, TypedValueFormat

__all__ = [
    "AvroValueCodec", "JsonValueCodec", "MIXED_SCHEMA_IDS", "NO_SCHEMA_ID", "SCHEMA_ID_FIELD",
    "SchemaRegistered", "SchemaRegistry", "SchemaType", "TypedValueFormat", "ValueCodec",
    "evolve", "make_app", "parse_schema", "start_http", "table_validator", "value_codec",
]
