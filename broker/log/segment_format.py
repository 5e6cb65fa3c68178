"""The segment file format: an Arrow IPC stream whose batch messages carry BatchMeta and a CRC-32C.

A segment is a plain Arrow IPC stream (schema message, then one record-batch message per
append), readable by ``pyarrow.ipc.open_stream``. Each record-batch message keeps two
entries in the custom metadata of its flatbuffer header: ``fluvial.batch`` (the encoded
BatchMeta) and ``fluvial.crc32c``. The checksum covers the segment's schema message, the
whole batch header (with the checksum text zeroed) and the body, so a torn or corrupt batch
is found from the segment file alone.
"""
from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

import crc32c
import pyarrow as pa
import pyarrow.ipc as ipc

from fluvial.broker.gc_untracked import untracked
from fluvial.broker.log.batch_meta import BatchMeta, decode_parts
from fluvial.broker.log.flatbuffer_read import deref as _deref
from fluvial.broker.log.flatbuffer_read import field as _field
from fluvial.broker.log.flatbuffer_read import field_u8 as _field_u8
from fluvial.broker.log.flatbuffer_read import root as _root
from fluvial.broker.log.flatbuffer_read import string_span as _string_span
from fluvial.broker.log.ipc_compression import DELTA_KEY, compress_record_batch, decode_delta, field_buffers
from fluvial.broker.log.statistics import STATS_KEY

META_KEY = b"fluvial.batch"
# A coalesced message (several small Kafka batches appended together): the BatchMeta of
# each, one a line, in offset order; `fluvial.batch` then holds their envelope.
PARTS_KEY = b"fluvial.batches"
CRC_KEY = b"fluvial.crc32c"
_CRC_PLACEHOLDER = b"CRC?CRC?"
_CONTINUATION = 0xFFFFFFFF
_PREFIX = struct.Struct("<Ii")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")

# Message.header_type values of the Arrow IPC flatbuffer schema.
_HEADER_SCHEMA = 1
_HEADER_RECORD_BATCH = 3
# Field ids of the Message table.
_MSG_HEADER_TYPE = 1
_MSG_HEADER = 2
_MSG_BODY_LENGTH = 3
_MSG_CUSTOM_METADATA = 4
# Field id of RecordBatch.compression (a BodyCompression table, absent when uncompressed).
_RB_COMPRESSION = 3

_WRITE_OPTIONS = ipc.IpcWriteOptions(use_threads=False)

# Arrow IPC buffer compression of stored batches (`fluvial.storage.compression`). The codec
# is written in each batch message's header (BodyCompression), so every batch says how it
# was stored: segments may mix codecs and any Arrow reader decodes them.
STORAGE_CODECS = ("none", "lz4", "zstd", "zstd-delta")
_OPTIONS_BY_CODEC = {
    "none": _WRITE_OPTIONS,
    # lz4 is Arrow's LZ4 frame format; zstd at Arrow's default level (1): level 3 and 9
    # gave under 1% fewer bytes on the 20-field records at a third of the write speed.
    "lz4": ipc.IpcWriteOptions(use_threads=False, compression="lz4"),
    "zstd": ipc.IpcWriteOptions(use_threads=False, compression="zstd"),
    # zstd with delta-coded offsets (ipc_compression.py); schemas it does not lay out
    # (dictionary columns) are written as plain zstd.
    "zstd-delta": ipc.IpcWriteOptions(use_threads=False, compression="zstd"),
}
# Batches smaller than this stay uncompressed: their buffers are a few bytes per column,
# which compress to about as much as they are, for a codec call per buffer.
MIN_COMPRESSED_BATCH_BYTES = 4096


class SegmentFormatError(Exception):
    """Bytes that are not a whole, valid batch message (torn write or corruption)."""


