"""A `pyarrow.compute.Expression` read as a tree: calls, field references, literals.

pyarrow has no public API to walk an Expression. Two stable forms carry its tree:

- `Expression.to_substrait(schema)`: binds the expression first (implicit casts are
  inserted, `int_col > 5.5` or unsigned columns fail to convert, durations have no
  Substrait type) and needs the `substrait` protobuf package of a matching version to read.
- the form pyarrow pickles an Expression with (`Expression.__reduce__`), which is how
  expressions travel between processes (multiprocessing, Dask, Ray): an Arrow IPC file
  whose schema metadata lists the unbound tree in prefix order (`call <function>`, its
  arguments, `options <column>`, `end <function>`; `field_ref <name>`; `literal <column>`)
  and whose one row holds each literal and each call's options as typed Arrow values.

The second keeps exactly what the user wrote (literal types, function options) without a
dependency, so it is the one read here. Its metadata has repeated keys, which
`Schema.metadata` (a dict) would merge, so the pairs are read in order through the Arrow C
data interface (`__arrow_c_schema__`, whose metadata encoding is specified). The format
is checked against known expressions on first use (`reader_works`); if a pyarrow release
changed it, nothing is pushed down and the whole filter is applied by the client.
"""
from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from typing import Any, Union

import pyarrow as pa
import pyarrow.compute as pc

_log = logging.getLogger(__name__)


class UnreadableExpression(Exception):
    """An expression whose tree cannot be read (nested field refs, array literals, a new format)."""


@dataclass(frozen=True)
class FieldRef:
    name: str


@dataclass(frozen=True)
class Literal:
    value: pa.Scalar


@dataclass(frozen=True)
class Call:
    function: str
    args: tuple["Node", ...]
    options: dict[str, pa.Scalar] | None = None

    def __hash__(self) -> int:  # options hold unhashable scalars; calls are compared, not hashed
        return hash((self.function, self.args))


Node = Union[FieldRef, Literal, Call]


class _CSchema(ctypes.Structure):
    """`struct ArrowSchema` of the Arrow C data interface."""

    _fields_ = [("format", ctypes.c_char_p), ("name", ctypes.c_char_p), ("metadata", ctypes.c_void_p),
                ("flags", ctypes.c_int64), ("n_children", ctypes.c_int64), ("children", ctypes.c_void_p),
                ("dictionary", ctypes.c_void_p), ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p)]


_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def ordered_metadata(schema: pa.Schema) -> list[tuple[str, str]]:
    """A schema's metadata pairs in order, repeated keys kept (C data interface encoding:
    int32 count, then per pair int32 length + key bytes, int32 length + value bytes)."""
    capsule = schema.__arrow_c_schema__()  # owns the exported struct until released
    c = _CSchema.from_address(_capsule_pointer(capsule, b"arrow_schema"))
    if not c.metadata:
        return []
    pos = c.metadata
    count = ctypes.c_int32.from_address(pos).value
    pos += 4
    pairs = []
    for _ in range(count):
        parts = []
        for _ in range(2):
            size = ctypes.c_int32.from_address(pos).value
            pos += 4
            parts.append(ctypes.string_at(pos, size).decode("utf-8"))
            pos += size
        pairs.append((parts[0], parts[1]))
    del capsule
    return pairs


def read_tree(expr: pc.Expression) -> Node:
    """The tree of an expression. Raises UnreadableExpression."""
    try:
        _, args = expr.__reduce__()
        reader = pa.ipc.open_file(args[0])
        row = reader.get_batch(0) if reader.num_record_batches else None
        tokens = ordered_metadata(reader.schema)
    except Exception as exc:  # pyarrow refuses to serialize it (e.g. a nested field reference)
        raise UnreadableExpression(str(exc)) from None
    node, end = _node(tokens, 0, row)
    if end != len(tokens):
        raise UnreadableExpression(f"trailing tokens {tokens[end:]}")
    return node


def _value(row: pa.RecordBatch | None, index: str) -> pa.Scalar:
    if row is None:
        raise UnreadableExpression("a literal without values")
    return row.column(int(index))[0]


def _node(tokens: list[tuple[str, str]], i: int, row) -> tuple[Node, int]:
    if i >= len(tokens):
        raise UnreadableExpression("expression ends early")
    kind, value = tokens[i]
    if kind == "literal":
        return Literal(_value(row, value)), i + 1
    if kind == "field_ref":
        return FieldRef(value), i + 1
    if kind != "call":
        raise UnreadableExpression(f"unexpected {kind!r}")
    args: list[Node] = []
    options = None
    i += 1
    while i < len(tokens):
        k, v = tokens[i]
        if k == "end":
            if v != value:
                raise UnreadableExpression(f"call {value!r} ends as {v!r}")
            return Call(value, tuple(args), options), i + 1
        if k == "options":
            struct = _value(row, v)
            options = {f.name: struct[f.name] for f in struct.type}
            i += 1
            continue
        arg, i = _node(tokens, i, row)
        args.append(arg)
    raise UnreadableExpression(f"call {value!r} has no end")


def field_names(node: Node) -> set[str]:
    """The columns an expression reads."""
    if isinstance(node, FieldRef):
        return {node.name}
    if isinstance(node, Call):
        return set().union(*(field_names(a) for a in node.args)) if node.args else set()
    return set()


@functools.cache
def reader_works() -> bool:
    """Whether this pyarrow's expressions read as expected (checked once per process)."""
    probe = (pc.field("x") > 1) & pc.field("y").isin([1, 2]) & ~pc.field("z").is_null()
    try:
        tree = read_tree(probe)
        outer_left, outer_right = tree.args
        gt, isin = outer_left.args
        ok = (tree.function == "and_kleene" and outer_left.function == "and_kleene"
              and gt == Call("greater", (FieldRef("x"), Literal(pa.scalar(1)))) and gt.args[1].value.type == pa.int64()
              and isin.function == "is_in" and isin.args == (FieldRef("y"),)
              and isin.options["value_set"].values.to_pylist() == [1, 2]
              and outer_right.function == "invert" and outer_right.args[0].function == "is_null"
              and outer_right.args[0].options["nan_is_null"].as_py() is False)
    except Exception as exc:
        _log.warning("pyarrow %s expressions cannot be read (%s): filters are applied by the client only",
                     pa.__version__, exc)
        return False
    if not ok:
        _log.warning("pyarrow %s expressions read differently than expected: filters are applied by the "
                     "client only", pa.__version__)
    return ok
