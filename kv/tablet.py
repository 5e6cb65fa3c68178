"""KV tablet: the current row of every key of one bucket of a primary-key table, in RocksDB.

The write path is split so that the bucket's log tablet stays the write-ahead log:
`prepare()` reads the old rows, merges and builds the changelog without touching
RocksDB; the caller appends the changelog to the log tablet; `apply()` then writes the
new rows together with the log offset they bring RocksDB up to, in one atomic write
batch. RocksDB's own WAL is off: after a crash `catch_up()` replays the changelog from
the last applied offset, so RocksDB never holds a change the log lacks, nor misses one.
"""
from __future__ import annotations

import enum
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rocksdict import Checkpoint, Options, Rdict, WriteBatch, WriteOptions

from fluvial.errors import InvalidRecordError
from fluvial.kv.row_codec import DATA_PREFIX, KeyLayout, RowCodec, struct_of
from fluvial.kv.rowmerger import Action, MergeSpec, merger_for

log = logging.getLogger(__name__)

_APPLIED_KEY = b"m/applied"  # next log offset whose change is not yet in RocksDB
_SCHEMA_KEY = b"m/schema/"  # + 2-byte row schema number -> Arrow schema (IPC)
_SCAN_CHUNK = 8192


class ChangeType(enum.IntEnum):
    """`_change` of a stored row (`+A` is an append to a log table)."""

    APPEND = 0
    INSERT = 1
    UPDATE_BEFORE = 2
    UPDATE_AFTER = 3
    DELETE = 4

    @property
    def label(self) -> str:
        return ("+A", "+I", "-U", "+U", "-D")[self]


CHANGE_COLUMN = "_change"
SOURCE_COLUMN = "_source"


@dataclass
class KvWrite:
    """A prepared write: its changelog (user columns, `_change`, `_source` = the index of
    the write row it comes from) and the RocksDB puts/deletes it implies."""

    changelog: pa.RecordBatch
    keys: list[bytes]
    values: list[bytes | None]  # None deletes the key

    @property
    def empty(self) -> bool:
        return self.changelog.num_rows == 0


class KvTabletError(Exception):
    """RocksDB state of a bucket that cannot be opened or brought in line with its log."""


def _write_options() -> WriteOptions:
    opts = WriteOptions()
    opts.disable_wal = True  # the log tablet is the write-ahead log
    return opts


def _open_rdict(path: Path, create: bool) -> Rdict:
    opts = Options(raw_mode=True)
    opts.create_if_missing(create)
    opts.increase_parallelism(2)
    return Rdict(str(path), opts)