# Integers, bytes and BatchMetas only: never in a cycle, and a segment keeps one per message.
@untracked
@dataclass(frozen=True, slots=True)
class BatchHeader:
    """Where one batch message lies in a segment, and what its header says."""

    position: int
    header_length: int  # the 8-byte prefix plus the flatbuffer metadata
    body_length: int
    meta: BatchMeta
    crc: int  # -1 (with crc_at) when built by the writer rather than parsed
    crc_at: int  # where the checksum text starts, relative to position
    stats: bytes = b""  # column statistics as stored (statistics.decode_stats reads them)
    compressed: bool = False  # the column buffers are compressed (the message names a codec)
    # A coalesced message: the Kafka batches it holds (their rows are dense and in order:
    # part i's rows start at its base offset minus the message's). Empty: one batch, `meta`.
    parts: tuple[BatchMeta, ...] = ()
    # Codec zstd-delta: the buffers holding delta-coded offsets (read_batch decodes them).
    delta: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return self.header_length + self.body_length

    @property
    def metas(self) -> tuple[BatchMeta, ...]:
        """The Kafka batches of this message, in offset order."""
        return self.parts or (self.meta,)

    @property
    def end(self) -> int:
        return self.position + self.header_length + self.body_length


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """An append ready to write: the schema message (for a fresh segment) and the batch message."""

    schema_message: bytes
    header: bytes
    # The body as the buffers that follow each other in the file: one buffer, or for a
    # large batch the column buffers themselves and their padding (written by one gather
    # write, never copied into a message buffer first).
    body_parts: tuple
    body_size: int
    stats: bytes = b""
    compressed: bool = False
    delta: tuple[int, ...] = ()  # as BatchHeader.delta

    @property
    def size(self) -> int:
        return len(self.header) + self.body_size

    @property
    def body(self) -> pa.Buffer:
        """The body as one buffer (a copy when it is in several parts)."""
        if len(self.body_parts) == 1:
            return pa.py_buffer(self.body_parts[0])
        return pa.py_buffer(b"".join(self.body_parts))


def encode_batch(batch: pa.RecordBatch, meta: BatchMeta, stats: bytes = b"",
                 schema: pa.Schema | None = None, compression: str = "none", parts: bytes = b"") -> EncodedBatch:
    """Serialize one batch as an IPC stream message with its BatchMeta, statistics and checksum.

    ``schema``: the batch's schema when the caller holds it already (compared by identity
    first, which is cheaper than by value). ``compression``: the codec of the column
    buffers (one of STORAGE_CODECS); batches under MIN_COMPRESSED_BATCH_BYTES are written
    uncompressed whatever it says. ``parts``: for a coalesced message, its Kafka batches
    (`encode_parts`), with ``meta`` their envelope."""
    custom = {META_KEY: meta.encode(), CRC_KEY: _CRC_PLACEHOLDER}
    if parts:
        custom[PARTS_KEY] = parts
    if stats:
        custom[STATS_KEY] = stats
    if compression not in _OPTIONS_BY_CODEC:
        raise ValueError(f"unknown storage compression {compression!r} (one of {', '.join(STORAGE_CODECS)})")
    size = batch.get_total_buffer_size()
    if size < MIN_COMPRESSED_BATCH_BYTES:
        compression = "none"
    batch_schema = batch.schema if schema is None else schema
    if compression == "zstd" or compression == "zstd-delta":
        stored = _stored_schema(batch_schema)
        if stored.single_message:
            if batch.schema is not batch_schema and not batch.schema.equals(batch_schema):
                raise ValueError("the batch's schema is not the stored schema")
            message = compress_record_batch(batch, custom, schema=stored.schema, delta=compression == "zstd-delta")
            body = message.body
            return _checksummed(stored.message, message.header, (body,), stats, True, len(body), message.delta)
    options = _OPTIONS_BY_CODEC[compression]
    if size <= _REUSED_MAX_BATCH_BYTES:
        encoder = _encoders.get(batch_schema, compression)
        encoded = encoder.write(batch, custom)
        if encoded is not None:
            return _checksummed_message(encoder.schema_message, encoded, stats, compression != "none")
    elif compression == "none":
        gathered = _gatherers.get(batch_schema).write(batch, custom)
        if gathered is not None:
            schema_message, header, body_parts, body_size = gathered
            return _checksummed(schema_message, header, body_parts, stats, False, body_size)
    sink = pa.BufferOutputStream()
    writer = ipc.new_stream(sink, batch.schema, options=options)
    writer.write_batch(batch, custom_metadata=custom)
    # The writer is not closed: closing would append the end-of-stream marker, so the
    # buffer ends exactly where the batch body ends.
    data = sink.getvalue()
    schema_length = 8 + _PREFIX.unpack_from(data, 0)[1]
    return _checksummed_message(data[:schema_length].to_pybytes(), data.slice(schema_length), stats,
                                compression != "none")


