"""Record batch compression codecs: gzip, snappy (raw and xerial-framed), LZ4 frame, zstd."""
from __future__ import annotations

import struct
from enum import IntEnum

import cramjam

from fluvial.errors import CorruptRecordError, UnsupportedCompressionError


class Compression(IntEnum):
    """The codec id carried in bits 0-2 of a record batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


# xerial snappy-java's stream header: magic, then format version and the oldest
# version able to read it, both 1 in every stream the Java client writes.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
# snappy-java's default block size; each block is compressed on its own.
XERIAL_BLOCK_SIZE = 32 * 1024

_BLOCK_LENGTH = struct.Struct(">i")

Buffer = bytes | bytearray | memoryview


def codec_from_id(codec: int) -> Compression:
    """The codec for a wire id; ids Kafka does not define raise UnsupportedCompressionError."""
    try:
        return Compression(codec)
    except ValueError:
        raise UnsupportedCompressionError(f"unknown compression codec id {codec}") from None


# Levels used when none is asked for. They favour speed: the broker compresses on the
# fetch path, where time counts for more than the last few percent of size (gzip 1 is
# ~3x faster than 6, LZ4's fast mode ~5x faster than its high-compression levels).
DEFAULT_LEVEL = {Compression.GZIP: 1, Compression.LZ4: 0, Compression.ZSTD: 3}


def compress(codec: Compression, data: Buffer, level: int | None = None) -> bytes:
    """Compress a records section as the Java client frames it for ``codec`` (snappy: xerial, lz4: LZ4 frame)."""
    codec = codec_from_id(codec)
    if codec is Compression.NONE:
        return bytes(data)
    if codec is Compression.SNAPPY:
        return snappy_xerial_compress(data)
    if level is None:
        level = DEFAULT_LEVEL[codec]
    if codec is Compression.GZIP:
        return bytes(cramjam.gzip.compress(data, level=level))
    if codec is Compression.LZ4:
        return bytes(cramjam.lz4.compress(data, level=level))
    return bytes(cramjam.zstd.compress(data, level=level))


def snappy_xerial_compress(data: Buffer, block_size: int = XERIAL_BLOCK_SIZE) -> bytes:
    """Snappy in snappy-java's block stream framing, as Java and Python clients send it."""
    view = memoryview(data).cast("B")
    parts = [XERIAL_HEADER]
    for start in range(0, len(view), block_size):
        block = bytes(cramjam.snappy.compress_raw(view[start:start + block_size]))
        parts.append(_BLOCK_LENGTH.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def is_xerial_framed(data: Buffer) -> bool:
    """True when ``data`` starts with snappy-java's stream header rather than a raw snappy block."""
    return len(data) >= len(XERIAL_HEADER) and bytes(data[:len(XERIAL_MAGIC)]) == XERIAL_MAGIC


def _snappy_decompress(data: Buffer) -> Buffer:
    if not is_xerial_framed(data):
        # librdkafka sends one raw snappy block.
        return cramjam.snappy.decompress_raw(data)
    view = memoryview(data).cast("B")
    pos = len(XERIAL_HEADER)
    blocks = []
    while pos < len(view):
        if pos + 4 > len(view):
            raise CorruptRecordError("xerial snappy stream ends inside a block length")
        (length,) = _BLOCK_LENGTH.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > len(view):
            raise CorruptRecordError("xerial snappy block runs past the end of the stream")
        blocks.append(cramjam.snappy.decompress_raw(view[pos:pos + length]))
        pos += length
    if len(blocks) == 1:
        return blocks[0]
    return b"".join(blocks)


def decompress_buffer(codec: Compression, data: Buffer) -> Buffer:
    """Like :func:`decompress` but returns any buffer object, saving a copy on the hot path."""
    codec = codec_from_id(codec)
    try:
        if codec is Compression.NONE:
            return data
        if codec is Compression.GZIP:
            return cramjam.gzip.decompress(data)
        if codec is Compression.SNAPPY:
            return _snappy_decompress(data)
        if codec is Compression.LZ4:
            return cramjam.lz4.decompress(data)
        # cramjam streams zstd, so frames written without a content size decode too.
        return cramjam.zstd.decompress(data)
    except cramjam.DecompressionError as exc:
        raise CorruptRecordError(f"cannot decompress {codec.name.lower()} records: {exc}") from None


def decompress(codec: Compression, data: Buffer) -> bytes:
    """Decompress a records section; snappy input may be xerial-framed or a raw block."""
    return bytes(decompress_buffer(codec, data))