class KvTablet:
    """RocksDB holding the current rows of one bucket."""

    def __init__(self, path: Path, db: Rdict, schema: pa.Schema, layout: KeyLayout, spec: MergeSpec):
        self.path = path
        self.db = db
        self.layout = layout
        self.spec = spec
        self.merger = merger_for(spec)
        self._write_opts = _write_options()
        schemas = {}
        it = db.iter()
        it.seek(_SCHEMA_KEY)
        while it.valid() and it.key().startswith(_SCHEMA_KEY):
            schemas[int.from_bytes(it.key()[len(_SCHEMA_KEY):], "big")] = pa.ipc.read_schema(pa.py_buffer(it.value()))
            it.next()
        del it
        self.codec = RowCodec(schema, schemas)
        self._row_type = pa.struct([f.with_nullable(True) for f in schema])
        if self.codec.number not in schemas:
            self.db.put(self._schema_key(self.codec.number), schema.serialize().to_pybytes(), self._write_opts)
        raw = db.get(_APPLIED_KEY)
        self.applied_offset = int.from_bytes(raw, "big") if raw is not None else 0

    @staticmethod
    def _schema_key(number: int) -> bytes:
        return _SCHEMA_KEY + int(number).to_bytes(2, "big")

    @classmethod
    def open(cls, path: Path, schema: pa.Schema, layout: KeyLayout, spec: MergeSpec, *,
             create: bool = True) -> "KvTablet":
        path = Path(path)
        try:
            db = _open_rdict(path, create)
        except Exception as exc:  # rocksdict raises plain Exception for corruption and missing dirs
            raise KvTabletError(f"RocksDB at {path} cannot be opened: {exc}") from exc
        return cls(path, db, schema, layout, spec)

    @property
    def schema(self) -> pa.Schema:
        return self.codec.schema

    def evolve(self, schema: pa.Schema) -> None:
        """The table's columns changed: new rows are written, and old ones read, as `schema`."""
        if schema.equals(self.codec.schema):
            return
        self.codec = RowCodec(schema, self.codec.schemas)
        self._row_type = pa.struct([f.with_nullable(True) for f in schema])
        self.db.put(self._schema_key(self.codec.number), schema.serialize().to_pybytes(), self._write_opts)

    # ------------------------------------------------------------ write path
    def prepare(self, rows: pa.RecordBatch | pa.Table, *, deletes: np.ndarray | None = None,
                partial_columns: list[str] | None = None) -> KvWrite:
        """Read old rows, merge and build the changelog of one write batch. Touches nothing.

        `rows` holds the table's columns (a delete needs only the key columns), or with
        `partial_columns` the primary key and those target columns. Raises
        InvalidRecordError for writes that cannot be applied; then nothing is.
        """
        if isinstance(rows, pa.Table):
            rows = rows.combine_chunks()
            rows = rows.to_batches()[0] if rows.num_rows else pa.RecordBatch.from_pylist([], rows.schema)
        n = rows.num_rows
        deletes = np.zeros(n, bool) if deletes is None else np.asarray(deletes, bool)
        if deletes.size != n:
            raise InvalidRecordError(f"{deletes.size} delete flags for {n} rows")
        self.layout.check_keys(rows)
        self.spec.check_write(rows.schema.names, deletes=bool(deletes.any()), partial_columns=partial_columns)
        new_rows = self._conform(rows, deletes, partial_columns)
        if n == 0:
            return KvWrite(self._changelog_batch(pa.array([], self._row_type), [], []), [], [])
        keys = self.layout.storage_keys(rows)

        # Group writes by key; the r-th write of a key is merged in round r, against the
        # result of round r-1, so several writes of one key in a batch apply in order.
        encoded = pc.dictionary_encode(keys)
        group = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        unique_keys = encoded.dictionary.to_pylist()
        g_count = len(unique_keys)
        order = np.argsort(group, kind="stable")
        sorted_groups = group[order]
        first = np.searchsorted(sorted_groups, sorted_groups, side="left")
        occurrence = np.empty(n, np.int64)
        occurrence[order] = np.arange(n) - first

        old_values = self.db.get(unique_keys)
        exists = np.fromiter((v is not None for v in old_values), bool, g_count)
        present = np.flatnonzero(exists)
        old_bytes = pa.array(old_values, pa.binary())
        decoded = self.codec.decode(old_bytes.take(pa.array(present))) if present.size else None
        take = np.full(g_count, -1, np.int64)
        take[present] = np.arange(present.size)
        if decoded is None:
            old_rows = pa.nulls(g_count, self._row_type)
        else:
            old_rows = decoded.cast(self._row_type).take(pa.array(take, mask=~exists))

        pool_rows: list[pa.Array] = [old_rows]
        pool_bytes: list[pa.Array] = [old_bytes]
        pool_size = g_count
        state_pos = np.arange(g_count, dtype=np.int64)
        state_exists = exists.copy()
        touched = np.zeros(g_count, bool)
        out_src, out_sub, out_change, out_pos = [], [], [], []
        for r in range(int(occurrence.max()) + 1):
            idx = np.flatnonzero(occurrence == r)
            g = group[idx]
            all_rows = pa.concat_arrays(pool_rows) if len(pool_rows) > 1 else pool_rows[0]
            all_bytes = pa.concat_arrays(pool_bytes) if len(pool_bytes) > 1 else pool_bytes[0]
            pos = pa.array(state_pos[g])
            old = all_rows.take(pos)
            ex = state_exists[g]
            new = new_rows.take(pa.array(idx))
            if partial_columns is not None:
                new = self._fill_partial(new, old, ex, partial_columns)
            dels = deletes[idx]
            act = self.merger.merge(old, ex, new, dels)
            writes = np.flatnonzero((act == Action.INSERT) | (act == Action.UPDATE))
            new_bytes = pa.nulls(len(idx), pa.binary())
            if writes.size:
                self._check_required(new.take(pa.array(writes)), idx[writes])
                enc = self.codec.encode(new.take(pa.array(writes)))
                scatter = np.full(len(idx), -1, np.int64)
                scatter[writes] = np.arange(writes.size)
                new_bytes = enc.take(pa.array(scatter, mask=scatter < 0))
                # Writing the row it already has is no change at all.
                same = pc.fill_null(pc.equal(new_bytes, all_bytes.take(pos)), False).to_numpy(zero_copy_only=False)
                act[(act == Action.UPDATE) & same] = Action.NONE
            new_pos = pool_size + np.arange(len(idx))
            pool_rows.append(new)
            pool_bytes.append(new_bytes)
            pool_size += len(idx)
            for a, sub, change, where in ((Action.INSERT, 0, ChangeType.INSERT, new_pos),
                                          (Action.UPDATE, 0, ChangeType.UPDATE_BEFORE, state_pos[g]),
                                          (Action.UPDATE, 1, ChangeType.UPDATE_AFTER, new_pos),
                                          (Action.DELETE, 0, ChangeType.DELETE, state_pos[g])):
                m = act == a
                if m.any():
                    out_src.append(idx[m])
                    out_sub.append(np.full(int(m.sum()), sub, np.int8))
                    out_change.append(np.full(int(m.sum()), change, np.int8))
                    out_pos.append(where[m])
            upd = (act == Action.INSERT) | (act == Action.UPDATE)
            state_pos[g[upd]] = new_pos[upd]
            state_exists[g[upd]] = True
            state_exists[g[act == Action.DELETE]] = False
            touched[g[act != Action.NONE]] = True

        all_rows = pa.concat_arrays(pool_rows) if len(pool_rows) > 1 else pool_rows[0]
        all_bytes = pa.concat_arrays(pool_bytes) if len(pool_bytes) > 1 else pool_bytes[0]
        if out_src:
            src = np.concatenate(out_src)
            sub = np.concatenate(out_sub)
            change = np.concatenate(out_change)
            where = np.concatenate(out_pos)
            o = np.lexsort((sub, src))
            src, change, where = src[o], change[o], where[o]
        else:
            src = np.zeros(0, np.int64)
            change = np.zeros(0, np.int8)
            where = np.zeros(0, np.int64)
        changelog = self._changelog_batch(all_rows.take(pa.array(where)), change, src)
        t = np.flatnonzero(touched)
        final_bytes = all_bytes.take(pa.array(state_pos[t])).to_pylist()
        values = [v if e else None for v, e in zip(final_bytes, state_exists[t])]
        return KvWrite(changelog, [unique_keys[i] for i in t], values)

    def _changelog_batch(self, rows: pa.StructArray, change, src) -> pa.RecordBatch:
        cols = rows.flatten() if len(rows) else [pa.array([], f.type) for f in self.schema]
        fields = [pa.field(CHANGE_COLUMN, pa.int8(), False), pa.field(SOURCE_COLUMN, pa.int32(), False),
                  *self.schema]
        return pa.RecordBatch.from_arrays([pa.array(np.asarray(change, np.int8)),
                                           pa.array(np.asarray(src, np.int32)), *cols], schema=pa.schema(fields))

    def _conform(self, rows: pa.RecordBatch, deletes: np.ndarray, partial_columns: list[str] | None) -> pa.StructArray:
        """The write rows as a struct of the table's columns (partial: key and target columns)."""
        schema = self.schema
        names = rows.schema.names
        unknown = [c for c in names if c not in schema.names]
        if unknown:
            raise InvalidRecordError(f"columns {unknown} are not columns of the table {schema.names}")
        if partial_columns is not None:
            targets = list(dict.fromkeys(partial_columns))
            bad = [c for c in targets if c not in schema.names]
            if bad:
                raise InvalidRecordError(f"partial-update columns {bad} are not columns of the table")
            lacking = [c for c in self.layout.primary_key if c not in targets]
            if lacking:
                raise InvalidRecordError(f"a partial update must name every primary-key column; "
                                         f"{lacking} missing from {targets}")
            absent = [c for c in targets if c not in names]
            if absent:
                raise InvalidRecordError(f"partial-update columns {absent} are not in the rows written")
            wanted = [schema.field(c) for c in schema.names if c in targets]
        else:
            wanted = list(schema)
            upserts = ~deletes
            absent = [f.name for f in schema if f.name not in names]
            if absent and upserts.any():
                raise InvalidRecordError(f"rows lack column(s) {absent}; an upsert writes every column "
                                         "(use a partial update to write some)")
        cols = []
        n = rows.num_rows
        for f in wanted:
            if f.name not in names:
                cols.append(pa.nulls(n, f.type))
                continue
            col = rows.column(f.name)
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise InvalidRecordError(f"column {f.name!r} has type {col.type}, the table's is {f.type}: {exc}") from None
            cols.append(col)
        if self.spec.version_column and n:
            v = rows.column(self.spec.version_column)
            bad = np.flatnonzero(v.is_null().to_numpy(zero_copy_only=False) & ~deletes)
            if bad.size:
                raise InvalidRecordError(f"row {int(bad[0])}: version column {self.spec.version_column!r} is null",
                                         record_errors=[(int(i), "version column is null") for i in bad])
        return pa.StructArray.from_arrays(cols, fields=[f.with_nullable(True) for f in wanted])

    def _fill_partial(self, new: pa.StructArray, old: pa.StructArray, exists: np.ndarray,
                      targets: list[str]) -> pa.StructArray:
        """Target columns from the write, the others from the old row (null for a new key)."""
        cols = []
        mask = pa.array(exists)
        old_fields = {old.type.field(i).name: i for i in range(old.type.num_fields)}
        new_fields = {new.type.field(i).name: i for i in range(new.type.num_fields)}
        for f in self.schema:
            if f.name in targets:
                cols.append(new.field(new_fields[f.name]))
            else:
                cols.append(pc.if_else(mask, old.field(old_fields[f.name]), pa.scalar(None, f.type)))
        return pa.StructArray.from_arrays(cols, fields=list(self._row_type))

    def _check_required(self, rows: pa.StructArray, sources: np.ndarray) -> None:
        for i, f in enumerate(self.schema):
            if f.nullable:
                continue
            nulls = rows.field(i).is_null().to_numpy(zero_copy_only=False)
            if nulls.any():
                bad = sources[nulls]
                raise InvalidRecordError(
                    f"row {int(bad[0])}: required column {f.name!r} has no value",
                    record_errors=[(int(b), f"required column {f.name!r} has no value") for b in bad])

    def apply(self, write: KvWrite, next_offset: int) -> None:
        """Write the prepared rows; RocksDB is then in line with the log up to `next_offset`."""
        wb = WriteBatch(raw_mode=True)
        for key, value in zip(write.keys, write.values):
            if value is None:
                wb.delete(key)
            else:
                wb.put(key, value)
        wb.put(_APPLIED_KEY, int(next_offset).to_bytes(8, "big"))
        self.db.write(wb, self._write_opts)
        self.applied_offset = next_offset

    # ------------------------------------------------------------ recovery
    def replay(self, batches: Iterable[pa.RecordBatch]) -> int:
        """Apply stored changelog batches (`_offset`, `_change`, user columns) past the
        applied offset; returns the number of changes applied."""
        applied = 0
        for batch in batches:
            offsets = batch.column("_offset").to_numpy(zero_copy_only=False)
            keep = np.flatnonzero(offsets >= self.applied_offset)
            if keep.size == 0:
                continue
            if keep.size < batch.num_rows:
                batch = batch.take(pa.array(keep))
                offsets = offsets[keep]
            change = batch.column(CHANGE_COLUMN).to_numpy(zero_copy_only=False)
            names = [f.name for f in self.schema]
            cols = []
            for f in self.schema:
                if f.name in batch.schema.names:
                    col = batch.column(f.name)
                    cols.append(col if col.type == f.type else col.cast(f.type))
                else:
                    cols.append(pa.nulls(batch.num_rows, f.type))
            rows = pa.RecordBatch.from_arrays(cols, names=names)
            keys = self.layout.storage_keys(rows).to_pylist()
            puts = np.flatnonzero((change == ChangeType.INSERT) | (change == ChangeType.UPDATE_AFTER))
            encoded = np.empty(batch.num_rows, object)
            if puts.size:
                encoded[puts] = self.codec.encode(struct_of(rows).take(pa.array(puts))).to_pylist()
            wb = WriteBatch(raw_mode=True)
            for i, c in enumerate(change.tolist()):
                if c == ChangeType.INSERT or c == ChangeType.UPDATE_AFTER:
                    wb.put(keys[i], encoded[i])
                elif c == ChangeType.DELETE:
                    wb.delete(keys[i])
            next_offset = int(offsets[-1]) + 1
            wb.put(_APPLIED_KEY, next_offset.to_bytes(8, "big"))
            self.db.write(wb, self._write_opts)
            self.applied_offset = next_offset
            applied += batch.num_rows
        return applied

    # ------------------------------------------------------------ reads
    def lookup(self, keys: pa.RecordBatch | pa.Table) -> pa.Table:
        """The current rows of the given keys (key columns), in the order asked; keys
        without a row are left out."""
        self.layout.check_keys(keys, "key")
        if keys.num_rows == 0:
            return self.schema.empty_table()
        values = self.db.get(self.layout.storage_keys(keys).to_pylist())
        found = pa.array(values, pa.binary()).drop_null()
        return self._rows_table(found)

    def prefix_lookup(self, prefixes: pa.RecordBatch | pa.Table) -> pa.Table:
        """The current rows whose bucket-key columns equal one of the given prefixes."""
        self.layout.check_keys(prefixes, "prefix", self.layout.bucket_key)
        values: list[bytes] = []
        for prefix in self.layout.prefix_keys(prefixes).to_pylist():
            it = self.db.iter()
            it.seek(prefix)
            while it.valid():
                key = it.key()
                if not key.startswith(prefix):
                    break
                values.append(it.value())
                it.next()
            del it
        return self._rows_table(pa.array(values, pa.binary()))

    def scan(self, chunk_rows: int = _SCAN_CHUNK) -> Iterator[pa.RecordBatch]:
        """Every current row, in key order, in batches."""
        it = self.db.iter()
        it.seek(DATA_PREFIX)
        values: list[bytes] = []
        while it.valid() and it.key().startswith(DATA_PREFIX):
            values.append(it.value())
            if len(values) >= chunk_rows:
                yield self._rows_batch(pa.array(values, pa.binary()))
                values = []
            it.next()
        del it
        if values:
            yield self._rows_batch(pa.array(values, pa.binary()))

    def count(self) -> int:
        return sum(b.num_rows for b in self.scan())

    def _rows_batch(self, values: pa.Array) -> pa.RecordBatch:
        rows = self.codec.decode(values)
        return pa.RecordBatch.from_arrays(rows.flatten(), schema=self.schema)

    def _rows_table(self, values: pa.Array) -> pa.Table:
        if len(values) == 0:
            return self.schema.empty_table()
        return pa.Table.from_batches([self._rows_batch(values)])

    # ------------------------------------------------------------ snapshots
    def checkpoint(self, dest: Path) -> int:
        """A RocksDB checkpoint of the current state in `dest`; returns the log offset it covers."""
        offset = self.applied_offset
        self.db.flush(True)
        Checkpoint(self.db).create_checkpoint(str(dest))
        return offset

    def close(self) -> None:
        try:
            self.db.flush(True)
        finally:
            self.db.close()


def destroy(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
