"""Spark's pushed-down filters as Fluvial scan filters, only where both give the same rows."""
from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pyarrow as pa
import pyarrow.types as pt

# Spark filter class name -> Fluvial operator, for `column op value`.
_COMPARE = {"EqualTo": "=", "EqualNullSafe": "=", "GreaterThan": ">", "GreaterThanOrEqual": ">=",
            "LessThan": "<", "LessThanOrEqual": "<="}


def _pushable_column(t: pa.DataType) -> bool:
    """Types whose comparisons the broker evaluates exactly as Spark does. Not floats for
    ranges (Spark orders NaN above everything, Arrow's comparisons with NaN are false), not
    timestamps (filters cross the wire at millisecond precision), not decimals, times or
    nested types (Spark's values for them are not the column's)."""
    return (pt.is_integer(t) and t != pa.uint64()) or pt.is_boolean(t) or pt.is_string(t) \
        or pt.is_large_string(t) or pt.is_binary(t) or pt.is_large_binary(t) or pt.is_date32(t) \
        or pt.is_floating(t)


def _fits(value: Any, t: pa.DataType) -> bool:
    if value is None:
        return False
    if pt.is_integer(t):
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        info = {8: 2 ** 7, 16: 2 ** 15, 32: 2 ** 31, 64: 2 ** 63}[t.bit_width]
        return (0 if pt.is_unsigned_integer(t) else -info) <= value < (2 * info if pt.is_unsigned_integer(t) else info)
    if pt.is_floating(t):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if pt.is_boolean(t):
        return isinstance(value, bool)
    if pt.is_string(t) or pt.is_large_string(t):
        return isinstance(value, str)
    if pt.is_binary(t) or pt.is_large_binary(t):
        return isinstance(value, (bytes, bytearray))
    if pt.is_date32(t):
        return isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    return False


def to_fluvial(f: Any, types: dict[str, pa.DataType]) -> tuple[str, str, Any] | None:
    """(column, op, value) for a Spark filter the broker evaluates with Spark's result, else None."""
    kind = type(f).__name__
    negated = kind == "Not"
    if negated:
        f = f.child
        kind = type(f).__name__
    attribute = getattr(f, "attribute", None)
    if not isinstance(attribute, tuple) or len(attribute) != 1 or attribute[0] not in types:
        return None
    column = attribute[0]
    t = types[column]
    if column == "_bucket" or not _pushable_column(t):
        return None
    if kind == "IsNull":
        return (column, "not_null" if negated else "is_null", None)
    if kind == "IsNotNull":
        return (column, "is_null" if negated else "not_null", None)
    if kind == "In":
        values = list(f.value)
        if not values or not all(_fits(v, t) for v in values):
            return None  # a null in the list makes Spark's result null, not a match
        return (column, "not in" if negated else "in", values)
    op = _COMPARE.get(kind)
    if op is None or not _fits(f.value, t):
        return None
    if pt.is_floating(t) and op != "=":
        return None
    if negated:
        if op != "=" or kind == "EqualNullSafe":
            return None  # NOT (a <=> v) holds for nulls, which `!=` drops
        return (column, "!=", f.value)
    return (column, op, f.value)
