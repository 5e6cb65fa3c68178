"""Rows of a primary-key table <-> RocksDB keys and values, whole batches at a time.

A value is a 2-byte row schema number followed by the row's Avro body (the top bit of the
number is a flag a merge engine may set, `ROW_FLAG`: readers ignore it); the schema
numbers are kept in the tablet, so rows written before a schema change are read back
evolved to the current columns. A key is the Avro body of the primary-key columns with
the bucket-key columns first: Avro fields are self-delimiting, so the keys of all rows
sharing a bucket key start with the same bytes, which is what a prefix lookup scans.
"""
from __future__ import annotations

import functools
import json

import numpy as np
import pyarrow as pa

from fluvial.errors import InvalidRecordError
from fluvial.kv.batch_io import long_keys
from fluvial.schema import avro_binary
from fluvial.schema.arrow_mapping import arrow_to_avro
from fluvial.schema.avro_binary import DecodeErrors, decode_avro, encode_avro
from fluvial.schema.evolution import evolve_array
from fluvial.schema.registry import parse_schema

DATA_PREFIX = b"d"
ROW_FLAG = 0x80  # on a value's first byte: the merge engine keeps more state for the key (ignored by readers)


@functools.lru_cache(maxsize=256)
def _avro_node(schema_bytes: bytes):
    schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
    return parse_schema(json.dumps(arrow_to_avro(schema, "Row")), "AVRO").avro.root


def avro_node(schema: pa.Schema):
    """The Avro writer node of an Arrow schema (cached by the schema's IPC form)."""
    return _avro_node(schema.serialize().to_pybytes())


def struct_of(data: pa.RecordBatch | pa.Table | pa.StructArray) -> pa.StructArray:
    if isinstance(data, pa.Table):
        data = data.combine_chunks()
        data = data.to_batches()[0] if data.num_rows else pa.RecordBatch.from_pylist([], data.schema)
    if isinstance(data, pa.RecordBatch):
        return pa.StructArray.from_arrays(data.columns, fields=list(data.schema))
    if isinstance(data, pa.ChunkedArray):
        return data.combine_chunks()
    return data


