"""Bounds-checked reads of the few flatbuffer shapes in Arrow IPC message headers.

Every read goes through struct against the metadata slice, so garbage raises struct.error or
IndexError instead of reading elsewhere.
"""
from __future__ import annotations

import struct

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")


def root(buf: memoryview) -> int:
    """Position of the root table."""
    return _U32.unpack_from(buf, 0)[0]


def field(buf: memoryview, table: int, field_id: int) -> int | None:
    """Position of a table's field, None when the field is absent."""
    vtable = table - _I32.unpack_from(buf, table)[0]
    vtable_length = _U16.unpack_from(buf, vtable)[0]
    slot = 4 + 2 * field_id
    if slot + 2 > vtable_length:
        return None
    offset = _U16.unpack_from(buf, vtable + slot)[0]
    return table + offset if offset else None


def field_u8(buf: memoryview, table: int, field_id: int) -> int:
    pos = field(buf, table, field_id)
    return _U8.unpack_from(buf, pos)[0] if pos is not None else 0


def deref(buf: memoryview, pos: int) -> int:
    """Follow the offset stored at ``pos`` (to a table, vector or string)."""
    return pos + _U32.unpack_from(buf, pos)[0]


def string_span(buf: memoryview, table: int, field_id: int) -> tuple[int, int]:
    """(start, end) of a string field's bytes; (0, 0) when absent."""
    pos = field(buf, table, field_id)
    if pos is None:
        return 0, 0
    string = deref(buf, pos)
    length = _U32.unpack_from(buf, string)[0]
    if string + 4 + length > len(buf):
        raise IndexError("string past the end of the header")
    return string + 4, string + 4 + length


def vector_span(buf: memoryview, table: int, field_id: int, item_size: int) -> tuple[int, int]:
    """(start, end) of a vector field's items (of ``item_size`` bytes each); (0, 0) when absent."""
    pos = field(buf, table, field_id)
    if pos is None:
        return 0, 0
    vector = deref(buf, pos)
    count = _U32.unpack_from(buf, vector)[0]
    if vector + 4 + count * item_size > len(buf):
        raise IndexError("vector past the end of the header")
    return vector + 4, vector + 4 + count * item_size
