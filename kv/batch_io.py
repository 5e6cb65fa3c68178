"""Arrow binary arrays <-> the lists of bytes the RocksDB binding takes and gives, and the
storage keys of integer key columns, each in one pass over a whole batch.

A batched lookup asks RocksDB for 1,000 keys: the binding wants a list of bytes in key
order and answers with a list of bytes-or-None in that order. Doing the reorder, the
list conversions and the key encoding with separate pyarrow calls cost about as much as
the multi-get itself; the compiled steps (kv/_kvbatch.c) do each in one pass. Without the
compiled module (no compiler at install) the pyarrow/NumPy versions here run instead;
they are also the reference the tests hold the compiled ones to.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:
    from fluvial.kv import _kvbatch as _native
except ImportError:  # pragma: no cover - built by setup.py wherever a C compiler exists
    _native = None

USE_NATIVE = _native is not None


def _buffers(values: pa.Array) -> tuple[np.ndarray, memoryview]:
    """(int32 offsets, data) of a binary array, its slice offset applied to the offsets."""
    n = len(values)
    _, obuf, dbuf = values.buffers()
    offsets = np.frombuffer(obuf, np.int32, n + 1, values.offset * 4)
    return offsets, (memoryview(dbuf) if dbuf is not None else memoryview(b""))


def key_order(keys: pa.Array, skip: int = 0) -> np.ndarray:
    """Positions of binary keys (no nulls) in byte order, for a RocksDB multi-get: ordered by
    their bytes `skip` to `skip` + 8 (zero-padded), ties kept in position order. Any order
    gives the same answers; byte order lets RocksDB visit each block once, and the first
    bytes after the common prefix are where storage keys differ."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not USE_NATIVE or keys.null_count or keys.type != pa.binary():
        return pc.array_sort_indices(keys).to_numpy()
    offsets, data = _buffers(keys)
    prefixes = np.frombuffer(_native.key_prefixes(offsets, data, skip), np.uint64, len(keys))
    return np.argsort(prefixes, kind="stable")


def murmur2_reheaded(keys: pa.Array, skip: int, header: bytes) -> np.ndarray | None:
    """Kafka's murmur2 (uint32) of each key with its first `skip` bytes replaced by `header`
    (a storage key as the Kafka key it stands for), in one pass; None without the
    compiled module (the caller then builds the Kafka keys)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not USE_NATIVE or keys.null_count or keys.type != pa.binary():
        return None
    offsets, data = _buffers(keys)
    return np.frombuffer(_native.murmur2_keys(offsets, data, skip, header), np.uint32, len(keys))


def take_bytes(values: pa.Array, order: np.ndarray | None = None) -> list[bytes]:
    """The values of a binary array (no nulls) at positions `order` (all, in order, when
    None), as a list of bytes."""
    if order is None:
        order = np.arange(len(values), dtype=np.int64)
    order = np.ascontiguousarray(order, np.int64)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not USE_NATIVE or values.null_count or values.type != pa.binary():
        return values.take(pa.array(order)).to_pylist()
    offsets, data = _buffers(values)
    return _native.gather_bytes(offsets, data, order)


def take_binary(values: pa.Array, rows: np.ndarray) -> pa.Array:
    """`values.take(rows)` for a binary array without nulls, in one pass (Arrow's `take`
    costs tens of microseconds per call before any work)."""
    rows = np.ascontiguousarray(rows, np.int64)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not USE_NATIVE or values.null_count or values.type != pa.binary():
        return values.take(pa.array(rows))
    offsets, data = _buffers(values)
    new_offsets, body = _native.take_binary(offsets, data, rows)
    return pa.Array.from_buffers(pa.binary(), len(rows), [None, pa.py_buffer(new_offsets), pa.py_buffer(body)])


def binary_at(values: list[bytes | None], order: np.ndarray | None = None) -> pa.BinaryArray:
    """A binary array holding `values[i]` at position `order[i]` (a permutation; None:
    position i), null where a value is None."""
    if order is not None:
        order = np.ascontiguousarray(order, np.int64)
    if not USE_NATIVE:
        arr = pa.array(values, pa.binary())
        if order is None:
            return arr
        back = np.empty(len(values), np.int64)
        back[order] = np.arange(len(values))
        return arr.take(pa.array(back))
    validity, offsets, data, nulls = _native.scatter_bytes(values, order)
    return pa.Array.from_buffers(pa.binary(), len(values),
                                 [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets),
                                  pa.py_buffer(data)], null_count=nulls)


def long_keys(prefix: bytes, columns: list[np.ndarray]) -> pa.BinaryArray:
    """Per row: `prefix`, then each column's value as an Avro zig-zag varint (what the Avro
    encoder writes for int and long fields); `columns`: int64 arrays of one length."""
    columns = [np.ascontiguousarray(c, np.int64) for c in columns]
    n = len(columns[0]) if columns else 0
    if USE_NATIVE:
        offsets, data, _ = _native.encode_long_keys(prefix, columns)
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return _long_keys_numpy(prefix, columns, n)


def _long_keys_numpy(prefix: bytes, columns: list[np.ndarray], n: int) -> pa.BinaryArray:
    """`long_keys` in NumPy: up to 10 vectorised steps per column (one per varint byte)."""
    zig = [((c.astype(np.int64) << 1) ^ (c.astype(np.int64) >> 63)).view(np.uint64) for c in columns]
    sizes = [np.maximum(1, (64 - _leading_zeros(z) + 6) // 7) for z in zig]
    row_len = len(prefix) + sum(sizes, np.zeros(n, np.int64))
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(row_len, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), np.uint8)
    at = offsets[:-1].copy()
    for j, b in enumerate(prefix):
        out[at + j] = b
    at += len(prefix)
    for z, size in zip(zig, sizes):
        for j in range(10):
            rows = np.flatnonzero(size > j)
            if rows.size == 0:
                break
            byte = ((z[rows] >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
            byte |= np.where(size[rows] > j + 1, 0x80, 0).astype(np.uint8)
            out[at[rows] + j] = byte
        at += size
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(out)])


def _leading_zeros(z: np.ndarray) -> np.ndarray:
    """Leading zero bits of uint64 values (64 for 0)."""
    bits = np.zeros(z.shape, np.int64)
    v = z.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        big = v >= (np.uint64(1) << np.uint64(shift))
        bits[big] += shift
        v[big] >>= np.uint64(shift)
    bits += (v > 0)
    return 64 - bits
