"""Avro schema <-> Arrow schema and JSON Schema <-> Arrow schema: the table's typed columns."""
from __future__ import annotations

import functools
import json
import re
from typing import Any

import numpy as np
import pyarrow as pa

from fluvial.schema.avro_schema import AvroNode, AvroSchema, parse_avro
from fluvial.schema.errors import UnsupportedSchemaError

# Field metadata that keeps what Arrow has no type for, so Arrow -> Avro gives the schema back.
META_ENUM = b"avro.enum"          # JSON {"name": ..., "symbols": [...]}
META_FIXED = b"avro.fixed"        # full name of the fixed type
META_FIXED_SIZE = b"avro.fixed.size"  # size of a fixed holding a decimal
META_UUID = b"logicalType"        # b"uuid" on a string column
META_RECORD = b"avro.record"      # full name of a nested record type
META_UNION = b"avro.union"        # b"null-last" when the writer put null second
META_DEFAULT = b"default"         # JSON of the Avro field default


# ---------------------------------------------------------------- Avro -> Arrow

def avro_to_arrow(schema: AvroSchema | str | dict) -> pa.Schema:
    """The Arrow schema of the user columns of a table whose values are this Avro record."""
    if not isinstance(schema, AvroSchema):
        schema = parse_avro(schema)
    root = schema.root
    if root.kind != "record":
        raise UnsupportedSchemaError(f"a table's Avro schema must be a record, not {root.kind}")
    meta = {META_RECORD: root.name.encode()} if root.name else None
    return pa.schema([_avro_field(f.name, f.type, f.has_default, f.default) for f in root.fields], metadata=meta)


@functools.lru_cache(maxsize=4096)  # nodes hash by identity; the codec asks once per batch
def avro_type_to_arrow(node: AvroNode) -> pa.DataType:
    """The Arrow type of the values of one Avro type (nullability is the field's business)."""
    return _avro_field("x", node, False, None).type


def _avro_field(name: str, node: AvroNode, has_default: bool, default: Any) -> pa.Field:
    meta: dict[bytes, bytes] = {}
    nullable = False
    if node.kind == "union":
        inner = node.nullable_value()
        if inner is None:
            if len(node.branches) == 1 and node.branches[0].kind == "null":
                return pa.field(name, pa.null(), True)
            if len(node.branches) == 1:
                inner = node.branches[0]
            else:
                raise UnsupportedSchemaError(
                    f"field {name!r}: unions other than [\"null\", T] have no column type")
        else:
            nullable = True
            if node.null_branch == 1:
                meta[META_UNION] = b"null-last"
        node = inner
    if has_default:
        meta[META_DEFAULT] = json.dumps(default).encode()
    typ = _arrow_type(node, meta, name)
    if node.kind == "null":
        nullable = True
    return pa.field(name, typ, nullable, metadata=meta or None)


