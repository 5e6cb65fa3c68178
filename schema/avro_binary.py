"""Columnar Avro binary decoding and encoding: a whole batch of values per NumPy/Arrow call.

The decoder walks the writer schema once per batch (not once per record): every read
step works on the cursor positions of all records at once. Arrays and maps advance one
item position per step across all records still holding items. The encoder builds one
binary column per schema node and joins them row-wise in Arrow (`binary_join_element_wise`).

Only the canonical binary encoding is accepted (minimal varints, arrays and maps in one
block, booleans 0/1, minimal two's-complement decimals): it is what every Avro writer
produces, and it is what makes re-encoding byte-identical to what was produced.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.schema.arrow_mapping import avro_type_to_arrow
from fluvial.schema.avro_schema import AvroNode

try:  # the compiled varint step (schema/_avro.c); this module's NumPy code is the reference
    from fluvial.schema import _avro as _native
except ImportError:  # pragma: no cover - built without a compiler
    _native = None

# Use the compiled step when it is there (tests switch it off to compare both).
USE_NATIVE = _native is not None
# Status codes of _avro.read_varints -> the message the NumPy reader gives for them.
_VARINT_PROBLEMS = ((1, "value ends inside a varint"), (2, "non-canonical varint"),
                    (3, "varint longer than 64 bits"), (4, "malformed varint"))

_PAD = 16
_K10 = np.arange(10, dtype=np.int64)
_SHIFT10 = (np.arange(10, dtype=np.uint64) * np.uint64(7))
_EMPTY = pa.scalar(b"", pa.binary())


# ---------------------------------------------------------------- decoding

@dataclass
class DecodeErrors:
    """The first problem of each record of a batch (-1 = none), by index into `messages`."""

    first: np.ndarray
    messages: list[str] = field(default_factory=list)

    def add(self, rows: np.ndarray, message: str) -> None:
        rows = rows[self.first[rows] < 0]
        if rows.size:
            self.messages.append(message)
            self.first[rows] = len(self.messages) - 1

    def by_record(self) -> list[tuple[int, str]]:
        bad = np.flatnonzero(self.first >= 0)
        return [(int(i), self.messages[self.first[i]]) for i in bad]


class _Cursor:
    """Read positions of a set of records inside one shared data buffer."""

    __slots__ = ("data", "pos", "end", "rows", "errors")

    def __init__(self, data: np.ndarray, pos: np.ndarray, end: np.ndarray, rows: np.ndarray, errors: DecodeErrors):
        self.data, self.pos, self.end, self.rows, self.errors = data, pos, end, rows, errors

    def __len__(self) -> int:
        return self.pos.size

    def sub(self, mask: np.ndarray) -> "_Cursor":
        return _Cursor(self.data, self.pos[mask], self.end[mask], self.rows[mask], self.errors)

    def merge(self, sub: "_Cursor", mask: np.ndarray) -> None:
        self.pos[mask] = sub.pos

    def fail(self, mask: np.ndarray, message: str) -> None:
        """Record a problem for these records and park their cursor at their end, so later
        reads stay inside the buffer and yield empty values."""
        if mask.any():
            self.errors.add(self.rows[mask], message)
            self.pos[mask] = self.end[mask]

    def take(self, size: int, path: str, what: str) -> np.ndarray:
        """Claim `size` bytes for every record; returns the start positions."""
        short = self.pos + size > self.end
        self.fail(short, f"field {path!r}: value ends before its {what} ({size} bytes)")
        start = self.pos.copy()
        start[short] = 0  # in bounds; the record is already refused
        self.pos[~short] += size
        return start

    def read_long(self, path: str, what: str = "long") -> np.ndarray:
        p = self.pos
        n = p.size
        if n == 0:
            return np.zeros(0, np.int64)
        if USE_NATIVE and p.dtype == np.int64 and p.flags.c_contiguous and self.data.flags.c_contiguous:
            return self._read_long_native(path, what)
        b = self.data[p]
        going = np.flatnonzero(b & 0x80)
        if not going.size:  # every varint is one byte: the common case of small values
            over = p >= self.end
            if over.any():
                self.fail(over, f"field {path!r}: value ends inside a varint ({what})")
                b = np.where(over, np.uint8(0), b)
            self.pos += ~over
            v = b.astype(np.int64)
            return (v >> 1) ^ -(v & 1)
        zz = (b & 0x7F).astype(np.uint64)
        ln = np.ones(n, np.int64)
        # One step per byte position, over the records whose varint is still going: most
        # varints are 1-3 bytes, so this touches far fewer bytes than a 10-wide matrix.
        for k in range(1, 10):
            if not going.size:
                break
            b = self.data[p[going] + k]
            zz[going] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            ln[going] += 1
            last = b < 0x80
            loose = going[last & (b == 0)]
            if loose.size:
                self.fail(_mask(n, loose), f"field {path!r}: non-canonical varint ({what})")
            if k == 9:  # the tenth byte holds bit 63 only
                wide = going[b > 1]
                if wide.size:
                    self.fail(_mask(n, wide), f"field {path!r}: varint longer than 64 bits ({what})")
            going = going[~last]
        if going.size:
            self.fail(_mask(n, going), f"field {path!r}: malformed varint ({what})")
        over = p + ln > self.end
        if over.any():
            self.fail(over, f"field {path!r}: value ends inside a varint ({what})")
            ln[over] = 0
        self.pos += ln
        v = (zz >> np.uint64(1)).astype(np.int64) ^ -(zz & np.uint64(1)).astype(np.int64)
        if over.any():
            v[over] = 0
        return v

    def _read_long_native(self, path: str, what: str) -> np.ndarray:
        n = self.pos.size
        values = np.empty(n, np.int64)
        status = np.empty(n, np.int8)
        end = np.ascontiguousarray(self.end, np.int64)
        if _native.read_varints(self.data, self.pos, end, values, status):
            for code, problem in _VARINT_PROBLEMS:
                rows = np.flatnonzero(status == code)
                if rows.size:  # the compiled step parked their cursors at their ends already
                    self.errors.add(self.rows[rows], f"field {path!r}: {problem} ({what})")
        return values

    def _read_blobs_native(self, path: str, what: str) -> pa.BinaryArray:
        n = self.pos.size
        offsets = np.empty(n + 1, np.int32)
        status = np.empty(n, np.int8)
        failed, body = _native.read_blobs(self.data, self.pos, np.ascontiguousarray(self.end, np.int64), offsets, status)
        if failed:
            problems = [(code, f"{problem} ({what} length)") for code, problem in _VARINT_PROBLEMS]
            problems += [(5, f"{what} length is negative"), (6, f"{what} length runs past the end of the value")]
            for code, problem in problems:
                rows = np.flatnonzero(status == code)
                if rows.size:  # parked at their ends with an empty value already
                    self.errors.add(self.rows[rows], f"field {path!r}: {problem}")
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(body)])

    def read_int(self, path: str, what: str = "int") -> np.ndarray:
        v = self.read_long(path, what)
        bad = (v < -(2 ** 31)) | (v >= 2 ** 31)
        self.fail(bad, f"field {path!r}: {what} out of 32-bit range")
        v[bad] = 0
        return v.astype(np.int32)

    def gather(self, start: np.ndarray, size: int) -> np.ndarray:
        return self.data[start[:, None] + np.arange(size)]

    def read_blobs(self, path: str, what: str) -> pa.BinaryArray:
        """Length-prefixed bytes of every record, as one binary array."""
        if USE_NATIVE and self.pos.dtype == np.int64 and self.pos.flags.c_contiguous and self.data.flags.c_contiguous:
            return self._read_blobs_native(path, what)
        ln = self.read_long(path, f"{what} length")
        negative = ln < 0
        self.fail(negative, f"field {path!r}: {what} length is negative")
        ln[negative] = 0
        long = self.pos + ln > self.end
        self.fail(long, f"field {path!r}: {what} length runs past the end of the value")
        ln[long] = 0
        start = self.pos.copy()
        self.pos += ln
        n = ln.size
        if n == 0:
            return pa.array([], pa.binary())
        if int(self.pos[-1]) >= 2 ** 31:
            raise OverflowError("batch values exceed 2 GiB")
        # The blobs are disjoint and in buffer order, so [start0, end0, start1, end1, ...]
        # are valid offsets of a view over the buffer whose even elements are the blobs;
        # `take` copies them out in C.
        edges = np.empty(2 * n, np.int32)
        edges[0::2] = start
        edges[1::2] = start + ln
        view = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(edges), pa.py_buffer(self.data)])
        return view.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))


def _mask(n: int, rows: np.ndarray) -> np.ndarray:
    m = np.zeros(n, bool)
    m[rows] = True
    return m


def decode_avro(node: AvroNode, data: np.ndarray, pos: np.ndarray, end: np.ndarray,
                rows: np.ndarray, errors: DecodeErrors) -> pa.Array:
    """Decode one Avro value per record at [pos, end) of `data` (uint8; the reference
    decoder's copy is padded here for its whole-varint reads).

    Records with problems get a message in `errors` (and a placeholder value); records
    whose value does not fill exactly [pos, end) are refused as well.
    """
    pos, end = pos.astype(np.int64), end.astype(np.int64)
    if USE_NATIVE and data.dtype == np.uint8 and data.flags.c_contiguous:
        arr = _decode_native(node, data, pos, end)
        if arr is not None:
            return arr
    cur = _Cursor(pad(data), pos, end, rows, errors)
    arr = _decode(node, cur, "")
    left = cur.end - cur.pos
    cur.fail(left > 0, "value has bytes left over after the record: it does not match its writer schema")
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        _fail_invalid_values(cur, arr, 0, len(arr))
    return arr


def _fail_invalid_values(cur: _Cursor, arr: pa.Array, start: int, stop: int) -> None:
    """Refuse the records holding a value its column type cannot hold (a decimal with more
    digits than its precision, a time of day outside the day): error path only, the bad
    records found by halving the range that fails Arrow's validation."""
    # A copy, not a slice: Arrow validates a slice's children whole.
    part = arr.take(pa.array(np.arange(start, stop)))
    try:
        part.validate(full=True)
        return
    except pa.ArrowInvalid as exc:
        if stop - start > 1:
            middle = (start + stop) // 2
            _fail_invalid_values(cur, arr, start, middle)
            _fail_invalid_values(cur, arr, middle, stop)
            return
        why = str(exc)
    name = ""
    if isinstance(part, pa.StructArray):
        for i, child in enumerate(part.flatten()):
            try:
                child.validate(full=True)
            except pa.ArrowInvalid as exc:
                name, why = part.type.field(i).name, str(exc)
                break
    cur.fail(_mask(len(cur), np.array([start])), f"field {name!r}: value does not fit its column: {why}")


# ---------------------------------------------------------------- whole-batch decoding in C

class _Op:
    """Operations of a schema program (mirrored by the OP_ enum of schema/_avro.c)."""

    NULL, BOOLEAN, INT, LONG, FIXED, BLOB, ENUM, RECORD, ARRAY, MAP, NULLABLE, SINGLE, DECIMAL_BYTES, \
        DECIMAL_FIXED = range(14)


# Flags of a program entry (its `b`), as schema/_avro.c reads them.
_BLOB_TEXT = 1  # a string column: the pass reports whether its bytes are known UTF-8
_BLOB_LARGE = 2
_INT_UNSIGNED = 0x100  # the low byte: the column's width in bytes when narrower than Avro's
_MAX_FIXED = 1 << 20  # the largest fixed size a program may hold (as schema/_avro.c checks)


class _NoProgram(Exception):
    """The schema has a part the compiled decoder does not take (the NumPy decoder does)."""


@dataclass
class _Program:
    """A writer schema flattened for `_avro.decode_batch`: one entry per schema position (a
    named type used twice is two entries: each gets its own column), the enum symbols, and
    the Arrow type of the decoded column."""

    code: np.ndarray  # int64: node count, kid count, (op, a, b, first kid, kid count) per entry, kids
    symbols: bytes
    symbol_offsets: np.ndarray  # int64
    type: pa.DataType
    node: AvroNode
    # `type` with the string columns a batch had known UTF-8 as binary (by the pass's
    # `checked` bytes): the type a decoded batch is imported and validated as.
    import_types: dict[bytes, pa.DataType] = field(default_factory=dict)

    @property
    def nodes(self) -> int:
        return int(self.code[0])

    def import_type(self, checked: np.ndarray) -> pa.DataType:
        key = checked.tobytes()
        typ = self.import_types.get(key)
        if typ is None:
            typ = _ascii_as_binary(self.node, self.type, checked, [0])
            if typ == self.type:
                typ = self.type
            if len(self.import_types) < _MAX_IMPORT_TYPES:
                self.import_types[key] = typ
        return typ


_PROGRAMS: dict[int, tuple[AvroNode, _Program | None]] = {}
_MAP_KEY = AvroNode("string")


def _program(node: AvroNode) -> _Program | None:
    """The compiled program of a writer schema's root, built once per schema (None: the
    schema has a part only the NumPy decoder takes)."""
    hit = _PROGRAMS.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    rows: list[list[int]] = []
    kids_of: list[list[int]] = []
    symbols: list[bytes] = []

    def add(n: AvroNode, depth: int) -> int:
        if depth > 64:  # recursive named types have no column type anyway
            raise _NoProgram
        i = len(rows)
        rows.append([])
        kids_of.append([])
        k, lg = n.kind, n.logical
        a = b = 0
        kids: list[int] = []
        if k == "union":
            if len(n.branches) == 1:
                op, kids = _Op.SINGLE, [add(n.branches[0], depth + 1)]
            elif n.nullable_value() is not None:
                op, a, kids = _Op.NULLABLE, n.null_branch, [add(n.nullable_value(), depth + 1)]
            else:
                raise _NoProgram
        elif lg == "decimal":
            width = 16 if n.precision <= 38 else 32
            if k == "fixed":
                if not 1 <= n.size <= width:
                    raise _NoProgram
                op, a, b = _Op.DECIMAL_FIXED, n.size, width
            else:
                op, a = _Op.DECIMAL_BYTES, width
        elif k in ("int", "long"):
            op = _Op.INT if k == "int" else _Op.LONG
            if n.arrow_type is not None and not lg:
                typ = avro_type_to_arrow(n)
                if not pa.types.is_integer(typ):
                    raise _NoProgram
                b = typ.bit_width // 8 | (0 if pa.types.is_signed_integer(typ) else _INT_UNSIGNED)
        elif k in ("bytes", "string"):
            op = _Op.BLOB
            if k == "string":
                b = _BLOB_TEXT | (_BLOB_LARGE if avro_type_to_arrow(n) == pa.large_string() else 0)
        elif k == "enum":
            if not n.symbols:
                raise _NoProgram
            op, a, b = _Op.ENUM, len(symbols), len(n.symbols)
            symbols.extend(s.encode() for s in n.symbols)
        elif k in ("null", "boolean"):
            op = _Op.NULL if k == "null" else _Op.BOOLEAN
        elif k in ("float", "double", "fixed"):
            op, a = _Op.FIXED, {"float": 4, "double": 8}.get(k, n.size)
            if not 0 <= a <= _MAX_FIXED:
                raise _NoProgram
        elif k == "record":
            if not n.fields:
                raise _NoProgram
            op, kids = _Op.RECORD, [add(f.type, depth + 1) for f in n.fields]
        elif k == "array":
            op, kids = _Op.ARRAY, [add(n.items, depth + 1)]
        elif k == "map":
            op, kids = _Op.MAP, [add(_MAP_KEY, depth + 1), add(n.values, depth + 1)]
        else:
            raise _NoProgram
        rows[i] = [op, a, b]
        kids_of[i] = kids
        return i

    try:
        add(node, 0)
        flat: list[int] = []
        code = [len(rows), sum(len(k) for k in kids_of)]
        for row, kids in zip(rows, kids_of):
            code += [*row, len(flat), len(kids)]
            flat += kids
        offsets = np.zeros(len(symbols) + 1, np.int64)
        np.cumsum([len(s) for s in symbols], out=offsets[1:])
        program: _Program | None = _Program(np.array(code + flat, np.int64), b"".join(symbols), offsets,
                                            avro_type_to_arrow(node), node)
    except _NoProgram:
        program = None
    _PROGRAMS[id(node)] = (node, program)
    return program


_MAX_IMPORT_TYPES = 64  # kept per program: one per set of checked string columns seen


def _ascii_as_binary(n: AvroNode, typ: pa.DataType, checked: np.ndarray, at: list[int]) -> pa.DataType:
    """`typ` (the Arrow type of `n`'s values) with the string columns `checked` marks (known
    UTF-8 in this batch) as binary, walking the schema in `_program`'s order (entry
    `at[0]` is `n`)."""
    i = at[0]
    at[0] += 1
    k = n.kind
    if k == "union":
        inner = n.branches[0] if len(n.branches) == 1 else n.nullable_value()
        return _ascii_as_binary(inner, typ, checked, at)
    if n.logical == "decimal":
        return typ
    if k in ("string", "enum"):
        if checked[i]:
            return {pa.string(): pa.binary(), pa.large_string(): pa.large_binary()}.get(typ, typ)
        return typ
    if k == "record":
        return pa.struct([typ.field(j).with_type(_ascii_as_binary(f.type, typ.field(j).type, checked, at))
                          for j, f in enumerate(n.fields)])
    if k == "array":
        return pa.list_(typ.value_field.with_type(_ascii_as_binary(n.items, typ.value_type, checked, at)))
    if k == "map":
        key = typ.key_field.with_type(_ascii_as_binary(_MAP_KEY, typ.key_type, checked, at))
        return pa.map_(key, typ.item_field.with_type(_ascii_as_binary(n.values, typ.item_type, checked, at)),
                       typ.keys_sorted)
    return typ


def _decode_native(node: AvroNode, data: np.ndarray, pos: np.ndarray, end: np.ndarray) -> pa.Array | None:
    """The batch decoded by `_avro.decode_batch` (its columns handed over as Arrow arrays
    through the C data interface), or None when a record has a problem or the schema has
    a part the compiled decoder does not take: the NumPy decoder then runs."""
    program = _program(node)
    if program is None:
        return None
    checked = np.zeros(program.nodes, np.uint8)
    address = _native.decode_batch(program.code, program.symbols, program.symbol_offsets, data, pos, end, checked)
    return _imported(address, program, checked)


def decode_framed(node: AvroNode, values: pa.Array, schema_id: int) -> pa.Array | None:
    """A batch of Confluent wire-format values (a binary column) all written with
    `schema_id`, decoded by the compiled decoder straight from the column's buffers (no
    per-record positions made in NumPy, the header checked in the same pass), or None
    when anything is not so (a null, another schema id, a record with a problem, no
    compiled program or decoder): `decode_avro` then decides, and names the problems."""
    if not USE_NATIVE or not pa.types.is_binary(values.type) or values.null_count or not len(values):
        return None
    program = _program(node)
    if program is None:
        return None
    _, offsets, data = values.buffers()
    if data is None:
        return None
    checked = np.zeros(program.nodes, np.uint8)
    address = _native.decode_framed(program.code, program.symbols, program.symbol_offsets,
                                    np.frombuffer(data, np.uint8),
                                    np.frombuffer(offsets, np.int32, len(values) + 1, values.offset * 4), schema_id,
                                    checked)
    return _imported(address, program, checked)


def _imported(address: int, program: _Program, checked: np.ndarray) -> pa.Array | None:
    if address < 0:
        return None
    # String columns the pass found well-formed UTF-8 (all ASCII, or checked whole 16 bytes
    # at a time) are imported as binary: Arrow's check of each value (a few ns a value
    # however short) is left to the columns the pass could not vouch for. Arrow still
    # validates everything else: every column's layout, decimals' precision, times of day.
    typ = program.import_type(checked)
    arr = pa.Array._import_from_c(address, typ)
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return arr if typ is program.type else arr.view(program.type)


def decode_native_one(node: AvroNode, value: bytes, skip: int) -> pa.Array | None:
    """One record (the bytes of `value` after `skip` header bytes) decoded by the compiled
    decoder as a one-element array, or None where `decode_avro` must decide (no compiled
    program for the schema, a record it refuses): a point lookup's decode without the
    batch path's per-call arrays."""
    return _decode_native(node, np.frombuffer(value, np.uint8), np.array([skip], np.int64),
                          np.array([len(value)], np.int64))


def pad(buffer: np.ndarray) -> np.ndarray:
    """The data buffer with room for whole-varint reads past its end."""
    return np.concatenate([buffer, np.zeros(_PAD, np.uint8)])


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def binary_from_buffers(offsets: np.ndarray, body: np.ndarray, typ: pa.DataType = pa.binary()) -> pa.Array:
    """A binary (or string) array over int32 offsets and a byte buffer, without copying."""
    n = offsets.size - 1
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets), pa.py_buffer(body)])


