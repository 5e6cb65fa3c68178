"""Per-batch column statistics (min, max, null count) that let scans skip whole batches."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:
    from fluvial.broker.log import _bounds as _native
except ImportError:  # not built: NumPy reductions
    _native = None

STATS_KEY = b"fluvial.stats"


@dataclass(frozen=True, slots=True)
class ColumnStats:
    """Bounds of one column in one batch; min/max are None when every value is null."""

    min: int | float | bool | None
    max: int | float | bool | None
    null_count: int


def _has_stats(arrow_type: pa.DataType) -> bool:
    # Numbers, booleans and temporal types: cheap to compute and small to store. Strings
    # and binaries are left out: their bounds could be as long as the values.
    return (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_timestamp(arrow_type)
        or pa.types.is_date(arrow_type)
        or pa.types.is_time(arrow_type)
        or pa.types.is_duration(arrow_type)
    )


def _as_plain(array: pa.Array) -> pa.Array:
    """Temporal columns as their integer storage, so bounds are plain JSON numbers."""
    arrow_type = array.type
    if pa.types.is_temporal(arrow_type) or pa.types.is_duration(arrow_type):
        width = arrow_type.bit_width
        return array.view(pa.int64() if width == 64 else pa.int32())
    return array


# NumPy views of the data buffer of fixed-width columns without nulls: the bounds in one
# reduction each, without the Arrow array a temporal column's view would make, and floats
# without Arrow's min_max kernel (several times slower per call on batch-sized columns).
_NUMPY_DTYPES = {
    pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
    pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
    pa.float32(): np.float32, pa.float64(): np.float64,
}


def _numpy_dtype(arrow_type: pa.DataType):
    dtype = _NUMPY_DTYPES.get(arrow_type)
    if dtype is None and (pa.types.is_temporal(arrow_type) or pa.types.is_duration(arrow_type)):
        dtype = np.int64 if arrow_type.bit_width == 64 else np.int32
    return dtype


# The struct letter of each NumPy dtype, for the compiled bounds (`broker/log/_bounds.c`).
_CODES = {np.int8: "b", np.int16: "h", np.int32: "i", np.int64: "q", np.uint8: "B", np.uint16: "H",
          np.uint32: "I", np.uint64: "Q", np.float32: "f", np.float64: "d"}
USE_NATIVE = _native is not None


def _dense_bounds(array: pa.Array) -> tuple | None:
    """(min, max) of a column without nulls, or None when the general path must decide (a
    type without a NumPy view, floats holding NaN, which Arrow's bounds skip). Compiled:
    one pass per column holding the GIL, where two NumPy reductions cost more in calls
    (and GIL hand-offs) than in work at batch sizes."""
    arrow_type = array.type
    if pa.types.is_boolean(arrow_type):
        return array.false_count == 0, array.true_count > 0
    dtype = _numpy_dtype(arrow_type)
    if dtype is None:
        return None
    if USE_NATIVE:
        return _native.bounds(array.buffers()[1], _CODES[dtype], array.offset, len(array))
    size = np.dtype(dtype).itemsize
    values = np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * size)
    low, high = values.min().item(), values.max().item()
    if isinstance(low, float) and (math.isnan(low) or math.isnan(high)):
        return None
    return low, high


def stats_columns(schema: pa.Schema) -> tuple[int, ...]:
    """Indexes of the columns that get statistics: user columns (names not starting with
    ``_``) of a type with cheap bounds. Callers appending many batches of one schema keep
    this, so a batch without such columns (a raw table's) costs nothing here."""
    return tuple(i for i, field in enumerate(schema)
                 if not field.name.startswith("_") and _has_stats(field.type))


def compute_stats(batch: pa.RecordBatch, columns: tuple[int, ...] | None = None) -> bytes:
    """Statistics of the user columns (names not starting with ``_``) as compact JSON; b"" if none.

    ``columns`` is ``stats_columns(batch.schema)`` when the caller has it already.
    """
    if columns is None:
        columns = stats_columns(batch.schema)
    if not columns:
        return b""
    stats: dict[str, list] = {}
    schema = batch.schema
    for i in columns:
        field = schema.field(i)
        array = batch.column(i)
        nulls = array.null_count
        if nulls == 0 and len(array):
            bounds = _dense_bounds(array)
            if bounds is not None:
                stats[field.name] = [*bounds, 0]
                continue
        array = _as_plain(array)
        if nulls == len(array):
            low = high = None
        elif nulls == 0 and pa.types.is_integer(array.type):
            values = array.to_numpy(zero_copy_only=True)
            low, high = values.min().item(), values.max().item()
        else:
            # Arrow skips nulls and NaN here.
            bounds = pc.min_max(array)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if isinstance(low, float) and (math.isnan(low) or math.isnan(high)):
            continue  # all NaN: no useful bounds
        stats[field.name] = [low, high, nulls]
    if not stats:
        return b""
    return json.dumps(stats, separators=(",", ":"), allow_nan=True).encode()


def decode_stats(data: bytes) -> dict[str, ColumnStats]:
    if not data:
        return {}
    return {name: ColumnStats(*values) for name, values in json.loads(data).items()}
