"""The row cache every KV tablet shares: point reads served from it are never stale (rows
updated or deleted after they were cached, in memtables or after flushes and compactions),
and tablets sharing it never see each other's rows under the same keys."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from fluvial.kv import KeyLayout, KvTablet, MergeSpec
from fluvial.kv import tablet as kv_tablet

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string())])


def open_tablet(path) -> KvTablet:
    return KvTablet.open(path, SCHEMA, KeyLayout(SCHEMA, ["id"]), MergeSpec.of(SCHEMA, ["id"], None, None))


class Writer:
    def __init__(self, tablet: KvTablet):
        self.tablet = tablet
        self.offset = 0

    def upsert(self, ids, names) -> None:
        rows = pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64()), "name": names}, schema=SCHEMA)
        self._apply(self.tablet.prepare(rows))

    def delete(self, ids) -> None:
        keys = pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64())})
        self._apply(self.tablet.prepare(keys, deletes=np.ones(len(ids), bool)))

    def _apply(self, write) -> None:
        self.offset += write.changelog.num_rows
        self.tablet.apply(write, self.offset)


def names(tablet: KvTablet, ids) -> dict:
    got = tablet.lookup(pa.table({"id": pa.array(ids, pa.int64())}))
    return dict(zip(got.column("id").to_pylist(), got.column("name").to_pylist()))


def test_rows_read_through_the_row_cache_are_never_stale(tmp_path):
    tablet = open_tablet(tmp_path / "a")
    w = Writer(tablet)
    ids = list(range(2000))
    w.upsert(ids, [f"v1-{i}" for i in ids])
    tablet.db.flush(True)  # into an SST file: reads now go through the row cache
    assert names(tablet, [5, 6, 7]) == {5: "v1-5", 6: "v1-6", 7: "v1-7"}
    assert names(tablet, [5, 6, 7]) == {5: "v1-5", 6: "v1-6", 7: "v1-7"}  # served from the cache

    w.upsert([5], ["v2-5"])  # newer row in the memtable
    w.delete([6])
    assert names(tablet, [5, 6, 7]) == {5: "v2-5", 7: "v1-7"}
    tablet.db.flush(True)
    assert names(tablet, [5, 6, 7]) == {5: "v2-5", 7: "v1-7"}
    tablet.db.compact_range(None, None)  # files rewritten: the cached entries name old files
    assert names(tablet, [5, 6, 7]) == {5: "v2-5", 7: "v1-7"}
    w.upsert([6], ["v3-6"])
    assert names(tablet, list(range(4, 9))) == {4: "v1-4", 5: "v2-5", 6: "v3-6", 7: "v1-7", 8: "v1-8"}
    tablet.close()

    # Reopened (its files and the process-wide cache outlive the tablet): the same answers.
    again = open_tablet(tmp_path / "a")
    assert names(again, [5, 6, 7]) == {5: "v2-5", 6: "v3-6", 7: "v1-7"}
    again.close()


def test_tablets_sharing_the_row_cache_keep_their_own_rows(tmp_path):
    a, b = open_tablet(tmp_path / "a"), open_tablet(tmp_path / "b")
    assert kv_tablet._row_cache() is kv_tablet._row_cache()  # one cache for the process
    Writer(a).upsert([1, 2], ["a1", "a2"])
    Writer(b).upsert([1, 3], ["b1", "b3"])
    for t in (a, b):
        t.db.flush(True)
    for _ in range(2):  # the second round is served from the cache
        assert names(a, [1, 2, 3]) == {1: "a1", 2: "a2"}
        assert names(b, [1, 2, 3]) == {1: "b1", 3: "b3"}
    a.close()
    b.close()