# zstd-compressed batches are written by ipc_compression (one zstd context per batch)
# rather than by Arrow's writer (a context per buffer), for every schema whose batches are
# a single message: dictionary columns would need dictionary messages before the batch,
# and segments do not hold those, so such schemas keep Arrow's writer and its error.
_SCHEMAS_KEPT = 16


@dataclass(frozen=True, slots=True)
class _StoredSchema:
    schema: pa.Schema
    message: bytes  # the schema message a stream writer starts with (a unit test checks it)
    single_message: bool  # no dictionary columns: each batch is one message


_stored_schemas: list[_StoredSchema] = []


def _stored_schema(schema: pa.Schema) -> _StoredSchema:
    global _stored_schemas
    for known in _stored_schemas:
        if known.schema is schema:
            return known
    for known in _stored_schemas:
        if known.schema.equals(schema, check_metadata=True):
            return known
    known = _StoredSchema(schema, schema.serialize().to_pybytes(), not any(_has_dictionary(f.type) for f in schema))
    # Replaced whole rather than changed in place: executor threads read it without a lock.
    _stored_schemas = [known, *_stored_schemas[: _SCHEMAS_KEPT - 1]]
    return known


def _has_dictionary(type_: pa.DataType) -> bool:
    if pa.types.is_dictionary(type_):
        return True
    return any(_has_dictionary(type_.field(i).type) for i in range(type_.num_fields))


def _checksummed_message(schema_message: bytes, message: pa.Buffer, stats: bytes, compressed: bool) -> EncodedBatch:
    """Split a batch message into header and body and fill in its checksum."""
    header_length = 8 + _PREFIX.unpack_from(message, 0)[1]
    body = message.slice(header_length)
    return _checksummed(schema_message, message[:header_length].to_pybytes(), (body,), stats, compressed, body.size)


def _checksummed(schema_message: bytes, header: bytes, body_parts: tuple, stats: bytes, compressed: bool,
                 body_size: int, delta: tuple[int, ...] = ()) -> EncodedBatch:
    """Fill in the checksum of a batch message (its header holds the placeholder)."""
    header = bytearray(header)
    # Found by value rather than by walking the flatbuffer: the placeholder text cannot occur
    # in the binary header fields (it would need lengths or offsets near 2**62), only in
    # other metadata text (statistics name the columns): then the flatbuffer says where.
    crc_at = header.find(_CRC_PLACEHOLDER)
    if crc_at >= 0 and header.find(_CRC_PLACEHOLDER, crc_at + 1) >= 0:
        meta = memoryview(header)[8:]
        crc_at = 8 + _custom_metadata(meta, _root(meta))[CRC_KEY][0]
    if crc_at < 0 or header[crc_at : crc_at + 8] != _CRC_PLACEHOLDER:
        raise AssertionError("checksum placeholder not found in the batch header")
    crc = crc32c.crc32c(header, schema_checksum(schema_message))
    for part in body_parts:
        crc = crc32c.crc32c(part, crc)
    header[crc_at : crc_at + 8] = b"%08x" % crc
    return EncodedBatch(schema_message, bytes(header), body_parts, body_size, stats, compressed, delta)


