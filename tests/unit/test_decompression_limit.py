"""Decompression stops at its size limit: a small section claiming gigabytes is refused."""
from __future__ import annotations

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.errors import CorruptRecordError, MessageTooLargeError
from fluvial.protocol.compression import (MAX_DECOMPRESSED_BYTES, Compression, compress, decompress,
                                          snappy_xerial_compress)

CODECS = [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]


def raw_snappy(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


@pytest.mark.parametrize("codec", CODECS)
@given(data=st.binary(max_size=5000), slack=st.integers(0, 3))
@settings(max_examples=40, deadline=None)
def test_output_up_to_the_limit_is_kept_and_one_byte_more_refused(codec, data, slack):
    packed = compress(codec, data)
    assert decompress(codec, packed, max_size=len(data) + slack) == data
    if data:
        with pytest.raises(MessageTooLargeError):
            decompress(codec, packed, max_size=len(data) - 1)


@pytest.mark.parametrize("codec", CODECS)
def test_outputs_larger_than_the_first_buffer_grow_into_place(codec):
    # Compressible far beyond 4x its compressed size: the output buffer has to grow.
    data = (b"fluvial " * 200_000) + bytes(range(256)) * 100
    assert decompress(codec, compress(codec, data), max_size=len(data)) == data


def test_raw_and_framed_snappy_are_both_bounded():
    data = b"z" * 100_000
    for packed in (raw_snappy(data), snappy_xerial_compress(data, block_size=4096)):
        assert decompress(Compression.SNAPPY, packed, max_size=100_000) == data
        with pytest.raises(MessageTooLargeError):
            decompress(Compression.SNAPPY, packed, max_size=99_999)


def test_gzip_trailer_lying_about_the_size_is_corrupt_whatever_the_first_buffer():
    data = b"q" * 300_000
    packed = bytearray(compress(Compression.GZIP, data))
    packed[-4:] = (10).to_bytes(4, "little")  # ISIZE, the first guess of the output size
    for limit in (1000, 300_000):
        with pytest.raises((CorruptRecordError, MessageTooLargeError)):
            decompress(Compression.GZIP, bytes(packed), max_size=limit)


@pytest.mark.parametrize("codec", [Compression.ZSTD, Compression.GZIP])
def test_a_bomb_over_the_default_limit_is_refused(codec):
    compressor = cramjam.zstd.Compressor() if codec is Compression.ZSTD else cramjam.gzip.Compressor()
    zeros = bytes(1 << 20)
    for _ in range(MAX_DECOMPRESSED_BYTES // len(zeros) + 1):
        compressor.compress(zeros)
    bomb = bytes(compressor.finish())
    assert len(bomb) < MAX_DECOMPRESSED_BYTES // 100
    with pytest.raises(MessageTooLargeError):
        decompress(codec, bomb)
