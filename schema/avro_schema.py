"""A parsed Avro schema as a tree of nodes with named types resolved, the form the codec and the checks walk."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException, UnknownType

from fluvial.schema.errors import InvalidSchemaError

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
# Logical types with their required underlying types; an unknown or ill-typed logical
# type is ignored (the Avro spec says readers fall back to the underlying type).
LOGICAL_BASE = {
    "date": ("int",),
    "time-millis": ("int",),
    "time-micros": ("long",),
    "timestamp-millis": ("long",),
    "timestamp-micros": ("long",),
    "local-timestamp-millis": ("long",),
    "local-timestamp-micros": ("long",),
    "uuid": ("string",),
    "decimal": ("bytes", "fixed"),
}


@dataclass(eq=False)
class AvroField:
    name: str
    type: "AvroNode"
    has_default: bool = False
    default: Any = None
    aliases: tuple[str, ...] = ()


@dataclass(eq=False)
class AvroNode:
    """One Avro type. `kind` is the Avro type name; named types carry their full name."""

    kind: str
    logical: str | None = None
    name: str | None = None
    aliases: tuple[str, ...] = ()
    fields: list[AvroField] = field(default_factory=list)
    symbols: tuple[str, ...] = ()
    enum_default: str | None = None
    items: "AvroNode | None" = None
    values: "AvroNode | None" = None
    size: int = 0
    precision: int = 0
    scale: int = 0
    branches: list["AvroNode"] = field(default_factory=list)
    # The Arrow type a primitive was derived from when Avro has no such type (`"arrow.type"`
    # attribute: int8/int16/uint8/uint16 as "int", uint32 as "long", large_string as "string").
    arrow_type: str | None = None

    @property
    def null_branch(self) -> int:
        """For a union: index of the "null" branch, -1 when there is none."""
        for i, b in enumerate(self.branches):
            if b.kind == "null":
                return i
        return -1

    def nullable_value(self) -> "AvroNode | None":
        """For a union of null and one other type: that type; otherwise None."""
        if self.kind != "union" or len(self.branches) != 2 or self.null_branch < 0:
            return None
        return self.branches[1 - self.null_branch]


@dataclass(eq=False)
class AvroSchema:
    """A registered Avro schema: its text, its canonical JSON and its resolved tree."""

    text: str
    canonical: str
    root: AvroNode
    parsed: Any  # fastavro's parsed form, used for per-record fallbacks and tests


def parse_avro(text: str | dict | list) -> AvroSchema:
    """Parse and validate an Avro schema; raise InvalidSchemaError (42201) when it is not one."""
    try:
        raw = json.loads(text) if isinstance(text, str) else text
    except (TypeError, ValueError) as exc:
        raise InvalidSchemaError(f"Invalid schema: not JSON ({exc})") from None
    try:
        parsed = fastavro.parse_schema(raw, _write_hint=False)
    except (SchemaParseException, UnknownType, TypeError, ValueError, KeyError, AttributeError) as exc:
        raise InvalidSchemaError(f"Invalid Avro schema: {exc}") from None
    named: dict[str, AvroNode] = {}
    try:
        root = _build(parsed, named, stack=())
    except RecursionError:
        raise InvalidSchemaError("Invalid Avro schema: nesting too deep") from None
    text_out = text if isinstance(text, str) else json.dumps(raw)
    canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":"))
    return AvroSchema(text=text_out, canonical=canonical, root=root, parsed=parsed)


ARROW_TYPE = "arrow.type"  # an attribute Avro readers ignore


def _build(s: Any, named: dict[str, AvroNode], stack: tuple[str, ...]) -> AvroNode:
    if isinstance(s, str):
        if s in PRIMITIVES:
            return AvroNode(kind=s)
        if s in stack:
            # A recursive type has no finite Arrow shape; the registry keeps it, tables refuse it.
            return AvroNode(kind="recursive", name=s)
        if s not in named:
            raise InvalidSchemaError(f"Invalid Avro schema: unknown type {s!r}")
        return named[s]
    if isinstance(s, list):
        return AvroNode(kind="union", branches=[_build(b, named, stack) for b in s])
    t = s["type"]
    if isinstance(t, (dict, list)) or (isinstance(t, str) and t not in PRIMITIVES | {"record", "error", "enum", "array", "map", "fixed"}):
        return _build(t, named, stack)
    logical = s.get("logicalType")
    if t in PRIMITIVES:
        node = AvroNode(kind=t)
        if isinstance(s.get(ARROW_TYPE), str):
            node.arrow_type = s[ARROW_TYPE]
    elif t in ("record", "error"):
        node = AvroNode(kind="record", name=s["name"], aliases=tuple(s.get("aliases", ())))
        named[node.name] = node
        inner = stack + (node.name,)
        for f in s["fields"]:
            node.fields.append(AvroField(
                name=f["name"], type=_build(f["type"], named, inner),
                has_default="default" in f, default=f.get("default"),
                aliases=tuple(f.get("aliases", ())),
            ))
    elif t == "enum":
        node = AvroNode(kind="enum", name=s["name"], symbols=tuple(s["symbols"]),
                        enum_default=s.get("default"), aliases=tuple(s.get("aliases", ())))
        named[node.name] = node
    elif t == "fixed":
        node = AvroNode(kind="fixed", name=s["name"], size=int(s["size"]), aliases=tuple(s.get("aliases", ())))
        named[node.name] = node
    elif t == "array":
        node = AvroNode(kind="array", items=_build(s["items"], named, stack))
    elif t == "map":
        node = AvroNode(kind="map", values=_build(s["values"], named, stack))
    else:  # pragma: no cover - fastavro refuses these first
        raise InvalidSchemaError(f"Invalid Avro schema: unknown type {t!r}")
    if logical in LOGICAL_BASE and node.kind in LOGICAL_BASE[logical]:
        if logical == "decimal":
            precision, scale = s.get("precision"), s.get("scale", 0)
            if isinstance(precision, int) and isinstance(scale, int) and 0 < precision and 0 <= scale <= precision:
                node.logical, node.precision, node.scale = logical, precision, scale
        else:
            node.logical = logical
    return node


def unique_name(node: AvroNode) -> str:
    """The short name of a named type (the part after the last dot)."""
    return (node.name or "").rsplit(".", 1)[-1]
