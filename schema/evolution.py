"""Arrow-level schema evolution: read a batch written under an older table schema as the new one."""
from __future__ import annotations

import base64
import datetime
import decimal
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.schema.arrow_mapping import META_DEFAULT

# Widenings a reader may apply to a writer's column (Avro promotion rules, plus Arrow's
# lossless integer and float widenings).
_NUMERIC_RANK = {pa.int8(): 1, pa.int16(): 2, pa.int32(): 3, pa.int64(): 4, pa.float32(): 5, pa.float64(): 6}


class EvolutionError(TypeError):
    """A column that cannot be read under the new schema (no default, narrowing, ...)."""


def can_widen(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether values of `src` can be read as `dst` without loss of meaning."""
    if src == dst:
        return True
    if src in _NUMERIC_RANK and dst in _NUMERIC_RANK:
        return _NUMERIC_RANK[src] <= _NUMERIC_RANK[dst]
    strings = (pa.string(), pa.binary(), pa.large_string(), pa.large_binary())
    return src in strings and dst in strings


def evolve(batch: pa.RecordBatch | pa.Table, schema: pa.Schema) -> pa.RecordBatch | pa.Table:
    """The batch's rows under `schema`: missing columns get their default or nulls, columns
    widen (int -> long, float -> double, ...), nested structs evolve the same way.

    Columns whose names start with "_" (the system columns of a stored batch) are kept in
    front as they are; user columns absent from `schema` are dropped.
    """
    names = batch.schema.names
    system = [(f, batch.column(i)) for i, f in enumerate(batch.schema) if f.name.startswith("_") and f.name not in schema.names]
    out_fields = [f for f, _ in system]
    out_cols = [c for _, c in system]
    n = batch.num_rows
    for field in schema:
        if field.name in names:
            col = batch.column(names.index(field.name))
            if isinstance(col, pa.ChunkedArray):
                col = pa.chunked_array([evolve_array(c, field) for c in col.chunks], field.type)
            else:
                col = evolve_array(col, field)
        else:
            col = fill_value(field, n)
        out_fields.append(field)
        out_cols.append(col)
    out_schema = pa.schema(out_fields, metadata=schema.metadata)
    if isinstance(batch, pa.Table):
        return pa.Table.from_arrays(out_cols, schema=out_schema)
    return pa.RecordBatch.from_arrays(out_cols, schema=out_schema)


def evolve_array(arr: pa.Array, field: pa.Field) -> pa.Array:
    """One column read as `field`'s type."""
    dst = field.type
    src = arr.type
    if src == dst:
        return arr
    if pa.types.is_struct(dst):
        if not pa.types.is_struct(src):
            raise EvolutionError(f"column {field.name!r}: {src} cannot be read as {dst}")
        have = {src.field(i).name: i for i in range(src.num_fields)}
        children = []
        for i in range(dst.num_fields):
            sub = dst.field(i)
            if sub.name in have:
                child = arr.field(have[sub.name])
                if len(child) != len(arr):
                    child = child.slice(arr.offset, len(arr))
                children.append(evolve_array(child, sub))
            else:
                children.append(fill_value(sub, len(arr)))
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(dst), mask=mask)
    if pa.types.is_list(dst) and pa.types.is_list(src):
        values = evolve_array(arr.flatten(), dst.value_field)
        offsets = _list_offsets(arr)
        return pa.ListArray.from_arrays(offsets, values, type=dst, mask=arr.is_null() if arr.null_count else None)
    if pa.types.is_map(dst) and pa.types.is_map(src):
        offsets = _list_offsets(arr)
        entries = arr.flatten()  # the map's entries (key, value) of its rows, slice applied
        items = evolve_array(entries.field(1), dst.item_field)
        return pa.MapArray.from_arrays(offsets, entries.field(0), items, type=dst)
    if can_widen(src, dst):
        return pc.cast(arr, dst)
    if pa.types.is_timestamp(src) and pa.types.is_timestamp(dst) and src.tz == dst.tz:
        return pc.cast(arr, dst)
    raise EvolutionError(f"column {field.name!r}: {src} cannot be read as {dst}")


def _list_offsets(arr: pa.Array) -> pa.Array:
    lengths = pc.list_value_length(arr).fill_null(0)
    off = np.zeros(len(arr) + 1, np.int32)
    np.cumsum(lengths.to_numpy(zero_copy_only=False), out=off[1:])
    return pa.array(off)


def fill_value(field: pa.Field, n: int) -> pa.Array:
    """A column of `n` copies of the field's default, or nulls when it has none."""
    meta = field.metadata or {}
    if META_DEFAULT in meta:
        default = json.loads(meta[META_DEFAULT])
        if default is not None:
            return pa.repeat(default_scalar(default, field.type), n)
    if not field.nullable and not pa.types.is_null(field.type):
        raise EvolutionError(f"column {field.name!r} has no default and is not nullable")
    return pa.nulls(n, field.type)


def default_scalar(default: Any, typ: pa.DataType) -> pa.Scalar:
    """An Avro/JSON default value (in its JSON form) as an Arrow scalar of the column type."""
    return pa.scalar(_default_py(default, typ), typ)


def _default_py(d: Any, t: pa.DataType) -> Any:
    if d is None:
        return None
    if pa.types.is_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_large_binary(t):
        # Avro writes byte defaults as strings of code points 0-255.
        return d.encode("latin-1") if isinstance(d, str) else base64.b64decode(d)
    if pa.types.is_decimal(t):
        if isinstance(d, str):
            raw = d.encode("latin-1")
            return decimal.Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-t.scale)
        return decimal.Decimal(str(d))
    if pa.types.is_date32(t):
        return datetime.date(1970, 1, 1) + datetime.timedelta(days=d) if isinstance(d, int) else datetime.date.fromisoformat(d)
    if pa.types.is_struct(t):
        return {t.field(i).name: _default_py(d.get(t.field(i).name), t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_list(t):
        return [_default_py(x, t.value_type) for x in d]
    if pa.types.is_map(t):
        return [(k, _default_py(v, t.item_type)) for k, v in d.items()]
    return d
