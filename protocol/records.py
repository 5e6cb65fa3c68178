"""Kafka record batch v2: split, parse, verify, decode to Arrow columns, and build back."""
from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import Literal

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.errors import CorruptRecordError, InvalidRecordError
from fluvial.protocol.compression import (MAX_DECOMPRESSED_BYTES, Compression, codec_from_id, compress,
                                         decompress_buffer)
from fluvial.protocol.varint import decode_varint, decode_varlong, encode_varint

try:
    from fluvial.protocol import _records as _native
    NATIVE_IMPORT_ERROR: str | None = None
except ImportError as _exc:  # the compiled codec is optional; the pure-Python one is the reference
    _native = None
    NATIVE_IMPORT_ERROR = str(_exc)

HAS_NATIVE = _native is not None
# Checking without decoding came later: a compiled module built from an older checkout
# lacks it, and the pure-Python check stands in until it is rebuilt.
_native_check = getattr(_native, "check_records", None)
_native_produced = getattr(_native, "check_produced", None)

Implementation = Literal["native", "python"]

MAGIC = 2
# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = _HEADER.size  # 61
# batchLength counts from just after itself.
LENGTH_END = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
# CRC-32C covers attributes to the end: the fields before it may be rewritten by the
# broker without touching the checksum.
CRC_START = 21
_MIN_BATCH_LENGTH = HEADER_SIZE - LENGTH_END
_CRC_COVERED = struct.Struct(">hiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_ATTRIBUTES = struct.Struct(">h")
_CRC = struct.Struct(">I")
_MAX_TIMESTAMP_OFFSET = 35

CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

HEADER_STRUCT_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(HEADER_STRUCT_TYPE)

Buffer = bytes | bytearray | memoryview


@dataclass(slots=True)
class BatchHeader:
    """The fixed 61-byte header of a record batch, field by field."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def compression(self) -> Compression:
        """The codec of the records section; an id Kafka does not define raises."""
        return codec_from_id(self.attributes & CODEC_MASK)

    @property
    def timestamp_type(self) -> int:
        """0 = CreateTime (set by the producer), 1 = LogAppendTime (set by the broker)."""
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def size(self) -> int:
        """Bytes the whole batch takes on the wire."""
        return LENGTH_END + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


@dataclass
class RecordColumns:
    """The records of one batch, column-wise; row i is the record at offset delta ``offset_delta[i]``.

    Decoded columns are zero-copy views of the decoder's buffers: the NumPy arrays are
    read-only (copy before changing them in place). The encoder takes any slice of
    Arrow arrays (string/large_binary are accepted for keys and values) and any
    integer NumPy arrays.
    """

    timestamp_delta: np.ndarray  # int64
    offset_delta: np.ndarray  # int32
    keys: pa.BinaryArray  # nullable
    values: pa.BinaryArray  # nullable
    headers: pa.ListArray  # list<struct<key: string (not null), value: binary (nullable)>>

    def __len__(self) -> int:
        return len(self.offset_delta)

    @classmethod
    def from_lists(
        cls,
        keys: list[bytes | None],
        values: list[bytes | None],
        headers: list[list[tuple[str, bytes | None]]] | None = None,
        timestamp_delta: list[int] | np.ndarray | None = None,
        offset_delta: list[int] | np.ndarray | None = None,
    ) -> RecordColumns:
        """Columns from Python lists (tests, control records, small batches); deltas default to 0 and 0..n-1."""
        n = len(values)
        if headers is None:
            headers = [[] for _ in range(n)]
        header_rows = [[{"key": k, "value": v} for k, v in row] for row in headers]
        return cls(
            timestamp_delta=np.zeros(n, np.int64) if timestamp_delta is None else np.asarray(timestamp_delta, np.int64),
            offset_delta=np.arange(n, dtype=np.int32) if offset_delta is None else np.asarray(offset_delta, np.int32),
            keys=pa.array(keys, pa.binary()),
            values=pa.array(values, pa.binary()),
            headers=pa.array(header_rows, HEADERS_TYPE),
        )


# ------------------------------------------------------------------ batch framing


def split_batches(data: Buffer) -> list[memoryview]:
    """Cut a records field into its batches (views, no copies); magic 0/1 and truncation are refused."""
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
    total = len(view)
    batches = []
    pos = 0
    while pos < total:
        if total - pos <= MAGIC_OFFSET:
            raise CorruptRecordError(f"record batch at byte {pos} truncated inside its header")
        magic = view[pos + MAGIC_OFFSET]
        if magic != MAGIC:
            raise CorruptRecordError(f"record batch at byte {pos} has magic {magic}; only magic 2 is accepted")
        if total - pos < HEADER_SIZE:
            raise CorruptRecordError(f"record batch at byte {pos} truncated inside its header")
        (batch_length,) = _LEADER_EPOCH.unpack_from(view, pos + 8)
        if batch_length < _MIN_BATCH_LENGTH:
            raise CorruptRecordError(f"record batch at byte {pos} declares length {batch_length}")
        end = pos + LENGTH_END + batch_length
        if end > total:
            raise CorruptRecordError(
                f"record batch at byte {pos} declares {batch_length} bytes but only {total - pos - LENGTH_END} follow"
            )
        batches.append(view[pos:end])
        pos = end
    return batches


def parse_batch_header(batch: Buffer) -> BatchHeader:
    """Read the batch header; the batch must hold at least the bytes its length declares."""
    if len(batch) < HEADER_SIZE:
        raise CorruptRecordError(f"record batch of {len(batch)} bytes is shorter than its {HEADER_SIZE}-byte header")
    header = BatchHeader(*_HEADER.unpack_from(batch, 0))
    if header.magic != MAGIC:
        raise CorruptRecordError(f"record batch has magic {header.magic}; only magic 2 is accepted")
    if header.batch_length < _MIN_BATCH_LENGTH or LENGTH_END + header.batch_length > len(batch):
        raise CorruptRecordError(f"record batch declares length {header.batch_length} but holds {len(batch) - LENGTH_END}")
    if header.records_count < 0:
        raise CorruptRecordError(f"record batch declares {header.records_count} records")
    return header


def check_produced(batch: Buffer) -> tuple | None:
    """The usual small produced batch checked in one compiled call (see _records.c):
    (attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id,
    producer_epoch, base_sequence, records_count, partition_leader_epoch, section,
    first_timestamp_delta, max_timestamp_delta) when ``batch`` is exactly one v2 batch
    that parse_batch_header, verify_crc, records_section and check_records_stats all
    accept, neither control nor transactional, uncompressed or one raw snappy block, its
    offset deltas 0..n-1; ``section`` is None when uncompressed. None for anything else
    (and when the module is not built): the step-by-step functions then decide."""
    if _native_produced is None:
        return None
    return _native_produced(batch, MAX_DECOMPRESSED_BYTES)


def verify_crc(batch: Buffer, header: BatchHeader) -> None:
    """Check the CRC-32C over attributes..end of the batch."""
    actual = crc32c.crc32c(memoryview(batch)[CRC_START:header.size])
    if actual != header.crc:
        raise CorruptRecordError(f"record batch CRC mismatch: stored {header.crc:#010x}, computed {actual:#010x}")


def set_base_offset(batch: bytearray | memoryview, base_offset: int, partition_leader_epoch: int) -> None:
    """Stamp the broker-assigned base offset and leader epoch in place; both lie outside the CRC."""
    _BASE_OFFSET.pack_into(batch, 0, base_offset)
    _LEADER_EPOCH.pack_into(batch, 12, partition_leader_epoch)


def set_log_append_time(batch: bytearray | memoryview, timestamp: int) -> None:
    """Mark a batch LogAppendTime with the broker's ``timestamp`` as its max timestamp, in place.

    Both fields are inside the CRC, so it is recomputed (the records are not touched).
    """
    view = memoryview(batch)
    (attributes,) = _ATTRIBUTES.unpack_from(view, CRC_START)
    _ATTRIBUTES.pack_into(view, CRC_START, attributes | TIMESTAMP_TYPE_MASK)
    _BASE_OFFSET.pack_into(view, _MAX_TIMESTAMP_OFFSET, timestamp)
    (batch_length,) = _LEADER_EPOCH.unpack_from(view, 8)
    _CRC.pack_into(view, CRC_OFFSET, crc32c.crc32c(view[CRC_START:LENGTH_END + batch_length]))


# ------------------------------------------------------------------ records section


def decode_records(batch: Buffer, header: BatchHeader, implementation: Implementation | None = None) -> RecordColumns:
    """Decompress and decode the records of a batch into columns."""
    records = memoryview(batch)[HEADER_SIZE:header.size]
    codec = header.compression
    if codec is not Compression.NONE:
        records = decompress_buffer(codec, records)
    return decode_records_section(records, header.records_count, implementation)


def records_section(batch: Buffer, header: BatchHeader) -> Buffer:
    """The (decompressed) records section of a batch."""
    records = memoryview(batch)[HEADER_SIZE:header.size]
    codec = header.compression
    if codec is not Compression.NONE:
        records = decompress_buffer(codec, records)
    return records


def check_records_stats(records: Buffer, count: int, implementation: Implementation | None = None
                        ) -> tuple[int, int, bool]:
    """Check ``count`` (>= 1) records as decode_records_section does (same errors) without
    building anything: (first timestamp delta, largest timestamp delta, offset deltas are
    0..count-1). The compiled scanner does it in its measuring pass alone."""
    if count < 1:
        raise CorruptRecordError(f"record count {count}: at least one record is checked")
    if implementation != "python" and _native_check is not None:
        return _native_check(records, count)
    ts_bytes, od_bytes = _pick("python", "decode_records", _decode_records_py)(records, count)[:2]
    ts = np.frombuffer(ts_bytes, np.int64)
    od = np.frombuffer(od_bytes, np.int32)
    return int(ts[0]), int(ts.max()), bool((od == np.arange(count, dtype=np.int32)).all())


def decode_records_section(records: Buffer, count: int, implementation: Implementation | None = None) -> RecordColumns:
    """Decode an uncompressed records section holding ``count`` records."""
    decoder = _pick(implementation, "decode_records", _decode_records_py)
    return _columns_from_buffers(count, decoder(records, count))


def encode_records_section(columns: RecordColumns, implementation: Implementation | None = None) -> bytes:
    """Write the uncompressed records section for ``columns``."""
    encoder = _pick(implementation, "encode_records", _encode_records_py)
    return encoder(*_encoder_arguments(columns))


def build_batch(
    *,
    base_offset: int,
    partition_leader_epoch: int,
    attributes: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    columns: RecordColumns,
    compression: Compression,
    last_offset_delta: int | None = None,
    compression_level: int | None = None,
    implementation: Implementation | None = None,
) -> bytes:
    """A complete batch with its CRC.

    ``attributes`` carries the timestamp type, transactional and control bits; its codec
    bits are ignored and replaced by ``compression``. ``last_offset_delta`` defaults to
    the last record's offset delta (0 for an empty batch); pass it to keep the span of
    a batch whose tail records were removed. ``compression_level`` defaults to
    ``compression.DEFAULT_LEVEL``. ``implementation`` forces the compiled or
    the pure-Python record writer (benchmarks, tests); by default the compiled one runs
    when it is built.
    """
    n = len(columns.offset_delta)
    records = encode_records_section(columns, implementation)
    compression = Compression(compression)
    if compression is not Compression.NONE:
        records = compress(compression, records, compression_level)
    if last_offset_delta is None:
        last_offset_delta = int(columns.offset_delta[-1]) if n else 0
    covered = _CRC_COVERED.pack(
        (attributes & ~CODEC_MASK) | compression,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        n,
    )
    crc = crc32c.crc32c(records, crc32c.crc32c(covered))
    head = struct.pack(
        ">qiibI", base_offset, HEADER_SIZE - LENGTH_END + len(records), partition_leader_epoch, MAGIC, crc
    )
    return b"".join((head, covered, records))


# ------------------------------------------------------------------ Arrow <-> flat buffers


def _pick(implementation: Implementation | None, name: str, fallback):
    if implementation == "python" or (implementation is None and _native is None):
        return fallback
    if _native is None:
        raise RuntimeError("the compiled record codec is not built")
    return getattr(_native, name)


def _columns_from_buffers(count: int, parts: tuple) -> RecordColumns:
    (ts, od, k_offsets, k_data, k_valid, k_nulls, v_offsets, v_data, v_valid, v_nulls,
     h_offsets, hk_offsets, hk_data, hv_offsets, hv_data, hv_valid, hv_nulls) = parts
    n_headers = (len(hk_offsets) // 4) - 1
    keys = _binary(_BINARY, count, k_valid, k_offsets, k_data, k_nulls)
    values = _binary(_BINARY, count, v_valid, v_offsets, v_data, v_nulls)
    if n_headers == 0:
        entries = _NO_HEADER_ENTRIES
    else:
        header_keys = _binary(_STRING, n_headers, None, hk_offsets, hk_data, 0)
        header_values = _binary(_BINARY, n_headers, hv_valid, hv_offsets, hv_data, hv_nulls)
        entries = pa.Array.from_buffers(HEADER_STRUCT_TYPE, n_headers, [None], 0, children=[header_keys, header_values])
    headers = pa.Array.from_buffers(HEADERS_TYPE, count, [None, pa.py_buffer(h_offsets)], 0, children=[entries])
    return RecordColumns(
        timestamp_delta=np.frombuffer(ts, np.int64),
        offset_delta=np.frombuffer(od, np.int32),
        keys=keys,
        values=values,
        headers=headers,
    )


_BINARY = pa.binary()
_STRING = pa.string()
# Most batches carry no headers; they all share one empty child array.
_NO_HEADER_ENTRIES = pa.array([], HEADER_STRUCT_TYPE)


def _binary(type_: pa.DataType, length: int, valid, offsets, data, nulls: int) -> pa.Array:
    return pa.Array.from_buffers(
        type_,
        length,
        [pa.py_buffer(valid) if valid is not None else None, pa.py_buffer(offsets), pa.py_buffer(data)],
        nulls,
    )


def _as_binary_array(column, what: str) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not isinstance(column, pa.Array):
        column = pa.array(column, pa.binary())
    if pa.types.is_binary(column.type):
        return column
    if pa.types.is_string(column.type):
        return column.view(pa.binary())
    if pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type) or pa.types.is_fixed_size_binary(column.type):
        return column.cast(pa.binary())
    raise TypeError(f"{what} must be a binary array, not {column.type}")


def _binary_parts(column: pa.Array) -> tuple:
    valid, offsets, data = column.buffers()
    if column.null_count == 0:
        valid = None
    return valid, offsets, data, column.offset


def _encoder_arguments(columns: RecordColumns) -> tuple:
    n = len(columns.offset_delta)
    ts = np.ascontiguousarray(columns.timestamp_delta, dtype=np.int64)
    od = np.ascontiguousarray(columns.offset_delta, dtype=np.int32)
    keys = _as_binary_array(columns.keys, "keys")
    values = _as_binary_array(columns.values, "values")
    headers = columns.headers
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    if not (len(ts) == len(keys) == len(values) == len(headers) == n):
        raise ValueError(
            f"record columns differ in length: timestamp_delta {len(ts)}, offset_delta {n}, "
            f"keys {len(keys)}, values {len(values)}, headers {len(headers)}"
        )
    # flatten() honours the list slice and drops entries under null lists, so counts
    # with nulls as 0 line up with it.
    entries = headers.flatten()
    n_headers = len(entries)
    if n_headers == 0:
        counts = None
        header_parts = (None, None, None, 0, None, None, None, 0)
    else:
        if entries.null_count:
            raise InvalidRecordError("a record header is null")
        counts = pc.list_value_length(headers).fill_null(0).cast(pa.int32()).to_numpy(zero_copy_only=False)
        header_keys = _as_binary_array(entries.field("key"), "header keys")
        header_values = _as_binary_array(entries.field("value"), "header values")
        header_parts = (*_binary_parts(header_keys), *_binary_parts(header_values))
    return (n, ts, od, *_binary_parts(keys), *_binary_parts(values), counts, n_headers, *header_parts)


# ------------------------------------------------------------------ pure-Python reference codec


def _decode_records_py(records: Buffer, count: int) -> tuple:
    """Same contract as the compiled ``decode_records``: flat buffers for ``count`` records."""
    data = bytes(records)
    end = len(data)
    if count < 0 or count > end // 7:
        raise CorruptRecordError(f"record count {count} does not fit in {end} bytes of records")

    def varint(pos: int, stop: int) -> tuple[int, int]:
        # Most varints in a batch are one byte; only the rest pay for the general reader.
        if pos < stop:
            byte = data[pos]
            if byte < 0x80:
                return (byte >> 1) ^ -(byte & 1), pos + 1
        return decode_varint(data, pos, stop)

    ts = array("q")
    od = array("i")
    k_offsets, v_offsets, h_offsets, hk_offsets, hv_offsets = (array("i", [0]) for _ in range(5))
    k_data, v_data, hk_data, hv_data = bytearray(), bytearray(), bytearray(), bytearray()
    k_valid = bytearray((count + 7) // 8)
    v_valid = bytearray((count + 7) // 8)
    hv_valid = bytearray()
    k_nulls = v_nulls = hv_nulls = 0
    n_headers = 0
    pos = 0
    i = 0
    try:
        for i in range(count):
            length, pos = varint(pos, end)
            if length < 6 or length > end - pos:
                raise CorruptRecordError("record length out of bounds")
            rend = pos + length
            pos += 1  # record attributes: unused by Kafka
            delta, pos = decode_varlong(data, pos, rend)
            ts.append(delta)
            delta, pos = varint(pos, rend)
            od.append(delta)
            size, pos = varint(pos, rend)
            if size < -1 or size > rend - pos:
                raise CorruptRecordError("key length out of bounds")
            if size >= 0:
                k_data += data[pos:pos + size]
                pos += size
                k_valid[i >> 3] |= 1 << (i & 7)
            else:
                k_nulls += 1
            k_offsets.append(len(k_data))
            size, pos = varint(pos, rend)
            if size < -1 or size > rend - pos:
                raise CorruptRecordError("value length out of bounds")
            if size >= 0:
                v_data += data[pos:pos + size]
                pos += size
                v_valid[i >> 3] |= 1 << (i & 7)
            else:
                v_nulls += 1
            v_offsets.append(len(v_data))
            header_count, pos = varint(pos, rend)
            if header_count < 0 or header_count > (rend - pos) // 2:
                raise CorruptRecordError("header count out of bounds")
            for _ in range(header_count):
                size, pos = varint(pos, rend)
                if size < 0 or size > rend - pos:
                    raise CorruptRecordError("null header key" if size == -1 else "header key length out of bounds")
                key = data[pos:pos + size]
                try:
                    key.decode("utf-8")
                except UnicodeDecodeError:
                    raise InvalidRecordError(f"record {i}: header key is not valid UTF-8") from None
                hk_data += key
                hk_offsets.append(len(hk_data))
                pos += size
                size, pos = varint(pos, rend)
                if size < -1 or size > rend - pos:
                    raise CorruptRecordError("header value length out of bounds")
                if n_headers % 8 == 0:
                    hv_valid.append(0)
                if size >= 0:
                    hv_data += data[pos:pos + size]
                    pos += size
                    hv_valid[n_headers >> 3] |= 1 << (n_headers & 7)
                else:
                    hv_nulls += 1
                hv_offsets.append(len(hv_data))
                n_headers += 1
            if pos != rend:
                raise CorruptRecordError("record length does not match its fields")
            h_offsets.append(n_headers)
        if pos != end:
            i = count
            raise CorruptRecordError("bytes left after the declared number of records")
    except CorruptRecordError as exc:
        raise CorruptRecordError(f"record {i}: {exc}") from None
    return (
        ts.tobytes(), od.tobytes(),
        k_offsets.tobytes(), bytes(k_data), bytes(k_valid) if k_nulls else None, k_nulls,
        v_offsets.tobytes(), bytes(v_data), bytes(v_valid) if v_nulls else None, v_nulls,
        h_offsets.tobytes(), hk_offsets.tobytes(), bytes(hk_data),
        hv_offsets.tobytes(), bytes(hv_data), bytes(hv_valid) if hv_nulls else None, hv_nulls,
    )


class _BinaryView:
    """Element access to a binary Arrow array through its raw buffers, as the C writer does it."""

    def __init__(self, valid, offsets, data, offset: int, length: int, what: str):
        self.valid = bytes(valid) if valid is not None else None
        raw = memoryview(offsets).cast("B") if offsets is not None else memoryview(b"")
        self.offsets = raw[: len(raw) // 4 * 4].cast("i")
        self.data = bytes(data) if data is not None else b""
        self.offset = offset
        if offset < 0 or length < 0 or len(self.offsets) < offset + length + 1:
            raise ValueError(f"{what}: offsets buffer too short")
        if self.valid is not None and len(self.valid) * 8 < offset + length:
            raise ValueError(f"{what}: validity buffer too short")

    def get(self, i: int) -> bytes | None:
        k = self.offset + i
        if self.valid is not None and not (self.valid[k >> 3] >> (k & 7)) & 1:
            return None
        start, stop = self.offsets[k], self.offsets[k + 1]
        if start < 0 or stop < start or stop > len(self.data):
            raise ValueError(f"record {i}: offsets outside their data buffer")
        return self.data[start:stop]


def _int_view(buffer, code: str):
    raw = memoryview(buffer).cast("B")
    size = array(code).itemsize
    return raw[: len(raw) // size * size].cast(code)


def _encode_records_py(
    n, ts, od, k_valid, k_offsets, k_data, k_offset, v_valid, v_offsets, v_data, v_offset,
    counts, n_headers, hk_valid, hk_offsets, hk_data, hk_offset, hv_valid, hv_offsets, hv_data, hv_offset,
) -> bytes:
    """Same contract as the compiled ``encode_records``."""
    ts = _int_view(ts, "q")
    od = _int_view(od, "i")
    if len(ts) < n or len(od) < n:
        raise ValueError("timestamp/offset delta buffers too short")
    keys = _BinaryView(k_valid, k_offsets, k_data, k_offset, n, "keys")
    values = _BinaryView(v_valid, v_offsets, v_data, v_offset, n, "values")
    if counts is None:
        if n_headers:
            raise ValueError("header values given without header counts")
    else:
        counts = _int_view(counts, "i")
        if len(counts) < n:
            raise ValueError("header counts buffer too short")
        header_keys = _BinaryView(hk_valid, hk_offsets, hk_data, hk_offset, n_headers, "header keys")
        header_values = _BinaryView(hv_valid, hv_offsets, hv_data, hv_offset, n_headers, "header values")
    out = bytearray()
    h = 0
    for i in range(n):
        body = bytearray(b"\x00")
        encode_varint(ts[i], body)
        encode_varint(od[i], body)
        for item in (keys.get(i), values.get(i)):
            if item is None:
                body.append(1)
            else:
                encode_varint(len(item), body)
                body += item
        count = counts[i] if counts is not None else 0
        if count < 0 or count > n_headers - h:
            raise ValueError(f"record {i}: header counts do not match the headers given")
        encode_varint(count, body)
        for _ in range(count):
            key = header_keys.get(h)
            if key is None:
                raise InvalidRecordError(f"record {i}: null header key")
            encode_varint(len(key), body)
            body += key
            value = header_values.get(h)
            if value is None:
                body.append(1)
            else:
                encode_varint(len(value), body)
                body += value
            h += 1
        encode_varint(len(body), out)
        out += body
    if h != n_headers:
        raise ValueError("header counts do not match the headers given")
    return bytes(out)