def _value_bounds(values: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, data) of a binary array's values, the data not copied (the decoder
    pads its own copy where it needs one)."""
    n = len(values)
    _, obuf, dbuf = values.buffers()
    offsets = np.frombuffer(obuf, np.int32, n + 1, values.offset * 4).astype(np.int64)
    data = np.frombuffer(dbuf, np.uint8) if dbuf is not None else np.zeros(0, np.uint8)
    return offsets[:-1], offsets[1:], data


def decode_bodies(schema: pa.Schema, values: pa.Array, skip: int, node=None,
                  bounds: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> pa.StructArray:
    """Decode Avro row bodies (after `skip` header bytes) written with `schema` (whose
    Avro node the caller may pass: it is then not looked up again; `bounds`: the values'
    `_value_bounds` when the caller has them)."""
    start, end, data = bounds if bounds is not None else _value_bounds(values)
    errors = DecodeErrors(np.full(len(values), -1, np.int64))
    arr = decode_avro(node or avro_node(schema), data, start + skip, end, np.arange(len(values)), errors)
    problems = errors.by_record()
    if problems:
        raise ValueError(f"stored row {problems[0][0]} cannot be read: {problems[0][1]}")
    return arr


# Without the compiled decoder, up to this many rows (point lookups) decode row by row:
# the NumPy decoder's fixed cost per call is larger than a few rows' worth of per-row
# work. The compiled one (schema/_avro.c) is faster than fastavro already for one row
# (about 60 vs 110 us), so it decodes every batch when present.
FEW_ROWS = 0 if avro_binary.USE_NATIVE else 16


@functools.lru_cache(maxsize=256)
def _fastavro_schema(schema_bytes: bytes):
    import fastavro
    schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
    return fastavro.parse_schema(arrow_to_avro(schema, "Row"))


def _decode_few(schema: pa.Schema, values: pa.Array, parsed=None) -> pa.StructArray | None:
    """Row-by-row decoding of a handful of values; None where the vectorized path must decide."""
    try:
        import io

        import fastavro
        parsed = parsed or _fastavro_schema(schema.serialize().to_pybytes())
        rows = [fastavro.schemaless_reader(io.BytesIO(v[2:]), parsed) for v in values.to_pylist()]
        table = pa.Table.from_pylist(rows, schema=schema)
        return pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], fields=list(schema))
    except Exception:  # noqa: BLE001 - types fastavro maps differently: the exact decoder decides
        return None


class RowCodec:
    """Current rows <-> RocksDB values; `schemas` maps row schema numbers to the schemas
    rows were written with (the tablet persists it)."""

    def __init__(self, schema: pa.Schema, schemas: dict[int, pa.Schema]):
        self.schema = schema
        self.schemas = dict(schemas)
        self.number = next((n for n, s in self.schemas.items() if s.equals(schema)), None)
        if self.number is None:
            self.number = max(self.schemas, default=0) + 1
            self.schemas[self.number] = schema
        self._header = int(self.number).to_bytes(2, "big")
        self._row_field = pa.field("row", pa.struct(list(schema)), False)
        # Per-schema decoding work (Avro nodes, fastavro schemas) is done once per codec,
        # not per lookup: a single-key lookup would otherwise spend most of its time here.
        self._node = avro_node(schema)
        self._nodes: dict[int, object] = {self.number: self._node}
        self._parsed: dict[int, object] = {}

    def encode(self, rows: pa.StructArray) -> pa.Array:
        # The header is joined in the encoder's own pass (no second copy of every value).
        return encode_avro(self._node, rows, self._header)

    def decode(self, values: pa.Array) -> pa.StructArray:
        """Values (no nulls) to rows in the current schema."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        n = len(values)
        if n == 0:
            return pa.array([], self._row_field.type)
        bounds = _value_bounds(values)
        start, end, data = bounds
        short = np.flatnonzero(end - start < 2)
        if short.size:
            raise ValueError(f"stored row {int(short[0])} cannot be read: shorter than its 2-byte schema header")
        numbers = ((data[start].astype(np.int32) & 0x7F) << 8) | data[start + 1]
        if numbers.min() == numbers.max():  # one row schema (the common case): no grouping
            return self._decode_group(int(numbers[0]), values, bounds)
        uniq = np.unique(numbers)
        parts, order = [], []
        for number in uniq:
            rows = np.flatnonzero(numbers == number)
            parts.append(self._decode_group(int(number), values.take(pa.array(rows))))
            order.append(rows)
        perm = np.empty(n, np.int64)
        perm[np.concatenate(order)] = np.arange(n)
        return pa.concat_arrays(parts).take(pa.array(perm))

    def decode_one(self, value: bytes) -> pa.StructArray:
        """One stored value to a one-row array in the current schema (a point lookup). Rows
        of the current row schema go straight to the compiled decoder, without the batch
        path's array bookkeeping (~7 vs ~24 us); anything else (older row schemas, no
        compiled decoder, a value it refuses) takes `decode`, which gives the same rows and
        the same errors."""
        if (len(value) >= 2 and ((value[0] & 0x7F) << 8 | value[1]) == self.number
                and avro_binary.USE_NATIVE):
            arr = avro_binary.decode_native_one(self._node, value, 2)
            if arr is not None:
                return arr
        return self.decode(pa.array([value], pa.binary()))

    def _decode_group(self, number: int, values: pa.Array, bounds=None) -> pa.StructArray:
        schema = self.schemas.get(number)
        if schema is None:
            raise ValueError(f"stored row uses unknown row schema number {number}")
        arr = None
        if len(values) <= FEW_ROWS:
            parsed = self._parsed.get(number)
            if parsed is None:
                parsed = self._parsed[number] = _fastavro_schema(schema.serialize().to_pybytes())
            arr = _decode_few(schema, values, parsed)
        if arr is None:
            node = self._nodes.get(number)
            if node is None:
                node = self._nodes[number] = avro_node(schema)
            arr = decode_bodies(schema, values, 2, node, bounds)
        return evolve_array(arr, self._row_field) if number != self.number else arr


# Up to this many keys, keys of plain column types encode one by one (see `_few_keys`).
FEW_KEYS = 8
_INT_KEY_TYPES = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_PLAIN_KEY_TYPES = (*_INT_KEY_TYPES, pa.string(), pa.binary())


def _varint(v: int, out: bytearray) -> None:
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