# Small batches (many small producers) are written by a stream writer kept per schema and
# thread, into a buffer that is filled message after message: opening a writer (and
# serializing the schema) for every batch cost more than writing the batch. A message's
# bytes do not depend on where in the stream it is written, so they are the same as a
# fresh writer's (a unit test checks it).
_REUSED_MAX_BATCH_BYTES = 16 * 1024
_ENCODER_BUFFER_BYTES = 256 * 1024
_ENCODERS_PER_THREAD = 8


class _StreamEncoder:
    """A stream writer for one schema, writing into a buffer that is never written over."""

    def __init__(self, schema: pa.Schema, compression: str = "none") -> None:
        self.schema = schema
        self.compression = compression
        self.schema_message: bytes | None = None  # the writer emits it with the first batch
        self._open()

    def _open(self) -> None:
        self._buffer = pa.allocate_buffer(_ENCODER_BUFFER_BYTES, resizable=False)
        self._sink = pa.FixedSizeBufferWriter(self._buffer)
        self._writer = ipc.new_stream(self._sink, self.schema, options=_OPTIONS_BY_CODEC[self.compression])
        self._fresh = True
        self._start = 0

    def write(self, batch: pa.RecordBatch, custom: dict) -> pa.Buffer | None:
        """The batch message (a slice of the buffer), or None when it does not fit."""
        # Metadata (a few hundred bytes per column at most) plus the 8-byte-padded buffers.
        needed = batch.get_total_buffer_size() + 64 * (batch.num_columns + 1) + 1024 + sum(len(v) for v in custom.values())
        if self.schema_message is not None:
            needed += len(self.schema_message)
        if self._start + needed > _ENCODER_BUFFER_BYTES:
            self._open()
            if needed > _ENCODER_BUFFER_BYTES:
                return None
        start = self._start
        try:
            self._writer.write_batch(batch, custom_metadata=custom)
        except (pa.ArrowException, OSError):
            self._open()  # the buffer's state is unknown: start a new one
            return None
        end = self._sink.tell()
        self._start = end
        if self._fresh:
            # A new writer wrote the schema message first.
            self._fresh = False
            schema_length = 8 + _PREFIX.unpack_from(self._buffer, start)[1]
            if self.schema_message is None:
                self.schema_message = self._buffer[start : start + schema_length].to_pybytes()
            start += schema_length
        return self._buffer.slice(start, end - start)


class _Encoders(threading.local):
    """The writers kept per thread, most recently used first: ``make(schema, compression)``
    opens one (`_StreamEncoder`, or `_GatherEncoder` for uncompressed large batches)."""

    def __init__(self, make) -> None:
        self.make = make
        self.recent: list = []

    def get(self, schema: pa.Schema, compression: str = "none") -> _StreamEncoder:
        recent = self.recent
        for i, encoder in enumerate(recent):
            if encoder.compression == compression and (
                    encoder.schema is schema or encoder.schema.equals(schema, check_metadata=True)):
                if i:
                    recent.insert(0, recent.pop(i))
                return encoder
        encoder = self.make(schema, compression)
        recent.insert(0, encoder)
        del recent[_ENCODERS_PER_THREAD:]
        return encoder


_encoders = _Encoders(_StreamEncoder)