def _decode(node: AvroNode, cur: _Cursor, path: str) -> pa.Array:
    n = len(cur)
    k, lg = node.kind, node.logical
    if k == "union":
        return _decode_union(node, cur, path)
    if lg == "decimal":
        return _decode_decimal(node, cur, path)
    if k == "null":
        return pa.nulls(n)
    if k == "boolean":
        start = cur.take(1, path, "boolean")
        b = cur.data[start]
        cur.fail(b > 1, f"field {path!r}: boolean byte is neither 0 nor 1")
        return pa.array(b == 1, pa.bool_())
    if k == "int":
        v = cur.read_int(path)
        if node.arrow_type is not None and not lg:
            return _narrowed(cur, v, avro_type_to_arrow(node), path)
        typ = {"date": pa.date32(), "time-millis": pa.time32("ms")}.get(lg, pa.int32())
        return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(v)])
    if k == "long":
        v = cur.read_long(path)
        if node.arrow_type is not None and not lg:
            return _narrowed(cur, v, avro_type_to_arrow(node), path)
        typ = avro_type_to_arrow(node) if lg else pa.int64()
        return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(v)])
    if k in ("float", "double"):
        size = 4 if k == "float" else 8
        start = cur.take(size, path, k)
        raw = np.ascontiguousarray(cur.gather(start, size))
        return pa.Array.from_buffers(pa.float32() if size == 4 else pa.float64(), n, [None, pa.py_buffer(raw)])
    if k in ("bytes", "string"):
        blobs = cur.read_blobs(path, k)
        if k == "bytes":
            return blobs
        text = _as_text(cur, blobs, path)
        return text.cast(pa.large_string()) if node.arrow_type is not None and \
            avro_type_to_arrow(node) == pa.large_string() else text
    if k == "fixed":
        start = cur.take(node.size, path, f"fixed({node.size})")
        raw = np.ascontiguousarray(cur.gather(start, node.size))
        return pa.Array.from_buffers(pa.binary(node.size), n, [None, pa.py_buffer(raw)])
    if k == "enum":
        idx = cur.read_int(path, "enum index")
        bad = (idx < 0) | (idx >= len(node.symbols))
        cur.fail(bad, f"field {path!r}: enum index out of range for {len(node.symbols)} symbols")
        idx[bad] = 0
        return pa.array(node.symbols, pa.string()).take(pa.array(idx))
    if k == "record":
        children = [_decode(f.type, cur, _join(path, f.name)) for f in node.fields]
        typ = avro_type_to_arrow(node)
        return pa.StructArray.from_arrays(children, fields=list(typ)) if children else pa.array([{}] * n, typ)
    if k in ("array", "map"):
        return _decode_repeated(node, cur, path)
    raise TypeError(f"field {path!r}: Avro type {k!r} cannot be decoded into a column")


