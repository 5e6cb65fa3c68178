"""DurableView: lookups read a KV tablet as of its durable changelog offset."""
from __future__ import annotations

import pyarrow as pa

from fluvial.kv.durable_view import DurableView


class Durable:
    offset = 0

    def __call__(self) -> int:
        return self.offset


def binary(values):
    return pa.array(values, pa.binary())


def test_pending_writes_are_rewound_until_durable():
    durable = Durable()
    view = DurableView(durable, 0)
    assert view.usable()
    keys = binary([b"a", b"b", b"c"])
    # Write 1 (offsets 0-1): a changed from a0, b inserted. Write 2 (2-3): a changed again, c deleted.
    view.add(2, [b"a", b"b"], [b"a0", None])
    view.add(4, [b"a", b"c"], [b"a1", b"c0"])
    live = binary([b"a2", b"b1", None])
    assert view.rewind(keys, live).to_pylist() == [b"a0", None, b"c0"]
    durable.offset = 2  # write 1 durable: its rows are visible, write 2's are not
    assert view.rewind(keys, live).to_pylist() == [b"a1", b"b1", b"c0"]
    durable.offset = 4
    assert view.rewind(keys, live).to_pylist() == live.to_pylist()
    view.add(6, [b"z"], [None])
    view.clear()
    assert view.rewind(keys, live).to_pylist() == live.to_pylist()


def test_prefix_reads_drop_added_rows_and_restore_changed_ones():
    durable = Durable()
    view = DurableView(durable, 0)
    view.add(3, [b"p1", b"p2", b"p3", b"q1"], [None, b"old2", b"old3", b"oldq"])
    found = {b"p1": b"new1", b"p2": b"new2"}  # p3 deleted by the pending write
    assert view.rewind_prefix(b"p", found) == {b"p2": b"old2", b"p3": b"old3"}


def test_not_usable_below_the_offset_tracking_began_at():
    durable = Durable()
    view = DurableView(durable, 10)
    assert not view.usable()
    durable.offset = 10
    assert view.usable()


def test_a_tablet_read_through_the_view_gives_the_rows_before_pending_writes(tmp_path):
    import numpy as np

    from fluvial.kv import KeyLayout, KvTablet, MergeSpec

    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
    tablet = KvTablet.open(tmp_path / "kv", schema, KeyLayout(schema, ["id"], None),
                           MergeSpec.of(schema, ["id"], None, None), create=True)
    durable = Durable()
    view = DurableView(durable, 0)
    first = tablet.prepare(pa.record_batch({"id": [1, 2], "v": ["a", "b"]}, schema=schema))
    tablet.apply(first, 2)
    durable.offset = 2
    # Pending: 1 updated, 2 deleted, 3 inserted.
    write = tablet.prepare(pa.record_batch({"id": [1, 2, 3], "v": ["A", None, "c"]}, schema=schema),
                           deletes=np.array([False, True, False]))
    # The merge's own read of the old rows serves as the before-images: the same as a re-read.
    assert write.before.to_pylist() == tablet.db.get(write.keys)
    view.add(6, write.keys, write.before.to_pylist())
    tablet.apply(write, 6)
    keys = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    assert tablet.lookup(keys).to_pydict() == {"id": [1, 3], "v": ["A", "c"]}
    assert tablet.lookup(keys, view).to_pydict() == {"id": [1, 2], "v": ["a", "b"]}
    assert tablet.prefix_lookup(keys, view).to_pydict() == {"id": [1, 2], "v": ["a", "b"]}
    durable.offset = 6
    assert tablet.lookup(keys, view).to_pydict() == {"id": [1, 3], "v": ["A", "c"]}
    tablet.close()


def test_many_keys_and_few_keys_are_put_back_alike():
    durable = Durable()
    view = DurableView(durable, 0)
    view.add(2, [b"k%03d" % i for i in range(0, 100, 2)], [b"old%03d" % i for i in range(0, 100, 2)])
    keys = [b"k%03d" % i for i in range(100)]
    live = binary([b"new%03d" % i for i in range(100)])
    expected = [b"old%03d" % i if i % 2 == 0 else b"new%03d" % i for i in range(100)]
    assert view.rewind(binary(keys), live).to_pylist() == expected  # vectorised
    assert view.rewind(binary(keys[:3]), live.slice(0, 3)).to_pylist() == expected[:3]  # probed
