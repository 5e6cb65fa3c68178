"""The `aggregation` merge engine: each non-key column folds the rows written to its key
with an aggregate function (`fluvial.agg.<column>=<function>`, default
`last_non_null_value`), as in Fluss and Paimon.

A write batch is folded per key with Arrow's grouped aggregations, then combined with the
stored row, column by column: no loop over rows or keys in Python. RETRACT rows (-U/-D
carrying a row) subtract where the function can (`sum`, `count`); a retraction of a
column whose function cannot take one back is refused with the write. A -D without a row
(a tombstone, a table API delete) removes the key. One key's changes within one write
batch are emitted as one change (+I, -U/+U or -D): the state is the visible row, so the
changelog alone rebuilds it.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.errors import InvalidConfigError, InvalidRecordError

AGG_PREFIX = "fluvial.agg."
DEFAULT_FUNCTION = "last_non_null_value"
FUNCTIONS = ("sum", "min", "max", "count", "last_value", "last_non_null_value", "first_value",
             "first_non_null_value", "bool_and", "bool_or", "listagg")
RETRACTABLE = ("sum", "count")
LISTAGG_DELIMITER = ","


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _orderable(t: pa.DataType) -> bool:
    return (_numeric(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_temporal(t)
            or pa.types.is_binary(t))


_TYPE_RULES = {
    "sum": (_numeric, "a numeric"),
    "count": (pa.types.is_integer, "an integer"),
    "min": (_orderable, "a numeric, string, binary or temporal"),
    "max": (_orderable, "a numeric, string, binary or temporal"),
    "bool_and": (pa.types.is_boolean, "a boolean"),
    "bool_or": (pa.types.is_boolean, "a boolean"),
    "listagg": (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "a string"),
}


def aggregates_from_configs(configs: dict[str, str]) -> dict[str, str]:
    return {k[len(AGG_PREFIX):]: v for k, v in configs.items() if k.startswith(AGG_PREFIX) and v}


def check_aggregates(schema: pa.Schema, primary_key: list[str], aggregates: dict[str, str]
                     ) -> tuple[tuple[str, str], ...]:
    """(column, function) of every non-key column, or InvalidConfigError naming what is wrong."""
    unknown = [c for c in aggregates if c not in schema.names]
    if unknown:
        raise InvalidConfigError(f"aggregate function(s) set for {unknown}, which are not columns of the table")
    keyed = [c for c in aggregates if c in primary_key]
    if keyed:
        raise InvalidConfigError(f"primary-key column(s) {keyed} cannot be aggregated")
    out = []
    for f in schema:
        if f.name in primary_key:
            continue
        fn = (aggregates.get(f.name) or DEFAULT_FUNCTION).strip().lower()
        if fn not in FUNCTIONS:
            raise InvalidConfigError(f"Unknown aggregate function {fn!r} for column {f.name!r}: must be one of "
                                     f"{list(FUNCTIONS)}")
        rule = _TYPE_RULES.get(fn)
        if rule is not None and not rule[0](f.type):
            raise InvalidConfigError(f"aggregate function {fn!r} of column {f.name!r} needs {rule[1]} column, "
                                     f"not {f.type}")
        out.append((f.name, fn))
    return tuple(out)


class AggregateMerger:
    """Folds one bucket's write batch into the stored rows of its keys."""

    def __init__(self, schema: pa.Schema, aggregates: tuple[tuple[str, str], ...], primary_key: list[str]):
        self.schema = schema
        # A column added to the table since its creation folds with the default function.
        self.functions = {f.name: DEFAULT_FUNCTION for f in schema if f.name not in primary_key}
        self.functions.update(dict(aggregates))
        self.irreversible = [(c, fn) for c, fn in aggregates if fn not in RETRACTABLE]

    def check_retractions(self, retract: np.ndarray) -> None:
        """Refuse RETRACT rows when a column's function cannot take a value back."""
        if not retract.any() or not self.irreversible:
            return
        bad = np.flatnonzero(retract)
        cols = ", ".join(f"{c!r} ({fn})" for c, fn in self.irreversible)
        msg = (f"a retraction (-U/-D with a row) cannot be applied: column(s) {cols} aggregate with a function "
               f"that cannot take a value back (only {list(RETRACTABLE)} can)")
        raise InvalidRecordError(f"record {int(bad[0])}: {msg}; nothing of the batch was written",
                                 record_errors=[(int(i), msg) for i in bad[:100]])

    def fold(self, new_rows: pa.StructArray, group: np.ndarray, g_count: int, old_rows: pa.StructArray,
             exists: np.ndarray, retract: np.ndarray, key_delete: np.ndarray
             ) -> tuple[pa.StructArray, np.ndarray, np.ndarray]:
        """(row per key after the batch, whether it exists, the last write of each key)."""
        n = len(group)
        idx = np.arange(n)
        last_write = np.full(g_count, -1, np.int64)
        np.maximum.at(last_write, group, idx)
        last_delete = np.full(g_count, -1, np.int64)
        if key_delete.any():
            np.maximum.at(last_delete, group[key_delete], idx[key_delete])
        # Only the rows after a key's last delete fold into it; a delete clears what was stored.
        effective = (idx > last_delete[group]) & ~key_delete
        base_exists = exists & (last_delete < 0)
        has_rows = np.zeros(g_count, bool)
        has_rows[group[effective]] = True
        final_exists = base_exists | has_rows
        sel = np.flatnonzero(effective)
        sign = np.where(retract[sel], -1, 1)
        g = group[sel]
        names = [self.schema.field(i).name for i in range(len(self.schema))]
        cols = {}
        for f in self.schema:
            i = names.index(f.name)
            old = old_rows.field(i)
            new = new_rows.field(i).take(pa.array(sel))
            fn = self.functions.get(f.name)
            if fn is None:  # a key column: the same in every write of the key
                batch_last = _grouped(new, g, g_count, "last", skip_nulls=False)
                cols[f.name] = pc.if_else(pa.array(has_rows), batch_last, old)
                continue
            cols[f.name] = self._column(fn, f.type, old, new, g, g_count, sign, base_exists, has_rows)
        fields = [f.with_nullable(True) for f in self.schema]
        rows = pa.StructArray.from_arrays([cols[f.name] for f in self.schema], fields=fields)
        return rows, final_exists, last_write

    def _column(self, fn: str, typ: pa.DataType, old: pa.Array, new: pa.Array, g: np.ndarray, g_count: int,
                sign: np.ndarray, base_exists: np.ndarray, has_rows: np.ndarray) -> pa.Array:
        base = pc.if_else(pa.array(base_exists), old, pa.scalar(None, typ))
        if fn == "sum":
            signed = pc.multiply(new, pa.array(sign).cast(typ if not pa.types.is_decimal(typ) else pa.int64()))
            part = _grouped(signed.cast(typ), g, g_count, "sum")
            return _combine(base, part, lambda a, b: pc.add(a, b)).cast(typ)
        if fn == "count":
            counted = pa.array(np.where(new.is_valid().to_numpy(zero_copy_only=False), sign, 0).astype(np.int64))
            part = _grouped(counted, g, g_count, "sum")
            total = pc.add(pc.fill_null(base.cast(pa.int64()), 0), pc.fill_null(part, 0))
            return total.cast(typ)
        if fn in ("min", "max"):
            part = _grouped(new, g, g_count, fn)
            op = pc.min_element_wise if fn == "min" else pc.max_element_wise
            return op(base, part, skip_nulls=True)
        if fn == "last_value":
            part = _grouped(new, g, g_count, "last", skip_nulls=False)
            return pc.if_else(pa.array(has_rows), part, base)
        if fn == "last_non_null_value":
            return pc.coalesce(_grouped(new, g, g_count, "last"), base)
        if fn == "first_value":
            part = _grouped(new, g, g_count, "first", skip_nulls=False)
            return pc.if_else(pa.array(base_exists), base, part)
        if fn == "first_non_null_value":
            return pc.coalesce(base, _grouped(new, g, g_count, "first"))
        if fn in ("bool_and", "bool_or"):
            part = _grouped(new, g, g_count, "all" if fn == "bool_and" else "any")
            part = pc.if_else(pa.array(_has_valid(new, g, g_count)), part, pa.scalar(None, pa.bool_()))
            op = pc.and_ if fn == "bool_and" else pc.or_
            return _combine(base, part, op)
        if fn == "listagg":
            valid = new.is_valid().to_numpy(zero_copy_only=False)
            vals = new.filter(pa.array(valid))
            lists = _grouped(vals, g[valid], g_count, "list")
            part = pc.binary_join(lists, LISTAGG_DELIMITER)
            return _combine(base, part, lambda a, b: pc.binary_join_element_wise(a, b, LISTAGG_DELIMITER)).cast(typ)
        raise InvalidConfigError(f"unknown aggregate function {fn!r}")


