"""Schema compatibility: Avro reader/writer resolution, JSON Schema subset rules, and the modes."""
from __future__ import annotations

import enum
from typing import Any, Iterable

import pyarrow as pa

from fluvial.schema.avro_schema import AvroNode
from fluvial.schema.evolution import can_widen


class Compatibility(str, enum.Enum):
    NONE = "NONE"
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        return self.value.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        return self.value.startswith(("FORWARD", "FULL"))


def check_modes(mode: Compatibility, new: Any, previous_oldest_first: list[Any], can_read) -> list[str]:
    """Problems of registering `new` after `previous` under `mode` (empty = compatible).

    `can_read(reader, writer)` gives the problems of reading writer data with the reader.
    """
    if mode is Compatibility.NONE or not previous_oldest_first:
        return []
    against = previous_oldest_first if mode.transitive else previous_oldest_first[-1:]
    problems: list[str] = []
    for old in reversed(against):
        if mode.backward:
            problems += [f"new schema cannot read data written with an existing one: {p}" for p in can_read(new, old)]
        if mode.forward:
            problems += [f"an existing schema cannot read data written with the new one: {p}" for p in can_read(old, new)]
    return problems


# ---------------------------------------------------------------- Avro

_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}


def avro_can_read(reader: AvroNode, writer: AvroNode) -> list[str]:
    """Problems of reading data written with `writer` using `reader` (Avro schema resolution)."""
    out: list[str] = []
    _avro_check(reader, writer, "", out, set())
    return out


def _short(name: str | None) -> str:
    return (name or "").rsplit(".", 1)[-1]


def _names_match(r: AvroNode, w: AvroNode) -> bool:
    return _short(r.name) == _short(w.name) or _short(w.name) in {_short(a) for a in r.aliases} \
        or (r.name or "") in set(r.aliases)


def _avro_check(r: AvroNode, w: AvroNode, path: str, out: list[str], seen: set) -> None:
    where = path or "the value"
    if w.kind == "union":
        for b in w.branches:
            _avro_check(r, b, path, out, seen)
        return
    if r.kind == "union":
        for b in r.branches:
            if not _avro_first_match_problems(b, w, path, seen):
                return
        out.append(f"{where}: reader union has no branch for writer type {w.kind}")
        return
    if r.kind == "recursive" or w.kind == "recursive":
        return
    if r.kind != w.kind:
        if r.kind in _PROMOTIONS.get(w.kind, ()):
            return
        out.append(f"{where}: writer type {w.kind} cannot be read as {r.kind}")
        return
    k = r.kind
    if k in ("record", "enum", "fixed") and not _names_match(r, w):
        out.append(f"{where}: writer {k} {w.name} does not match reader {k} {r.name}")
        return
    key = (id(r), id(w))
    if key in seen:
        return
    seen = seen | {key}
    if k == "record":
        wf = {f.name: f for f in w.fields}
        for f in r.fields:
            fp = f"{path}.{f.name}" if path else f.name
            match = wf.get(f.name) or next((wf[a] for a in f.aliases if a in wf), None)
            if match is not None:
                _avro_check(f.type, match.type, fp, out, seen)
            elif not f.has_default:
                out.append(f"field {fp!r} is missing in the writer's schema and has no default")
    elif k == "enum":
        missing = [s for s in w.symbols if s not in r.symbols]
        if missing and r.enum_default is None:
            out.append(f"{where}: enum {r.name} lacks writer symbols {missing}")
    elif k == "fixed":
        if r.size != w.size:
            out.append(f"{where}: fixed {r.name} size {w.size} cannot be read as size {r.size}")
    elif k == "array":
        _avro_check(r.items, w.items, f"{path}[]", out, seen)
    elif k == "map":
        _avro_check(r.values, w.values, f"{path}[]", out, seen)


def _avro_first_match_problems(r: AvroNode, w: AvroNode, path: str, seen: set) -> list[str]:
    out: list[str] = []
    _avro_check(r, w, path, out, seen)
    return out


# ---------------------------------------------------------------- JSON Schema

def json_can_read(reader: Any, writer: Any) -> list[str]:
    """Problems of accepting every document valid under `writer` with `reader` (common cases:
    properties added/removed, required, type widening, enums, nested objects and arrays)."""
    out: list[str] = []
    _json_check(_Doc(reader), _Doc(writer), reader, writer, "", out, 0)
    return out


class _Doc:
    def __init__(self, root: Any):
        self.root = root

    def resolve(self, node: Any) -> Any:
        for _ in range(32):
            if not (isinstance(node, dict) and "$ref" in node and node["$ref"].startswith("#")):
                return node
            target = self.root
            for part in [p for p in node["$ref"][1:].split("/") if p]:
                target = target[part.replace("~1", "/").replace("~0", "~")]
            node = target
        return node