class KeyLayout:
    """The primary key (bucket-key columns first) of a table and its storage key encoding."""

    def __init__(self, schema: pa.Schema, primary_key: list[str], bucket_key: list[str] | None = None):
        bucket_key = list(bucket_key or primary_key)
        self.primary_key = list(primary_key)
        self.bucket_key = bucket_key
        # Storage order: the bucket key as a prefix, then the rest of the primary key.
        self.storage_order = bucket_key + [c for c in primary_key if c not in bucket_key]
        self.key_schema = pa.schema([schema.field(c).with_nullable(False) for c in self.storage_order])
        self.prefix_schema = pa.schema([schema.field(c).with_nullable(False) for c in bucket_key])
        self._nodes = {id(self.key_schema): avro_node(self.key_schema), id(self.prefix_schema): avro_node(self.prefix_schema)}
        # Key columns whose Avro form is a zigzag varint or a length-prefixed byte string.
        self._plain_key = all(f.type in _PLAIN_KEY_TYPES for f in self.key_schema)
        # Keys of integer columns only: encoded by batch_io.long_keys in one pass.
        self._long_key = all(f.type in _INT_KEY_TYPES for f in self.key_schema)

    def check_keys(self, data: pa.RecordBatch | pa.Table, what: str = "row", columns: list[str] | None = None) -> None:
        """Refuse batches without every key column, or with a null in one (InvalidRecordError)."""
        columns = columns or self.primary_key
        names = data.schema.names  # built anew by every access
        missing = [c for c in columns if c not in names]
        if missing:
            raise InvalidRecordError(f"{what}s lack primary-key column(s) {missing} (primary key {self.primary_key})")
        for c in columns:
            col = data.column(c)
            if col.null_count:
                first = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                raise InvalidRecordError(f"{what} {first}: primary-key column {c!r} is null",
                                         record_errors=[(first, f"primary-key column {c!r} is null")])

    def _encode(self, data, schema: pa.Schema) -> pa.Array:
        cols = []
        for f in schema:
            col = data.column(f.name)
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise InvalidRecordError(
                        f"key column {f.name!r} has type {col.type}, the table's is {f.type}: {exc}") from None
            cols.append(col)
        arr = pa.StructArray.from_arrays(cols, fields=list(schema))
        return encode_avro(self._nodes[id(schema)], arr, DATA_PREFIX)

    def storage_keys(self, data: pa.RecordBatch | pa.Table) -> pa.Array:
        """RocksDB keys of the rows (or key rows) of `data`."""
        if data.num_rows <= FEW_KEYS and self._plain_key:
            few = self._few_keys(data)
            if few is not None:
                return few
        if self._long_key:
            longs = self._long_keys(data)
            if longs is not None:
                return longs
        return self._encode(data, self.key_schema)

    def _long_keys(self, data) -> pa.Array | None:
        """Keys of integer columns already of the key's types and without nulls, encoded in
        one pass (the same bytes as the Avro encoder); None: the Avro encoder decides."""
        columns = []
        for f in self.key_schema:
            col = data.column(f.name)
            if col.type != f.type or col.null_count:
                return None
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            columns.append(col.to_numpy().astype(np.int64, copy=False))
        return long_keys(DATA_PREFIX, columns)

    def _few_keys(self, data) -> pa.Array | None:
        """Point-lookup keys of integer, string and binary columns already of the key's
        types, encoded key by key: the same bytes as the array encoder, whose fixed cost
        per call (~40 us) is most of a point lookup's key work. None: the array path decides."""
        keys = self.few_key_bytes(data)
        return None if keys is None else pa.array(keys, pa.binary())

    def few_key_bytes(self, data) -> list[bytes] | None:
        """`_few_keys` as a list of bytes (a single-key lookup reads RocksDB with them
        directly); None where the array path decides (other key types, nulls, a key column
        missing or named twice): a list returned means `check_keys` passes."""
        if not self._plain_key:
            return None
        columns = []
        schema = data.schema
        for f in self.key_schema:
            i = schema.get_field_index(f.name)
            if i < 0:
                return None
            col = data.column(i)
            if col.type != f.type:
                return None
            columns.append(col.to_pylist())
        keys = []
        for values in zip(*columns):
            out = bytearray(DATA_PREFIX)
            for v in values:
                if v is None:
                    return None
                if isinstance(v, int):
                    _varint((v << 1) ^ (v >> 63), out)
                else:
                    raw = v.encode() if isinstance(v, str) else v
                    _varint(len(raw) << 1, out)
                    out += raw
            keys.append(bytes(out))
        return keys

    def prefix_keys(self, data: pa.RecordBatch | pa.Table) -> pa.Array:
        """RocksDB key prefixes of bucket-key rows."""
        return self._encode(data, self.prefix_schema)

    def decode_keys(self, keys: pa.Array) -> pa.StructArray:
        return decode_bodies(self.key_schema, keys, len(DATA_PREFIX), self._nodes[id(self.key_schema)])
