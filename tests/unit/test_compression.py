"""Record batch compression: every codec round-trips and reads what the real clients write."""
from __future__ import annotations

import gzip
import struct

import cramjam
import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.errors import CorruptRecordError, MessageTooLargeError, UnsupportedCompressionError
from fluvial.protocol.compression import (
    XERIAL_BLOCK_SIZE,
    XERIAL_HEADER,
    Compression,
    compress,
    decompress,
    is_xerial_framed,
    snappy_xerial_compress,
)

ALL = list(Compression)
COMPRESSED = [c for c in Compression if c is not Compression.NONE]
TEXT = b"the quick brown fox jumps over the lazy dog " * 3000  # > one xerial block


@settings(max_examples=60, deadline=None)
@given(codec=st.sampled_from(ALL), data=st.binary(max_size=5000))
def test_every_codec_round_trips(codec: Compression, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", ALL)
def test_decompress_accepts_memoryview(codec: Compression) -> None:
    packed = compress(codec, TEXT)
    assert decompress(codec, memoryview(packed)) == TEXT


def test_snappy_is_xerial_framed_like_the_java_client() -> None:
    packed = compress(Compression.SNAPPY, TEXT)
    assert packed.startswith(b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
    # Blocks of at most 32 KiB of input, each an int32 length and a raw snappy block.
    pos, blocks = len(XERIAL_HEADER), []
    while pos < len(packed):
        (length,) = struct.unpack_from(">i", packed, pos)
        blocks.append(snappy.uncompress(packed[pos + 4:pos + 4 + length]))
        pos += 4 + length
    assert pos == len(packed)
    assert len(blocks) == -(-len(TEXT) // XERIAL_BLOCK_SIZE) > 1
    assert b"".join(blocks) == TEXT


def test_snappy_raw_block_as_librdkafka_sends_it() -> None:
    raw = snappy.compress(TEXT)
    assert not is_xerial_framed(raw)
    assert decompress(Compression.SNAPPY, raw) == TEXT


def test_snappy_xerial_from_the_python_clients() -> None:
    from aiokafka.codec import snappy_encode as aiokafka_snappy
    from kafka.codec import snappy_encode as kafka_python_snappy

    for framed in (kafka_python_snappy(TEXT), aiokafka_snappy(TEXT)):
        assert is_xerial_framed(framed)
        assert decompress(Compression.SNAPPY, framed) == TEXT
    # and they read ours
    from kafka.codec import snappy_decode

    assert snappy_decode(compress(Compression.SNAPPY, TEXT)) == TEXT


def test_snappy_xerial_with_custom_block_size_and_empty_input() -> None:
    assert decompress(Compression.SNAPPY, snappy_xerial_compress(TEXT, block_size=1000)) == TEXT
    empty = compress(Compression.SNAPPY, b"")
    assert empty == XERIAL_HEADER
    assert decompress(Compression.SNAPPY, empty) == b""


@pytest.mark.parametrize(
    "stream",
    [
        XERIAL_HEADER + b"\x00\x00",  # ends inside a block length
        XERIAL_HEADER + struct.pack(">i", 100) + b"abc",  # block past the end
        XERIAL_HEADER + struct.pack(">i", -1),  # negative length
        XERIAL_HEADER + struct.pack(">i", 3) + b"\xff\xff\xff",  # garbage block
    ],
)
def test_broken_xerial_stream_is_corrupt(stream: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decompress(Compression.SNAPPY, stream)


def test_lz4_frames_interoperate_with_the_lz4_library() -> None:
    assert decompress(Compression.LZ4, lz4.frame.compress(TEXT)) == TEXT
    assert lz4.frame.decompress(compress(Compression.LZ4, TEXT)) == TEXT
    # Java's KafkaLZ4BlockOutputStream writes independent 64 KiB blocks without content size.
    java_like = lz4.frame.compress(
        TEXT, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False, store_size=False
    )
    assert decompress(Compression.LZ4, java_like) == TEXT


def test_gzip_interoperates_with_the_standard_library() -> None:
    assert decompress(Compression.GZIP, gzip.compress(TEXT)) == TEXT
    assert gzip.decompress(compress(Compression.GZIP, TEXT)) == TEXT


def test_zstd_frames_with_and_without_content_size() -> None:
    with_size = zstandard.ZstdCompressor().compress(TEXT)
    streamer = zstandard.ZstdCompressor().compressobj()
    without_size = streamer.compress(TEXT) + streamer.flush()
    assert zstandard.get_frame_parameters(without_size).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert decompress(Compression.ZSTD, with_size) == TEXT
    assert decompress(Compression.ZSTD, without_size) == TEXT
    assert zstandard.ZstdDecompressor().decompress(compress(Compression.ZSTD, TEXT)) == TEXT


@pytest.mark.parametrize("codec", COMPRESSED)
def test_garbage_is_corrupt(codec: Compression) -> None:
    with pytest.raises(CorruptRecordError):
        decompress(codec, b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x09garbage!!")
    with pytest.raises(CorruptRecordError):
        decompress(codec, b"\xff" * 40)


@settings(max_examples=80, deadline=None)
@given(codec=st.sampled_from(COMPRESSED), data=st.binary(max_size=300))
def test_random_input_decompresses_or_is_corrupt(codec: Compression, data: bytes) -> None:
    # A snappy block is free to claim any size up front; one over the limit is refused unread.
    try:
        decompress(codec, data)
    except (CorruptRecordError, MessageTooLargeError):
        pass


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_ids_are_unsupported(codec_id: int) -> None:
    with pytest.raises(UnsupportedCompressionError):
        decompress(codec_id, b"x")
    with pytest.raises(UnsupportedCompressionError):
        compress(codec_id, b"x")


def test_cramjam_error_type_is_what_we_catch() -> None:
    # decompress_buffer maps this exception to CorruptRecordError; if cramjam renames it,
    # garbage would escape as an unexpected exception type.
    with pytest.raises(cramjam.DecompressionError):
        cramjam.zstd.decompress(b"\xff" * 10)


@pytest.mark.parametrize(("codec", "levels"), [(Compression.GZIP, [1, 9]), (Compression.LZ4, [0, 9]), (Compression.ZSTD, [1, 19])])
def test_compression_levels(codec: Compression, levels: list[int]) -> None:
    fast, small = (compress(codec, TEXT, level) for level in levels)
    assert decompress(codec, fast) == decompress(codec, small) == TEXT
    assert len(small) <= len(fast)


# ------------------------------------------------------------------ small snappy blocks, compiled

from fluvial.protocol import compression as _compression  # noqa: E402

_small = _compression._snappy_small


def _cramjam_outcome(block: bytes, max_size: int):
    try:
        if cramjam.snappy.decompress_raw_len(block) > max_size:
            return "too large"
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError:
        return CorruptRecordError


def _compiled_outcome(block: bytes, max_size: int):
    try:
        out = _small(block, max_size)
    except CorruptRecordError:
        return CorruptRecordError
    return "too large" if out is None else bytes(out)


def test_small_snappy_blocks_use_the_compiled_decoder():
    assert _small is not None, "the compiled codec is not built (or older than this checkout)"


@pytest.mark.skipif(_small is None, reason="compiled codec not built")
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=3000) | st.lists(st.sampled_from([b"ab", b"xyz", b"\0" * 70, b"k"]), max_size=200).map(b"".join),
       st.data())
def test_compiled_snappy_agrees_with_cramjam(data, draw):
    """Byte for byte on valid blocks; the same refusal (CorruptRecordError, or too large)
    on mutated ones, never a crash."""
    block = bytearray(cramjam.snappy.compress_raw(data))
    assert _compiled_outcome(bytes(block), 1 << 20) == data
    for _ in range(draw.draw(st.integers(0, 3))):
        at = draw.draw(st.integers(0, len(block) - 1))
        kind = draw.draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip":
            block[at] = draw.draw(st.integers(0, 255))
        elif kind == "cut":
            del block[at:at + draw.draw(st.integers(1, 5))]
        else:
            block[at:at] = draw.draw(st.binary(min_size=1, max_size=5))
        if not block:
            break
    max_size = draw.draw(st.sampled_from([1 << 20, len(data), max(len(data) - 1, 0)]))
    assert _compiled_outcome(bytes(block), max_size) == _cramjam_outcome(bytes(block), max_size)


@pytest.mark.skipif(_small is None, reason="compiled codec not built")
@given(st.binary(max_size=40))
def test_compiled_snappy_refuses_garbage_like_cramjam(block):
    assert _compiled_outcome(block, 1 << 20) == _cramjam_outcome(block, 1 << 20)