# Larger uncompressed batches are not copied into a message buffer at all: a stream writer
# kept per schema and thread writes into a sink that keeps what it is given, which for the
# body is the column buffers themselves (Arrow hands a sink each buffer whole) and their
# padding. The segment writes header and body parts with one gather write (pwritev), so
# the record bytes go from the Arrow batch straight to the page cache.
class _PartsSink:
    """A file-like sink that keeps the objects written to it rather than their bytes."""

    closed = False

    def __init__(self) -> None:
        self.parts: list = []

    def write(self, data) -> int:
        self.parts.append(data)
        return _part_size(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class _GatherEncoder:
    """A stream writer for one schema whose messages come out as parts (`_PartsSink`)."""

    compression = "none"

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.schema_message = b""
        self._open()

    def _open(self) -> None:
        self._sink = _PartsSink()
        self._writer = ipc.new_stream(self._sink, self.schema, options=_WRITE_OPTIONS)
        self._fresh = True

    def write(self, batch: pa.RecordBatch, custom: dict) -> tuple[bytes, bytes, tuple, int] | None:
        """(schema message, batch header, body parts, body size), or None when the writer failed."""
        sink = self._sink
        sink.parts = []
        try:
            self._writer.write_batch(batch, custom_metadata=custom)
        except (pa.ArrowException, OSError):
            self._open()
            return None
        parts = sink.parts
        sink.parts = []
        if self._fresh:
            # A new writer writes the schema message before the first batch.
            self._fresh = False
            schema_parts, parts = _split_parts(parts, _message_prefix_length(parts))
            self.schema_message = b"".join(bytes(p) for p in schema_parts)
        header_parts, body_parts = _split_parts(parts, _message_prefix_length(parts))
        header = b"".join(bytes(p) for p in header_parts)
        body_size = sum(_part_size(p) for p in body_parts)
        return self.schema_message, header, tuple(body_parts), body_size


def _part_size(part) -> int:
    """Bytes of one part a stream writer wrote: bytes (prefixes, padding) or an Arrow buffer."""
    return len(part) if isinstance(part, bytes) else part.size


def _message_prefix_length(parts: list) -> int:
    """The length of the prefix and flatbuffer of the message that ``parts`` start with."""
    head = b""
    for part in parts:
        head += bytes(part[: 8 - len(head)])
        if len(head) == 8:
            break
    continuation, meta_length = _PREFIX.unpack(head)
    if continuation != _CONTINUATION:
        raise AssertionError("stream writer output does not start with a message prefix")
    return 8 + meta_length


def _split_parts(parts: list, at: int) -> tuple[list, list]:
    """``parts`` cut ``at`` bytes from their start (a part spanning the cut is sliced)."""
    for i, part in enumerate(parts):
        n = _part_size(part)
        if at < n:
            if at == 0:
                return parts[:i], parts[i:]
            return parts[:i] + [part[:at]], [part[at:]] + parts[i + 1:]
        at -= n
    return parts, []


_gatherers = _Encoders(lambda schema, compression: _GatherEncoder(schema))


def schema_checksum(schema_message: bytes) -> int:
    return crc32c.crc32c(schema_message)


def read_schema_message(view: memoryview, limit: int) -> tuple[int, pa.Schema]:
    """The length and schema of the stream's first message; SegmentFormatError when it is not whole."""
    length = _message_length(view, 0, limit)
    meta = view[8:length]
    try:
        header_type = _field_u8(meta, _root(meta), _MSG_HEADER_TYPE)
    except (struct.error, IndexError) as exc:
        raise SegmentFormatError(f"unreadable schema header: {exc}") from exc
    if header_type != _HEADER_SCHEMA:
        raise SegmentFormatError("first message of a segment is not a schema")
    try:
        schema = ipc.read_schema(pa.py_buffer(bytes(view[:length])))
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise SegmentFormatError(f"unreadable schema message: {exc}") from exc
    return length, schema


def parse_batch_header(view: memoryview, position: int, limit: int) -> BatchHeader:
    """Decode the header of the batch message at ``position``; the body must end before ``limit``."""
    if position + 8 > limit:
        raise SegmentFormatError("truncated message prefix")
    continuation, meta_length = _PREFIX.unpack_from(view, position)
    if continuation != _CONTINUATION or meta_length <= 0 or meta_length % 8:
        raise SegmentFormatError("bad message prefix")
    header_length = 8 + meta_length
    if position + header_length > limit:
        raise SegmentFormatError("truncated message header")
    start = position + 8
    meta = view[start : start + meta_length]
    try:
        root = _root(meta)
        if _field_u8(meta, root, _MSG_HEADER_TYPE) != _HEADER_RECORD_BATCH:
            raise SegmentFormatError("message is not a record batch")
        body_pos = _field(meta, root, _MSG_BODY_LENGTH)
        body_length = _I64.unpack_from(meta, body_pos)[0] if body_pos is not None else 0
        kv = _custom_metadata(meta, root)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise SegmentFormatError(f"unreadable message header: {exc}") from exc
    if body_length < 0 or position + header_length + body_length > limit:
        raise SegmentFormatError("truncated message body")
    if META_KEY not in kv or CRC_KEY not in kv:
        raise SegmentFormatError("batch message without fluvial metadata")
    crc_start, crc_end = kv[CRC_KEY]
    meta_start, meta_end = kv[META_KEY]
    if crc_end - crc_start != 8:
        raise SegmentFormatError("bad checksum field")
    try:
        crc_text = bytes(meta[crc_start:crc_end])
        crc = int(crc_text, 16)
        if crc_text != b"%08x" % crc:
            # Written as 8 lowercase hex digits: a damaged digit that still parses (a
            # flipped case bit, a sign) must not pass the checksum.
            raise ValueError(f"checksum text {crc_text!r} is not 8 lowercase hex digits")
        batch_meta = BatchMeta.decode(bytes(meta[meta_start:meta_end]))
        parts: tuple[BatchMeta, ...] = ()
        if PARTS_KEY in kv:
            parts_start, parts_end = kv[PARTS_KEY]
            parts = decode_parts(bytes(meta[parts_start:parts_end]))
            _check_parts(batch_meta, parts)
        delta: tuple[int, ...] = ()
        if DELTA_KEY in kv:
            delta_start, delta_end = kv[DELTA_KEY]
            delta = tuple(int(i) for i in bytes(meta[delta_start:delta_end]).split(b","))
    except ValueError as exc:
        raise SegmentFormatError(f"bad batch metadata: {exc}") from exc
    try:
        header_pos = _field(meta, root, _MSG_HEADER)
        compressed = header_pos is not None and _field(meta, _deref(meta, header_pos), _RB_COMPRESSION) is not None
    except (struct.error, IndexError):
        compressed = False  # a damaged header: the checksum, checked by the caller, fails
    stats_start, stats_end = kv.get(STATS_KEY, (0, 0))
    stats = bytes(meta[stats_start:stats_end])
    return BatchHeader(position, header_length, body_length, batch_meta, crc, 8 + crc_start, stats, compressed, parts,
                       delta)


def split_parts(header: BatchHeader, batch: pa.RecordBatch) -> list[tuple[BatchMeta, pa.RecordBatch]]:
    """The Kafka batches of a message with their rows (zero-copy slices of ``batch``)."""
    if not header.parts:
        return [(header.meta, batch)]
    base = header.meta.base_offset
    return [(part, batch.slice(part.base_offset - base, part.record_count)) for part in header.parts]


def _check_parts(envelope: BatchMeta, parts: tuple[BatchMeta, ...]) -> None:
    """The parts of a coalesced message follow each other and fill its envelope exactly."""
    expected = envelope.base_offset
    rows = 0
    for part in parts:
        if part.base_offset != expected or part.record_count != part.last_offset_delta + 1:
            raise ValueError(f"coalesced batch part at {part.base_offset} does not follow offset {expected}")
        expected = part.next_offset
        rows += part.record_count
    if not parts or expected != envelope.next_offset or rows != envelope.record_count:
        raise ValueError("coalesced batch parts do not cover their message")


def checksum_matches(view: memoryview, header: BatchHeader, schema_crc: int) -> bool:
    start = header.position
    head = bytearray(view[start : start + header.header_length])
    head[header.crc_at : header.crc_at + 8] = _CRC_PLACEHOLDER
    crc = crc32c.crc32c(head, schema_crc)
    body_start = start + header.header_length
    crc = crc32c.crc32c(view[body_start : body_start + header.body_length], crc)
    return crc == header.crc


def read_batch(data: pa.Buffer, header: BatchHeader, schema: pa.Schema,
               columns: list[int] | None = None, schema_message: bytes = b"") -> pa.RecordBatch:
    """Zero-copy for an uncompressed batch: its column buffers are slices of ``data`` (a
    memory map); a compressed batch's buffers are decompressed into new memory.

    ``columns`` (indexes into ``schema``, with ``schema_message``): of a compressed batch only
    these columns are decompressed, and only they are in the result. An uncompressed batch
    is read whole (it costs nothing) and the caller projects it."""
    message = data.slice(header.position, header.size)
    projected = columns is not None and header.compressed and bool(schema_message)
    if header.delta:
        delta = header.delta
        starts = field_buffers(schema) if projected else None
        if starts is not None:  # only the offsets of the columns read are summed back
            wanted = [(starts[c], starts[c + 1]) for c in columns]
            delta = tuple(i for i in delta if any(start <= i < end for start, end in wanted))
        try:
            # A projection's stream (below) is built in the same copy.
            message = pa.py_buffer(decode_delta(message, delta, schema_message if projected else b""))
        except ValueError as exc:
            raise SegmentFormatError(f"unreadable delta-coded batch: {exc}") from exc
    if projected:
        # pyarrow reads a subset of fields only through a stream reader, so the batch goes
        # behind its schema message: a copy of the compressed bytes, less than decompressing
        # the columns not asked for.
        stream = message if header.delta else pa.py_buffer(schema_message + message.to_pybytes())
        options = ipc.IpcReadOptions(included_fields=sorted(set(columns)), use_threads=False)
        return ipc.open_stream(stream, options=options).read_next_batch()
    return ipc.read_record_batch(ipc.read_message(message), schema)


def _message_length(view: memoryview, position: int, limit: int | None = None) -> int:
    """Length of a whole message (prefix, metadata, body) at ``position``."""
    limit = len(view) if limit is None else limit
    if position + 8 > limit:
        raise SegmentFormatError("truncated message prefix")
    continuation, meta_length = _PREFIX.unpack_from(view, position)
    if continuation != _CONTINUATION or meta_length <= 0 or position + 8 + meta_length > limit:
        raise SegmentFormatError("bad or truncated message")
    meta = view[position + 8 : position + 8 + meta_length]
    try:
        body_pos = _field(meta, _root(meta), _MSG_BODY_LENGTH)
        body_length = _I64.unpack_from(meta, body_pos)[0] if body_pos is not None else 0
    except (struct.error, IndexError) as exc:
        raise SegmentFormatError(f"unreadable message header: {exc}") from exc
    end = position + 8 + meta_length + body_length
    if body_length < 0 or end > limit:
        raise SegmentFormatError("truncated message body")
    return end - position


def _custom_metadata(buf: memoryview, root: int) -> dict[bytes, tuple[int, int]]:
    """Key -> (start, end) of its value within the header."""
    pos = _field(buf, root, _MSG_CUSTOM_METADATA)
    if pos is None:
        return {}
    vector = _deref(buf, pos)
    count = _U32.unpack_from(buf, vector)[0]
    if count > 64:
        raise IndexError("implausible custom metadata length")
    spans = {}
    for i in range(count):
        entry = _deref(buf, vector + 4 + 4 * i)
        key_start, key_end = _string_span(buf, entry, 0)
        spans[bytes(buf[key_start:key_end])] = _string_span(buf, entry, 1)
    return spans
