"""Arrow IPC record-batch messages with zstd-compressed buffers, one zstd context per batch.

Arrow's own IPC writer compresses each buffer of a batch (about 40 for a 20-field table)
with a zstd context created for that buffer; the context's set-up (allocating and clearing
its tables) then costs as much as the compression of a small buffer. Here pyarrow still
lays the batch out (the message ``RecordBatch.serialize`` writes: field nodes, buffer
offsets, slicing and rebasing of sliced arrays, all as Arrow does it), into a buffer each
thread keeps from batch to batch, and this module only rewrites the body and
the RecordBatch header: the batch's buffers compressed in one call with one context, in the
IPC format's BodyCompression layout (per buffer, the uncompressed length as a little-endian
int64, then one zstd frame; length -1: the bytes follow uncompressed; buffers padded to 8
bytes). The result is a plain IPC message that any Arrow reader decodes.

With ``delta=True`` (storage codec ``zstd-delta``) the int32 offsets buffers of string,
binary, list and map columns are stored as the differences between consecutive offsets
(the first offset as it is), which zstd shrinks to the entropy of the values' lengths where
the offsets themselves, a rising sequence whose low bytes look random, only lose their zero
high bytes. Such a message names codec 2 (not an Arrow codec, so a plain Arrow reader
refuses it rather than reading differences as offsets) and lists the buffers in its custom
metadata (``fluvial.delta``); ``decode_delta`` gives back the plain zstd message.

LZ4 frames stay with Arrow's writer: its LZ4 frame call keeps its state on the stack, so
there is nothing to reuse, and a call per buffer from Python measured slower.
"""
from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import zstandard

from fluvial.broker.log.flatbuffer_read import deref, field, field_u8, root, vector_span

# Arrow's flatbuffer schema: Message.header_type of a RecordBatch, MetadataVersion V5,
# CompressionType.ZSTD (BodyCompression.codec) and BodyCompressionMethod.BUFFER.
_HEADER_RECORD_BATCH = 3
_METADATA_V5 = 4
_CODEC_ZSTD = 1
# Not one of Arrow's codecs (LZ4_FRAME 0, ZSTD 1): zstd frames with delta-coded offsets.
CODEC_ZSTD_DELTA = 2
# Custom metadata of a delta-coded message: the indexes (in the message's buffer order) of
# the buffers holding differences, ASCII, comma-separated.
DELTA_KEY = b"fluvial.delta"
_METHOD_BUFFER = 0
# zstd at Arrow's default level. Level -1 and lz4 write 1.3-1.4x the bytes of typed
# records; level 3 saves under 1% for twice the CPU (docs/architecture.md).
ZSTD_LEVEL = 1
# Buffers this small are stored as they are: a zstd frame's own header and block header
# (up to 21 bytes) leave nothing to gain.
MIN_COMPRESSED_BUFFER_BYTES = 64

_PREFIX = struct.Struct("<Ii")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_UNCOMPRESSED = _I64.pack(-1)
_PADDING = bytes(8)