def _as_text(cur: _Cursor, blobs: pa.BinaryArray, path: str) -> pa.Array:
    """The blobs as strings; records holding invalid UTF-8 are refused (and get "")."""
    text = blobs.view(pa.string())
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        _fail_bad_utf8(cur, blobs, path)
        text = pa.array([""] * len(blobs), pa.string())
    return text


def _fail_bad_utf8(cur: _Cursor, blobs: pa.BinaryArray, path: str) -> None:
    # Error path only: find which records hold the invalid text.
    bad = np.zeros(len(blobs), bool)
    for i, raw in enumerate(blobs.to_pylist()):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            bad[i] = True
    cur.fail(bad, f"field {path!r}: string is not valid UTF-8")


def _decode_union(node: AvroNode, cur: _Cursor, path: str) -> pa.Array:
    idx = cur.read_long(path, "union branch")
    bad = (idx < 0) | (idx >= len(node.branches))
    cur.fail(bad, f"field {path!r}: union branch {idx[bad][0] if bad.any() else 0} does not exist")
    if len(node.branches) == 1:
        return _decode(node.branches[0], cur, path)
    inner = node.nullable_value()
    if inner is None:
        raise TypeError(f"field {path!r}: only [null, T] unions have a column type")
    nb = node.null_branch
    is_null = (idx == nb) | bad
    present = ~is_null
    sub = cur.sub(present)
    child = _decode(inner, sub, path)
    cur.merge(sub, present)
    if not is_null.any():
        return child
    take = np.cumsum(present) - 1
    take[is_null] = 0
    return child.take(pa.array(take, mask=is_null))


