"""The `retract` merge engine: per key the list of live rows, so that a changelog whose
ADD and RETRACT rows of one key arrive reordered (several writers, shuffled by another
column) still ends with the right row.

ADD (+I/+U) replaces the live row with the same upsert key (all columns when the table
names none) in place, or appends it; RETRACT (-U/-D) removes the matching live row. The
table's row for the key is the last live one, and the changelog follows it: a new last
row emits +I (none before) or -U/+U; removing the last emits -U/+U of the new last one,
or -D when none is left; changing an earlier row emits nothing; retracting a row that is
not there emits nothing and is counted. A -D without a row (a Kafka tombstone, a table
API delete) removes the key with all its live rows.

RocksDB holds, beside the visible row (`d` + key, what lookups and scans read), the list
(`s` + key). Each written row is also logged (change `+S`/`-S`/`-K`, hidden from readers)
ahead of the changelog rows it causes: the list cannot be rebuilt from the visible
changelog, so recovery replays these rows through the same merge.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from fluvial.kv.change_types import ChangeType
from fluvial.kv.row_codec import avro_node
from fluvial.schema.avro_binary import encode_avro

STATE_PREFIX = b"s"
_VERSION = 1
_HEAD = struct.Struct(">BI")  # version, entries
_ENTRY = struct.Struct(">IIq")  # ident length, row length, added at (ms)
# Rows kept per key, as a histogram: keys with 1, 2, 3-4, 5-8, 9-16, 17-64, more.
HISTOGRAM_BOUNDS = (1, 2, 4, 8, 16, 64)
HISTOGRAM_LABELS = ("1", "2", "3-4", "5-8", "9-16", "17-64", ">64")
INPUT_DELETE_KEY = 7  # hidden code of a key-level delete (no row to match)


def state_key(data_key: bytes) -> bytes:
    return STATE_PREFIX + data_key[1:]


def encode_state(entries: list[list], whole_row: bool) -> bytes:
    """A key's live rows: [ident, row value, added at ms, _] each; with whole-row identity
    the ident is the row's body and is not stored twice."""
    parts = [_HEAD.pack(_VERSION, len(entries))]
    for ident, row, added, _ in entries:
        ident_b = b"" if whole_row else ident
        parts.append(_ENTRY.pack(len(ident_b), len(row), added))
        parts.append(ident_b)
        parts.append(row)
    return b"".join(parts)


def decode_state(value: bytes, whole_row: bool) -> list[list]:
    version, count = _HEAD.unpack_from(value, 0)
    if version != _VERSION:
        raise ValueError(f"retract state version {version} is not known")
    pos = _HEAD.size
    out = []
    for _ in range(count):
        ilen, rlen, added = _ENTRY.unpack_from(value, pos)
        pos += _ENTRY.size
        ident = value[pos:pos + ilen]
        pos += ilen
        row = value[pos:pos + rlen]
        pos += rlen
        out.append([row[2:] if whole_row else ident, row, added, None])
    return out


def _expire(entries: list[list], horizon: int) -> int:
    """Drop the rows added before `horizon`, except the last (visible) one; how many went."""
    kept = [e for e in entries[:-1] if e[2] >= horizon]
    dropped = len(entries) - 1 - len(kept)
    if dropped:
        kept.append(entries[-1])
        entries[:] = kept
    return dropped


def histogram_slot(length: int) -> int:
    return int(np.searchsorted(HISTOGRAM_BOUNDS, length))


@dataclass
class RetractStats:
    """Figures of a table's retract state (per bucket, summed per table)."""

    keys: int = 0  # keys with live rows
    rows: int = 0  # live rows kept
    histogram: list[int] = field(default_factory=lambda: [0] * len(HISTOGRAM_LABELS))
    retracts_absent: int = 0  # RETRACT rows that matched no live row (nothing emitted)
    rows_expired: int = 0  # live rows dropped by the state TTL

    def add(self, other: "RetractStats") -> None:
        self.keys += other.keys
        self.rows += other.rows
        self.histogram = [a + b for a, b in zip(self.histogram, other.histogram)]
        self.retracts_absent += other.retracts_absent
        self.rows_expired += other.rows_expired

    def to_json(self) -> dict:
        return {"keys": self.keys, "rows": self.rows,
                "rows_per_key": round(self.rows / self.keys, 3) if self.keys else 0.0,
                "rows_per_key_histogram": dict(zip(HISTOGRAM_LABELS, self.histogram)),
                "retracts_absent": self.retracts_absent, "rows_expired": self.rows_expired}

    @classmethod
    def from_json(cls, body: dict) -> "RetractStats":
        hist = body.get("rows_per_key_histogram") or {}
        return cls(body.get("keys", 0), body.get("rows", 0), [hist.get(label, 0) for label in HISTOGRAM_LABELS],
                   body.get("retracts_absent", 0), body.get("rows_expired", 0))


@dataclass
class RetractResult:
    """What one write does: changelog rows as (source write, change, row reference) where a
    reference >= 0 is a write row and < 0 a stored row (`stored_rows[-1 - ref]`), the
    RocksDB puts (None deletes) and the change of the figures."""

    src: np.ndarray
    change: np.ndarray
    ref: np.ndarray
    stored_rows: list[bytes]
    keys: list[bytes]
    values: list[bytes | None]
    stats: RetractStats


