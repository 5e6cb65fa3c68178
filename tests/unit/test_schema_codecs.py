"""Value codecs of typed tables: Avro and JSON values <-> typed Arrow columns."""
from __future__ import annotations

import datetime as dt
import decimal
import functools
import io
import json
import random
import tempfile
import uuid
from pathlib import Path

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fluvial.broker.metadata import MetadataStore
from fluvial.errors import InvalidRecordError
from fluvial.schema.codecs import AvroValueCodec, JsonValueCodec, value_codec
from fluvial.schema.evolution import evolve
from fluvial.schema.registry import SchemaRegistry, parse_schema

# Shared with the integration tests and the benchmarks (re-exported: tests import them from here).
from benchmarks.avro_records import SCHEMA20, confluent_wire, make_record  # noqa: F401

UTC = dt.timezone.utc

wire = confluent_wire


def normalized(record: dict) -> dict:
    """A record of SCHEMA20 as fastavro reads it or as Arrow gives it back, made comparable:
    Arrow maps come back as lists of pairs, fastavro uuids as UUID objects."""
    return {**record, "attrs": dict(record["attrs"]), "uid": str(record["uid"])}


@pytest.fixture
def registry(tmp_path) -> SchemaRegistry:
    return SchemaRegistry(MetadataStore(tmp_path / "meta.db"))


@functools.lru_cache(maxsize=None)
def shared_registry() -> SchemaRegistry:
    """One registry for the examples of property tests (registering again is a no-op)."""
    return SchemaRegistry(MetadataStore(Path(tempfile.mkdtemp(prefix="fluvial-schema-")) / "meta.db"))


def register(registry: SchemaRegistry, subject: str, schema: dict, schema_type: str = "AVRO") -> int:
    return registry.register(subject, parse_schema(json.dumps(schema), schema_type))[0]


# ---------------------------------------------------------------- Avro round trip

def test_avro_round_trip_is_byte_identical_and_values_match_fastavro(registry):
    sid = register(registry, "orders-value", SCHEMA20)
    rng = random.Random(7)
    records = [make_record(rng, i) for i in range(3000)]
    values = pa.array(wire(SCHEMA20, sid, records), pa.binary())
    codec = value_codec(registry, "orders")
    assert isinstance(codec, AvroValueCodec)
    columns, ids = codec.decode(values)
    assert ids.dtype == np.int32 and (ids == sid).all()
    assert columns.type == pa.struct(list(codec.table_schema))
    parsed = fastavro.parse_schema(SCHEMA20)
    expected = [fastavro.schemaless_reader(io.BytesIO(v[5:]), parsed) for v in values.to_pylist()[:300]]
    assert [normalized(r) for r in columns.to_pylist()[:300]] == [normalized(r) for r in expected]
    assert codec.encode(columns, ids).equals(values)


def test_avro_columns_are_typed(registry):
    register(registry, "orders-value", SCHEMA20)
    types = {f.name: f.type for f in value_codec(registry, "orders").table_schema}
    assert types["amount"] == pa.decimal128(12, 2)
    assert types["ts_ms"] == pa.timestamp("ms", tz="UTC")
    assert types["day"] == pa.date32()
    assert types["attrs"] == pa.map_(pa.field("key", pa.string(), False), pa.field("value", pa.int64(), False))


avro_values = st.fixed_dictionaries({
    "i": st.integers(-2 ** 31, 2 ** 31 - 1),
    "l": st.integers(-2 ** 63, 2 ** 63 - 1),
    "s": st.text(max_size=20),
    "n": st.none() | st.floats(allow_nan=False, width=64),
    "a": st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), max_size=5),
    "m": st.dictionaries(st.text(max_size=5), st.booleans(), max_size=4),
    "d": st.decimals(min_value=-10 ** 20, max_value=10 ** 20, places=4, allow_nan=False, allow_infinity=False),
    "f": st.floats(width=32, allow_nan=False),
})
PROPERTY_SCHEMA = {"type": "record", "name": "P", "fields": [
    {"name": "i", "type": "int"}, {"name": "l", "type": "long"}, {"name": "s", "type": "string"},
    {"name": "n", "type": ["double", "null"]}, {"name": "a", "type": {"type": "array", "items": "long"}},
    {"name": "m", "type": {"type": "map", "values": "boolean"}},
    {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 4}},
    {"name": "f", "type": "float"},
]}