def _has_valid(values: pa.Array, g: np.ndarray, g_count: int) -> np.ndarray:
    out = np.zeros(g_count, bool)
    out[g[values.is_valid().to_numpy(zero_copy_only=False)]] = True
    return out


def _combine(base: pa.Array, part: pa.Array, op) -> pa.Array:
    """op(base, part) where both have a value, else whichever has one."""
    both = op(base, part)
    return pc.coalesce(both, base, part)


def _grouped(values: pa.Array, g: np.ndarray, g_count: int, how: str, skip_nulls: bool = True) -> pa.Array:
    """A grouped aggregate of `values` by key group, one value per group 0..g_count-1 (null
    for groups without rows). Groups keep their rows' order (first/last are by write order)."""
    if how == "list":
        out_type = pa.list_(values.type)
    elif how == "sum" and pa.types.is_integer(values.type):
        out_type = pa.int64() if pa.types.is_signed_integer(values.type) else pa.uint64()
    elif how in ("all", "any"):
        out_type = pa.bool_()
    else:
        out_type = values.type
    if len(values) == 0:
        return pa.nulls(g_count, out_type)
    table = pa.table({"g": pa.array(g, pa.int64()), "v": values})
    opts = pc.ScalarAggregateOptions(skip_nulls=skip_nulls) if how in ("first", "last", "sum", "all", "any") \
        else None
    agg = table.group_by("g", use_threads=False).aggregate([("v", how, opts) if opts else ("v", how)])
    keys = agg.column("g").to_numpy()
    res = agg.column(1).combine_chunks()
    scatter = np.full(g_count, -1, np.int64)
    scatter[keys] = np.arange(len(keys))
    return res.take(pa.array(scatter, mask=scatter < 0))
