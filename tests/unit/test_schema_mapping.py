"""Avro schema <-> Arrow schema and JSON Schema <-> Arrow schema."""
from __future__ import annotations

import pyarrow as pa
import pytest

from fluvial.schema.arrow_mapping import (
    arrow_to_avro, arrow_to_json_schema, avro_to_arrow, json_schema_to_arrow,
)
from fluvial.schema.errors import InvalidSchemaError, UnsupportedSchemaError

MAP_LONG = pa.map_(pa.field("key", pa.string(), False), pa.field("value", pa.int64(), False))

AVRO_CASES = [
    ("null", pa.null(), True),
    ("boolean", pa.bool_(), False),
    ("int", pa.int32(), False),
    ("long", pa.int64(), False),
    ("float", pa.float32(), False),
    ("double", pa.float64(), False),
    ("string", pa.string(), False),
    ("bytes", pa.binary(), False),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, pa.string(), False),
    ({"type": "fixed", "name": "F", "size": 16}, pa.binary(16), False),
    ({"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 3}, pa.decimal128(9, 3), False),
    ({"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 0},
     pa.decimal128(18, 0), False),
    ({"type": "bytes", "logicalType": "decimal", "precision": 50, "scale": 2}, pa.decimal256(50, 2), False),
    ({"type": "int", "logicalType": "date"}, pa.date32(), False),
    ({"type": "int", "logicalType": "time-millis"}, pa.time32("ms"), False),
    ({"type": "long", "logicalType": "time-micros"}, pa.time64("us"), False),
    ({"type": "long", "logicalType": "timestamp-millis"}, pa.timestamp("ms", tz="UTC"), False),
    ({"type": "long", "logicalType": "timestamp-micros"}, pa.timestamp("us", tz="UTC"), False),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, pa.timestamp("us"), False),
    ({"type": "string", "logicalType": "uuid"}, pa.string(), False),
    (["null", "long"], pa.int64(), True),
    (["string", "null"], pa.string(), True),
    ({"type": "record", "name": "In", "fields": [{"name": "x", "type": "int"}]},
     pa.struct([pa.field("x", pa.int32(), False)]), False),
    ({"type": "array", "items": ["null", "double"]}, pa.list_(pa.field("item", pa.float64(), True)), False),
    ({"type": "map", "values": "long"}, MAP_LONG, False),
]


def record(field_type) -> dict:
    return {"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type}]}


@pytest.mark.parametrize("avro,arrow,nullable", AVRO_CASES, ids=[str(c[1]) for c in AVRO_CASES])
def test_avro_type_maps_to_arrow_and_back(avro, arrow, nullable):
    schema = avro_to_arrow(record(avro))
    f = schema.field("f")
    assert f.type == arrow
    assert f.nullable == nullable
    # Arrow -> Avro -> Arrow keeps types, nullability and the metadata (enum symbols, fixed names, ...)
    # (a nullable field gains `"default": null`, which Avro readers need to evolve)
    again = avro_to_arrow(arrow_to_avro(schema))
    assert again.equals(schema)
    assert without_default(again.field("f").metadata) == without_default(f.metadata)


def without_default(meta):
    return {k: v for k, v in (meta or {}).items() if k != b"default"}


def test_enum_symbols_and_union_order_survive_the_way_back():
    schema = avro_to_arrow(record(["string", "null"]))
    assert arrow_to_avro(schema)["fields"][0]["type"] == ["string", "null"]
    enum = avro_to_arrow(record({"type": "enum", "name": "E", "symbols": ["A", "B"]}))
    assert arrow_to_avro(enum)["fields"][0]["type"] == {"type": "enum", "name": "E", "symbols": ["A", "B"]}


def test_named_types_used_twice_map_to_the_same_columns():
    s = {"type": "record", "name": "R", "fields": [
        {"name": "a", "type": {"type": "fixed", "name": "F", "size": 4}}, {"name": "b", "type": "F"}]}
    arrow = avro_to_arrow(s)
    assert arrow.field("a").type == arrow.field("b").type == pa.binary(4)
    avro = arrow_to_avro(arrow)
    assert avro["fields"][1]["type"] == "F"  # a second definition of F would be invalid Avro


@pytest.mark.parametrize("bad", [
    ["int", "string"],                                   # a real union
    {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]},  # recursive
])
def test_schemas_without_a_column_type_are_refused(bad):
    with pytest.raises(UnsupportedSchemaError):
        avro_to_arrow(record(bad))


def test_invalid_avro_is_an_invalid_schema():
    with pytest.raises(InvalidSchemaError):
        avro_to_arrow({"type": "record", "name": "R", "fields": [{"name": "f", "type": "nope"}]})


def test_non_record_root_is_refused():
    with pytest.raises(UnsupportedSchemaError):
        avro_to_arrow('"string"')


JSON_CASES = [
    ({"type": "boolean"}, pa.bool_()),
    ({"type": "integer"}, pa.int64()),
    ({"type": "number"}, pa.float64()),
    ({"type": "string"}, pa.string()),
    ({"type": "string", "format": "date"}, pa.date32()),
    ({"type": "string", "format": "date-time"}, pa.string()),
    ({"type": "string", "format": "uuid"}, pa.string()),
    ({"type": "string", "enum": ["a", "b"]}, pa.string()),
    ({"type": "array", "items": {"type": "integer"}}, pa.list_(pa.field("item", pa.int64(), False))),
    ({"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
     pa.struct([pa.field("x", pa.float64(), False)])),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, MAP_LONG),
    ({"$ref": "#/$defs/n"}, pa.float64()),
]


@pytest.mark.parametrize("node,arrow", JSON_CASES, ids=[str(c[1]) for c in JSON_CASES])
def test_json_schema_property_maps_to_arrow(node, arrow):
    doc = {"type": "object", "properties": {"f": node, "g": node}, "required": ["f"],
           "$defs": {"n": {"type": "number"}}}
    schema = json_schema_to_arrow(doc)
    assert schema.field("f").type == arrow and not schema.field("f").nullable
    assert schema.field("g").nullable
    # and back: a JSON Schema whose objects map to the same columns
    assert json_schema_to_arrow(arrow_to_json_schema(schema)).equals(schema)


@pytest.mark.parametrize("nullable", [
    {"type": ["integer", "null"]},
    {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    {"oneOf": [{"type": "null"}, {"type": "integer"}]},
])
def test_json_nullable_forms(nullable):
    schema = json_schema_to_arrow({"type": "object", "properties": {"f": nullable}, "required": ["f"]})
    assert schema.field("f").type == pa.int64() and schema.field("f").nullable


def test_json_schema_without_column_type_is_refused():
    with pytest.raises(UnsupportedSchemaError):
        json_schema_to_arrow({"type": "object", "properties": {"f": {"type": ["integer", "string"]}}})
    with pytest.raises(UnsupportedSchemaError):
        json_schema_to_arrow({"type": "array"})


def test_decimal_on_fixed_keeps_its_size():
    s = record({"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 0})
    assert arrow_to_avro(avro_to_arrow(s))["fields"][0]["type"] == {
        "type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 0}