def _decode_repeated(node: AvroNode, cur: _Cursor, path: str) -> pa.Array:
    what = "array" if node.kind == "array" else "map"
    count = cur.read_long(path, f"{what} block count")
    bad = count < 0
    cur.fail(bad, f"field {path!r}: {what} written in sized blocks (not the canonical encoding)")
    count[bad] = 0
    too_many = count > (cur.end - cur.pos)
    cur.fail(too_many, f"field {path!r}: {what} item count exceeds the value's size")
    count[too_many] = 0
    item_node = node.items if node.kind == "array" else node.values
    if node.kind == "array" and count.any():
        size = _fixed_size(item_node)
        if size or _is_varint(item_node):
            return _decode_flat_array(node, item_node, cur, count, size, path)
    offsets = np.zeros(count.size + 1, np.int64)
    np.cumsum(count, out=offsets[1:])
    keys_parts: list[pa.Array] = []
    item_parts: list[pa.Array] = []
    slots: list[np.ndarray] = []
    item_path = f"{path}[]"
    for j in range(int(count.max()) if count.size else 0):
        active = count > j
        sub = cur.sub(active)
        if node.kind == "map":
            keys_parts.append(_as_text(sub, sub.read_blobs(item_path, "map key"), f"{path} (map key)"))
        item_parts.append(_decode(item_node, sub, item_path))
        cur.merge(sub, active)
        slots.append(offsets[:-1][active] + j)
    _read_block_end(cur, count, path, what)
    typ = avro_type_to_arrow(node)
    item_type = typ.item_type if node.kind == "map" else typ.value_type
    if item_parts:
        perm = np.empty(int(offsets[-1]), np.int64)
        perm[np.concatenate(slots)] = np.arange(perm.size)
        perm_arr = pa.array(perm)
        items = pa.concat_arrays(item_parts).take(perm_arr)
    else:
        items = pa.array([], item_type)
    off = pa.array(offsets.astype(np.int32))
    if node.kind == "array":
        return pa.ListArray.from_arrays(off, items.cast(item_type) if items.type != item_type else items, type=typ)
    keys = pa.concat_arrays(keys_parts).take(perm_arr) if keys_parts else pa.array([], pa.string())
    return pa.MapArray.from_arrays(off, keys, items, type=typ)


