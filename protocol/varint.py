"""Zig-zag varints as Kafka writes them (the pure-Python reference for the record codec)."""
from __future__ import annotations

from fluvial.errors import CorruptRecordError

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def zigzag(value: int) -> int:
    """Map a signed integer to the unsigned form that varints carry."""
    return (value << 1) ^ (value >> 63)


def encode_varint(value: int, out: bytearray) -> None:
    """Append a zig-zag varint (also a varlong: the encoding is the same)."""
    raw = zigzag(value) & 0xFFFFFFFFFFFFFFFF
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def size_of_varint(value: int) -> int:
    raw = zigzag(value) & 0xFFFFFFFFFFFFFFFF
    size = 1
    while raw >= 0x80:
        raw >>= 7
        size += 1
    return size


def _decode(data: bytes | memoryview, pos: int, end: int, max_bytes: int, last_byte_max: int) -> tuple[int, int]:
    raw = 0
    shift = 0
    for i in range(max_bytes):
        if pos >= end:
            raise CorruptRecordError("varint runs past the end of its record")
        byte = data[pos]
        pos += 1
        # The last permitted byte may only carry the bits left in the integer; anything
        # more would silently wrap in other implementations, so it is refused.
        if i == max_bytes - 1 and byte > last_byte_max:
            raise CorruptRecordError("varint longer than its integer type")
        raw |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
    raise CorruptRecordError("varint longer than its integer type")  # pragma: no cover


def decode_varint(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Read a 32-bit zig-zag varint at ``pos``; return (value, next position)."""
    return _decode(data, pos, end, 5, 0x0F)


def decode_varlong(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Read a 64-bit zig-zag varint at ``pos``; return (value, next position)."""
    return _decode(data, pos, end, 10, 0x01)
