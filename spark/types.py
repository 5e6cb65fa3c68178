"""Arrow <-> Spark types: a table's Arrow schema as a Spark schema, and Arrow batches in the exact layout Spark expects."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pt
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType, BinaryType, BooleanType, ByteType, DataType, DateType, DecimalType, DoubleType, FloatType,
    IntegerType, LongType, MapType, NullType, ShortType, StringType, StructField, StructType, TimestampNTZType,
    TimestampType,
)

# What `includeMetadata` adds after the user columns, in this order.
METADATA_FIELDS = (
    pa.field("_offset", pa.int64(), nullable=False),
    pa.field("_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("_change", pa.int8(), nullable=False),
    pa.field("_bucket", pa.int32(), nullable=False),
)


class UnsupportedTypeError(TypeError):
    """An Arrow type Spark has no type for."""


def spark_type(t: pa.DataType) -> DataType:
    """The Spark type of an Arrow type. Times of day become their integer count (milliseconds
    in an int, microseconds in a long), as Spark's own Avro reader gives them."""
    if pt.is_dictionary(t):
        return spark_type(t.value_type)
    if pt.is_boolean(t):
        return BooleanType()
    simple = {pa.int8(): ByteType(), pa.int16(): ShortType(), pa.int32(): IntegerType(), pa.int64(): LongType(),
              pa.uint8(): ShortType(), pa.uint16(): IntegerType(), pa.uint32(): LongType(),
              pa.float32(): FloatType(), pa.float64(): DoubleType(), pa.date32(): DateType(),
              pa.date64(): DateType(), pa.null(): NullType()}
    if t in simple:
        return simple[t]
    if t == pa.uint64():
        return DecimalType(20, 0)
    if pt.is_string(t) or pt.is_large_string(t) or pt.is_string_view(t):
        return StringType()
    if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t) or pt.is_binary_view(t):
        return BinaryType()
    if pt.is_decimal(t):
        if t.precision > 38:
            raise UnsupportedTypeError(f"{t}: Spark decimals hold at most 38 digits")
        return DecimalType(t.precision, t.scale)
    if pt.is_time32(t):
        return IntegerType()
    if pt.is_time64(t):
        return LongType()
    if pt.is_timestamp(t):
        return TimestampType() if t.tz is not None else TimestampNTZType()
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        return ArrayType(spark_type(t.value_type), t.value_field.nullable)
    if pt.is_map(t):
        return MapType(spark_type(t.key_type), spark_type(t.item_type), t.item_field.nullable)
    if pt.is_struct(t):
        return StructType([spark_field(t.field(i)) for i in range(t.num_fields)])
    raise UnsupportedTypeError(f"Spark has no type for Arrow's {t}")


def spark_field(f: pa.Field) -> StructField:
    return StructField(f.name, spark_type(f.type), f.nullable)


def spark_schema(schema: pa.Schema | list[pa.Field]) -> StructType:
    return StructType([spark_field(f) for f in schema])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark requires of the batches a data source yields (UTC timestamps in
    microseconds, nullability as declared)."""
    return to_arrow_schema(schema, timezone="UTC")


def _as_storage(column: pa.Array) -> pa.Array:
    """Arrow types Spark has no direct form of, as the values Spark's type holds."""
    t = column.type
    if pt.is_dictionary(t):
        return column.dictionary_decode()
    if pt.is_time32(t):
        return column.view(pa.int32())
    if pt.is_time64(t):
        return column.view(pa.int64())
    if pt.is_fixed_size_binary(t):
        return column.cast(pa.binary())
    return column


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """`batch` in Spark's layout (`target`): same names and order, Spark's Arrow types, and
    Spark's nullability (a cast, column by column, never row by row)."""
    if batch.schema.equals(target):
        return batch
    columns = []
    for f in target:
        column = _as_storage(batch.column(f.name))
        if not column.type.equals(f.type):
            column = column.cast(f.type)
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=target)


def same_type(a: DataType, b: DataType) -> bool:
    """Spark types equal up to nullability inside nested types."""
    if isinstance(a, StructType) and isinstance(b, StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and same_type(x.dataType, y.dataType) for x, y in zip(a.fields, b.fields))
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return same_type(a.elementType, b.elementType)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return same_type(a.keyType, b.keyType) and same_type(a.valueType, b.valueType)
    return a == b