def _read_block_end(cur: _Cursor, count: np.ndarray, path: str, what: str) -> None:
    """The 0 that closes a non-empty array or map (a second block is not canonical)."""
    ended = count > 0
    if ended.any():
        sub = cur.sub(ended)
        tail = sub.read_long(path, f"{what} end")
        sub.fail(tail != 0, f"field {path!r}: {what} written in several blocks (not the canonical encoding)")
        cur.merge(sub, ended)


def _fixed_size(node: AvroNode) -> int:
    """Encoded size of every value of this type when it is the same for all, else 0."""
    if node.kind in ("float", "double"):
        return 4 if node.kind == "float" else 8
    if node.kind == "boolean":
        return 1
    if node.kind == "fixed":
        return node.size
    return 0


def _is_varint(node: AvroNode) -> bool:
    return node.kind in ("int", "long", "enum")


def _decode_flat_array(node: AvroNode, item_node: AvroNode, cur: _Cursor, count: np.ndarray, size: int,
                       path: str) -> pa.Array:
    """Arrays whose items are fixed-size or single varints: every item's span is found at
    once (for varints, from the bytes that end a varint), then all items of all records
    are decoded as one column by a cursor over items."""
    n = len(cur)
    start = cur.pos.copy()
    if size:
        items_end = start + count * size
    else:
        lo, hi = int(start.min()), int(cur.end.max())
        stops = np.flatnonzero(cur.data[lo:hi] < 0x80) + lo  # last byte of every varint in the span
        first_stop = np.searchsorted(stops, start)  # index of the first stop at or after each start
        last = first_stop + count - 1
        over = (count > 0) & (last >= stops.size)
        if stops.size:
            items_end = np.where(over, hi + 1, stops[np.minimum(last, stops.size - 1)] + 1)
        else:  # no varint ends anywhere in the span: every non-empty array runs past its value
            items_end = np.where(count > 0, hi + 1, start)
    runs_past = (count > 0) & (items_end > cur.end)
    cur.fail(runs_past, f"field {path!r}: array items run past the end of the value")
    count = np.where(runs_past, 0, count)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(count, out=offsets[1:])
    total = int(offsets[-1])
    owner = np.repeat(np.arange(n), count)
    j = np.arange(total) - offsets[:-1][owner]  # position of each item within its record
    if size:
        item_start = start[owner] + j * size
        item_end = item_start + size
    else:
        ends = stops[np.repeat(first_stop, count) + j] + 1
        item_start = np.where(j == 0, start[owner], np.concatenate([[0], ends[:-1]]))
        item_end = ends
    items_cur = _Cursor(cur.data, item_start.astype(np.int64), item_end.astype(np.int64), cur.rows[owner], cur.errors)
    items = _decode(item_node, items_cur, f"{path}[]")
    left = items_cur.end - items_cur.pos
    items_cur.fail(left > 0, f"field {path!r}: array item is malformed")
    ok = ~runs_past & (count > 0)
    cur.pos[ok] = items_end[ok]
    _read_block_end(cur, count, path, "array")
    typ = avro_type_to_arrow(node)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), items, type=typ)


