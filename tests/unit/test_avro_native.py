"""The compiled varint step of the Avro decoder gives what the NumPy reference gives:
values, cursor positions and each record's first problem, on any bytes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.schema import avro_binary
from fluvial.schema.avro_binary import DecodeErrors, _Cursor, pad

pytestmark = pytest.mark.skipif(avro_binary._native is None, reason="compiled Avro step not built")


def _read(data: bytes, starts: list[int], ends: list[int], native: bool) -> tuple:
    saved, avro_binary.USE_NATIVE = avro_binary.USE_NATIVE, native
    try:
        return _read_longs(data, starts, ends)
    finally:
        avro_binary.USE_NATIVE = saved


def _read_longs(data: bytes, starts: list[int], ends: list[int]) -> tuple:
    n = len(starts)
    errors = DecodeErrors(np.full(n, -1, np.int64))
    cur = _Cursor(pad(np.frombuffer(data, np.uint8)), np.array(starts, np.int64), np.array(ends, np.int64),
                  np.arange(n), errors)
    out = []
    for _ in range(3):  # several reads in a row: positions carry over, failed records stay parked
        out.append(cur.read_long("f").tolist())
    return out, cur.pos.tolist(), errors.by_record()


varint_bytes = st.lists(st.one_of(st.integers(0, 255), st.sampled_from([0x80, 0xFF, 0x00, 0x01, 0x7F])),
                        min_size=0, max_size=60)


@settings(max_examples=300, deadline=None)
@given(data=varint_bytes, cuts=st.lists(st.integers(0, 60), min_size=1, max_size=8))
def test_native_varints_match_the_numpy_reader(data, cuts):
    raw = bytes(data)
    bounds = sorted(min(c, len(raw)) for c in cuts)
    starts = [0, *bounds[:-1]]
    ends = bounds
    assert _read(raw, starts, ends, True) == _read(raw, starts, ends, False)


def test_native_varints_edge_values():
    def zigzag(v: int) -> bytes:
        z = (v << 1) ^ (v >> 63)
        out = bytearray()
        while z >= 0x80:
            out.append((z & 0x7F) | 0x80)
            z >>= 7
        out.append(z)
        return bytes(out)

    values = [0, -1, 1, 63, -64, 64, 2**31 - 1, -2**31, 2**63 - 1, -2**63]
    cells = [zigzag(v) for v in values] + [b"\x80\x00", b"\xff" * 10 + b"\x01", b"\x80" * 9 + b"\x02", b"\x81"]
    data = b"".join(cells)
    starts = np.cumsum([0] + [len(c) for c in cells[:-1]]).tolist()
    ends = [s + len(c) for s, c in zip(starts, cells)]
    got = _read(data, starts, ends, True)
    assert got == _read(data, starts, ends, False)
    assert got[0][0][: len(values)] == values
    # The later reads run past every record's end; the first problems are those of the first read.
    first = [m for row, m in got[2] if row >= len(values)]
    assert first == ["field 'f': non-canonical varint (long)", "field 'f': varint longer than 64 bits (long)",
                     "field 'f': varint longer than 64 bits (long)", "field 'f': non-canonical varint (long)"]
    # (the lone 0x81 continues into the next byte, 0: a non-canonical two-byte varint)
    assert all(row >= len(values) or "varint" in m for row, m in got[2])


def _blobs(data: bytes, starts: list[int], ends: list[int], native: bool) -> tuple:
    saved, avro_binary.USE_NATIVE = avro_binary.USE_NATIVE, native
    try:
        n = len(starts)
        errors = DecodeErrors(np.full(n, -1, np.int64))
        cur = _Cursor(pad(np.frombuffer(data, np.uint8)), np.array(starts, np.int64), np.array(ends, np.int64),
                      np.arange(n), errors)
        out = [cur.read_blobs("f", "bytes").to_pylist() for _ in range(2)]
        return out, cur.pos.tolist(), errors.by_record()
    finally:
        avro_binary.USE_NATIVE = saved


@settings(max_examples=300, deadline=None)
@given(data=st.lists(st.one_of(st.integers(0, 255), st.sampled_from([0x00, 0x02, 0x04, 0x7F, 0x80, 0x01, 0x03])),
                     max_size=60),
       cuts=st.lists(st.integers(0, 60), min_size=1, max_size=8))
def test_native_blobs_match_the_numpy_reader(data, cuts):
    raw = bytes(data)
    bounds = sorted(min(c, len(raw)) for c in cuts)
    starts = [0, *bounds[:-1]]
    assert _blobs(raw, starts, bounds, True) == _blobs(raw, starts, bounds, False)


def test_native_blobs_read_lengths_and_refuse_bad_ones():
    cells = [b"\x06abc", b"\x00", b"\x03", b"\x0axy"]  # "abc", "", length -2, length 5 with 2 bytes left
    data = b"".join(cells)
    starts = np.cumsum([0] + [len(c) for c in cells[:-1]]).tolist()
    ends = [s + len(c) for s, c in zip(starts, cells)]
    got = _blobs(data, starts, ends, True)
    assert got == _blobs(data, starts, ends, False)
    assert got[0][0] == [b"abc", b"", b"", b""]
    assert [m for row, m in got[2] if row >= 2] == ["field 'f': bytes length is negative",
                                                    "field 'f': bytes length runs past the end of the value"]


@pytest.mark.parametrize("native", [False, True])
def test_an_array_of_varints_with_no_varint_end_is_refused_not_crashed(native):
    """An array of ints whose item bytes all have the continuation bit set: no varint ends in
    the value, so its items run past it, a record error rather than an IndexError."""
    import json

    from fluvial.schema.avro_schema import parse_avro

    node = parse_avro(json.loads(
        '{"type": "record", "name": "R", "fields": [{"name": "a", "type": {"type": "array", "items": "int"}}]}'))
    node = getattr(node, "root", node)
    # Count 2 (zigzag 4), then two bytes that never end a varint.
    data = np.frombuffer(bytes([4, 0x80, 0x80]), np.uint8)
    errors = DecodeErrors(np.full(1, -1))
    saved, avro_binary.USE_NATIVE = avro_binary.USE_NATIVE, native
    try:
        avro_binary.decode_avro(node, data, np.array([0]), np.array([3]), np.arange(1), errors)
    finally:
        avro_binary.USE_NATIVE = saved
    assert [row for row, _ in errors.by_record()] == [0]
    assert "run past the end" in errors.by_record()[0][1] or "malformed" in errors.by_record()[0][1]
