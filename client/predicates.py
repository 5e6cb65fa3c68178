"""Scan predicates shared by the broker's scans and the client's reads of remote segments.

One definition of what a filter is, when a batch's column statistics prove it cannot
match, and which rows pass: the broker applies it to local log segments, the client to
remote segments it reads straight from the object store, so both sides skip and filter
exactly alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fluvial.client.wire import COMPARISONS, FILTER_OPS
from fluvial.errors import InvalidRequestError

_COMPARE = {"=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal,
            ">": pc.greater, ">=": pc.greater_equal}


@dataclass(frozen=True)
class Filter:
    """One condition `column op value`; a scan's filters are AND-ed."""

    column: str
    op: str
    value: Any  # a pa.Scalar of the column's type, a pa.Array for in/not in, None for null tests

    @property
    def stats_value(self) -> Any:
        """The value as batch statistics hold it: temporal values as their integer storage."""
        value = self.value
        if value is None:
            return None
        t = value.type
        if pa.types.is_temporal(t) or pa.types.is_duration(t):
            storage = pa.int64() if t.bit_width == 64 else pa.int32()
            value = value.view(storage) if isinstance(value, pa.Array) else value.cast(storage)
        return value.to_pylist() if isinstance(value, pa.Array) else value.as_py()

    @property
    def plain_value(self) -> Any:
        if isinstance(self.value, pa.Array):
            return self.value.to_pylist()
        return self.value.as_py() if isinstance(self.value, pa.Scalar) else self.value


def parse_filter(raw: Any, field_of) -> Filter:
    """A wire filter `[column, op, value]` typed by its column: `field_of(name)` gives the
    column's pa.Field (raising for unknown columns). Raises InvalidRequestError."""
    if not isinstance(raw, (list, tuple)) or len(raw) != 3:
        raise InvalidRequestError(f"a filter is (column, op, value), not {raw!r}")
    column, op, value = raw
    if op not in FILTER_OPS:
        raise InvalidRequestError(f"unknown filter operator {op!r}; use one of {list(FILTER_OPS)}")
    field = field_of(column)
    if op in ("is_null", "not_null"):
        return Filter(column, op, None)
    try:
        if op in ("in", "not in"):
            if not isinstance(value, (list, tuple)):
                raise InvalidRequestError(f"filter {column} {op} needs a list of values, not {value!r}")
            return Filter(column, op, pa.array(list(value), field.type))
        if value is None:
            raise InvalidRequestError(f"filter {column} {op} None: use is_null / not_null")
        return Filter(column, op, pa.scalar(value, field.type))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequestError(f"filter value {value!r} does not fit column {column!r} of type {field.type}: {exc}") \
            from None


# -- batch skipping -----------------------------------------------------------------------

def batch_may_match(meta, stats: dict | None, filters: list[Filter]) -> bool:
    """False when the batch's per-column statistics (min, max, null count, recorded by the
    log tablet at append) prove that no row passes the filters.

    The one place batches are skipped. Columns without statistics never decide."""
    if not filters or not stats:
        return True
    rows = meta.record_count
    for f in filters:
        col = stats.get(f.column)
        if col is None:
            continue
        try:
            if not _range_may_match(f, col.min, col.max, col.null_count, rows):
                return False
        except TypeError:
            continue  # bounds of a type the value cannot be compared with: read the batch
    return True


def _py(v: Any) -> Any:
    return v.as_py() if isinstance(v, pa.Scalar) else v


def _range_may_match(f: Filter, low: Any, high: Any, nulls: int | None, rows: int) -> bool:
    low, high = _py(low), _py(high)
    if f.op == "is_null":
        return nulls is None or nulls > 0
    all_null = nulls is not None and nulls >= rows
    if f.op == "not_null":
        return not all_null
    if all_null:
        return False  # comparisons with null never hold
    if low is None or high is None:
        return True
    v = f.stats_value
    if f.op == "=":
        return low <= v <= high
    if f.op in ("!=", "not in") and pa.types.is_floating(f.value.type):
        return True  # NaN is outside the bounds yet passes != and not in
    if f.op == "!=":
        return not (low == high == v)
    if f.op == "<":
        return low < v
    if f.op == "<=":
        return low <= v
    if f.op == ">":
        return high > v
    if f.op == ">=":
        return high >= v
    if f.op == "in":
        return any(x is not None and low <= x <= high for x in v)
    if f.op == "not in":
        return not (low == high and low in v)
    return True


# -- rows ---------------------------------------------------------------------------------

def filter_mask(batch: pa.RecordBatch, filters: list[Filter]) -> pa.Array:
    """Rows passing every filter (null comparisons count as not passing)."""
    mask = None
    for f in filters:
        col = batch.column(f.column)
        if f.op in COMPARISONS:
            m = _COMPARE[f.op](col, f.value)
        elif f.op == "in":
            m = pc.is_in(col, value_set=f.value)
        elif f.op == "not in":
            m = pc.and_(pc.invert(pc.is_in(col, value_set=f.value)), pc.is_valid(col))
        elif f.op == "is_null":
            m = pc.is_null(col)
        else:
            m = pc.is_valid(col)
        mask = m if mask is None else pc.and_kleene(mask, m)
    return mask


def read_columns(batch: pa.RecordBatch, fields: list[pa.Field]) -> pa.RecordBatch:
    """The fields' columns of a stored batch; batches written under an earlier table schema
    are evolved (added columns as nulls or defaults, widened types)."""
    schema = batch.schema
    names = [f.name for f in fields]
    if all(schema.get_field_index(f.name) >= 0 and schema.field(f.name).type == f.type for f in fields):
        return batch.select(names)
    from fluvial.schema.evolution import evolve

    present = [n for n in schema.names if n in names]
    users = pa.schema([f for f in fields if not f.name.startswith("_")])
    return evolve(batch.select(present), users).select(names)


def system_fields() -> dict[str, pa.Field]:
    """The system columns a scan may name (`_offset`, `_timestamp`, ...), with their types."""
    from fluvial.broker.flight.catalog import SYSTEM_FIELDS
    return SYSTEM_FIELDS


# `_change` codes from this one on mark rows a 'retract' table logs for its merge state
# (the rows written to it): never shown to readers (`fluvial.kv.change_types.FIRST_HIDDEN`).
FIRST_STATE_CHANGE = 5


def hide_state_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch without a 'retract' table's logged input rows (a batch without `_change` as it is)."""
    i = batch.schema.get_field_index("_change")
    if i < 0 or batch.num_rows == 0:
        return batch
    shown = pc.less(batch.column(i), FIRST_STATE_CHANGE)
    if pc.all(shown).as_py():
        return batch
    return batch.filter(shown)