def fastavro_widened(d) -> bool:
    """fastavro writes an unscaled decimal of -2^(8k-1) with an extra sign byte."""
    unscaled = int(d.scaleb(4))
    return unscaled < 0 and (-unscaled) & (-unscaled - 1) == 0 and (-unscaled).bit_length() % 8 == 0


def test_fastavro_decimal_with_extra_sign_byte_is_accepted(registry):
    """-1.28 at scale 2 is unscaled -128: fastavro writes ff 80, Java writes 80."""
    schema = {"type": "record", "name": "D", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}}]}
    sid = register(registry, "dec-value", schema)
    values = pa.array(wire(schema, sid, [{"d": decimal.Decimal("-1.28")}, {"d": decimal.Decimal("-1.29")}]), pa.binary())
    assert values[0].as_py()[5:] == b"\x04\xff\x80"  # fastavro's bytes: length 2, ff 80
    codec = value_codec(registry, "dec")
    columns, ids = codec.decode(values)
    assert columns.field("d").to_pylist() == [decimal.Decimal("-1.28"), decimal.Decimal("-1.29")]
    again = codec.encode(columns, ids)
    assert again[0].as_py()[5:] == b"\x02\x80"  # minimal: length 1, 80
    assert again[1].as_py() == values[1].as_py()
    # Other non-minimal forms are still refused.
    bad = pa.array([values[0].as_py()[:5] + b"\x04\xff\x81"], pa.binary())
    with pytest.raises(InvalidRecordError):
        codec.decode(bad)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(avro_values, min_size=1, max_size=40))
def test_avro_round_trip_property(records):
    registry = shared_registry()
    sid = register(registry, "p-value", PROPERTY_SCHEMA)
    values = pa.array(wire(PROPERTY_SCHEMA, sid, records), pa.binary())
    codec = value_codec(registry, "p")
    columns, ids = codec.decode(values)
    if not any(fastavro_widened(r["d"]) for r in records):
        assert codec.encode(columns, ids).equals(values)
    got = columns.to_pylist()
    assert [r["l"] for r in got] == [r["l"] for r in records]
    assert [r["d"] for r in got] == [r["d"] for r in records]
    assert [dict(r["m"]) for r in got] == [r["m"] for r in records]


# ---------------------------------------------------------------- invalid records

