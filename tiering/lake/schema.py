"""Fluvial table columns -> lake table columns (Arrow types Iceberg can hold), and batches conformed to them.

A log table's lake table holds its user columns, then `_bucket`, `_offset` and
`_timestamp` (`_bucket` and `_offset` name a row's place in the log: the union read joins
lake and log on them); a primary-key table's holds its user columns only, the primary key as
Iceberg identifier fields: the lake keeps the current row of each key.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pt

BUCKET, OFFSET, TIMESTAMP, CHANGE = "_bucket", "_offset", "_timestamp", "_change"
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

# Changelog kinds (`_change`) after which a key has no row: -U (update before) and -D.
GONE_CHANGES = (2, 4)


class LakeSchemaError(ValueError):
    """A column type the lake format cannot hold."""


def lake_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type a column has in the lake table (what Iceberg's types map back to).

    Iceberg has no unsigned integers (widened; uint64 as decimal(20, 0)), keeps times and
    timestamps in microseconds, and has no dictionary, view or large variants.
    """
    if pt.is_dictionary(t):
        return lake_type(t.value_type)
    if pt.is_boolean(t) or t in (pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.date32()):
        return t
    if t in (pa.int8(), pa.int16(), pa.uint8(), pa.uint16()):
        return pa.int32()
    if t == pa.uint32():
        return pa.int64()
    if t == pa.uint64():
        return pa.decimal128(20, 0)
    if t == pa.float16():
        return pa.float32()
    if t == pa.date64():
        return pa.date32()
    if pt.is_string(t) or pt.is_large_string(t) or pt.is_string_view(t):
        return pa.string()
    if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_binary_view(t):
        return pa.binary()
    if pt.is_fixed_size_binary(t):
        return t
    if pt.is_decimal(t):
        if t.precision > 38:
            raise LakeSchemaError(f"{t}: Iceberg decimals hold at most 38 digits")
        return pa.decimal128(t.precision, t.scale)
    if pt.is_time(t):
        return pa.time64("us")
    if pt.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz is not None else None)
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t) or pt.is_list_view(t):
        return pa.list_(lake_field(t.value_field))
    if pt.is_map(t):
        return pa.map_(lake_type(t.key_type), lake_field(t.item_field))
    if pt.is_struct(t):
        return pa.struct([lake_field(t.field(i)) for i in range(t.num_fields)])
    raise LakeSchemaError(f"column type {t} has no Iceberg type")


def lake_field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, lake_type(f.type), f.nullable)


def lake_arrow_schema(user_schema: pa.Schema, primary_key: list[str] | None, raw: bool) -> pa.Schema:
    """The lake table's columns for a Fluvial table with these user columns."""
    fields = [lake_field(f.remove_metadata()) for f in user_schema]
    if primary_key:
        # Identifier fields must be required in Iceberg.
        return pa.schema([f.with_nullable(False) if f.name in primary_key else f for f in fields])
    system = [pa.field(BUCKET, pa.int32(), False), pa.field(OFFSET, pa.int64(), False),
              pa.field(TIMESTAMP, TIMESTAMP_TYPE, False)]
    return pa.schema(fields + system)


def read_columns(user_schema: pa.Schema, primary_key: list[str] | None, raw: bool) -> list[str]:
    """The columns a tiering round reads from the table."""
    users = list(user_schema.names)
    if primary_key:
        return users + [OFFSET, CHANGE]
    return users + [BUCKET, OFFSET, TIMESTAMP]


def conform(data: pa.Table | pa.RecordBatch, target: pa.Schema) -> pa.Table:
    """`data` with exactly the target's columns in its order and types; columns it lacks
    (older rows of an evolved table) become nulls."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    columns = []
    for f in target:
        if f.name in data.column_names:
            col = data.column(f.name)
            columns.append(col if col.type == f.type else col.cast(f.type))
        else:
            columns.append(pa.nulls(data.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=target)
