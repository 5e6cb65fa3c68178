"""Record batch compression codecs: gzip, snappy (raw and xerial-framed), LZ4 frame, zstd."""
from __future__ import annotations

import struct
from enum import IntEnum

import cramjam
import numpy as np

from fluvial.errors import CorruptRecordError, MessageTooLargeError, UnsupportedCompressionError


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
try:
    # Small snappy blocks (a producer's few records) are decompressed holding the GIL:
    # cramjam releases it, and on a loop thread shared with the fsync and executor threads
    # getting it back cost more than the decompression itself.
    from fluvial.protocol._records import snappy_uncompress as _snappy_small
except ImportError:  # not built, or built from an older checkout: cramjam for every block
    _snappy_small = None
SMALL_SNAPPY_BYTES = 64 * 1024

# The most a compressed records section may expand to. A small batch of zeros can claim
# gigabytes (a decompression bomb); decompression stops once this much is written.
MAX_DECOMPRESSED_BYTES = 128 * 1024 * 1024
# cramjam's message when an output buffer is full before the input is used up.
_OUTPUT_FULL = "failed to write whole buffer"

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


def _too_large(codec: Compression, max_size: int) -> MessageTooLargeError:
    return MessageTooLargeError(f"{codec.name.lower()} records decompress to more than {max_size} bytes")


def _snappy_block(block: Buffer, max_size: int) -> Buffer:
    if _snappy_small is not None and len(block) <= SMALL_SNAPPY_BYTES:
        out = _snappy_small(block, max_size)
        if out is None:
            raise _too_large(Compression.SNAPPY, max_size)
        return out
    # A raw snappy block states its uncompressed length up front.
    if cramjam.snappy.decompress_raw_len(block) > max_size:
        raise _too_large(Compression.SNAPPY, max_size)
    return cramjam.snappy.decompress_raw(block)


def _snappy_decompress(data: Buffer, max_size: int) -> Buffer:
    if not is_xerial_framed(data):
        # librdkafka sends one raw snappy block.
        return _snappy_block(data, max_size)
    view = memoryview(data).cast("B")
    pos = len(XERIAL_HEADER)
    blocks = []
    left = max_size
    while pos < len(view):
        if pos + 4 > len(view):
            raise CorruptRecordError("xerial snappy stream ends inside a block length")
        (length,) = _BLOCK_LENGTH.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > len(view):
            raise CorruptRecordError("xerial snappy block runs past the end of the stream")
        try:
            block = _snappy_block(view[pos:pos + length], left)
        except MessageTooLargeError:
            raise _too_large(Compression.SNAPPY, max_size) from None
        left -= len(block)
        blocks.append(block)
        pos += length
    if len(blocks) == 1:
        return blocks[0]
    return b"".join(blocks)


def _first_guess(codec: Compression, data: Buffer) -> int:
    if codec is Compression.GZIP and len(data) >= 18:
        # The gzip trailer's ISIZE: the uncompressed size mod 2**32 (right for one member).
        return int.from_bytes(memoryview(data)[-4:], "little") + 1
    return 4 * len(data)


def _bounded(codec: Compression, data: Buffer, max_size: int) -> Buffer:
    """Decompress into a buffer of bounded size, growing it (x4) while the output does not
    fit, up to ``max_size`` + 1 bytes: filling that means the section is too large."""
    decompress_into = {Compression.GZIP: cramjam.gzip.decompress_into, Compression.LZ4: cramjam.lz4.decompress_into,
                       Compression.ZSTD: cramjam.zstd.decompress_into}[codec]
    size = min(max_size + 1, max(64 * 1024, _first_guess(codec, data)))
    while True:
        out = np.empty(size, np.uint8)  # not zero-filled: only the written part is returned
        try:
            n = decompress_into(data, out)
        except cramjam.DecompressionError as exc:
            if _OUTPUT_FULL not in str(exc):
                raise
            if size > max_size:
                raise _too_large(codec, max_size) from None
            size = min(max_size + 1, size * 4)
            continue
        if n > max_size:
            raise _too_large(codec, max_size)
        return memoryview(out)[:n]


def decompress_buffer(codec: Compression, data: Buffer, max_size: int = MAX_DECOMPRESSED_BYTES) -> Buffer:
    """Like :func:`decompress` but returns any buffer object, saving a copy on the hot path.

    Output beyond ``max_size`` bytes raises MessageTooLargeError before it is held in memory.
    """
    codec = codec_from_id(codec)
    try:
        if codec is Compression.NONE:
            return data
        if codec is Compression.SNAPPY:
            return _snappy_decompress(data, max_size)
        # cramjam streams zstd, so frames written without a content size decode too.
        return _bounded(codec, data, max_size)
    except cramjam.DecompressionError as exc:
        raise CorruptRecordError(f"cannot decompress {codec.name.lower()} records: {exc}") from None


def decompress(codec: Compression, data: Buffer, max_size: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """Decompress a records section; snappy input may be xerial-framed or a raw block."""
    return bytes(decompress_buffer(codec, data, max_size))