# The header is laid out front to back: root offset, the four vtables, then the tables,
# vectors and strings, each referring forward (flatbuffer offsets are unsigned) and each
# scalar aligned to its size relative to the start of the metadata (Arrow's flatbuffer
# verifier checks it). Vtables: their byte size, the table's size, then per field id the
# field's position in the table (0: absent).
_VT_MESSAGE = struct.pack("<7H", 14, 24, 4, 6, 8, 16, 12)  # version, header_type, header, bodyLength, custom_metadata
_VT_RECORD_BATCH = struct.pack("<6H", 12, 24, 8, 4, 16, 20)  # length, nodes, buffers, compression
_VT_RECORD_BATCH_VARIADIC = struct.pack("<7H", 14, 32, 8, 4, 16, 20, 24)  # ... variadicBufferCounts
_VT_COMPRESSION = struct.pack("<4H", 8, 8, 4, 5)  # codec, method
_VT_KEY_VALUE = struct.pack("<4H", 8, 12, 4, 8)  # key, value
_VT_MESSAGE_AT = 4
_VT_RECORD_BATCH_AT = _VT_MESSAGE_AT + 14
_VT_COMPRESSION_AT = _VT_RECORD_BATCH_AT + 14
_VT_KEY_VALUE_AT = _VT_COMPRESSION_AT + 8
_MESSAGE_AT = 48  # where the vtables end: the tables start 8-aligned
_RECORD_BATCH_AT = _MESSAGE_AT + 24
_COMPRESSION_AT = _RECORD_BATCH_AT + 32
_VECTORS_AT = _COMPRESSION_AT + 8
_HEAD = (_U32.pack(_MESSAGE_AT) + _VT_MESSAGE + _VT_RECORD_BATCH_VARIADIC + _VT_COMPRESSION + _VT_KEY_VALUE).ljust(
    _MESSAGE_AT, b"\0")
_HEAD_NO_VARIADIC = (_U32.pack(_MESSAGE_AT) + _VT_MESSAGE + _VT_RECORD_BATCH.ljust(14, b"\0") + _VT_COMPRESSION
                     + _VT_KEY_VALUE).ljust(_MESSAGE_AT, b"\0")
_MESSAGE_TABLE = struct.Struct("<ihBxIIq")  # soffset, version, header_type, header, custom_metadata, bodyLength
_RECORD_BATCH_TABLE = struct.Struct("<iIqIIIxxxx")  # soffset, nodes, length, buffers, compression, variadic
_COMPRESSION_TABLE = struct.Struct("<ibbxx")  # soffset, codec, method
_KEY_VALUE_TABLE = struct.Struct("<iII")  # soffset, key, value

# Field ids in Arrow's Message and RecordBatch tables.
_MSG_HEADER_TYPE, _MSG_HEADER, _MSG_BODY_LENGTH = 1, 2, 3
_RB_LENGTH, _RB_NODES, _RB_BUFFERS, _RB_COMPRESSION, _RB_VARIADIC = 0, 1, 2, 3, 4


@dataclass(frozen=True, slots=True)
class CompressedMessage:
    """A record-batch message: ``header`` (prefix and flatbuffer metadata) then ``body``."""

    header: bytes
    body: bytes
    delta: tuple[int, ...] = ()  # the buffers holding delta-coded offsets (codec zstd-delta)


class _Compressors(threading.local):
    """The thread's zstd compressors, one per level (a compressor is not safe to share
    between threads)."""

    def __init__(self) -> None:
        self.by_level: dict[int, zstandard.ZstdCompressor] = {}

    def get(self, level: int) -> zstandard.ZstdCompressor:
        compressor = self.by_level.get(level)
        if compressor is None:
            compressor = self.by_level[level] = zstandard.ZstdCompressor(level=level)
        return compressor


_compressors = _Compressors()

# A buffer of a batch that zstd could not shrink by at least 1/MIN_SAVING_FRACTION of its
# size (random ids, digests, random payloads, random doubles) is stored as it is: a frame
# that saves a few percent costs about as much CPU as one that saves half (zstd's time goes
# mostly to the Huffman coding of literals), and reading it costs a decompression. The same
# buffer of the next batches of that schema most likely will not shrink either, so it is
# stored as it is without a try for this many batches, then tried again. zstd gives up on
# such data quickly, but not for free: at 1 KB records the random payload column was about
# a tenth of the batch's compression time.
INCOMPRESSIBLE_SKIP_BATCHES = 15
MIN_SAVING_FRACTION = 16
_SCHEMAS_TRACKED = 16


