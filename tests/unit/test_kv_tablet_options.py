"""A KV tablet whose SST files were written under other RocksDB table options (no
filters, no data-block hash index: RocksDB's defaults) opens and reads under the tablet's
point-lookup options, also after its old and new files are compacted together."""
from __future__ import annotations

import pyarrow as pa
from rocksdict import Options, Rdict

from fluvial.kv import KeyLayout, KvTablet, MergeSpec

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string())])


def batch(ids) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]})


def names(tablet: KvTablet, ids) -> dict:
    found = tablet.lookup(pa.table({"id": pa.array(ids, pa.int64())})).to_pylist()
    return {r["id"]: r["name"] for r in found}


def test_a_tablet_written_under_default_options_reads_under_the_point_lookup_options(tmp_path):
    path = tmp_path / "kv"
    layout, spec = KeyLayout(SCHEMA, ["id"]), MergeSpec.of(SCHEMA, ["id"], "last_row", None)
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    old = KvTablet(path, Rdict(str(path), opts), SCHEMA, layout, spec)
    old.apply(old.prepare(batch(range(0, 3000))), 1)
    old.db.flush(True)
    old.close()

    tablet = KvTablet.open(path, SCHEMA, layout, spec, create=False)
    assert tablet.applied_offset == 1
    assert names(tablet, [0, 1500, 2999, 5000]) == {0: "n0", 1500: "n1500", 2999: "n2999"}
    one = tablet.layout.few_key_bytes(pa.table({"id": pa.array([7], pa.int64())}))[0]
    assert tablet.row_batch(tablet.value_at(one)).to_pylist() == [{"id": 7, "name": "n7"}]
    tablet.apply(tablet.prepare(batch(range(2000, 5000))), 2)  # new files beside the old ones
    tablet.db.flush(True)
    tablet.db.compact_range(None, None)  # old and new files merged under the new options
    assert names(tablet, [1, 2500, 4999, 6000]) == {1: "n1", 2500: "n2500", 4999: "n4999"}
    assert tablet.count() == 5000
    tablet.close()
    reopened = KvTablet.open(path, SCHEMA, layout, spec, create=False)
    assert names(reopened, [0, 4999]) == {0: "n0", 4999: "n4999"}
    reopened.close()