def _decode_decimal(node: AvroNode, cur: _Cursor, path: str) -> pa.Array:
    n = len(cur)
    width = 16 if node.precision <= 38 else 32
    if node.kind == "fixed":
        size = node.size
        start = cur.take(size, path, f"decimal fixed({size})")
        ln = np.full(n, size, np.int64)
        if size > width:
            raise TypeError(f"field {path!r}: decimal fixed({size}) is wider than {width} bytes")
    else:
        ln = cur.read_long(path, "decimal length")
        bad = (ln < 1) | (ln > width) | (cur.pos + ln > cur.end)
        cur.fail(bad, f"field {path!r}: decimal of {width * 8} bits has a bad byte length")
        ln[bad] = 1
        start = cur.pos.copy()
        start[bad] = 0
        cur.pos[~bad] += ln[~bad]
    # Big-endian two's complement of variable length -> little-endian fixed width.
    k = np.arange(width)
    src = start[:, None] + ln[:, None] - 1 - k[None, :]
    inside = k[None, :] < ln[:, None]
    raw = cur.data[np.where(inside, src, start[:, None])]
    sign = np.where(cur.data[start] >= 0x80, np.uint8(0xFF), np.uint8(0))
    le = np.where(inside, raw, sign[:, None]).astype(np.uint8)
    if node.kind == "bytes":
        first = cur.data[start]
        second = cur.data[np.minimum(start + 1, cur.data.size - 1)]
        loose = (ln > 1) & (((first == 0) & (second < 0x80)) | ((first == 0xFF) & (second >= 0x80)))
        # fastavro (so confluent-kafka's Python AvroSerializer) writes -2^(8k-1) with one
        # sign byte too many (ff 80 00.. instead of 80 00..). Accepted; such a value comes
        # back to consumers in the minimal form Java writes: the same value, other bytes.
        rest_zero = ~np.any(inside & (k[None, :] < (ln - 2)[:, None]) & (le != 0), axis=1)
        loose &= ~((first == 0xFF) & (second == 0x80) & rest_zero)
        cur.fail(loose, f"field {path!r}: decimal bytes are not minimal (not the canonical encoding)")
    typ = pa.decimal128(node.precision, node.scale) if width == 16 else pa.decimal256(node.precision, node.scale)
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(np.ascontiguousarray(le))])


# ---------------------------------------------------------------- encoding

_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