class _Incompressible(threading.local):
    """Per schema (this thread's batches of it), for each buffer of a batch the number of
    batches still to store it without trying to compress it."""

    def __init__(self) -> None:
        self.by_schema: dict[int, tuple[pa.Schema, list[int]]] = {}

    def skips(self, schema: pa.Schema, buffers: int) -> list[int]:
        entry = self.by_schema.get(id(schema))
        if entry is None or entry[0] is not schema or len(entry[1]) != buffers:
            if len(self.by_schema) >= _SCHEMAS_TRACKED:
                self.by_schema.clear()
            # The schema is kept with its entry, so its id is not reused meanwhile.
            entry = self.by_schema[id(schema)] = (schema, [0] * buffers)
        return entry[1]


_incompressible = _Incompressible()

# Batches whose IPC message is larger than this are laid out in a buffer of their own
# rather than in the thread's kept one (which would then hold that much for good).
MAX_KEPT_LAYOUT_BYTES = 16 << 20
_LAYOUT_OPTIONS = pa.ipc.IpcWriteOptions(use_threads=False)


class _LayoutBuffer(threading.local):
    """The thread's buffer that batches are laid out in before compression. A fresh
    buffer per batch (``RecordBatch.serialize``) cost the broker about a tenth of its CPU
    at 200 B records: the allocator handed out freshly mapped pages for each ~1 MB batch,
    and the kernel faulted and zeroed them. This one stays mapped, so its pages stay too."""

    def __init__(self) -> None:
        self.buffer: pa.Buffer | None = None

    def layout(self, batch: pa.RecordBatch) -> memoryview:
        """The record-batch message of ``batch`` as ``serialize`` writes it, in this
        thread's buffer (valid until this thread's next call)."""
        needed = pa.ipc.get_record_batch_size(batch) + 4096 + 64 * batch.num_columns
        if needed > MAX_KEPT_LAYOUT_BYTES:
            return memoryview(batch.serialize())
        while True:
            if self.buffer is None or self.buffer.size < needed:
                self.buffer = pa.allocate_buffer(max(needed, 1 << 20), resizable=False)
            sink = pa.FixedSizeBufferWriter(self.buffer)
            try:
                # A stream writer writes the schema message first: the batch follows it.
                pa.ipc.new_stream(sink, batch.schema, options=_LAYOUT_OPTIONS).write_batch(batch)
            except OSError:  # out of room: the schema message was larger than allowed for
                needed = 2 * self.buffer.size
                if needed > MAX_KEPT_LAYOUT_BYTES:
                    return memoryview(batch.serialize())
                continue
            end = sink.tell()
            view = memoryview(self.buffer)
            return view[8 + _PREFIX.unpack_from(view, 0)[1] : end]


_layout = _LayoutBuffer()


def _compress_zstd(body: memoryview, spans: list[int], level: int) -> list:
    """The frames of the buffers at ``spans`` (offset, length, ...) of ``body``. One call
    for the whole batch: one zstd context for all its buffers, and the GIL released once
    rather than around each buffer (each time taking it back could wait for the event
    loop's thread for up to the interpreter's switch interval)."""
    segments = zstandard.BufferWithSegments(body, struct.pack(f"<{len(spans)}Q", *spans))
    try:
        frames = _compressors.get(level).multi_compress_to_buffer(segments)
    except zstandard.ZstdError as exc:
        # ValueError: what the log tablet takes as a batch it could not encode.
        raise ValueError(f"zstd compression of a batch failed: {exc}") from exc
    return [frames[i] for i in range(len(frames))]