SMALL = {"type": "record", "name": "S", "fields": [
    {"name": "n", "type": "int"},
    {"name": "label", "type": "string"},
    {"name": "ok", "type": "boolean"},
    {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
]}


def test_invalid_avro_records_are_refused_each_with_its_reason(registry):
    sid = register(registry, "s-value", SMALL)
    other = register(registry, "other-value", {"type": "record", "name": "O", "fields": [{"name": "x", "type": "int"}]})
    good = wire(SMALL, sid, [{"n": 1, "label": "hi", "ok": True, "kind": "B"}])[0]
    header = good[:5]
    values = [
        good,
        header + b"\x02\x7e" + b"hi\x01\x02",                 # label length 63 runs past the end
        header + b"\x02\x04hi\x05\x02",                       # boolean byte 5
        header + b"\x02\x04hi\x01\x08",                       # enum index 4 of 2 symbols
        b"\0" + (999).to_bytes(4, "big") + good[5:],          # unknown schema id
        b"\0" + other.to_bytes(4, "big") + b"\x02",           # id of another subject
        b"\x01garbage",                                       # no magic byte
        good + b"\x00",                                       # bytes left over
        header + b"\x82\x00\x04hi\x01\x02",                   # non-canonical varint
        None,
        header + b"\x02\x04\xff\xfe\x01\x02",                   # label is not UTF-8
    ]
    codec = value_codec(registry, "s")
    with pytest.raises(InvalidRecordError) as info:
        codec.decode(pa.array(values, pa.binary()))
    errors = dict(info.value.record_errors)
    assert 0 not in errors
    assert "field 'label'" in errors[1] and "past the end" in errors[1]
    assert "field 'ok'" in errors[2] and "boolean" in errors[2]
    assert "field 'kind'" in errors[3] and "enum index" in errors[3]
    assert "schema id 999 is not registered" in errors[4]
    assert f"schema id {other} is not a version of subject 's-value'" in errors[5]
    assert "magic byte" in errors[6]
    assert "left over" in errors[7]
    assert "field 'n'" in errors[8] and "non-canonical" in errors[8]
    assert "null" in errors[9]
    assert "field 'label'" in errors[10] and "UTF-8" in errors[10]
    assert len(errors) == 10
    # the good value alone still decodes
    cols, _ = codec.decode(pa.array([good], pa.binary()))
    assert cols.to_pylist() == [{"n": 1, "label": "hi", "ok": True, "kind": "B"}]


def test_a_writer_field_without_a_column_is_refused(registry):
    registry.set_compatibility("NONE", "w-value")
    v1 = register(registry, "w-value", {"type": "record", "name": "W", "fields": [
        {"name": "a", "type": "int"}, {"name": "gone", "type": "string"}]})
    register(registry, "w-value", {"type": "record", "name": "W", "fields": [{"name": "a", "type": "int"}]})
    codec = value_codec(registry, "w")
    with pytest.raises(InvalidRecordError) as info:
        codec.decode(pa.array(wire({"type": "record", "name": "W", "fields": [
            {"name": "a", "type": "int"}, {"name": "gone", "type": "string"}]}, v1, [{"a": 1, "gone": "x"}])))
    assert "gone" in info.value.record_errors[0][1]


# ---------------------------------------------------------------- evolution

V1 = {"type": "record", "name": "E", "fields": [
    {"name": "id", "type": "int"}, {"name": "price", "type": "float"}]}
V2 = {"type": "record", "name": "E", "fields": [
    {"name": "id", "type": "long"}, {"name": "price", "type": "double"},
    {"name": "currency", "type": "string", "default": "EUR"}]}
V3 = {"type": "record", "name": "E", "fields": [
    {"name": "id", "type": "long"}, {"name": "price", "type": "double"},
    {"name": "currency", "type": "string", "default": "EUR"},
    {"name": "coupon", "type": ["null", "string"], "default": None}]}


def test_evolution_v1_v2_v3_old_batches_read_under_new_schema(registry):
    id1 = register(registry, "e-value", V1)
    codec = value_codec(registry, "e")
    v1_values = pa.array(wire(V1, id1, [{"id": 1, "price": 1.5}, {"id": 2, "price": 2.25}]), pa.binary())
    cols1, ids1 = codec.decode(v1_values)
    stored_v1 = pa.RecordBatch.from_struct_array(cols1)
    assert stored_v1.schema.field("id").type == pa.int32()

    id2 = register(registry, "e-value", V2)
    id3 = register(registry, "e-value", V3)
    assert len({id1, id2, id3}) == 3
    table = codec.table_schema
    assert table.names == ["id", "price", "currency", "coupon"]

    old = evolve(stored_v1.add_column(0, "_offset", pa.array([0, 1], pa.int64())), table)
    assert old.schema.names == ["_offset", "id", "price", "currency", "coupon"]
    assert old.select(["id", "price", "currency", "coupon"]).to_pylist() == [
        {"id": 1, "price": 1.5, "currency": "EUR", "coupon": None},
        {"id": 2, "price": 2.25, "currency": "EUR", "coupon": None}]

    # a batch mixing writers: each record comes back with its own writer schema, byte for byte
    mixed = pa.array(v1_values.to_pylist()[:1]
                     + wire(V3, id3, [{"id": 2 ** 40, "price": 0.1, "currency": "USD", "coupon": "X"}])
                     + wire(V2, id2, [{"id": 7, "price": 3.0, "currency": "GBP"}]), pa.binary())
    cols, ids = codec.decode(mixed)
    assert ids.tolist() == [id1, id3, id2]
    assert cols.to_pylist()[1] == {"id": 2 ** 40, "price": 0.1, "currency": "USD", "coupon": "X"}
    assert codec.encode(cols, ids).equals(mixed)
    # and so do the evolved old columns
    evolved_struct = pa.StructArray.from_arrays(old.select(table.names).columns, fields=list(table))
    assert codec.encode(evolved_struct, ids1).equals(v1_values)


def test_evolution_nested_record_gets_default_struct():
    from fluvial.schema.arrow_mapping import avro_to_arrow
    v1 = {"type": "record", "name": "N", "fields": [{"name": "a", "type": "int"}]}
    v2 = {"type": "record", "name": "N", "fields": [
        {"name": "a", "type": "int"},
        {"name": "loc", "type": {"type": "record", "name": "L", "fields": [
            {"name": "x", "type": "double"}, {"name": "tags", "type": {"type": "array", "items": "string"}}]},
         "default": {"x": 1.0, "tags": ["t"]}}]}
    batch = pa.RecordBatch.from_pylist([{"a": 1}], schema=avro_to_arrow(v1))
    assert evolve(batch, avro_to_arrow(v2)).to_pylist() == [{"a": 1, "loc": {"x": 1.0, "tags": ["t"]}}]


# ---------------------------------------------------------------- JSON

JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "price": {"type": "number"},
        "active": {"type": "boolean"},
        "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "owner": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": ["integer", "null"]}},
                  "required": ["name"]},
        "note": {"type": ["string", "null"]},
    },
    "required": ["id", "name"],
}


