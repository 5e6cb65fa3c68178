"""Compatibility rules (Avro resolution, JSON Schema subset), modes, and the registry's behaviour."""
from __future__ import annotations

import json

import pytest

from fluvial.broker.metadata import MetadataStore
from fluvial.schema.avro_schema import parse_avro
from fluvial.schema.compatibility import avro_can_read, json_can_read
from fluvial.schema.errors import (
    IncompatibleSchemaError, InvalidSchemaError, SchemaNotFoundError, SchemaVersionNotSoftDeletedError,
    SubjectNotFoundError, VersionNotFoundError,
)
from fluvial.schema.registry import SchemaRegistry, parse_schema, table_validator


def rec(*fields, name="R") -> dict:
    return {"type": "record", "name": name, "fields": list(fields)}


def can_read(reader, writer) -> list[str]:
    return avro_can_read(parse_avro(reader).root, parse_avro(writer).root)


INT = {"name": "a", "type": "int"}


# ---------------------------------------------------------------- Avro rules

@pytest.mark.parametrize("reader,writer,ok", [
    (rec(INT, {"name": "b", "type": "string", "default": ""}), rec(INT), True),     # added with default
    (rec(INT, {"name": "b", "type": "string"}), rec(INT), False),                    # added without default
    (rec(INT), rec(INT, {"name": "b", "type": "string"}), True),                     # removed (reader ignores)
    (rec({"name": "a", "type": "long"}), rec(INT), True),                            # int -> long
    (rec({"name": "a", "type": "double"}), rec({"name": "a", "type": "float"}), True),  # float -> double
    (rec(INT), rec({"name": "a", "type": "long"}), False),                           # long -> int narrows
    (rec({"name": "a", "type": "bytes"}), rec({"name": "a", "type": "string"}), True),
    (rec({"name": "a", "type": ["null", "int"]}), rec(INT), True),                   # made nullable
    (rec(INT), rec({"name": "a", "type": ["null", "int"]}), False),                  # null cannot be read as int
    (rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}}),
     rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}), True),
    (rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}),
     rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}), False),
    (rec({"name": "f", "type": {"type": "fixed", "name": "F", "size": 4}}),
     rec({"name": "f", "type": {"type": "fixed", "name": "F", "size": 8}}), False),
    (rec(INT, name="Other"), rec(INT), False),                                       # record renamed
    (rec({"name": "l", "type": {"type": "array", "items": "long"}}),
     rec({"name": "l", "type": {"type": "array", "items": "int"}}), True),
    (rec({"name": "m", "type": {"type": "map", "values": "int"}}),
     rec({"name": "m", "type": {"type": "map", "values": "string"}}), False),
    (rec({"name": "b", "type": "int", "aliases": ["a"]}), rec(INT), True),           # field alias
])
def test_avro_resolution_rules(reader, writer, ok):
    problems = can_read(reader, writer)
    assert (not problems) == ok, problems


def test_avro_problem_names_the_field():
    problems = can_read(rec(INT, {"name": "b", "type": "string"}), rec(INT))
    assert problems == ["field 'b' is missing in the writer's schema and has no default"]


# ---------------------------------------------------------------- JSON rules

def obj(props: dict, required=(), closed=False) -> dict:
    out = {"type": "object", "properties": props, "required": list(required)}
    if closed:
        out["additionalProperties"] = False
    return out


@pytest.mark.parametrize("reader,writer,ok", [
    (obj({"a": {"type": "integer"}, "b": {"type": "string"}}), obj({"a": {"type": "integer"}}), True),   # optional added
    (obj({"a": {"type": "integer"}, "b": {"type": "string"}}, ["b"]), obj({"a": {"type": "integer"}}), False),  # required added
    (obj({"a": {"type": "integer"}}), obj({"a": {"type": "integer"}, "b": {"type": "string"}}), True),   # removed, open
    (obj({"a": {"type": "integer"}}, closed=True),
     obj({"a": {"type": "integer"}, "b": {"type": "string"}}, closed=True), False),                       # removed, closed
    (obj({"a": {"type": "number"}}), obj({"a": {"type": "integer"}}), True),                              # widened
    (obj({"a": {"type": "integer"}}), obj({"a": {"type": "number"}}), False),                             # narrowed
    (obj({"a": {"type": ["string", "null"]}}), obj({"a": {"type": "string"}}), True),
    (obj({"a": {"type": "string", "enum": ["x", "y"]}}), obj({"a": {"type": "string", "enum": ["x"]}}), True),
    (obj({"a": {"type": "string", "enum": ["x"]}}), obj({"a": {"type": "string", "enum": ["x", "y"]}}), False),
    (obj({"o": obj({"x": {"type": "integer"}})}), obj({"o": obj({"x": {"type": "string"}})}), False),   # nested
    (obj({"l": {"type": "array", "items": {"type": "number"}}}),
     obj({"l": {"type": "array", "items": {"type": "integer"}}}), True),
])
def test_json_schema_rules(reader, writer, ok):
    problems = json_can_read(reader, writer)
    assert (not problems) == ok, problems


# ---------------------------------------------------------------- registry

@pytest.fixture
def registry(tmp_path) -> SchemaRegistry:
    return SchemaRegistry(MetadataStore(tmp_path / "meta.db"))


def avro(schema) -> object:
    return parse_schema(json.dumps(schema))