def compress_record_batch(batch: pa.RecordBatch, custom_metadata: dict[bytes, bytes],
                          level: int = ZSTD_LEVEL, schema: pa.Schema | None = None,
                          delta: bool = False) -> CompressedMessage:
    """The IPC message of ``batch`` with its buffers compressed by zstd at ``level`` and
    ``custom_metadata`` in its header. Each buffer is a frame of its own (a reader
    decompresses only the columns it asks for); one that would not shrink by at least
    1/MIN_SAVING_FRACTION is stored as it is, and so is that buffer of this schema's next
    INCOMPRESSIBLE_SKIP_BATCHES batches.
    ``schema``: the one schema object the caller keeps for batches of this schema (equal
    to the batch's), under which that is remembered; by default the batch's own.
    ``delta``: offsets buffers delta-coded (see the module's description); a schema with
    types whose buffers ``offsets_buffers`` does not lay out is written without."""
    view = _layout.layout(batch)
    meta_length = _PREFIX.unpack_from(view, 0)[1]
    meta = view[8 : 8 + meta_length]
    message = root(meta)
    if field_u8(meta, message, _MSG_HEADER_TYPE) != _HEADER_RECORD_BATCH:
        raise ValueError("serialized batch is not a record-batch message")
    record_batch = deref(meta, field(meta, message, _MSG_HEADER))
    if field(meta, record_batch, _RB_COMPRESSION) is not None:
        raise ValueError("serialized batch is compressed already")
    length_at = field(meta, record_batch, _RB_LENGTH)
    row_count = _I64.unpack_from(meta, length_at)[0] if length_at is not None else 0
    nodes_start, nodes_end = vector_span(meta, record_batch, _RB_NODES, 16)
    buffers_start, buffers_end = vector_span(meta, record_batch, _RB_BUFFERS, 16)
    variadic_start, variadic_end = vector_span(meta, record_batch, _RB_VARIADIC, 8)
    body = view[8 + meta_length :]
    spans = struct.unpack_from(f"<{(buffers_end - buffers_start) // 8}q", meta, buffers_start)
    codec = _CODEC_ZSTD
    indexes: list[int] = []
    if delta:
        coded = _delta_code(body, spans, batch.schema if schema is None else schema)
        if coded is not None:
            body, indexes = coded
            custom_metadata = {**custom_metadata, DELTA_KEY: b",".join(b"%d" % i for i in indexes)}
            codec = CODEC_ZSTD_DELTA
    skips = _incompressible.skips(batch.schema if schema is None else schema, len(spans) // 2)
    tried = [spans[i + 1] >= MIN_COMPRESSED_BUFFER_BYTES and not skips[i // 2] for i in range(0, len(spans), 2)]
    wanted = [x for i in range(0, len(spans), 2) if tried[i // 2] for x in (spans[i], spans[i + 1])]
    frames = _compress_zstd(body, wanted, level) if wanted else []

    parts: list = []
    locations: list[int] = []
    position = 0
    next_frame = 0
    for i in range(0, len(spans), 2):
        offset, size = spans[i], spans[i + 1]
        if size == 0:
            # Arrow writes an empty buffer as empty (no length prefix) and reads it so.
            locations += (position, 0)
            continue
        packed = None
        if tried[i // 2]:  # in the order of `wanted`
            packed = frames[next_frame]
            next_frame += 1
            if len(packed) > size - size // MIN_SAVING_FRACTION:
                packed = None
            skips[i // 2] = 0 if packed is not None else INCOMPRESSIBLE_SKIP_BATCHES
        elif skips[i // 2]:
            skips[i // 2] -= 1
        if packed is not None:
            parts += (_I64.pack(size), packed)
            stored = 8 + len(packed)
        else:
            parts += (_UNCOMPRESSED, body[offset : offset + size])
            stored = 8 + size
        locations += (position, stored)
        padding = -stored % 8
        if padding:
            parts.append(_PADDING[:padding])
        position += stored + padding
    header = _record_batch_header(row_count, meta[nodes_start:nodes_end], struct.pack(f"<{len(locations)}q", *locations),
                                  meta[variadic_start:variadic_end] if variadic_end else None,
                                  position, custom_metadata, codec)
    return CompressedMessage(header, b"".join(parts), tuple(indexes))


def _record_batch_header(row_count: int, nodes: memoryview, buffers: bytes, variadic: memoryview | None,
                         body_length: int, custom_metadata: dict[bytes, bytes], codec: int = _CODEC_ZSTD) -> bytes:
    """Prefix and flatbuffer metadata of a compressed record-batch message."""
    out = bytearray(_HEAD if variadic is not None else _HEAD_NO_VARIADIC)
    out += bytes(_VECTORS_AT - _MESSAGE_AT)  # the three tables, filled in below

    def vector(items: bytes | memoryview, count: int) -> int:
        """Append a vector of 8-aligned items; its position (that of its count)."""
        out.extend(bytes(-(len(out) + 4) % 8))
        at = len(out)
        out.extend(_U32.pack(count))
        out.extend(items)
        return at

    nodes_at = vector(nodes, len(nodes) // 16)
    buffers_at = vector(buffers, len(buffers) // 16)
    variadic_at = vector(variadic, len(variadic) // 8) if variadic is not None else 0
    # custom_metadata: a vector of offsets to KeyValue tables, each with two strings.
    out.extend(bytes(-len(out) % 4))
    entries_at = len(out)
    out.extend(_U32.pack(len(custom_metadata)))
    out.extend(bytes(4 * len(custom_metadata)))
    tables_at = len(out)
    out.extend(bytes(_KEY_VALUE_TABLE.size * len(custom_metadata)))
    for i, (key, value) in enumerate(custom_metadata.items()):
        table = tables_at + i * _KEY_VALUE_TABLE.size
        slot = entries_at + 4 + 4 * i
        _U32.pack_into(out, slot, table - slot)
        strings = []
        for text in (key, value):
            strings.append(len(out))
            out.extend(_U32.pack(len(text)))
            out.extend(text)
            out.extend(bytes(1 + (-(len(text) + 1) % 4)))  # NUL terminator, then 4-aligned
        _KEY_VALUE_TABLE.pack_into(out, table, table - _VT_KEY_VALUE_AT,
                                   strings[0] - (table + 4), strings[1] - (table + 8))
    out.extend(bytes(-len(out) % 8))  # the body starts 8-aligned

    _MESSAGE_TABLE.pack_into(out, _MESSAGE_AT, _MESSAGE_AT - _VT_MESSAGE_AT, _METADATA_V5, _HEADER_RECORD_BATCH,
                             _RECORD_BATCH_AT - (_MESSAGE_AT + 8), entries_at - (_MESSAGE_AT + 12), body_length)
    _RECORD_BATCH_TABLE.pack_into(out, _RECORD_BATCH_AT, _RECORD_BATCH_AT - _VT_RECORD_BATCH_AT,
                                  nodes_at - (_RECORD_BATCH_AT + 4), row_count, buffers_at - (_RECORD_BATCH_AT + 16),
                                  _COMPRESSION_AT - (_RECORD_BATCH_AT + 20),
                                  variadic_at - (_RECORD_BATCH_AT + 24) if variadic is not None else 0)
    _COMPRESSION_TABLE.pack_into(out, _COMPRESSION_AT, _COMPRESSION_AT - _VT_COMPRESSION_AT, codec, _METHOD_BUFFER)
    return _PREFIX.pack(0xFFFFFFFF, len(out)) + out


# Delta-coded offsets (storage codec ``zstd-delta``).
_OFFSETS_TYPES = (pa.types.is_string, pa.types.is_binary, pa.types.is_list, pa.types.is_map)
_FIXED_WIDTH_TYPES = (pa.types.is_boolean, pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal,
                      pa.types.is_temporal, pa.types.is_fixed_size_binary)


def offsets_buffers(schema: pa.Schema) -> tuple[int, tuple[int, ...]] | None:
    """(buffers of a batch message of ``schema``, indexes of its int32 offsets buffers) in
    the IPC format's buffer order (depth first: validity, then offsets, then data or the
    children), or None when the schema has a type laid out otherwise (views, unions,
    dictionaries, run-end encoded, large offsets, extension types...): such batches are
    not delta-coded."""
    layout = _offsets_layouts.get(schema)
    return None if layout is None else (layout[0], layout[1])


def field_buffers(schema: pa.Schema) -> tuple[int, ...] | None:
    """Where each top-level field's buffers start in a batch message of ``schema`` (and,
    last, the buffer count); None as for ``offsets_buffers``."""
    layout = _offsets_layouts.get(schema)
    return None if layout is None else layout[2]


def _layout_of(schema: pa.Schema) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    count = 0
    offsets: list[int] = []
    starts: list[int] = []

    def walk(type_: pa.DataType) -> bool:
        nonlocal count
        if any(test(type_) for test in _FIXED_WIDTH_TYPES):
            count += 2  # validity, values
            return True
        if pa.types.is_string(type_) or pa.types.is_binary(type_):
            offsets.append(count + 1)
            count += 3  # validity, offsets, data
            return True
        if pa.types.is_list(type_) or pa.types.is_map(type_):
            offsets.append(count + 1)
            count += 2  # validity, offsets; then the entries
            return walk(type_.value_type if pa.types.is_list(type_) else
                        pa.struct([type_.key_field, type_.item_field]))
        if pa.types.is_struct(type_) or pa.types.is_fixed_size_list(type_):
            count += 1  # validity; then the children
            children = ([type_.field(i).type for i in range(type_.num_fields)] if pa.types.is_struct(type_)
                        else [type_.value_type])
            return all(walk(child) for child in children)
        return False

    if not isinstance(schema, pa.Schema):
        return None
    for f in schema:
        starts.append(count)
        if isinstance(f.type, pa.ExtensionType) or not walk(f.type):
            return None
    return count, tuple(offsets), (*starts, count)


_LAYOUTS_TRACKED = 16


class _OffsetsLayouts(threading.local):
    """The buffer layout (``_layout_of``) per schema object (this thread's)."""

    def __init__(self) -> None:
        self.by_schema: dict[int, tuple[pa.Schema, tuple | None]] = {}

    def get(self, schema: pa.Schema) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
        entry = self.by_schema.get(id(schema))
        if entry is None or entry[0] is not schema:
            if len(self.by_schema) >= _LAYOUTS_TRACKED:
                self.by_schema.clear()
            # The schema is kept with its entry, so its id is not reused meanwhile.
            entry = self.by_schema[id(schema)] = (schema, _layout_of(schema))
        return entry[1]


_offsets_layouts = _OffsetsLayouts()


def _delta_code(body: memoryview, spans: tuple[int, ...], schema: pa.Schema) -> tuple[memoryview, list[int]] | None:
    """``body`` with the offsets buffers of ``schema`` replaced by their differences (in
    place when it is writable, else in a copy), and the indexes of those buffers; None when
    there are none or the message's buffers are not laid out as expected."""
    layout = _offsets_layouts.get(schema)
    if layout is None or layout[0] != len(spans) // 2:
        return None
    indexes = [i for i in layout[1]
               if spans[2 * i + 1] >= 8 and spans[2 * i + 1] % 4 == 0 and spans[2 * i] % 4 == 0]
    if not indexes:
        return None
    if body.readonly:
        body = memoryview(bytearray(body))
    # Buffers start 8-aligned in the body: one int32 view of it serves them all.
    words = np.frombuffer(body, dtype="<i4", count=len(body) // 4)
    for i in indexes:
        start = spans[2 * i] // 4
        values = words[start : start + spans[2 * i + 1] // 4]
        # int32 arithmetic wraps: any contents round-trip exactly.
        np.subtract(values[1:], values[:-1], out=values[1:])
    return body, indexes


class _Decompressors(threading.local):
    def __init__(self) -> None:
        self.zstd = zstandard.ZstdDecompressor()


_decompressors = _Decompressors()


def decode_delta(message: memoryview | bytes, indexes: tuple[int, ...], prefix: bytes = b"") -> bytes:
    """The plain zstd message (Arrow's own codec) of a delta-coded one: the buffers at
    ``indexes`` decompressed, summed back into offsets and stored uncompressed, every other
    buffer as it was. A projection may pass only the delta-coded buffers of the fields it
    reads: the others are then left as differences, and must not be read. ``prefix`` (a
    schema message, for a stream) comes before it in the same buffer. ValueError when the
    message is not such a message."""
    view = memoryview(message)
    meta_length = _PREFIX.unpack_from(view, 0)[1]
    meta = view[8 : 8 + meta_length]
    try:
        message_table = root(meta)
        if field_u8(meta, message_table, _MSG_HEADER_TYPE) != _HEADER_RECORD_BATCH:
            raise ValueError("not a record-batch message")
        record_batch = deref(meta, field(meta, message_table, _MSG_HEADER))
        length_at = field(meta, record_batch, _RB_LENGTH)
        row_count = _I64.unpack_from(meta, length_at)[0] if length_at is not None else 0
        nodes_start, nodes_end = vector_span(meta, record_batch, _RB_NODES, 16)
        buffers_start, buffers_end = vector_span(meta, record_batch, _RB_BUFFERS, 16)
        variadic_start, variadic_end = vector_span(meta, record_batch, _RB_VARIADIC, 8)
    except (struct.error, IndexError) as exc:
        raise ValueError(f"unreadable record-batch header: {exc}") from exc
    body = view[8 + meta_length :]
    spans = np.frombuffer(meta, dtype="<i8", count=(buffers_end - buffers_start) // 8, offset=buffers_start)
    offsets, sizes = spans[0::2], spans[1::2].copy()
    if len(offsets) and (offsets.min() < 0 or sizes.min() < 0 or (offsets + sizes).max() > len(body)):
        raise ValueError("buffer outside the message body")
    # Only the delta-coded buffers change (and grow: they are stored uncompressed); the
    # bytes between them are copied in one piece each, moved by what the buffers before
    # them grew.
    parts: list = []
    ends: list[int] = []  # where each delta-coded buffer's stored region ended in the old body
    shifts: list[int] = []  # how far everything after that end moves
    shift = 0
    copied_to = 0
    for i in sorted(set(indexes)):
        if i < 0 or i >= len(offsets):
            raise ValueError("delta-coded buffer index out of range")
        offset, size = int(offsets[i]), int(sizes[i])
        if size == 0:
            continue
        if size < 8 or offset < copied_to:
            raise ValueError("delta-coded buffer without its length, or out of order")
        length = _I64.unpack_from(body, offset)[0]
        if length == -1:
            raw = body[offset + 8 : offset + size]
        else:
            try:
                raw = _decompressors.zstd.decompress(body[offset + 8 : offset + size], max_output_size=length)
            except zstandard.ZstdError as exc:
                raise ValueError(f"zstd decompression failed: {exc}") from exc
            if len(raw) != length:
                raise ValueError("decompressed buffer of the wrong length")
        if len(raw) % 4:
            raise ValueError("delta-coded buffer not a whole number of int32")
        summed = np.frombuffer(raw, dtype="<i4").cumsum(dtype=np.int32).astype("<i4", copy=False)
        old_end = offset + size + (-size % 8)
        new_size = 8 + summed.nbytes
        padding = -new_size % 8
        parts += (body[copied_to:offset], _UNCOMPRESSED, summed.data, _PADDING[:padding])
        copied_to = old_end
        sizes[i] = new_size
        shift += new_size + padding - (old_end - offset)
        ends.append(old_end)
        shifts.append(shift)
    parts.append(body[copied_to:])
    moved = offsets + np.concatenate(([0], shifts)).astype(np.int64)[np.searchsorted(ends, offsets, side="right")]
    locations = np.empty(2 * len(offsets), dtype="<i8")
    locations[0::2], locations[1::2] = moved, sizes
    header = _record_batch_header(row_count, meta[nodes_start:nodes_end], locations.tobytes(),
                                  meta[variadic_start:variadic_end] if variadic_end else None, len(body) + shift, {})
    return b"".join((prefix, header, *parts))
