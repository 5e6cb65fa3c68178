"""A scan's `filter` as the user gives it, checked and split before anything is sent.

Accepted forms: a `pyarrow.compute` Expression (what `pyarrow.dataset`, Polars and DuckDB
users write), a `(column, op, value)` tuple, or a list of tuples and expressions (AND-ed).

An expression is split into its AND-ed conditions; each condition the broker evaluates
exactly as pyarrow does (a column compared with a literal, `isin`, `is_null`, `is_valid`,
their negations where that is exact) is pushed down as a tuple filter, so the broker skips
batches by their statistics and sends only matching rows. If anything is left, the client
applies the whole expression with pyarrow to what arrives (the pushed conditions already
hold for those rows), so the result is always `pyarrow.dataset`'s for the same expression.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from fluvial.client.errors import FilterColumnError, FilterError, FilterTypeError
from fluvial.client.expression_tree import Call, FieldRef, Literal, UnreadableExpression, read_tree, reader_works
from fluvial.client.predicates import parse_filter
from fluvial.client.wire import FILTER_OPS, decode_value, encode_value
from fluvial.errors import InvalidRequestError, UnknownColumnError

ACCEPTED = ("a pyarrow.compute Expression such as pc.field('score') > 5 (comparisons, isin, is_null, is_valid, "
            "&, |, ~ over columns and literals, or any boolean expression pyarrow evaluates), a (column, op, value) "
            f"tuple with op one of {list(FILTER_OPS)}, or a list of tuples and expressions (all AND-ed)")

_OPS = {"equal": "=", "not_equal": "!=", "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">="}
_FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_NEGATED = {"=": "!=", "!=": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}
_BUCKET = "_bucket"  # not stored: the broker cannot filter on it, the client can


@dataclass(frozen=True)
class ScanFilter:
    """What the broker is asked to filter, and what the client applies afterwards."""

    pushed: list[list[Any]] = field(default_factory=list)  # (column, op, value) filters, AND-ed
    residual: pc.Expression | None = None                  # applied by the client to what arrives
    columns: tuple[str, ...] = ()                          # columns `residual` reads

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch if self.residual is None else batch.filter(self.residual)


def compile_filter(filter: Any, fields: Mapping[str, pa.Field], table: str) -> ScanFilter:
    """Check a scan's filter against the table's columns (user and system) and split it.
    Raises FilterTypeError (not a filter), FilterColumnError (unknown column), FilterError
    (a bad operator or a value that does not fit its column)."""
    if filter is None:
        return ScanFilter()
    if isinstance(filter, pc.Expression):
        return _expression(filter, fields, table)
    if isinstance(filter, (str, bytes)):
        raise FilterTypeError(f"a scan filter is {ACCEPTED}; not a string ({filter!r}): write "
                              f"pc.field('score') > 5 instead of 'score > 5'")
    if isinstance(filter, tuple) and len(filter) == 3 and isinstance(filter[0], str):
        items = [filter]
    elif isinstance(filter, (list, tuple)):
        items = list(filter)
    else:
        raise FilterTypeError(f"a scan filter is {ACCEPTED}; not {type(filter).__name__} {filter!r}")
    pushed: list[list[Any]] = []
    residuals: list[pc.Expression] = []
    columns: set[str] = set()
    for item in items:
        if isinstance(item, pc.Expression):
            part = _expression(item, fields, table)
            pushed += part.pushed
            if part.residual is not None:
                residuals.append(part.residual)
                columns.update(part.columns)
        elif isinstance(item, (list, tuple)) and not isinstance(item, str):
            pushed.append(_tuple(item, fields, table))
        else:
            raise FilterTypeError(f"a scan filter is {ACCEPTED}; the list holds {type(item).__name__} {item!r}")
    residual = None
    for r in residuals:
        residual = r if residual is None else residual & r
    return ScanFilter(pushed, residual, tuple(sorted(columns)))


def _field_of(fields: Mapping[str, pa.Field], table: str):
    users = [n for n in fields if not n.startswith("_")]

    def field_of(name: Any) -> pa.Field:
        f = fields.get(name) if isinstance(name, str) else None
        if f is None:
            raise FilterColumnError(f"table {table!r} has no column {name!r}; its columns are {users}")
        return f
    return field_of


def _tuple(item: Any, fields: Mapping[str, pa.Field], table: str) -> list[Any]:
    if len(item) != 3 or not isinstance(item[0], str):
        raise FilterTypeError(f"a filter tuple is (column, op, value), not {item!r}; a scan filter is {ACCEPTED}")
    try:
        parsed = parse_filter(list(item), _field_of(fields, table))
    except UnknownColumnError:
        raise
    except InvalidRequestError as exc:
        raise FilterError(f"{exc.message}; a scan filter is {ACCEPTED}") from None
    if parsed.column == _BUCKET:
        raise FilterError(f"{_BUCKET} cannot be filtered on with a tuple; choose the buckets to scan instead "
                          f"(or filter with an expression, which the client applies)")
    return list(item)


def _expression(expr: pc.Expression, fields: Mapping[str, pa.Field], table: str) -> ScanFilter:
    schema = pa.schema(list(fields.values()))
    tree = None
    if reader_works():
        try:
            tree = read_tree(expr)
        except UnreadableExpression:
            tree = None
    if tree is not None:
        from fluvial.client.expression_tree import field_names

        names = field_names(tree)
        unknown = sorted(n for n in names if n not in fields)
        if unknown:
            _field_of(fields, table)(unknown[0])
    _check_binds(expr, schema, fields, table)
    if tree is None:
        # Not readable here: everything is applied by the client, reading every column it may use.
        return ScanFilter([], expr, tuple(n for n in fields if _uses(expr, schema, n)))
    pushed = []
    whole = True
    for condition in _conjuncts(tree):
        raw = _pushable(condition, fields)
        if raw is None:
            whole = False
        else:
            pushed.append(raw)
    if whole:
        return ScanFilter(pushed)
    return ScanFilter(pushed, expr, tuple(sorted(names)))


def _check_binds(expr: pc.Expression, schema: pa.Schema, fields, table: str) -> None:
    """Bind the expression to the columns as pyarrow.dataset would: unknown columns, types
    that do not compare, and non-boolean expressions are refused before any request."""
    try:
        schema.empty_table().filter(expr)
    except pa.ArrowInvalid as exc:
        text = str(exc)
        if "No match for FieldRef" in text:
            name = text.split("FieldRef.Name(", 1)[-1].split(")", 1)[0]
            _field_of(fields, table)(name)
        raise FilterTypeError(f"the filter {expr} does not fit the columns of table {table!r}: "
                              f"{text.splitlines()[0]}; a scan filter is {ACCEPTED}") from None
    except (pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as exc:
        raise FilterTypeError(f"the filter {expr} does not fit the columns of table {table!r}: "
                              f"{str(exc).splitlines()[0]}; a scan filter is {ACCEPTED}") from None


def _uses(expr: pc.Expression, schema: pa.Schema, name: str) -> bool:
    """Whether the expression reads column `name` (it no longer binds without it)."""
    try:
        pa.schema([f for f in schema if f.name != name]).empty_table().filter(expr)
        return False
    except pa.ArrowInvalid:
        return True


def _conjuncts(node) -> list:
    if isinstance(node, Call) and node.function in ("and_kleene", "and") and len(node.args) == 2:
        return _conjuncts(node.args[0]) + _conjuncts(node.args[1])
    return [node]


def _pushable(node, fields: Mapping[str, pa.Field]) -> list[Any] | None:
    """The tuple filter that keeps exactly the rows this condition keeps, or None."""
    negated = False
    if isinstance(node, Call) and node.function == "invert" and len(node.args) == 1:
        negated, node = True, node.args[0]
    if isinstance(node, FieldRef):  # a boolean column alone
        f = fields.get(node.name)
        if f is None or not pa.types.is_boolean(f.type) or node.name == _BUCKET:
            return None
        return [node.name, "=", not negated]
    if not isinstance(node, Call):
        return None
    fn, args = node.function, node.args
    if fn in _OPS and len(args) == 2:
        if isinstance(args[0], FieldRef) and isinstance(args[1], Literal):
            column, literal, op = args[0].name, args[1].value, _OPS[fn]
        elif isinstance(args[1], FieldRef) and isinstance(args[0], Literal):
            column, literal, op = args[1].name, args[0].value, _FLIPPED[_OPS[fn]]
        else:
            return None
        f = fields.get(column)
        if f is None or column == _BUCKET:
            return None
        if negated:
            # not(a < 5) keeps NaN, a >= 5 does not: only exact for non-float columns (and = / !=).
            if pa.types.is_floating(f.type) and op not in ("=", "!="):
                return None
            op = _NEGATED[op]
        value = _wire_value(literal, f.type)
        return None if value is _NO else [column, op, value]
    if fn in ("is_null", "is_valid") and len(args) == 1 and isinstance(args[0], FieldRef):
        f = fields.get(args[0].name)
        if f is None or args[0].name == _BUCKET:
            return None
        nan_is_null = node.options and node.options.get("nan_is_null")
        if fn == "is_null" and nan_is_null is not None and nan_is_null.as_py() and pa.types.is_floating(f.type):
            return None
        null = (fn == "is_null") != negated
        return [args[0].name, "is_null" if null else "not_null", None]
    if fn == "is_in" and not negated and len(args) == 1 and isinstance(args[0], FieldRef) and node.options:
        # Without nulls in the value set every null-matching behaviour keeps the same rows
        # (a null row never matches); `not isin` keeps null rows, the broker's `not in` does not.
        f = fields.get(args[0].name)
        value_set = node.options.get("value_set")
        if f is None or args[0].name == _BUCKET or value_set is None or not value_set.is_valid:
            return None
        values = value_set.values
        if values.null_count:
            return None
        out = []
        for v in values:
            w = _wire_value(v, f.type)
            if w is _NO:
                return None
            out.append(w)
        return [args[0].name, "in", out]
    return None


_NO = object()


def _wire_value(literal: pa.Scalar, column_type: pa.DataType) -> Any:
    """The literal as the broker will see it, if it survives the trip exactly: cast to the
    column's type without loss, through the JSON of the request and back. Else _NO (the
    condition stays with the client)."""
    if not literal.is_valid:
        return _NO
    try:
        typed = literal.cast(column_type, safe=True) if literal.type != column_type else literal
        if typed.cast(literal.type, safe=True) != literal:
            return _NO
        plain = typed.as_py()
        back = decode_value(json.loads(json.dumps(encode_value(plain))))
        if pa.scalar(back, column_type) != typed:
            return _NO
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError,
            OverflowError):
        return _NO
    return plain