@dataclass(frozen=True)
class _Cells:
    """Short encodings of one value per row held as a byte matrix: row r's bytes are
    `data[r, :lengths[r]]` (all of `data[r]` when `lengths` is None). Neighbouring cells of
    a record are joined row-wise by one masked copy instead of one Arrow join per field."""

    data: np.ndarray  # (n, width) uint8
    lengths: np.ndarray | None = None

    def keep(self) -> np.ndarray:
        width = self.data.shape[1]
        if self.lengths is None:
            return np.ones(self.data.shape, bool)
        return _K10[None, :width] < self.lengths[:, None] if width <= 10 else \
            np.arange(width)[None, :] < self.lengths[:, None]

    def without(self, rows: np.ndarray) -> "_Cells":
        """The same cells with no bytes in the rows where `rows` is True."""
        lengths = np.full(len(self.data), self.data.shape[1], np.int64) if self.lengths is None else self.lengths
        return _Cells(self.data, np.where(rows, 0, lengths))


def _varint_cells(v: np.ndarray) -> _Cells:
    """Zigzag varints of int64 values."""
    v = v.astype(np.int64, copy=False)
    zz = ((v << 1) ^ (v >> 63)).view(np.uint64)
    if zz.size == 0 or zz.max() < 128:
        return _Cells(zz.astype(np.uint8).reshape(-1, 1))
    ln = np.searchsorted(_VARINT_LIMITS, zz, side="right").astype(np.int64) + 1
    width = int(ln.max())
    # One row of `width` candidate bytes per value; the first `ln` of each are kept.
    m = ((zz[:, None] >> _SHIFT10[None, :width]) & np.uint64(0x7F)).astype(np.uint8)
    m |= (_K10[None, :width] < (ln[:, None] - 1)).view(np.uint8) << np.uint8(7)
    return _Cells(m, ln)


def _cells_to_binary(cells: list[_Cells]) -> pa.Array:
    data = cells[0].data if len(cells) == 1 else np.hstack([c.data for c in cells])
    n, width = data.shape
    if all(c.lengths is None for c in cells):
        return binary_from_buffers(np.arange(0, (n + 1) * width, width, dtype=np.int32), np.ascontiguousarray(data))
    keep = cells[0].keep() if len(cells) == 1 else np.hstack([c.keep() for c in cells])
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(keep.sum(axis=1), out=offsets[1:])
    return binary_from_buffers(offsets, data[keep])


def encode_varints(v: np.ndarray) -> pa.Array:
    """Zigzag varints of int64 values, one binary value per element."""
    return _cells_to_binary([_varint_cells(v)])


def _fixed_width(arr: pa.Array, dtype: str) -> np.ndarray:
    """The values buffer of a primitive array as NumPy, ignoring validity (nulls hold any value)."""
    buf = arr.buffers()[1]
    width = np.dtype(dtype).itemsize
    return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * width)


def _join_rows(parts: list[pa.Array | _Cells], n: int) -> pa.Array:
    arrays: list[pa.Array] = []
    run: list[_Cells] = []
    for part in parts:
        if isinstance(part, _Cells):
            run.append(part)
            continue
        if run:
            arrays.append(_cells_to_binary(run))
            run = []
        arrays.append(part)
    if run:
        arrays.append(_cells_to_binary(run))
    if not arrays:
        return pa.array([b""] * n, pa.binary())
    if len(arrays) == 1:
        return arrays[0]
    return pc.binary_join_element_wise(*arrays, _EMPTY)


