"""Writing a tiering round into a lake table: data files, per-key reduction of a changelog,
and the one commit that makes a round visible together with the offsets it covers."""
from __future__ import annotations

import functools
import itertools
import uuid
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.tiering.lake.catalog import OFFSETS_PROPERTY, offsets_json, snapshot_offsets
from fluvial.tiering.lake.schema import CHANGE, GONE_CHANGES, OFFSET, conform


class LakeConflictError(RuntimeError):
    """The lake table changed since the round read its offsets (another job committed): the
    round's commit is refused, so no offset is tiered twice."""


def write_data_files(metadata, io, data: pa.Table, task: int = 0) -> list:
    """Parquet data files (Iceberg field ids, column statistics) for `data` in the table's
    data folder; returns their `DataFile` entries, for the driver to commit."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    if data.num_rows == 0:
        return []
    target = metadata.schema().as_arrow()
    return list(_dataframe_to_data_files(table_metadata=metadata, df=conform(data, target), io=io,
                                         write_uuid=uuid.uuid4(), counter=itertools.count(task * 1_000_000)))


def reduce_changes(changes: pa.Table, primary_key: list[str]) -> tuple[pa.Table, pa.Table]:
    """Each key's last change by changelog offset (whatever order the rows came in):
    (rows to upsert, keys to delete). A key whose last change is -U or -D has no row."""
    if changes.num_rows == 0:
        return changes.drop_columns([c for c in (OFFSET, CHANGE) if c in changes.column_names]), \
            changes.select(primary_key)
    # Sort by key, then offset: each key's last change ends its run of equal keys.
    order = pc.sort_indices(changes, [(c, "ascending") for c in primary_key] + [(OFFSET, "ascending")])
    ordered = changes.take(order)
    n = ordered.num_rows
    ends = np.zeros(n, dtype=bool)
    ends[-1] = True
    for c in primary_key:
        col = ordered.column(c).combine_chunks()
        ends[:-1] |= pc.not_equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    latest = ordered.filter(pa.array(ends))
    gone = pc.is_in(latest.column(CHANGE), pa.array(GONE_CHANGES, pa.int8()))
    rows = latest.filter(pc.invert(gone)).drop_columns([OFFSET, CHANGE])
    deleted = latest.filter(gone).select(primary_key)
    return rows, deleted


def key_filter(keys: pa.Table, primary_key: list[str]):
    """An Iceberg row filter matching every row of these keys: exact for a one-column key;
    for a composite key the AND of each column's IN-list, a superset (see `commit_round`)."""
    from pyiceberg.expressions import And, In

    terms = [In(c, set(keys.column(c).to_pylist())) for c in primary_key]
    return functools.reduce(And, terms) if len(terms) > 1 else terms[0]


def commit_round(table, start_snapshot_id: int | None, offsets: dict[int, int], *, data_files: Iterable = (),
                 upserts: pa.Table | None = None, deleted: pa.Table | None = None,
                 primary_key: list[str] | None = None) -> int:
    """One lake commit: the round's rows plus `fluvial.offsets` (every bucket's end offset)
    in the snapshot summary. Refused (`LakeConflictError`) unless the table's current
    snapshot is still `start_snapshot_id`, the one the round's start offsets came from.

    Log tables: `data_files` (written by the tasks) are fast-appended. Primary-key tables:
    every key the round changed is deleted (copy-on-write: the data files holding one are
    rewritten without it), then the `upserts` (current rows) are appended; `deleted` keys
    stay deleted. All of it is one Iceberg commit. Returns the new snapshot id.
    """
    from pyiceberg.exceptions import CommitFailedException

    table.refresh()
    current = table.current_snapshot()
    if (current.snapshot_id if current else None) != start_snapshot_id:
        raise LakeConflictError(f"lake table {'.'.join(table.name())} moved to snapshot "
                                f"{current.snapshot_id if current else None} (covering "
                                f"{snapshot_offsets(current)}) since the round started from {start_snapshot_id}")
    props = {OFFSETS_PROPERTY: offsets_json(offsets)}
    try:
        with table.transaction() as txn:
            if primary_key:
                parts = [t.select(primary_key) for t in (upserts, deleted) if t is not None and t.num_rows]
                kept = None
                if parts and current is not None:
                    touched = pa.concat_tables([p.cast(parts[0].schema) for p in parts])
                    row_filter = key_filter(touched, primary_key)
                    if len(primary_key) > 1:
                        # The filter also matches rows of untouched keys (a mix of touched
                        # columns' values): they are deleted with the rest and written again.
                        matched = table.scan(row_filter=row_filter).to_arrow()
                        kept = matched.join(touched.select(primary_key).cast(matched.select(primary_key).schema),
                                            primary_key, join_type="left anti")
                    txn.delete(row_filter, snapshot_properties=props)
                target = txn.table_metadata.schema().as_arrow()
                rows = [conform(t, target) for t in (kept, upserts) if t is not None and t.num_rows]
                if rows:
                    txn.append(pa.concat_tables(rows), snapshot_properties=props)
            # Always a snapshot of its own: it carries the offsets even when the round added no file.
            with txn.update_snapshot(snapshot_properties=props).fast_append() as append:
                for f in data_files:
                    append.append_data_file(f)
    except CommitFailedException as exc:
        raise LakeConflictError(f"lake commit refused: {exc}") from None
    table.refresh()
    return table.current_snapshot().snapshot_id
