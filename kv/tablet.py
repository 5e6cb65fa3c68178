"""KV tablet: the current row of every key of one bucket of a primary-key table, in RocksDB.

The write path is split so that the bucket's log tablet stays the write-ahead log:
`prepare()` reads the old rows, merges and builds the changelog without touching
RocksDB; the caller appends the changelog to the log tablet; `apply()` then writes the
new rows together with the log offset they bring RocksDB up to, in one atomic write
batch. RocksDB's own WAL is off: after a crash `catch_up()` replays the changelog from
the last applied offset, so RocksDB never holds a change the log lacks, nor misses one.
"""
from __future__ import annotations

import json
import logging
import shutil
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rocksdict import BlockBasedOptions, Cache, Checkpoint, DataBlockIndexType, Options, Rdict, WriteBatch, WriteOptions

from fluvial.errors import InvalidRecordError
from fluvial.kv.batch_io import binary_at, key_order, take_bytes
from fluvial.kv.change_types import FIRST_HIDDEN, ChangeType, is_retraction
from fluvial.kv.row_codec import DATA_PREFIX, ROW_FLAG, KeyLayout, RowCodec, struct_of
from fluvial.kv.rowmerger import Action, MergeEngine, MergeSpec, merger_for
from fluvial.kv.rowmerger.aggregate import AggregateMerger
from fluvial.kv.rowmerger.retract import INPUT_DELETE_KEY, RetractMaterializer, RetractStats, state_key

if TYPE_CHECKING:
    from fluvial.kv.durable_view import DurableView

log = logging.getLogger(__name__)

_APPLIED_KEY = b"m/applied"  # next log offset whose change is not yet in RocksDB
_STATS_KEY = b"m/retract-stats"  # figures of the retract state, written with the rows they describe
_SCHEMA_KEY = b"m/schema/"  # + 2-byte row schema number -> Arrow schema (IPC)
_SCAN_CHUNK = 8192


CHANGE_COLUMN = "_change"
SOURCE_COLUMN = "_source"


@dataclass
class KvWrite:
    """A prepared write: its changelog (user columns, `_change`, `_source` = the index of
    the write row it comes from) and the RocksDB puts/deletes it implies."""

    changelog: pa.RecordBatch
    keys: list[bytes]
    values: list[bytes | None]  # None deletes the key
    stats: RetractStats | None = None  # change of the retract state's figures
    # What `keys` held when the write was prepared (null: nothing), read by the merge
    # anyway: the before-images of a durable view (None: not known, read them again).
    before: pa.Array | None = None

    @property
    def empty(self) -> bool:
        return self.changelog.num_rows == 0


class KvTabletError(Exception):
    """RocksDB state of a bucket that cannot be opened or brought in line with its log."""