def test_json_round_trip_equal_in_value(registry):
    sid = register(registry, "j-value", JSON_SCHEMA, "JSON")
    codec = value_codec(registry, "j")
    assert isinstance(codec, JsonValueCodec)
    docs = [{"id": i, "name": f"n{i}", "price": i * 1.5, "active": i % 2 == 0, "day": "2024-03-0%d" % (i % 9 + 1),
             "at": "2024-03-01T10:00:00Z", "tags": ["a"] * (i % 3),
             "owner": {"name": "o", "age": None if i % 2 else i}, "note": None} for i in range(50)]
    plain = [json.dumps(d, indent=1).encode() for d in docs[:25]]          # pretty-printed, plain
    framed = [b"\0" + sid.to_bytes(4, "big") + json.dumps(d).encode() for d in docs[25:]]
    cols, ids = codec.decode(pa.array(plain + framed, pa.binary()))
    assert codec.table_schema.field("day").type == pa.date32()
    assert ids.tolist() == [0] * 25 + [sid] * 25
    back = codec.encode(cols, ids).to_pylist()
    assert [json.loads(v) for v in back[:25]] == docs[:25]
    assert all(v[:5] == b"\0" + sid.to_bytes(4, "big") for v in back[25:])
    assert [json.loads(v[5:]) for v in back[25:]] == docs[25:]
    assert back[0] == json.dumps(docs[0], separators=(",", ":")).encode()


def test_invalid_json_records_are_refused_each_with_its_reason(registry):
    register(registry, "j-value", JSON_SCHEMA, "JSON")
    codec = value_codec(registry, "j")
    values = [
        b'{"id": 1, "name": "ok"}',
        b'{"id": "one", "name": "x"}',        # wrong type
        b'{"name": "x"}',                      # missing required field
        b'not json',                           # non-JSON
        b'[1, 2]',                             # not an object
        b'{"id": 1, "name": "x", "owner": {}}',  # nested required field missing
        b'\0\0\0\3\x15{"id": 1, "name": "x"}',  # unknown schema id in wire format
    ]
    with pytest.raises(InvalidRecordError) as info:
        codec.decode(pa.array(values, pa.binary()))
    errors = dict(info.value.record_errors)
    assert 0 not in errors
    assert "'id'" in errors[1] and "integer" in errors[1]
    assert "'id'" in errors[2] and "required" in errors[2]
    assert "not valid JSON" in errors[3]
    assert "not an object" in errors[4]
    assert "owner" in errors[5] and "name" in errors[5]
    assert "not registered" in errors[6]


def test_sliced_and_empty_inputs(registry):
    sid = register(registry, "orders-value", SCHEMA20)
    rng = random.Random(3)
    values = pa.array(wire(SCHEMA20, sid, [make_record(rng, i) for i in range(50)]), pa.binary())
    codec = value_codec(registry, "orders")
    part = values.slice(7, 20)
    columns, ids = codec.decode(part)
    assert codec.encode(columns, ids).equals(part)
    full, full_ids = codec.decode(values)
    assert codec.encode(full.slice(13, 30), full_ids[13:43]).equals(values.slice(13, 30))
    empty_cols, empty_ids = codec.decode(values.slice(0, 0))
    assert len(empty_cols) == 0 and len(empty_ids) == 0
    assert len(codec.encode(empty_cols, empty_ids)) == 0