def encode_avro(node: AvroNode, arr: pa.Array, prefix: bytes = b"") -> pa.Array:
    """Encode one Avro value per element of `arr` (a column of the table), as binary,
    each after `prefix` (e.g. a wire-format header: joined in the same pass, not copied again).

    `arr` may hold a wider type than the writer's (long for int, double for float, ...):
    values narrow back, as they were widened from this writer's values.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    parts = _encode_parts(node, arr)
    if prefix:
        parts.insert(0, _Cells(np.broadcast_to(np.frombuffer(prefix, np.uint8), (n, len(prefix)))))
    return _join_rows(parts, n)


def _encode_parts(node: AvroNode, arr: pa.Array) -> list[pa.Array | _Cells]:
    """The encoding as binary columns to be joined row-wise: records and strings give
    several, so that a whole record is joined in one call."""
    n = len(arr)
    k, lg = node.kind, node.logical
    if k == "union":
        inner = node.nullable_value()
        if inner is None:
            return _encode_parts(node.branches[0], arr) if len(node.branches) == 1 else _unsupported(node)
        nb = node.null_branch
        if not arr.null_count:
            return [_Cells(np.full((n, 1), (1 - nb) * 2, np.uint8)), *_encode_parts(inner, arr)]
        is_null = arr.is_null().to_numpy(zero_copy_only=False)
        branch = np.where(is_null, nb, 1 - nb).astype(np.uint8) * 2  # zigzag of 0 and 1
        head = _Cells(branch.reshape(n, 1))
        if is_null.all():
            return [head]
        inner_parts = _encode_parts(inner, arr)
        if all(isinstance(p, _Cells) for p in inner_parts):
            return [head, *(p.without(is_null) for p in inner_parts)]
        body = _join_rows(inner_parts, n)
        return [head, pc.if_else(pa.array(is_null), _EMPTY, body)]
    if lg == "decimal":
        return _encode_decimal(node, arr)
    if k == "null":
        return []
    if k == "boolean":
        b = arr.cast(pa.bool_()).fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8)
        return [_Cells(b.reshape(n, 1))]
    if k in ("int", "long"):
        return [_varint_cells(_as_int64(arr))]
    if k in ("float", "double"):
        dt = "<f4" if k == "float" else "<f8"
        if pa.types.is_floating(arr.type) and arr.type.bit_width == np.dtype(dt).itemsize * 8:
            vals = _fixed_width(arr, dt)
        else:
            vals = arr.cast(pa.float64()).fill_null(0).to_numpy(zero_copy_only=False).astype(dt)
        return [_Cells(np.ascontiguousarray(vals).view(np.uint8).reshape(n, np.dtype(dt).itemsize))]
    if k in ("bytes", "string"):
        b = arr if pa.types.is_binary(arr.type) else arr.cast(pa.binary())
        if b.null_count:
            b = b.fill_null(b"")
        offsets = np.frombuffer(b.buffers()[1], np.int32, n + 1, b.offset * 4)
        return [_varint_cells(np.diff(offsets)), b]
    if k == "fixed":
        return [arr.fill_null(b"\0" * node.size).cast(pa.binary())]
    if k == "enum":
        idx = pc.index_in(arr, value_set=pa.array(node.symbols, pa.string()))
        if idx.null_count > arr.null_count:
            raise ValueError(f"enum {node.name}: column holds a value that is not one of its symbols")
        return [_varint_cells(idx.fill_null(0).to_numpy(zero_copy_only=False))]
    if k == "record":
        if not pa.types.is_struct(arr.type):
            raise TypeError(f"record {node.name}: column is {arr.type}, not a struct")
        names = {arr.type.field(i).name: i for i in range(arr.type.num_fields)}
        parts: list[pa.Array | _Cells] = []
        for f in node.fields:
            if f.name not in names:
                raise KeyError(f"record {node.name}: no column for writer field {f.name!r}")
            parts += _encode_parts(f.type, _struct_child(arr, names[f.name]))
        return parts
    if k in ("array", "map"):
        return _encode_repeated(node, arr)
    return _unsupported(node)


def _narrowed(cur, v: np.ndarray, typ: pa.DataType, path: str) -> pa.Array:
    """Integers of a column narrower than Avro's int/long (recorded as `arrow.type`): records
    holding a value the column cannot hold are refused."""
    if not pa.types.is_integer(typ):
        return pa.array(v, pa.int64()).cast(typ)
    info = np.iinfo(typ.to_pandas_dtype())
    bad = (v < info.min) | (v > info.max)
    cur.fail(bad, f"field {path!r}: value out of the range of {typ} [{info.min}, {info.max}]")
    v = np.where(bad, 0, v)
    return pa.array(v.astype(typ.to_pandas_dtype()), typ)


def _unsupported(node: AvroNode) -> pa.Array:
    raise TypeError(f"Avro type {node.kind!r} cannot be encoded from a column")


def _as_int64(arr: pa.Array) -> np.ndarray:
    t = arr.type
    if pa.types.is_int64(t) or pa.types.is_timestamp(t) or pa.types.is_time64(t) or pa.types.is_date64(t):
        return _fixed_width(arr, "<i8")
    if pa.types.is_int32(t) or pa.types.is_date32(t) or pa.types.is_time32(t):
        return _fixed_width(arr, "<i4").astype(np.int64)
    return arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)


def _struct_child(arr: pa.StructArray, i: int) -> pa.Array:
    # `.field()` ignores the struct's slice offset; flatten-like slicing keeps rows aligned.
    child = arr.field(i)
    if len(child) != len(arr):
        child = child.slice(arr.offset, len(arr))
    return child


def _encode_repeated(node: AvroNode, arr: pa.Array) -> list[pa.Array | _Cells]:
    """Item count, the items, and the closing zero-count block (absent when empty)."""
    n = len(arr)
    off = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    counts = np.diff(off)
    if arr.null_count:
        counts[arr.is_null().to_numpy(zero_copy_only=False)] = 0
    base, total = int(off[0]), int(off[-1] - off[0])
    if node.kind == "array":
        items = encode_avro(node.items, arr.values.slice(base, total))
    else:
        keys = arr.keys.slice(base, total)
        vals = arr.items.slice(base, total)
        items = _join_rows([*_encode_parts(AvroNode(kind="string"), keys), *_encode_parts(node.values, vals)],
                           total)
    rel = (off - base).astype(np.int32)
    if arr.null_count:
        rel = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        keep = np.repeat(~arr.is_null().to_numpy(zero_copy_only=False), np.diff(off))
        items = items.filter(pa.array(keep))
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(rel), items), _EMPTY)
    tail = _Cells(np.zeros((n, 1), np.uint8), (counts > 0).astype(np.int64))
    return [_varint_cells(counts), joined, tail]


def _encode_decimal(node: AvroNode, arr: pa.Array) -> list[pa.Array | _Cells]:
    width = 16 if node.precision <= 38 else 32
    typ = pa.decimal128(node.precision, node.scale) if width == 16 else pa.decimal256(node.precision, node.scale)
    if arr.type != typ:
        arr = arr.cast(typ)
    n = len(arr)
    raw = np.frombuffer(arr.buffers()[1], np.uint8, count=n * width, offset=arr.offset * width).reshape(n, width)
    be = raw[:, ::-1]
    if node.kind == "fixed":
        size = node.size
        return [_Cells(np.ascontiguousarray(be[:, width - size:]))]
    # Minimal two's complement: drop leading sign bytes while the next byte keeps the sign bit.
    sign = np.where(be[:, 0] >= 0x80, np.uint8(0xFF), np.uint8(0))
    lead = be == sign[:, None]
    nonsign = np.where(lead.all(axis=1), width - 1, lead.argmin(axis=1))
    first = be[np.arange(n), nonsign]
    keep_sign = (first >= 0x80) != (sign == 0xFF)
    start = nonsign - keep_sign.astype(np.int64)
    start = np.maximum(start, 0)
    ln = width - start
    body = be[np.arange(width)[None, :] >= start[:, None]]
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(ln, out=offsets[1:])
    return [_varint_cells(ln), binary_from_buffers(offsets, np.ascontiguousarray(body))]
