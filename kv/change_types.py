"""Change types of primary-key writes and changelogs: codes, labels and parsing of written ones.

A write to a primary-key table may carry a change type per row (the Kafka header
`fluvial.change`, the table API column `_change`): ADD rows (+I, +U) add or replace a row,
RETRACT rows (-U, -D) take one back. Tables whose merge engine keeps more than the visible
row (`retract`) also log each written row with an input code (`+S` ADD, `-S` RETRACT): those
rows rebuild the state after a crash and are never shown to readers.
"""
from __future__ import annotations

import enum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.errors import InvalidRecordError


class ChangeType(enum.IntEnum):
    """`_change` of a stored row (`+A` is an append to a log table)."""

    APPEND = 0
    INSERT = 1
    UPDATE_BEFORE = 2
    UPDATE_AFTER = 3
    DELETE = 4
    INPUT_ADD = 5  # a written ADD row, kept in the log as the merge state's write-ahead record
    INPUT_RETRACT = 6  # a written RETRACT row, idem

    @property
    def label(self) -> str:
        return ("+A", "+I", "-U", "+U", "-D", "+S", "-S")[self]


# Rows with a code at or above this are state records: hidden from every reader.
FIRST_HIDDEN = ChangeType.INPUT_ADD
WRITABLE_LABELS = ("+I", "-U", "+U", "-D")
_WRITABLE = pa.array(list(WRITABLE_LABELS), pa.string())
_WRITABLE_BYTES = pa.array([label.encode() for label in WRITABLE_LABELS], pa.binary())
_CODES = np.array([ChangeType.INSERT, ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER, ChangeType.DELETE], np.int8)


def is_retraction(changes: np.ndarray) -> np.ndarray:
    """-U and -D rows."""
    return (changes == ChangeType.UPDATE_BEFORE) | (changes == ChangeType.DELETE)


def visible_mask(change: np.ndarray) -> np.ndarray:
    """Rows a reader sees (not state records)."""
    return change < FIRST_HIDDEN


def parse_changes(values: pa.Array, what: str = "_change") -> np.ndarray:
    """Written change types (strings `+I`, `-U`, `+U`, `-D`, or their int codes 1-4) as int8
    codes; every invalid one is named (InvalidRecordError with per-record errors)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_integer(values.type):
        codes = values.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        bad = np.flatnonzero((codes < ChangeType.INSERT) | (codes > ChangeType.DELETE))
        if bad.size:
            _refuse(bad, [str(values[int(i)].as_py()) for i in bad[:100]], what)
        return codes.astype(np.int8)
    binary = pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)
    if not binary and not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise InvalidRecordError(f"{what} must hold the change types {list(WRITABLE_LABELS)} as strings, "
                                 f"not {values.type}")
    idx = pc.index_in(values, value_set=_WRITABLE_BYTES if binary else _WRITABLE)
    found = idx.is_valid().to_numpy(zero_copy_only=False)
    if not found.all():
        bad = np.flatnonzero(~found)
        shown = [values[int(i)].as_py() for i in bad[:100]]
        _refuse(bad, [repr(v.decode("utf-8", "replace") if isinstance(v, bytes) else v) for v in shown], what)
    return _CODES[idx.to_numpy(zero_copy_only=False)]


def _refuse(bad: np.ndarray, shown: list[str], what: str) -> None:
    errors = [(int(i), f"invalid change type {s} in {what}: must be one of {list(WRITABLE_LABELS)}")
              for i, s in zip(bad[:100].tolist(), shown)]
    raise InvalidRecordError(f"record {int(bad[0])}: {errors[0][1]} ({bad.size} invalid record(s); "
                             "nothing of the batch was written)", record_errors=errors)