def cast_column(column, field: pa.Field, what: str = "column"):
    """``column`` as ``field``'s type; a column that cannot be cast is refused naming both types."""
    if column.type == field.type:
        return column
    try:
        return column.cast(field.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidRecordError(
            f"{what} {field.name!r} has type {column.type}, the table's is {field.type}: {exc}") from None


def _write_options() -> WriteOptions:
    opts = WriteOptions()
    opts.disable_wal = True  # the log tablet is the write-ahead log
    return opts


# One row cache for every KV tablet of the process (RocksDB keys its entries per table
# file, so tablets sharing it never see each other's rows). Point reads answered from it
# skip the index, filter and data-block searches of the SST files: bare multi-gets of
# in-cache keys ran about 3x faster with it (see docs/architecture.md, KV lookup path).
# Rows still in a memtable are read there; the cache holds only rows read from files.
ROW_CACHE_BYTES = 256 << 20
_ROW_CACHE: Cache | None = None


def _row_cache() -> Cache:
    global _ROW_CACHE
    if _ROW_CACHE is None:
        _ROW_CACHE = Cache(ROW_CACHE_BYTES)
    return _ROW_CACHE


def _open_rdict(path: Path, create: bool) -> Rdict:
    opts = Options(raw_mode=True)
    opts.set_row_cache(_row_cache())
    opts.create_if_missing(create)
    opts.increase_parallelism(2)
    # Most point lookups (and the old-row reads of upserts) find their key in an SST file or
    # in one memtable of several: a whole-key bloom filter per memtable skips the skiplist
    # searches of the others (multi-gets ~1.4x in benchmarks/bench_pk's setting).
    opts.set_memtable_whole_key_filtering(True)
    opts.set_memtable_prefix_bloom_ratio(0.1)
    table = BlockBasedOptions()
    # Point lookups dominate: whole-key bloom filters skip files without the key.
    table.set_bloom_filter(10, False)
    table.set_block_cache(Cache(64 << 20))
    table.set_cache_index_and_filter_blocks(True)
    # The newest files' (L0) index and filter blocks stay in the block cache instead of
    # competing with data blocks, and each data block carries a hash index of its keys (a
    # point read then skips the binary search within the block). Both only decide how new
    # SST files are written and how reads use the cache: files written before read as they
    # were (tests/unit/test_kv_tablet_options.py). Measured on 500k rows (CPU time per
    # 1,000-key multi-get): within noise once the row cache is warm (~0.7-0.9 ms), ~10%
    # less when reads miss it (~2.4 vs ~2.8 ms) and on the first, cold round.
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_data_block_index_type(DataBlockIndexType.binary_and_hash())
    table.set_data_block_hash_ratio(0.75)
    opts.set_block_based_table_factory(table)
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
        self._empty: tuple[pa.Schema, pa.RecordBatch] | None = None  # no rows in the current schema (see row_batch)
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
        self._retract = RetractMaterializer(schema, spec.upsert_key, spec.state_ttl_ms) \
            if spec.engine is MergeEngine.RETRACT else None
        self._aggregate = AggregateMerger(schema, spec.aggregates, layout.primary_key) \
            if spec.engine is MergeEngine.AGGREGATION else None
        raw = db.get(_STATS_KEY)
        self.retract_stats = RetractStats.from_json(json.loads(raw)) if raw is not None else RetractStats()

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
        if self._retract is not None:
            self._retract = RetractMaterializer(schema, self.spec.upsert_key, self.spec.state_ttl_ms)
        if self._aggregate is not None:
            self._aggregate = AggregateMerger(schema, self.spec.aggregates, self.layout.primary_key)
        self.db.put(self._schema_key(self.codec.number), schema.serialize().to_pybytes(), self._write_opts)

    # ------------------------------------------------------------ write path
    def prepare(self, rows: pa.RecordBatch | pa.Table, *, deletes: np.ndarray | None = None,
                partial_columns: list[str] | None = None, changes: np.ndarray | None = None,
                timestamps: np.ndarray | None = None) -> KvWrite:
        """Read old rows, merge and build the changelog of one write batch. Touches nothing.

        `rows` holds the table's columns (a delete needs only the key columns), or with
        `partial_columns` the primary key and those target columns. `changes` is each row's
        change type (`ChangeType` +I/-U/+U/-D codes; None: all ADD); `deletes` marks rows
        that delete their key (no row to retract). `timestamps` (ms) date the rows for the
        retract state's TTL. Several writes of one key apply in order. Raises
        InvalidRecordError for writes that cannot be applied; then nothing is.
        """
        if isinstance(rows, pa.Table):
            rows = rows.combine_chunks()
            rows = rows.to_batches()[0] if rows.num_rows else pa.RecordBatch.from_pylist([], rows.schema)
        n = rows.num_rows
        deletes = np.zeros(n, bool) if deletes is None else np.asarray(deletes, bool)
        if deletes.size != n:
            raise InvalidRecordError(f"{deletes.size} delete flags for {n} rows")
        retract = np.zeros(n, bool) if changes is None else is_retraction(np.asarray(changes)) & ~deletes
        if retract.size != n:
            raise InvalidRecordError(f"{retract.size} change types for {n} rows")
        self.layout.check_keys(rows)
        self.spec.check_write(rows.schema.names, deletes=bool(deletes.any()), partial_columns=partial_columns,
                              retractions=bool(retract.any()))
        if self._retract is not None or self._aggregate is not None:
            return self._prepare_stateful(rows, deletes, retract, timestamps)
        # Engines that keep one row per key: a retraction deletes it (what a plain upsert
        # sink does: right only when the changelog arrives in order).
        deletes = deletes | retract
        new_rows = self._conform(rows, deletes, partial_columns)
        if n == 0:
            return KvWrite(self._changelog_batch(pa.array([], self._row_type), [], []), [], [])
        keys = self.layout.storage_keys(rows)

        # Each key's old row is read once; the writes of a key are chained in input order
        # (each one's old row is the state the writes before it left), all in one pass.
        encoded = pc.dictionary_encode(keys)
        group = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        unique_arrow = encoded.dictionary
        g_count = len(unique_arrow)
        order = np.lexsort((np.arange(n), group))
        sorted_groups = group[order]
        first_in_group = np.ones(n, bool)
        first_in_group[1:] = sorted_groups[1:] != sorted_groups[:-1]
        prev = np.full(n, -1, np.int64)
        prev[order[~first_in_group]] = order[np.flatnonzero(~first_in_group) - 1]

        # One sort of the batch's keys serves the multi-get and the write batch.
        key_order = pc.array_sort_indices(unique_arrow) if g_count > 1 else None
        old_rows, exists, old_bytes = self._stored_rows(unique_arrow, key_order)
        if partial_columns is not None:
            # Non-target columns cannot change within the batch (no deletes ride with a
            # partial update): they come from the stored row, or are null for a new key.
            new_rows = self._fill_partial(new_rows, old_rows.take(pa.array(group)), exists[group], partial_columns)

        upserts = np.flatnonzero(~deletes)
        new_bytes = pa.nulls(n, pa.binary())
        if upserts.size == n:
            # Every row writes a row (the common upsert batch): no gathers and scatters.
            self._check_required(new_rows, upserts)
            new_bytes = self.codec.encode(new_rows)
        elif upserts.size:
            upsert_rows = new_rows.take(pa.array(upserts))
            self._check_required(upsert_rows, upserts)
            enc = self.codec.encode(upsert_rows)
            scatter = np.full(n, -1, np.int64)
            scatter[upserts] = np.arange(upserts.size)
            new_bytes = enc.take(pa.array(scatter, mask=scatter < 0))

        # Where the state before each write lives: pool position g (stored row of its key)
        # or g_count + j (write j of this batch); and whether the key exists then.
        has_prev = prev >= 0
        state_pos = np.where(has_prev, g_count + prev, group)
        state_exists = np.where(has_prev, True, exists[group])
        engine = self.spec.engine
        if engine is MergeEngine.LAST_ROW:
            state_exists = np.where(has_prev, ~deletes[np.maximum(prev, 0)], exists[group])
        elif engine is MergeEngine.FIRST_ROW:
            first_write = order[first_in_group][np.searchsorted(sorted_groups[first_in_group], group)]
            state_pos = np.where(has_prev & ~exists[group], g_count + first_write, group)
        else:
            state_pos = self._versioned_state(new_rows, old_rows, exists, group, order, first_in_group, g_count)

        pool_rows = pa.concat_arrays([old_rows, new_rows])
        pool_bytes = pa.concat_arrays([old_bytes, new_bytes])
        pos = pa.array(state_pos)
        old = pool_rows.take(pos)
        act = self.merger.merge(old, state_exists, new_rows, deletes)
        # Writing the row a key already has is no change at all.
        same = pc.fill_null(pc.equal(new_bytes, pool_bytes.take(pos)), False).to_numpy(zero_copy_only=False)
        act[(act == Action.UPDATE) & same] = Action.NONE

        own = g_count + np.arange(n)
        out_src, out_sub, out_change, out_pos = [], [], [], []
        for a, sub, change, where in ((Action.INSERT, 0, ChangeType.INSERT, own),
                                      (Action.UPDATE, 0, ChangeType.UPDATE_BEFORE, state_pos),
                                      (Action.UPDATE, 1, ChangeType.UPDATE_AFTER, own),
                                      (Action.DELETE, 0, ChangeType.DELETE, state_pos)):
            m = np.flatnonzero(act == a)
            out_src.append(m)
            out_sub.append(np.full(m.size, sub, np.int8))
            out_change.append(np.full(m.size, change, np.int8))
            out_pos.append(where[m])
        src = np.concatenate(out_src)
        o = np.lexsort((np.concatenate(out_sub), src))
        src = src[o]
        change = np.concatenate(out_change)[o]
        where = np.concatenate(out_pos)[o]
        changelog = self._changelog_batch(pool_rows.take(pa.array(where)), change, src)

        # A key's final state is what its last changing write left.
        changed = np.flatnonzero(act != Action.NONE)
        last = np.full(g_count, -1, np.int64)
        np.maximum.at(last, group[changed], changed)
        # The write batch goes in key order too (memtable inserts then follow each other).
        ordered = np.arange(g_count) if key_order is None else key_order.to_numpy()
        touched = ordered[last[ordered] >= 0]
        final = last[touched]
        final_bytes = new_bytes.take(pa.array(final))
        deleted = act[final] == Action.DELETE
        if deleted.any():
            final_bytes = pc.if_else(pa.array(deleted), pa.scalar(None, pa.binary()), final_bytes)
        return KvWrite(changelog, unique_arrow.take(pa.array(touched)).to_pylist(), final_bytes.to_pylist(),
                       before=old_bytes.take(pa.array(touched)))

    def _prepare_stateful(self, rows: pa.RecordBatch, deletes: np.ndarray, retract: np.ndarray,
                          timestamps: np.ndarray | None) -> KvWrite:
        """The `retract` and `aggregation` engines: every ADD/RETRACT row folds into its key's state."""
        n = rows.num_rows
        new_rows = self._conform(rows, deletes, None)
        if n == 0:
            return KvWrite(self._changelog_batch(pa.array([], self._row_type), [], []), [], [])
        rowful = np.flatnonzero(~deletes)
        if rowful.size:
            self._check_required(new_rows.take(pa.array(rowful)), rowful)
        encoded = pc.dictionary_encode(self.layout.storage_keys(rows))
        group = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        unique_keys = encoded.dictionary.to_pylist()
        if self._aggregate is not None:
            return self._prepare_aggregate(new_rows, group, unique_keys, deletes, retract)
        if rowful.size == n:
            values = self.codec.encode(new_rows).to_pylist()
        else:
            values = [None] * n
            if rowful.size:
                enc = self.codec.encode(new_rows.take(pa.array(rowful))).to_pylist()
                for i, v in zip(rowful.tolist(), enc):
                    values[i] = v
        # A key's visible row, which alone is its list unless it is flagged: then the list
        # (kept for two rows or more, or with a TTL) is read as well.
        old_rows = self.db.get(unique_keys)
        g_count = len(unique_keys)
        old_states: list = [None] * g_count
        listed = [k for k in range(g_count) if old_rows[k] is not None and old_rows[k][0] & ROW_FLAG]
        if listed:
            for k, v in zip(listed, self.db.get([state_key(unique_keys[k]) for k in listed])):
                if v is None:
                    raise KvTabletError(f"KV tablet {self.path}: the live rows of a key are missing")
                old_states[k] = v
        old_idents = None
        if not self._retract.whole_row:
            lone = [k for k in range(g_count) if old_states[k] is None and old_rows[k] is not None]
            old_idents = [None] * g_count
            if lone:
                decoded = self.codec.decode(pa.array([old_rows[k] for k in lone], pa.binary()))
                for k, ident in zip(lone, self._retract.idents(decoded.cast(self._row_type), [None] * len(lone))):
                    old_idents[k] = ident
        idents = self._retract.idents(new_rows, values)
        times = np.zeros(n, np.int64) if timestamps is None else np.asarray(timestamps, np.int64)
        res = self._retract.merge(group, unique_keys, old_states, old_rows, old_idents, retract, deletes, idents,
                                  values, times)
        pool = new_rows
        if res.stored_rows:
            stored = self.codec.decode(pa.array(res.stored_rows, pa.binary())).cast(self._row_type)
            pool = pa.concat_arrays([new_rows, stored])
        take = np.where(res.ref >= 0, res.ref, n - 1 - res.ref)
        changelog = self._changelog_batch(pool.take(pa.array(take)), res.change, res.src)
        return KvWrite(changelog, res.keys, res.values, res.stats)

    def multi_get(self, keys: pa.Array, order: pa.Array | None = None) -> pa.BinaryArray:
        """The stored values of `keys` (binary storage keys), null where a key has none: one
        RocksDB multi-get with the keys in key order (each SST block and memtable stretch is
        then visited once, in order), answered in the order asked. `order`: the keys'
        sort indices when the caller has them."""
        n = len(keys)
        if n <= 1:
            return pa.array(self.db.get(keys.to_pylist()), pa.binary())
        if order is None:
            order = key_order(keys, len(DATA_PREFIX))
        order = order.to_numpy() if isinstance(order, (pa.Array, pa.ChunkedArray)) else order
        # The reorder and the list conversions each in one pass (kv/batch_io.py).
        return binary_at(self.db.get(take_bytes(keys, order)), order)

    def _stored_rows(self, keys: list[bytes] | pa.Array,
                     order: pa.Array | None = None) -> tuple[pa.StructArray, np.ndarray, pa.BinaryArray]:
        """The stored row of each key (null where none), which keys have one, and the stored
        bytes (null where none): one multi-get."""
        if isinstance(keys, list):
            keys = pa.array(keys, pa.binary())
        old_bytes = self.multi_get(keys, order)
        exists = old_bytes.is_valid().to_numpy(zero_copy_only=False)
        present = np.flatnonzero(exists)
        if not present.size:
            return pa.nulls(len(keys), self._row_type), exists, old_bytes
        take = np.full(len(keys), -1, np.int64)
        take[present] = np.arange(present.size)
        decoded = self.codec.decode(old_bytes.take(pa.array(present))).cast(self._row_type)
        return decoded.take(pa.array(take, mask=~exists)), exists, old_bytes

    def _prepare_aggregate(self, new_rows: pa.StructArray, group: np.ndarray, unique_keys: list[bytes],
                           deletes: np.ndarray, retract: np.ndarray) -> KvWrite:
        self._aggregate.check_retractions(retract)
        g_count = len(unique_keys)
        old_rows, exists, old_bytes = self._stored_rows(unique_keys)
        final, final_exists, last_write = self._aggregate.fold(new_rows, group, g_count, old_rows, exists,
                                                               retract, deletes)
        live = np.flatnonzero(final_exists)
        final_bytes = pa.nulls(g_count, pa.binary())
        if live.size:
            self._check_required(final.take(pa.array(live)), last_write[live])
            scatter = np.full(g_count, -1, np.int64)
            scatter[live] = np.arange(live.size)
            final_bytes = self.codec.encode(final.take(pa.array(live))).take(pa.array(scatter, mask=scatter < 0))
        same = pc.fill_null(pc.equal(final_bytes, old_bytes), False).to_numpy(zero_copy_only=False)
        insert = final_exists & ~exists
        delete = exists & ~final_exists
        update = exists & final_exists & ~same
        # Changelog rows per key: (source write, sub-order, change, pool position) with the
        # pool = stored rows (0..g-1), then the folded rows (g..2g-1).
        parts = []
        for mask, sub, change, offset in ((insert, 0, ChangeType.INSERT, g_count),
                                          (update, 0, ChangeType.UPDATE_BEFORE, 0),
                                          (update, 1, ChangeType.UPDATE_AFTER, g_count),
                                          (delete, 0, ChangeType.DELETE, 0)):
            k = np.flatnonzero(mask)
            parts.append((last_write[k], np.full(k.size, sub), np.full(k.size, change, np.int8), k + offset))
        src = np.concatenate([p[0] for p in parts])
        o = np.lexsort((np.concatenate([p[1] for p in parts]), src))
        change = np.concatenate([p[2] for p in parts])[o]
        where = np.concatenate([p[3] for p in parts])[o]
        pool = pa.concat_arrays([old_rows, final])
        changelog = self._changelog_batch(pool.take(pa.array(where)), change, src[o])
        touched = np.flatnonzero(insert | update | delete)
        return KvWrite(changelog, [unique_keys[i] for i in touched.tolist()],
                       final_bytes.take(pa.array(touched)).to_pylist(), before=old_bytes.take(pa.array(touched)))

    def _versioned_state(self, new_rows: pa.StructArray, old_rows: pa.StructArray, exists: np.ndarray,
                         group: np.ndarray, order: np.ndarray, first_in_group: np.ndarray, g_count: int) -> np.ndarray:
        """Pool positions of the state before each write of a 'versioned' table: the last
        earlier write of its key that won (its version at least the highest before it),
        else the stored row."""
        i = self.schema.get_field_index(self.spec.version_column)
        v_new = _as_int64(new_rows.field(i))
        v_old = np.where(exists, _as_int64(old_rows.field(i)), np.iinfo(np.int64).min)
        vs = v_new[order]
        gs = group[order]
        n = vs.size
        # Highest version before each write: segmented running max, seeded by the stored row.
        starts = np.flatnonzero(first_in_group)
        running = vs.copy()
        seg = np.repeat(np.arange(starts.size), np.diff(np.append(starts, n)))
        running = _segmented_cummax(running, seg)
        before = np.empty(n, np.int64)
        before[1:] = running[:-1]
        before[first_in_group] = np.iinfo(np.int64).min
        before = np.maximum(before, v_old[gs])
        has_state = ~first_in_group | exists[gs]
        wins = ~has_state | (vs >= before)
        # The last winning write before each one, within its key.
        win_pos = np.where(wins, np.arange(n), -1)
        last_win = np.maximum.accumulate(win_pos)
        prior = np.full(n, -1, np.int64)
        prior[1:] = last_win[:-1]
        group_start = starts[seg]
        state_sorted = np.where(prior >= group_start, g_count + order[np.maximum(prior, 0)], gs)
        state = np.empty(n, np.int64)
        state[order] = state_sorted
        return state

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
            cols.append(cast_column(rows.column(f.name), f))
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
        if None not in write.values:
            # Only puts (the common upsert batch): iterated in C, not by a Python loop.
            deque(map(wb.put, write.keys, write.values), maxlen=0)
        else:
            for key, value in zip(write.keys, write.values):
                if value is None:
                    wb.delete(key)
                else:
                    wb.put(key, value)
        stats = None
        if write.stats is not None:
            stats = RetractStats.from_json(self.retract_stats.to_json())
            stats.add(write.stats)
            wb.put(_STATS_KEY, json.dumps(stats.to_json()).encode())
        wb.put(_APPLIED_KEY, int(next_offset).to_bytes(8, "big"))
        self.db.write(wb, self._write_opts)
        self.applied_offset = next_offset
        if stats is not None:
            self.retract_stats = stats

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
            next_offset = int(offsets[-1]) + 1
            if self._retract is not None:
                # The list state is rebuilt from the written rows logged with the changelog.
                self._replay_inputs(batch, rows, change, next_offset)
                applied += batch.num_rows
                continue
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
            wb.put(_APPLIED_KEY, next_offset.to_bytes(8, "big"))
            self.db.write(wb, self._write_opts)
            self.applied_offset = next_offset
            applied += batch.num_rows
        return applied

    def _replay_inputs(self, batch: pa.RecordBatch, rows: pa.RecordBatch, change: np.ndarray,
                       next_offset: int) -> None:
        inputs = np.flatnonzero(change >= FIRST_HIDDEN)
        if inputs.size == 0:
            self.apply(KvWrite(self._changelog_batch(pa.array([], self._row_type), [], []), [], []), next_offset)
            return
        code = change[inputs]
        deletes = code == INPUT_DELETE_KEY
        changes = np.where(code == ChangeType.INPUT_RETRACT, ChangeType.DELETE, ChangeType.INSERT).astype(np.int8)
        times = batch.column("_timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)[inputs] \
            if "_timestamp" in batch.schema.names else None
        part = rows.take(pa.array(inputs))
        if deletes.any():
            keep = [f.name for f in self.schema if f.name in self.layout.primary_key or not deletes.all()]
            part = part.select(keep)
        write = self.prepare(part, deletes=deletes, changes=changes, timestamps=times)
        self.apply(write, next_offset)

    # ------------------------------------------------------------ reads
    def lookup(self, keys: pa.RecordBatch | pa.Table, durable: "DurableView | None" = None) -> pa.Table:
        """The current rows of the given keys (key columns), in the order asked; keys
        without a row are left out. With `durable`: as of the durable changelog."""
        self.layout.check_keys(keys, "key")
        if keys.num_rows == 0:
            return self.schema.empty_table()
        return self.rows_of(self.layout.storage_keys(keys), durable)

    def rows_of(self, keys: pa.Array, durable: "DurableView | None" = None) -> pa.Table:
        """The current rows of storage keys (`layout.storage_keys`), in the order asked;
        keys without a row are left out. One sorted multi-get, one batch decode. With
        `durable`: as of the durable changelog."""
        return self._rows_table(self.values_of(keys, durable))

    def values_of(self, keys: pa.Array, durable: "DurableView | None" = None) -> pa.BinaryArray:
        """The stored values (`codec.decode` reads them) of the storage keys that have a
        row, in the order asked: `rows_of` before decoding."""
        found = self.multi_get(keys)
        if durable is not None:
            found = durable.rewind(keys, found)
        return found.drop_null() if found.null_count else found

    def value_at(self, key: bytes, durable: "DurableView | None" = None) -> bytes | None:
        """The stored value of one storage key (None: no row): one RocksDB get, no arrays
        (a point lookup). With `durable`: as of the durable changelog."""
        value = self.db.get(key)
        return value if durable is None else durable.rewind_one(key, value)

    def row_batch(self, value: bytes | None) -> pa.RecordBatch:
        """The row of one stored value as a one-row record batch (no rows for None)."""
        if value is None:
            return self._empty_batch()
        rows = self.codec.decode_one(value)
        if rows.null_count:  # the batch path's rows carry no row-level nulls; keep flatten's meaning
            rows = rows.flatten()
            return pa.RecordBatch.from_arrays(rows, schema=self.schema)
        return pa.RecordBatch.from_arrays([rows.field(i) for i in range(rows.type.num_fields)], schema=self.schema)

    def _empty_batch(self) -> pa.RecordBatch:
        schema = self.schema
        if self._empty is None or self._empty[0] is not schema:  # built again after a schema change
            self._empty = (schema, pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema))
        return self._empty[1]

    def same_codec(self, other: "KvTablet") -> bool:
        """Whether `other` numbers row schemas as this tablet does (their values decode alike)."""
        a, b = self.codec, other.codec
        return a is b or (a.number == b.number and a.schemas.keys() == b.schemas.keys()
                          and all(a.schemas[n].equals(b.schemas[n]) for n in a.schemas))

    def prefix_lookup(self, prefixes: pa.RecordBatch | pa.Table, durable: "DurableView | None" = None) -> pa.Table:
        """The current rows whose bucket-key columns equal one of the given prefixes. With
        `durable`: as of the durable changelog."""
        self.layout.check_keys(prefixes, "prefix", self.layout.bucket_key)
        values: list[bytes] = []
        for prefix in self.layout.prefix_keys(prefixes).to_pylist():
            found: dict[bytes, bytes] = {}
            it = self.db.iter()
            it.seek(prefix)
            while it.valid():
                key = it.key()
                if not key.startswith(prefix):
                    break
                found[key] = it.value()
                it.next()
            del it
            if durable is not None:
                found = durable.rewind_prefix(prefix, found)
                found = dict(sorted(found.items()))  # key order, as the scan gives it
            values.extend(found.values())
        return self._rows_table(pa.array(values, pa.binary()))

    def snapshot(self):
        """A consistent point-in-time view of the rows (pass it to `scan`), and the log offset it covers."""
        return self.db.snapshot(), self.applied_offset

    def scan(self, chunk_rows: int = _SCAN_CHUNK, view=None) -> Iterator[pa.RecordBatch]:
        """Every current row (or every row of a `snapshot()` view), in key order, in batches."""
        it = (view or self.db).iter()
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


def _as_int64(arr: pa.Array) -> np.ndarray:
    if pa.types.is_timestamp(arr.type) or pa.types.is_date(arr.type):
        arr = arr.cast(pa.int64()) if not pa.types.is_date32(arr.type) else arr.cast(pa.int32()).cast(pa.int64())
    return arr.cast(pa.int64()).fill_null(np.iinfo(np.int64).min).to_numpy(zero_copy_only=False)


def _segmented_cummax(values: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Running max of `values` restarting at each new `segment` id (ids ascending)."""
    if values.size == 0:
        return values
    # Shift each segment above all earlier ones so one global running max never crosses
    # a segment boundary; done on ranks to stay inside int64.
    ranks = np.unique(values, return_inverse=True)[1].astype(np.int64)
    span = int(ranks.max()) + 1
    lifted = np.maximum.accumulate(ranks + segment.astype(np.int64) * span) - segment.astype(np.int64) * span
    return np.unique(values)[lifted]


def destroy(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