def _types(node: Any) -> set[str] | None:
    """The JSON types a node allows; None for "anything"."""
    if node is True or node == {}:
        return None
    if node is False:
        return set()
    alts = node.get("anyOf") or node.get("oneOf")
    if alts is not None and "type" not in node:
        acc: set[str] = set()
        for a in alts:
            t = _types(a)
            if t is None:
                return None
            acc |= t
        return acc
    t = node.get("type")
    if t is None:
        if "properties" in node:
            return {"object"}
        if "enum" in node:
            return {_json_type_of(v) for v in node["enum"]}
        return None
    types = set(t) if isinstance(t, list) else {t}
    if "number" in types:
        types.add("integer")
    return types


def _json_type_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _branch(node: Any, type_name: str, doc: _Doc) -> Any:
    """The sub-schema of an anyOf/oneOf node that allows `type_name`."""
    if isinstance(node, dict):
        for a in node.get("anyOf") or node.get("oneOf") or ():
            a = doc.resolve(a)
            t = _types(a)
            if t is None or type_name in t:
                return a
    return node


def _json_check(rd: _Doc, wd: _Doc, r: Any, w: Any, path: str, out: list[str], depth: int) -> None:
    where = f"property {path!r}" if path else "the document"
    if depth > 32:
        return
    r, w = rd.resolve(r), wd.resolve(w)
    rt, wt = _types(r), _types(w)
    if rt is None:
        return
    if wt is None:
        out.append(f"{where}: reader restricts the type to {sorted(rt)} where the writer allowed any")
        return
    narrowed = wt - rt
    if narrowed:
        out.append(f"{where}: writer type {sorted(narrowed)} is not accepted by the reader {sorted(rt)}")
    if isinstance(r, dict) and "enum" in r:
        wvals = w.get("enum") if isinstance(w, dict) else None
        if wvals is None or [v for v in wvals if v not in r["enum"]]:
            out.append(f"{where}: reader enum {r['enum']} does not include every writer value")
    if "object" in rt and "object" in wt:
        ro, wo = _branch(r, "object", rd), _branch(w, "object", wd)
        rp, wp = ro.get("properties", {}), wo.get("properties", {})
        r_req, w_req = set(ro.get("required", ())), set(wo.get("required", ()))
        r_open = ro.get("additionalProperties", True) is not False
        w_open = wo.get("additionalProperties", True) is not False
        for name, sub in rp.items():
            sp = f"{path}.{name}" if path else name
            if name in wp:
                _json_check(rd, wd, sub, wp[name], sp, out, depth + 1)
                if name in r_req and name not in w_req:
                    out.append(f"property {sp!r} became required")
            elif name in r_req:
                out.append(f"required property {sp!r} was added")
            elif w_open and isinstance(wo.get("additionalProperties"), dict):
                _json_check(rd, wd, sub, wo["additionalProperties"], sp, out, depth + 1)
        for name in wp:
            if name not in rp and not r_open:
                out.append(f"property {(path + '.' if path else '') + name!r} was removed from a closed object")
        if r_open is False and w_open:
            out.append(f"{where}: reader closed the object (additionalProperties false)")
    if "array" in rt and "array" in wt:
        ra, wa = _branch(r, "array", rd), _branch(w, "array", wd)
        _json_check(rd, wd, ra.get("items", {}), wa.get("items", {}), f"{path}[]", out, depth + 1)


# ---------------------------------------------------------------- tables

def arrow_can_evolve(old: pa.Schema, new: pa.Schema) -> list[str]:
    """Problems of reading batches stored under `old` as `new` (see evolution.evolve)."""
    out: list[str] = []
    _arrow_fields(list(old), list(new), "", out)
    return out


def _arrow_fields(old: Iterable[pa.Field], new: Iterable[pa.Field], path: str, out: list[str]) -> None:
    have = {f.name: f for f in old}
    for f in new:
        p = f"{path}.{f.name}" if path else f.name
        if f.name in have:
            _arrow_type(have[f.name].type, f.type, p, out)
        elif not f.nullable and b"default" not in (f.metadata or {}):
            out.append(f"column {p!r} is new, not nullable and has no default")


def _arrow_type(src: pa.DataType, dst: pa.DataType, path: str, out: list[str]) -> None:
    if pa.types.is_struct(src) and pa.types.is_struct(dst):
        _arrow_fields(list(src), list(dst), path, out)
    elif pa.types.is_list(src) and pa.types.is_list(dst):
        _arrow_type(src.value_type, dst.value_type, f"{path}[]", out)
    elif pa.types.is_map(src) and pa.types.is_map(dst):
        _arrow_type(src.item_type, dst.item_type, f"{path}[]", out)
    elif not (can_widen(src, dst) or (pa.types.is_timestamp(src) and pa.types.is_timestamp(dst) and src.tz == dst.tz)):
        out.append(f"column {path!r} of type {src} cannot be read as {dst}")