def test_json_value_the_columns_cannot_hold_is_named(registry):
    register(registry, "j-value", JSON_SCHEMA, "JSON")
    codec = value_codec(registry, "j")
    with pytest.raises(InvalidRecordError) as info:
        codec.decode(pa.array([b'{"id": 1, "name": "a"}', b'{"id": 2.0, "name": "b"}'], pa.binary()))
    assert [i for i, _ in info.value.record_errors] == [1]


json_docs = st.lists(st.fixed_dictionaries(
    {"id": st.integers(-2 ** 63, 2 ** 63 - 1), "name": st.text(max_size=10)},
    optional={"price": st.floats(allow_nan=False, allow_infinity=False),
              "active": st.booleans(),
              "tags": st.lists(st.text(max_size=4), max_size=3),
              "owner": st.fixed_dictionaries({"name": st.text(max_size=5)},
                                             optional={"age": st.none() | st.integers(0, 200)}),
              "note": st.none() | st.text(max_size=5)}), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(json_docs)
def test_json_round_trip_property(docs):
    registry = shared_registry()
    register(registry, "j-value", JSON_SCHEMA, "JSON")
    codec = value_codec(registry, "j")
    values = pa.array([json.dumps(d).encode() for d in docs], pa.binary())
    cols, ids = codec.decode(values)
    back = [json.loads(v) for v in codec.encode(cols, ids).to_pylist()]
    # a property left out comes back as null; everything present comes back equal
    assert [without_added_nulls(got, sent) for got, sent in zip(back, docs)] == docs


def without_added_nulls(got, sent):
    if isinstance(got, dict) and isinstance(sent, dict):
        return {k: without_added_nulls(v, sent.get(k)) for k, v in got.items() if k in sent or v is not None}
    return got


def test_json_date_that_is_not_a_date_is_named(registry):
    register(registry, "j-value", JSON_SCHEMA, "JSON")
    codec = value_codec(registry, "j")
    with pytest.raises(InvalidRecordError) as info:
        codec.decode(pa.array([b'{"id": 1, "name": "a", "day": "2024-01-02"}',
                               b'{"id": 2, "name": "b", "day": "yesterday"}'], pa.binary()))
    assert info.value.record_errors == [(1, "field 'day': not a date (YYYY-MM-DD)")]


def test_a_version_without_columns_leaves_the_table_as_it_was(registry):
    registry.set_compatibility("NONE", "u-value")
    id1 = register(registry, "u-value", V1)
    codec = value_codec(registry, "u")
    id2 = register(registry, "u-value", {"type": "record", "name": "E", "fields": [
        {"name": "id", "type": ["int", "string"]}]})
    assert codec.table_schema.names == ["id", "price"]
    values = pa.array(wire(V1, id1, [{"id": 1, "price": 2.0}]) + [b"\0" + id2.to_bytes(4, "big") + b"\0\2"],
                      pa.binary())
    with pytest.raises(InvalidRecordError) as info:
        codec.decode(values)
    assert [i for i, _ in info.value.record_errors] == [1]
    assert "no column mapping" in info.value.record_errors[0][1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 32 - 1), cuts=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4),
       tail=st.binary(max_size=6), trim=st.integers(0, 3))
def test_mangled_avro_values_are_refused_or_come_back_identical(seed, cuts, tail, trim):
    """Whatever the bytes after the header, decode refuses them with InvalidRecordError or
    accepts them, and accepted values re-encode to exactly the same bytes."""
    registry = shared_registry()
    sid = register(registry, "f-value", SCHEMA20)
    rng = random.Random(seed)
    values = wire(SCHEMA20, sid, [make_record(rng, i) for i in range(3)])
    mangled = bytearray(values[1])
    for pos, byte in cuts:
        if 5 <= pos < len(mangled):
            mangled[pos] = byte
    mangled = bytes(mangled[:len(mangled) - trim]) + tail
    batch = pa.array([values[0], mangled, values[2]], pa.binary())
    codec = value_codec(registry, "f")
    try:
        columns, ids = codec.decode(batch)
    except InvalidRecordError as exc:
        assert [i for i, _ in exc.record_errors] == [1]
        return
    assert codec.encode(columns, ids).equals(batch)