class RetractMaterializer:
    """The per-key list merge of one bucket's writes (pure: reads the old lists it is given)."""

    def __init__(self, schema: pa.Schema, upsert_key: tuple[str, ...] | None, state_ttl_ms: int | None):
        self.upsert_key = upsert_key
        self.whole_row = upsert_key is None
        self.ttl = state_ttl_ms
        self.schema = schema

    def idents(self, rows: pa.StructArray, row_values: list[bytes | None]) -> list[bytes | None]:
        """What identifies each write row in its key's list: its upsert-key columns (Avro), or its body."""
        if self.whole_row:
            return [None if v is None else v[2:] for v in row_values]
        names = [rows.type.field(i).name for i in range(rows.type.num_fields)]
        cols = [rows.field(names.index(c)) for c in self.upsert_key]
        fields = [self.schema.field(c).with_nullable(True) for c in self.upsert_key]
        key_schema = pa.schema(fields)
        arr = pa.StructArray.from_arrays(cols, fields=fields)
        return encode_avro(avro_node(key_schema), arr).to_pylist()

    def merge(self, group: np.ndarray, unique_keys: list[bytes], old_states: list[bytes | None],
              retract: np.ndarray, key_delete: np.ndarray, idents: list[bytes | None],
              row_values: list[bytes | None], times: np.ndarray) -> RetractResult:
        n = len(group)
        whole = self.whole_row
        ttl = self.ttl
        states: list[list | None] = [None] * len(unique_keys)
        before_len = np.zeros(len(unique_keys), np.int64)
        for k, raw in enumerate(old_states):
            if raw is not None:
                states[k] = decode_state(raw, whole)
                before_len[k] = len(states[k])
        dirty = np.zeros(len(unique_keys), bool)
        out_src: list[int] = []
        out_change: list[int] = []
        out_ref: list[object] = []
        absent = expired = 0
        INSERT, UB, UA, DELETE = (int(ChangeType.INSERT), int(ChangeType.UPDATE_BEFORE),
                                  int(ChangeType.UPDATE_AFTER), int(ChangeType.DELETE))
        IN_ADD, IN_RETRACT = int(ChangeType.INPUT_ADD), int(ChangeType.INPUT_RETRACT)
        group_l = group.tolist()
        retract_l = retract.tolist()
        kdel_l = key_delete.tolist()
        times_l = times.tolist()
        # One pass in write order: each key's list is a small Python list; the rest of the
        # write (identities, encodings, the changelog's rows) is built vectorized around it.
        for i in range(n):
            k = group_l[i]
            st = states[k]
            if st is None:
                st = states[k] = []
            if ttl is not None and len(st) > 1:
                dropped = _expire(st, times_l[i] - ttl)
                if dropped:
                    expired += dropped
                    dirty[k] = True
            before = st[-1] if st else None
            if kdel_l[i]:
                out_src.append(i)
                out_change.append(INPUT_DELETE_KEY)
                out_ref.append(i)
                if st:
                    st.clear()
                    dirty[k] = True
            elif retract_l[i]:
                out_src.append(i)
                out_change.append(IN_RETRACT)
                out_ref.append(i)
                ident = idents[i]
                for j, e in enumerate(st):
                    if e[0] == ident:
                        del st[j]
                        dirty[k] = True
                        break
                else:
                    absent += 1
                    continue
            else:
                out_src.append(i)
                out_change.append(IN_ADD)
                out_ref.append(i)
                ident = idents[i]
                entry = [ident, row_values[i], times_l[i], i]
                for j, e in enumerate(st):
                    if e[0] == ident:
                        st[j] = entry
                        break
                else:
                    st.append(entry)
                dirty[k] = True
            if ttl is not None and len(st) > 1:
                # The row just added may have turned earlier ones into ones that stay hidden
                # past the TTL: bounded now, not at the key's next write.
                expired += _expire(st, times_l[i] - ttl)
            after = st[-1] if st else None
            if after is before:
                continue
            if before is None:
                out_src.append(i)
                out_change.append(INSERT)
                out_ref.append(after)
            elif after is None:
                out_src.append(i)
                out_change.append(DELETE)
                out_ref.append(before)
            elif after[1] != before[1]:
                out_src += (i, i)
                out_change += (UB, UA)
                out_ref += (before, after)

        # Row references: write rows by index, stored rows once each into a pool to decode.
        stored_rows: list[bytes] = []
        refs = np.empty(len(out_ref), np.int64)
        for p, r in enumerate(out_ref):
            if type(r) is int:
                refs[p] = r
            elif r[3] is not None:
                refs[p] = r[3]
            else:
                stored_rows.append(r[1])
                r[3] = -len(stored_rows)
                refs[p] = r[3]

        stats = RetractStats(retracts_absent=absent, rows_expired=expired)
        keys: list[bytes] = []
        values: list[bytes | None] = []
        touched = np.flatnonzero(dirty).tolist()
        after_len = np.zeros(len(touched), np.int64)
        for t, k in enumerate(touched):
            st = states[k]
            dkey = unique_keys[k]
            keys.append(dkey)
            keys.append(state_key(dkey))
            if st:
                values.append(st[-1][1])
                values.append(encode_state(st, whole))
                after_len[t] = len(st)
            else:
                values.append(None)
                values.append(None)
        old_len = before_len[touched] if touched else np.zeros(0, np.int64)
        stats.keys = int((after_len > 0).sum() - (old_len > 0).sum())
        stats.rows = int(after_len.sum() - old_len.sum())
        slots = len(HISTOGRAM_LABELS)
        hist = np.zeros(slots, np.int64)
        if touched:
            np.add.at(hist, np.searchsorted(HISTOGRAM_BOUNDS, after_len[after_len > 0]), 1)
            np.subtract.at(hist, np.searchsorted(HISTOGRAM_BOUNDS, old_len[old_len > 0]), 1)
        stats.histogram = hist.tolist()
        return RetractResult(np.asarray(out_src, np.int64), np.asarray(out_change, np.int8), refs, stored_rows,
                             keys, values, stats)
