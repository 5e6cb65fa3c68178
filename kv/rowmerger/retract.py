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

RocksDB holds the visible row (`d` + key, what lookups and scans read); when a key has
more than that one live row (or a TTL dates its rows) the list too (`s` + key), and the
visible row's value carries `ROW_FLAG` so that a write reads the list only for such keys. Each written row is also logged (change `+S`/`-S`/`-K`, hidden from readers)
ahead of the changelog rows it causes: the list cannot be rebuilt from the visible
changelog, so recovery replays these rows through the same merge.
"""
from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.kv.change_types import ChangeType
from fluvial.kv.row_codec import ROW_FLAG, avro_node
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
    return bisect.bisect_left(HISTOGRAM_BOUNDS, length)


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
              old_rows: list[bytes | None], old_idents: list[bytes | None] | None, retract: np.ndarray,
              key_delete: np.ndarray, idents: list[bytes | None], row_values: list[bytes | None],
              times: np.ndarray) -> RetractResult:
        """`old_states`: each key's stored list (None: none stored); `old_rows`: its visible
        row, the whole list when no list is stored (`old_idents` then gives its identity)."""
        n = len(group)
        g_count = len(unique_keys)
        writes = np.bincount(group, minlength=g_count)
        listed = np.fromiter((v is not None for v in old_states), bool, g_count)
        # Keys written once in this batch whose list is at most their visible row (and no
        # TTL dates rows) are merged column-wise; the others row by row, in write order.
        simple_key = (writes == 1) & ~listed if self.ttl is None else np.zeros(g_count, bool)
        simple = simple_key[group]
        out = _Emitted()
        stats = RetractStats()
        keys: list[bytes] = []
        values: list[bytes | None] = []
        stored_rows: list[bytes] = []
        if simple.any():
            self._merge_simple(np.flatnonzero(simple), group, unique_keys, old_rows, old_idents, retract,
                               key_delete, idents, row_values, times, out, stats, keys, values, stored_rows)
        if not simple.all():
            self._merge_rows(np.flatnonzero(~simple), group, unique_keys, old_states, old_rows, old_idents,
                             retract, key_delete, idents, row_values, times, out, stats, keys, values, stored_rows)
        # Every written row is logged first (its input code), then what it emitted.
        hidden = np.where(key_delete, INPUT_DELETE_KEY,
                          np.where(retract, int(ChangeType.INPUT_RETRACT), int(ChangeType.INPUT_ADD))).astype(np.int8)
        e_src, e_sub, e_change, e_ref = out.arrays()
        src = np.concatenate([np.arange(n, dtype=np.int64), e_src])
        sub = np.concatenate([np.zeros(n, np.int8), e_sub])
        order = np.lexsort((sub, src))
        change = np.concatenate([hidden, e_change])[order]
        ref = np.concatenate([np.arange(n, dtype=np.int64), e_ref])[order]
        return RetractResult(src[order], change, ref, stored_rows, keys, values, stats)

    def _merge_simple(self, w: np.ndarray, group, unique_keys, old_rows, old_idents, retract, key_delete, idents,
                      row_values, times, out: "_Emitted", stats: RetractStats, keys: list, values: list,
                      stored_rows: list) -> None:
        """Writes that are their key's only one, the key holding at most its visible row."""
        g = group[w]
        old = [old_rows[k] for k in g.tolist()]
        exists = np.fromiter((v is not None for v in old), bool, w.size)
        if self.whole_row:
            old_ident_l = [None if v is None else v[2:] for v in old]
        else:
            old_ident_l = [old_idents[k] for k in g.tolist()]
        old_ident = pa.array(old_ident_l, pa.binary())
        new_ident = pa.array([idents[i] for i in w.tolist()], pa.binary())
        same = pc.fill_null(pc.equal(old_ident, new_ident), False).to_numpy(zero_copy_only=False)
        new_row = pa.array([row_values[i] for i in w.tolist()], pa.binary())
        old_row = pa.array(old, pa.binary())
        same_row = pc.fill_null(pc.equal(old_row, new_row), False).to_numpy(zero_copy_only=False)
        kdel = key_delete[w]
        ret = retract[w] & ~kdel
        add = ~kdel & ~retract[w]
        insert = add & ~exists  # a first row: +I
        replace = add & exists & same & ~same_row  # its row again, changed: -U/+U
        append = add & exists & ~same  # a second row: -U/+U, the list is stored
        gone = exists & (kdel | (ret & same))  # the only row goes: -D
        stats.retracts_absent += int((ret & ~(exists & same)).sum())
        # Stored rows a change shows (the old visible ones) go to the pool to decode.
        shows_old = np.flatnonzero(replace | append | gone)
        pool_at = -(len(stored_rows) + 1 + np.arange(shows_old.size))
        stored_rows += [old[j] for j in shows_old.tolist()]
        old_ref = np.zeros(w.size, np.int64)
        old_ref[shows_old] = pool_at
        upd = np.flatnonzero(replace | append)
        ins = np.flatnonzero(insert)
        dele = np.flatnonzero(gone)
        out.add(w[ins], 1, ChangeType.INSERT, w[ins])
        out.add(w[upd], 1, ChangeType.UPDATE_BEFORE, old_ref[upd])
        out.add(w[upd], 2, ChangeType.UPDATE_AFTER, w[upd])
        out.add(w[dele], 1, ChangeType.DELETE, old_ref[dele])
        # RocksDB: the new visible row; a second row stores the list and flags the row.
        for j in np.flatnonzero(insert | replace).tolist():
            keys.append(unique_keys[g[j]])
            values.append(row_values[w[j]])
        for j in dele.tolist():
            keys.append(unique_keys[g[j]])
            values.append(None)
        whole = self.whole_row
        for j in np.flatnonzero(append).tolist():
            k, i = g[j], w[j]
            row = row_values[i]
            key = unique_keys[k]
            keys.append(key)
            values.append(bytes((row[0] | ROW_FLAG,)) + row[1:])
            keys.append(state_key(key))
            values.append(encode_state([[old_ident_l[j], old[j], 0, None],
                                        [idents[i], row, int(times[i]), i]], whole))
        stats.keys += int(insert.sum()) - int(gone.sum())
        stats.rows += int(insert.sum()) + int(append.sum()) - int(gone.sum())
        hist = stats.histogram
        hist[0] += int(insert.sum()) - int(append.sum()) - int(gone.sum())
        hist[1] += int(append.sum())

    def _merge_rows(self, w: np.ndarray, group, unique_keys, old_states, old_rows, old_idents, retract,
                    key_delete, idents, row_values, times, out: "_Emitted", stats: RetractStats, keys: list,
                    values: list, stored_rows: list) -> None:
        """The other writes, one by one in write order, on each key's list."""
        whole = self.whole_row
        ttl = self.ttl
        states: dict[int, list] = {}
        before_len: dict[int, int] = {}
        for k in np.unique(group[w]).tolist():
            raw = old_states[k]
            if raw is not None:
                st = decode_state(raw, whole)
            elif old_rows[k] is not None:
                row = old_rows[k]
                st = [[row[2:] if whole else old_idents[k], row, 0, None]]
            else:
                st = []
            states[k] = st
            before_len[k] = len(st)
        dirty: set[int] = set()
        e_src: list[int] = []
        e_sub: list[int] = []
        e_change: list[int] = []
        e_ref: list[object] = []
        absent = expired = 0
        INSERT, UB, UA, DELETE = (int(ChangeType.INSERT), int(ChangeType.UPDATE_BEFORE),
                                  int(ChangeType.UPDATE_AFTER), int(ChangeType.DELETE))
        group_l = group.tolist()
        retract_l = retract.tolist()
        kdel_l = key_delete.tolist()
        times_l = times.tolist()
        for i in w.tolist():
            k = group_l[i]
            st = states[k]
            if ttl is not None and len(st) > 1:
                dropped = _expire(st, times_l[i] - ttl)
                if dropped:
                    expired += dropped
                    dirty.add(k)
            before = st[-1] if st else None
            if kdel_l[i]:
                if not st:
                    continue
                st.clear()
            elif retract_l[i]:
                ident = idents[i]
                for j in range(len(st)):
                    if st[j][0] == ident:
                        del st[j]
                        break
                else:
                    absent += 1
                    continue
            else:
                ident = idents[i]
                entry = [ident, row_values[i], times_l[i], i]
                for j in range(len(st)):
                    if st[j][0] == ident:
                        st[j] = entry
                        break
                else:
                    st.append(entry)
                if ttl is not None and len(st) > 1:
                    # The row just added may have turned earlier ones into ones that stay
                    # hidden past the TTL: bounded now, not at the key's next write.
                    expired += _expire(st, times_l[i] - ttl)
            dirty.add(k)
            after = st[-1] if st else None
            if after is before:
                continue
            if before is None:
                e_src.append(i)
                e_sub.append(1)
                e_change.append(INSERT)
                e_ref.append(after)
            elif after is None:
                e_src.append(i)
                e_sub.append(1)
                e_change.append(DELETE)
                e_ref.append(before)
            elif after[1] != before[1]:
                e_src += (i, i)
                e_sub += (1, 2)
                e_change += (UB, UA)
                e_ref += (before, after)
        # Row references: write rows by index, stored rows once each into the pool to decode.
        refs = np.empty(len(e_ref), np.int64)
        for p, r in enumerate(e_ref):
            if r[3] is None:
                stored_rows.append(r[1])
                r[3] = -len(stored_rows)
            refs[p] = r[3]
        out.add(np.asarray(e_src, np.int64), np.asarray(e_sub, np.int8), np.asarray(e_change, np.int8), refs)

        stats.retracts_absent += absent
        stats.rows_expired += expired
        keep_single = ttl is not None  # a lone row's age matters once another row follows it
        hist = stats.histogram
        for k in sorted(dirty):
            st = states[k]
            dkey = unique_keys[k]
            size = len(st)
            old_size = before_len[k]
            keys.append(dkey)
            if size > 1 or (size == 1 and keep_single):
                # The visible row is flagged: its key's list is stored beside it.
                row = st[-1][1]
                values.append(bytes((row[0] | ROW_FLAG,)) + row[1:])
                keys.append(state_key(dkey))
                values.append(encode_state(st, whole))
            else:
                values.append(st[-1][1] if size else None)
                if old_states[k] is not None:
                    keys.append(state_key(dkey))
                    values.append(None)
            stats.keys += (size > 0) - (old_size > 0)
            stats.rows += size - old_size
            if size:
                hist[histogram_slot(size)] += 1
            if old_size:
                hist[histogram_slot(old_size)] -= 1


class _Emitted:
    """Changelog rows a write batch emits: (source write, order within it, change, row reference)."""

    def __init__(self):
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, src: np.ndarray, sub, change, ref: np.ndarray) -> None:
        src = np.asarray(src, np.int64)
        self.parts.append((src, np.broadcast_to(np.asarray(sub, np.int8), src.shape),
                           np.broadcast_to(np.asarray(change, np.int8), src.shape), np.asarray(ref, np.int64)))

    def arrays(self):
        if not self.parts:
            empty = np.zeros(0, np.int64)
            return empty, empty.astype(np.int8), empty.astype(np.int8), empty
        return tuple(np.concatenate([p[i] for p in self.parts]) for i in range(4))
