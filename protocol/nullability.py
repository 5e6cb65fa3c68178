"""Kafka's non-nullable fields, checked on every decoded request.

The message specs say, field by field, in which versions a string, bytes, array or struct
may be null (`nullableVersions`). Apache Kafka's generated readers refuse a null anywhere
else ("non-nullable field ... was serialized as null"); kafka-python's decoders accept it
and give `None`, which a handler would then iterate over. One walk after decoding applies
the specs' rule to every API at once, so no handler has to guard its fields one by one.

The walk is planned once per (message struct, version): only fields that can hold a null
(strings, bytes, arrays, structs, UUIDs are never null on the wire) and the structs below
them are visited.
"""
from __future__ import annotations

from typing import Any

from fluvial.errors import InvalidRequestError

# A plan: (attribute name, spec name, nullable?, kind, sub-plan) per field to look at.
# kind: "value" (string/bytes), "struct", "structs" (array of structs), "values" (array of
# strings/bytes/ints).
_Plan = tuple[tuple[str, str, bool, str, Any], ...]
_plans: dict[tuple[int, int], _Plan] = {}


def _plan(struct: Any, version: int) -> _Plan:
    key = (id(struct), version)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    steps = []
    for field in struct._fields:
        if not field.for_version_q(version):
            continue
        # A tagged field may be left out, and then holds its default (None for structs).
        nullable = field.nullable_for_version_q(version) or field.tagged_field_q(version)
        if field.is_struct_array():
            steps.append((field.name, field._name, nullable, "structs", _plan(field.array_of, version)))
        elif field.is_struct():
            steps.append((field.name, field._name, nullable, "struct", _plan(field, version)))
        elif field.is_array():
            element_nullable = field.array_of.type_str in ("string", "bytes", "records")
            steps.append((field.name, field._name, nullable, "values", element_nullable))
        elif field.type_str in ("string", "bytes", "records"):
            steps.append((field.name, field._name, nullable, "value", None))
    plan = tuple(steps)
    _plans[key] = plan
    return plan


def check_non_nullable(message: Any, version: int) -> None:
    """Raise InvalidRequestError naming the first non-nullable field that holds null."""
    _check(message, _plan(message._struct, version))


def _check(obj: Any, plan: _Plan) -> None:
    for name, spec_name, nullable, kind, sub in plan:
        value = getattr(obj, name)
        if value is None:
            if not nullable:
                raise InvalidRequestError(f"non-nullable field {spec_name} was serialized as null")
            continue
        if kind == "structs":
            if sub:
                for item in value:
                    _check(item, sub)
        elif kind == "struct":
            if sub:
                _check(value, sub)
        elif kind == "values" and sub and None in value:
            raise InvalidRequestError(f"an element of {spec_name} was serialized as null")