def _arrow_type(node: AvroNode, meta: dict[bytes, bytes], name: str) -> pa.DataType:
    k, lg = node.kind, node.logical
    if lg == "decimal":
        if node.kind == "fixed":
            meta[META_FIXED] = node.name.encode()
            meta[META_FIXED_SIZE] = str(node.size).encode()
        return pa.decimal128(node.precision, node.scale) if node.precision <= 38 else pa.decimal256(node.precision, node.scale)
    if lg == "date":
        return pa.date32()
    if lg == "time-millis":
        return pa.time32("ms")
    if lg == "time-micros":
        return pa.time64("us")
    if lg in ("timestamp-millis", "timestamp-micros"):
        return pa.timestamp("ms" if lg.endswith("millis") else "us", tz="UTC")
    if lg in ("local-timestamp-millis", "local-timestamp-micros"):
        return pa.timestamp("ms" if lg.endswith("millis") else "us")
    if lg == "uuid":
        meta[META_UUID] = b"uuid"
        return pa.string()
    kept = _avro_kept_type(node)
    if kept is not None:
        return kept
    simple = {"null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
              "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}
    if k in simple:
        return simple[k]
    if k == "enum":
        meta[META_ENUM] = json.dumps({"name": node.name, "symbols": list(node.symbols),
                                      **({"default": node.enum_default} if node.enum_default else {})}).encode()
        return pa.string()
    if k == "fixed":
        meta[META_FIXED] = node.name.encode()
        return pa.binary(node.size)
    if k == "record":
        meta[META_RECORD] = node.name.encode()
        return pa.struct([_avro_field(f.name, f.type, f.has_default, f.default) for f in node.fields])
    if k == "array":
        return pa.list_(_avro_field("item", node.items, False, None))
    if k == "map":
        value = _avro_field("value", node.values, False, None)
        return pa.map_(pa.field("key", pa.string(), False), value)
    if k == "union":
        raise UnsupportedSchemaError(f"field {name!r}: nested unions have no column type")
    if k == "recursive":
        raise UnsupportedSchemaError(f"field {name!r}: recursive type {node.name!r} has no column type")
    raise UnsupportedSchemaError(f"field {name!r}: Avro type {k!r} has no column type")


# The Arrow types an Avro primitive may be recorded as (`"arrow.type"`), by Avro type: what
# the Avro codec decodes into exactly (values outside the narrower range are refused).
AVRO_ARROW_TYPE = "arrow.type"
_AVRO_KEEPS = {
    "int": (pa.int8(), pa.int16(), pa.uint8(), pa.uint16()),
    "long": (pa.uint32(),),
    "string": (pa.large_string(),),
}


def _avro_kept_type(node: AvroNode) -> pa.DataType | None:
    if node.arrow_type is None or node.logical:
        return None
    try:
        t = pa.type_for_alias(node.arrow_type)
    except (ValueError, KeyError):
        return None
    return t if t in _AVRO_KEEPS.get(node.kind, ()) else None


# ---------------------------------------------------------------- Arrow -> Avro

def arrow_to_avro(schema: pa.Schema, name: str = "Value") -> dict:
    """An Avro record schema (as JSON-ready dict) for an Arrow schema, using the field metadata."""
    rec_name = (schema.metadata or {}).get(META_RECORD, name.encode()).decode()
    names: set[str] = set()
    return {"type": "record", "name": rec_name, "fields": [_avro_field_json(f, names) for f in schema]}


def _avro_field_json(f: pa.Field, names: set[str]) -> dict:
    meta = f.metadata or {}
    t = _avro_type_json(f.type, meta, f.name, names)
    out: dict[str, Any] = {"name": f.name}
    if f.nullable and not pa.types.is_null(f.type):
        t = [t, "null"] if meta.get(META_UNION) == b"null-last" else ["null", t]
    out["type"] = t
    if META_DEFAULT in meta:
        out["default"] = json.loads(meta[META_DEFAULT])
    elif f.nullable and isinstance(t, list) and t[0] == "null":
        out["default"] = None
    return out


def _named(names: set[str], wanted: str, f_name: str, suffix: str) -> str:
    """A full name not yet defined in this schema (Avro forbids defining a name twice)."""
    n = base = wanted or f"{f_name}_{suffix}"
    i = 1
    while n in names:
        i += 1
        n = f"{base}{i}"
    names.add(n)
    return n


def _avro_type_json(t: pa.DataType, meta: dict, name: str, names: set[str]) -> Any:
    if isinstance(t, pa.ExtensionType) and t.extension_name == "arrow.uuid":
        return {"type": "string", "logicalType": "uuid"}
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        base = "long" if t.bit_width == 64 or t == pa.uint32() else "int"
        # Avro has only int and long: the Arrow type is kept in an attribute readers ignore.
        return {"type": base, AVRO_ARROW_TYPE: str(t)} if t in _AVRO_KEEPS[base] else base
    if pa.types.is_floating(t):
        return "double" if t.bit_width == 64 else "float"
    if pa.types.is_large_string(t) and META_ENUM not in meta and meta.get(META_UUID) != b"uuid":
        return {"type": "string", AVRO_ARROW_TYPE: "large_string"}
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        if META_ENUM in meta:
            e = json.loads(meta[META_ENUM])
            full = e["name"]
            if full in names:
                return full
            names.add(full)
            return {"type": "enum", **e}
        if meta.get(META_UUID) == b"uuid":
            return {"type": "string", "logicalType": "uuid"}
        return "string"
    if pa.types.is_fixed_size_binary(t):
        full = meta.get(META_FIXED, b"").decode()
        if full and full in names:
            return full
        return {"type": "fixed", "name": _named(names, full, name, "fixed"), "size": t.byte_width}
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    if pa.types.is_decimal(t):
        if META_FIXED in meta:
            full = meta[META_FIXED].decode()
            if full in names:
                return full
            size = int(meta.get(META_FIXED_SIZE, b"16" if t.bit_width == 128 else b"32"))
            return {"type": "fixed", "name": _named(names, full, name, "decimal"), "size": size,
                    "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
        return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
    if pa.types.is_date32(t) or pa.types.is_date64(t):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_time32(t):
        return {"type": "int", "logicalType": "time-millis"}
    if pa.types.is_time64(t):
        return {"type": "long", "logicalType": "time-micros"}
    if pa.types.is_timestamp(t):
        unit = "millis" if t.unit in ("s", "ms") else "micros"
        return {"type": "long", "logicalType": f"{'timestamp' if t.tz else 'local-timestamp'}-{unit}"}
    if pa.types.is_struct(t):
        full = meta.get(META_RECORD, b"").decode()
        if full and full in names:
            return full
        return {"type": "record", "name": _named(names, full, name, "record"),
                "fields": [_avro_field_json(t.field(i), names) for i in range(t.num_fields)]}
    if pa.types.is_map(t):
        v = _avro_field_json(t.item_field, names)
        return {"type": "map", "values": v["type"]}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        v = _avro_field_json(t.value_field, names)
        return {"type": "array", "items": v["type"]}
    if pa.types.is_dictionary(t):
        return _avro_type_json(t.value_type, meta, name, names)
    raise UnsupportedSchemaError(f"column {name!r}: Arrow type {t} has no Avro type")


# ---------------------------------------------------------------- JSON Schema -> Arrow

# Only "date" becomes a typed column: its RFC 3339 text form is unique, so values come back
# textually equal. "date-time" and "time" texts have many spellings of one instant and
# stay strings, so that Kafka consumers get exactly the text that was produced.
_JSON_STRING_FORMATS = {"date": pa.date32()}


def json_schema_to_arrow(schema: dict | str) -> pa.Schema:
    """The Arrow schema of the user columns of a table whose values are this JSON Schema's objects."""
    doc = json.loads(schema) if isinstance(schema, str) else schema
    resolver = _JsonRefs(doc)
    root = resolver.resolve(doc)
    if _json_types(root) - {"object"} or "properties" not in root:
        raise UnsupportedSchemaError("a table's JSON Schema must be an object with properties")
    return pa.schema(_json_object_fields(root, resolver))


class _JsonRefs:
    def __init__(self, doc: Any):
        self.doc = doc

    def resolve(self, node: Any, depth: int = 0) -> Any:
        if isinstance(node, dict) and "$ref" in node:
            if depth > 32:
                raise UnsupportedSchemaError("recursive JSON Schema $ref has no column type")
            ref = node["$ref"]
            if not ref.startswith("#"):
                raise UnsupportedSchemaError(f"JSON Schema $ref {ref!r} outside the document")
            target = self.doc
            for part in [p for p in ref[1:].split("/") if p]:
                target = target[part.replace("~1", "/").replace("~0", "~")]
            return self.resolve(target, depth + 1)
        return node


def _json_types(node: Any) -> set[str]:
    if node is True or node == {}:
        return set()
    t = node.get("type")
    if t is None:
        if "properties" in node:
            return {"object"}
        if "items" in node:
            return {"array"}
        if "enum" in node:
            return {"string"} if all(isinstance(v, str) for v in node["enum"]) else set()
        return set()
    return set(t) if isinstance(t, list) else {t}


def _json_object_fields(node: dict, refs: _JsonRefs) -> list[pa.Field]:
    required = set(node.get("required", ()))
    return [_json_field(name, refs.resolve(sub), name in required, refs) for name, sub in node["properties"].items()]


def _json_field(name: str, node: Any, required: bool, refs: _JsonRefs) -> pa.Field:
    nullable = not required
    # anyOf/oneOf of one type and null: a nullable column of that type.
    for key in ("anyOf", "oneOf"):
        if isinstance(node, dict) and key in node:
            alts = [refs.resolve(a) for a in node[key]]
            non_null = [a for a in alts if _json_types(a) != {"null"}]
            if len(non_null) != 1:
                raise UnsupportedSchemaError(f"property {name!r}: {key} of several types has no column type")
            nullable = nullable or len(non_null) < len(alts)
            node = non_null[0]
    types = _json_types(node)
    if "null" in types:
        nullable = True
        types.discard("null")
    if "integer" in types and "number" in types:
        types.discard("integer")
    if len(types) != 1:
        raise UnsupportedSchemaError(f"property {name!r}: JSON type {sorted(types) or 'any'} has no column type")
    meta: dict[bytes, bytes] = {}
    if "default" in node:
        meta[META_DEFAULT] = json.dumps(node["default"]).encode()
    t = types.pop()
    kept = _kept_arrow_type(node, t)
    if kept is not None:
        typ: pa.DataType = kept
    elif t == "boolean":
        typ = pa.bool_()
    elif t == "integer":
        typ = pa.int64()
    elif t == "number":
        typ = pa.float64()
    elif t == "string":
        fmt = node.get("format")
        typ = _JSON_STRING_FORMATS.get(fmt, pa.string())
        if fmt == "uuid":
            meta[META_UUID] = b"uuid"
        if "enum" in node:
            meta[b"json.enum"] = json.dumps(node["enum"]).encode()
    elif t == "array":
        item = _json_field("item", refs.resolve(node.get("items", {})), True, refs)
        typ = pa.list_(item)
    elif t == "object":
        if "properties" in node:
            typ = pa.struct(_json_object_fields(node, refs))
        else:
            add = node.get("additionalProperties")
            if not isinstance(add, dict):
                raise UnsupportedSchemaError(f"property {name!r}: an object without properties or a value schema")
            value = _json_field("value", refs.resolve(add), True, refs)
            typ = pa.map_(pa.field("key", pa.string(), False), value)
    else:
        raise UnsupportedSchemaError(f"property {name!r}: JSON type {t!r} has no column type")
    return pa.field(name, typ, nullable, metadata=meta or None)


# The Arrow type a JSON Schema property was derived from, when the JSON type alone does not
# say it (JSON has one integer and one number type): a table created with an int32 column
# keeps int32 through its JSON Schema. An annotation keyword: validators ignore it.
JSON_ARROW_TYPE = "x-arrow-type"
# The Arrow types the JSON value format reads and writes as the same JSON values, by JSON type.
_JSON_KEEPS = {
    "integer": lambda t: pa.types.is_integer(t),
    # decimals of up to 15 digits: written as the JSON number of the float64 holding them exactly
    "number": lambda t: pa.types.is_float32(t) or pa.types.is_float64(t) or (
        pa.types.is_decimal128(t) and t.precision <= 15),
    "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_timestamp(t)
    or pa.types.is_time(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t),
}


def _kept_arrow_type(node: dict, json_type: str) -> pa.DataType | None:
    """The recorded Arrow type of a property, if the JSON value format keeps it exactly."""
    text = node.get(JSON_ARROW_TYPE) if isinstance(node, dict) else None
    if not isinstance(text, str):
        return None
    t = _arrow_type_of(text)
    if t is None:
        return None  # a type recorded by a newer writer, or one JSON values cannot hold
    if pa.types.is_timestamp(t) and node.get("format") != "date-time":
        return None
    if pa.types.is_time(t) and node.get("format") != "time":
        return None
    if (pa.types.is_binary(t) or pa.types.is_large_binary(t)) and node.get("contentEncoding") != "base64":
        return None
    keeps = _JSON_KEEPS.get(json_type)
    return t if keeps is not None and keeps(t) else None


_DECIMAL_TEXT = re.compile(r"decimal128\((\d+), (\d+)\)")
_TIMESTAMP_TEXT = re.compile(r"timestamp\[(s|ms|us|ns)(?:, tz=([^\]]+))?\]")


def _arrow_type_of(text: str) -> pa.DataType | None:
    """An Arrow type from its `str()` (the simple types and timestamps)."""
    m = _DECIMAL_TEXT.fullmatch(text)
    if m:
        try:
            return pa.decimal128(int(m.group(1)), int(m.group(2)))
        except (ValueError, pa.ArrowInvalid):
            return None
    m = _TIMESTAMP_TEXT.fullmatch(text)
    if m:
        try:
            return pa.timestamp(m.group(1), tz=m.group(2))
        except (ValueError, pa.ArrowInvalid):
            return None
    try:
        return pa.type_for_alias(text)
    except (ValueError, KeyError):
        return None


def _json_default_type(node: dict) -> pa.DataType | None:
    """The Arrow type a JSON Schema property maps to without an annotation."""
    t = node.get("type")
    return {"integer": pa.int64(), "number": pa.float64(), "string": pa.string(), "boolean": pa.bool_()}.get(t) \
        if isinstance(t, str) and node.get("format") is None and "contentEncoding" not in node else None


# ---------------------------------------------------------------- Arrow -> JSON Schema

def arrow_to_json_schema(schema: pa.Schema, title: str | None = None) -> dict:
    """A JSON Schema (draft 2020-12 vocabulary) whose objects map to this Arrow schema."""
    out = _json_object(list(schema))
    if title:
        out["title"] = title
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **out}


def _json_object(fields: list[pa.Field]) -> dict:
    return {
        "type": "object",
        "properties": {f.name: _json_node(f) for f in fields},
        "required": [f.name for f in fields if not f.nullable],
        "additionalProperties": False,
    }


def _json_node(f: pa.Field) -> dict:
    t, meta = f.type, f.metadata or {}
    if pa.types.is_boolean(t):
        node: dict = {"type": "boolean"}
    elif pa.types.is_integer(t):
        node = {"type": "integer"}
        if t != pa.int64():
            info = np.iinfo(t.to_pandas_dtype())
            # Bounds make JSON Schema validators refuse what the column cannot hold.
            node.update({JSON_ARROW_TYPE: str(t), "minimum": int(info.min), "maximum": int(info.max)})
    elif pa.types.is_floating(t) or pa.types.is_decimal(t):
        node = {"type": "number"}
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        node = {"type": "string"}
        if meta.get(META_UUID) == b"uuid":
            node["format"] = "uuid"
        if b"json.enum" in meta:
            node["enum"] = json.loads(meta[b"json.enum"])
        elif META_ENUM in meta:
            node["enum"] = json.loads(meta[META_ENUM])["symbols"]
    elif pa.types.is_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_large_binary(t):
        node = {"type": "string", "contentEncoding": "base64"}
    elif pa.types.is_date(t):
        node = {"type": "string", "format": "date"}
    elif pa.types.is_time(t):
        node = {"type": "string", "format": "time"}
    elif pa.types.is_timestamp(t):
        node = {"type": "string", "format": "date-time"}
    elif pa.types.is_struct(t):
        node = _json_object([t.field(i) for i in range(t.num_fields)])
    elif pa.types.is_map(t):
        node = {"type": "object", "additionalProperties": _json_node(t.item_field)}
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        node = {"type": "array", "items": _json_node(t.value_field)}
    elif pa.types.is_null(t):
        return {"type": "null"}
    else:
        raise UnsupportedSchemaError(f"column {f.name!r}: Arrow type {t} has no JSON Schema type")
    nested = pa.types.is_nested(t)
    if JSON_ARROW_TYPE not in node and not nested and _json_default_type(node) != t and "type" in node:
        node[JSON_ARROW_TYPE] = str(t)  # the Arrow type the column came from (an annotation)
    if META_DEFAULT in meta:
        node["default"] = json.loads(meta[META_DEFAULT])
    if f.nullable:
        if "type" in node and isinstance(node["type"], str) and "properties" not in node and "additionalProperties" not in node:
            node["type"] = [node["type"], "null"]
        else:
            node = {"anyOf": [node, {"type": "null"}]}
    return node