def test_json_line_breaks_inside_strings_are_refused_and_pretty_printing_is_fine(registry):
    register(registry, "j-value", JSON_SCHEMA, "JSON")
    codec = value_codec(registry, "j")
    pretty = b'{\r\n  "id": 1,\n  "name": "a b"\n}'
    cols, _ = codec.decode(pa.array([pretty, b'{"id": 2, "name": "c"}'], pa.binary()))
    assert [(r["id"], r["name"]) for r in cols.to_pylist()] == [(1, "a b"), (2, "c")]
    with pytest.raises(InvalidRecordError) as info:
        codec.decode(pa.array([b'{"id": 1, "name": "a\nb"}', pretty], pa.binary()))
    assert [i for i, _ in info.value.record_errors] == [0]
    assert "not valid JSON" in info.value.record_errors[0][1]


ARRAYS = {"type": "record", "name": "Arr", "fields": [
    {"name": "longs", "type": {"type": "array", "items": "long"}},
    {"name": "ints", "type": {"type": "array", "items": "int"}},
    {"name": "doubles", "type": {"type": "array", "items": "double"}},
    {"name": "flags", "type": {"type": "array", "items": "boolean"}},
    {"name": "kinds", "type": {"type": "array", "items": {"type": "enum", "name": "K", "symbols": ["A", "B", "C"]}}},
    {"name": "ids", "type": {"type": "array", "items": {"type": "fixed", "name": "Id", "size": 3}}},
    {"name": "days", "type": {"type": "array", "items": {"type": "int", "logicalType": "date"}}},
    {"name": "maybe", "type": {"type": "array", "items": ["null", "long"]}},
    {"name": "nested", "type": {"type": "array", "items": {"type": "array", "items": "int"}}},
]}
array_records = st.fixed_dictionaries({
    "longs": st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), max_size=8),
    "ints": st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), max_size=8),
    "doubles": st.lists(st.floats(allow_nan=False), max_size=5),
    "flags": st.lists(st.booleans(), max_size=5),
    "kinds": st.lists(st.sampled_from(["A", "B", "C"]), max_size=5),
    "ids": st.lists(st.binary(min_size=3, max_size=3), max_size=4),
    "days": st.lists(st.dates(min_value=dt.date(1900, 1, 1)), max_size=4),
    "maybe": st.lists(st.none() | st.integers(-10 ** 12, 10 ** 12), max_size=4),
    "nested": st.lists(st.lists(st.integers(-1000, 1000), max_size=3), max_size=3),
})


@settings(max_examples=80, deadline=None)
@given(st.lists(array_records, min_size=1, max_size=30))
def test_arrays_of_every_item_kind_round_trip(records):
    registry = shared_registry()
    sid = register(registry, "arr-value", ARRAYS)
    values = pa.array(wire(ARRAYS, sid, records), pa.binary())
    codec = value_codec(registry, "arr")
    columns, ids = codec.decode(values)
    assert columns.to_pylist() == records
    assert codec.encode(columns, ids).equals(values)


def test_array_items_running_past_the_value_are_refused(registry):
    sid = register(registry, "arr-value", ARRAYS)
    good = wire(ARRAYS, sid, [{"longs": [1, 2], "ints": [], "doubles": [1.0], "flags": [], "kinds": [], "ids": [],
                               "days": [], "maybe": [], "nested": []}])[0]
    header = good[:5]
    values = [good,
              header + b"\x06\x02\x04",                 # 3 longs announced, 2 present
              header + b"\x00\x00\x04" + b"\0" * 8,     # 2 doubles announced, 1 present
              header + b"\x02\x80",                     # the long never ends
              ]
    codec = value_codec(registry, "arr")
    with pytest.raises(InvalidRecordError) as info:
        codec.decode(pa.array(values, pa.binary()))
    errors = dict(info.value.record_errors)
    assert sorted(errors) == [1, 2, 3]
    assert "'longs'" in errors[1] and "'doubles'" in errors[2] and "'longs" in errors[3]