def test_same_schema_twice_keeps_its_id_and_version(registry):
    first = registry.register("t-value", avro(rec(INT)))
    # same schema, other spelling
    again = registry.register("t-value", parse_schema('{"fields": [{"type": "int", "name": "a"}], "name": "R", "type": "record"}'))
    assert first == again == (1, 1)
    # same schema under another subject: same global id, its own version 1
    assert registry.register("u-value", avro(rec(INT))) == (1, 1)


def test_ids_are_stable_across_restarts(tmp_path):
    reg = SchemaRegistry(MetadataStore(tmp_path / "m.db"))
    a = reg.register("t-value", avro(rec(INT)))[0]
    b = reg.register("t-value", avro(rec(INT, {"name": "b", "type": "int", "default": 0})))[0]
    reg.metadata.close()
    reopened = SchemaRegistry(MetadataStore(tmp_path / "m.db"))
    assert reopened.schema(a).canonical == avro(rec(INT)).canonical
    assert [v.schema_id for v in reopened.versions("t-value")] == [a, b]
    c = reopened.register("x-value", avro(rec({"name": "z", "type": "string"})))[0]
    assert c not in (a, b)


@pytest.mark.parametrize("mode,new,ok", [
    ("BACKWARD", rec(INT, {"name": "b", "type": "int"}), False),
    ("BACKWARD", rec(INT, {"name": "b", "type": "int", "default": 1}), True),
    ("FORWARD", rec(INT, {"name": "b", "type": "int"}), True),       # old readers ignore the new field
    ("FORWARD", rec({"name": "b", "type": "int", "default": 1}), False),  # old readers need a
    ("FULL", rec(INT, {"name": "b", "type": "int"}), False),
    ("FULL", rec(INT, {"name": "b", "type": "int", "default": 1}), True),
    ("NONE", rec({"name": "z", "type": "string"}), True),
])
def test_modes_against_latest(registry, mode, new, ok):
    registry.set_compatibility(mode, "t-value")
    registry.register("t-value", avro(rec(INT)))
    if ok:
        registry.register("t-value", avro(new))
    else:
        with pytest.raises(IncompatibleSchemaError) as info:
            registry.register("t-value", avro(new))
        assert info.value.error_code == 409 and info.value.http_status == 409


def test_transitive_checks_every_version(registry):
    v1 = rec(INT)
    v2 = rec({"name": "b", "type": "int", "default": 0})           # drops a: fine for BACKWARD vs v1
    v3 = rec(INT, {"name": "b", "type": "int", "default": 0})    # reads v2 data? a has no default -> no
    registry.set_compatibility("BACKWARD", "t-value")
    registry.register("t-value", avro(v1))
    registry.register("t-value", avro(v2))
    with pytest.raises(IncompatibleSchemaError):
        registry.register("t-value", avro(v3))
    v3b = rec({"name": "a", "type": "int", "default": 5}, {"name": "b", "type": "int", "default": 0})
    registry.set_compatibility("BACKWARD_TRANSITIVE", "t-value")
    registry.register("t-value", avro(v3b))
    assert registry.test_compatibility("t-value", avro(v1), "1") == []


def test_config_levels(registry):
    assert registry.compatibility().value == "BACKWARD"
    registry.set_compatibility("full")
    assert registry.compatibility("any").value == "FULL"
    registry.set_compatibility("NONE", "s")
    assert registry.compatibility("s").value == "NONE"
    assert registry.delete_compatibility("s").value == "NONE"
    assert registry.compatibility("s").value == "FULL"


def test_deletes(registry):
    registry.register("t-value", avro(rec(INT)))
    registry.register("t-value", avro(rec(INT, {"name": "b", "type": "int", "default": 0})))
    with pytest.raises(SchemaVersionNotSoftDeletedError):
        registry.delete_version("t-value", 1, permanent=True)
    assert registry.delete_version("t-value", "1") == 1
    assert [v.version for v in registry.versions("t-value")] == [2]
    with pytest.raises(VersionNotFoundError):
        registry.version("t-value", 1)
    assert registry.delete_version("t-value", 1, permanent=True) == 1
    assert registry.delete_subject("t-value") == [2]
    assert registry.subjects() == []
    with pytest.raises(SubjectNotFoundError):
        registry.versions("t-value")
    assert registry.schema(1)  # ids stay resolvable for old records


def test_invalid_and_unknown(registry):
    with pytest.raises(InvalidSchemaError) as info:
        parse_schema('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}')
    assert info.value.error_code == 42201
    with pytest.raises(InvalidSchemaError):
        parse_schema('{"type": "object", "properties": 5}', "JSON")
    with pytest.raises(SchemaNotFoundError) as info:
        registry.schema(77)
    assert info.value.error_code == 40403


def test_listeners_hear_registrations_under_topic_value(registry):
    heard = []
    registry.listeners.append(heard.append)
    registry.register("orders-value", avro(rec(INT)))
    registry.register("orders-value", avro(rec(INT)))  # no new version, no event
    assert [(e.topic, e.version, e.schema_id) for e in heard] == [("orders", 1, 1)]


def test_table_validator_refuses_unmappable_and_unevolvable_schemas(registry):
    registry.validators.append(table_validator(lambda subject: subject.endswith("-value")))
    registry.set_compatibility("NONE")
    registry.register("t-value", avro(rec(INT)))
    with pytest.raises(IncompatibleSchemaError, match="column"):
        registry.register("t-value", avro(rec({"name": "a", "type": "string"})))
    with pytest.raises(IncompatibleSchemaError, match="table schema"):
        registry.register("t-value", avro(rec({"name": "a", "type": ["int", "string"]})))
