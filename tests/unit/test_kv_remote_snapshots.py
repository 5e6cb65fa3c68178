"""KV snapshots in the object store (local folder and a real moto_server S3 process): upload,
manifest commit, retention, garbage collection, restore into a working RocksDB, rows export,
and clear errors for missing or corrupt objects."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from fluvial.errors import StorageError
from fluvial.kv import KeyLayout, KvTablet, MergeSpec, SnapshotStore
from fluvial.tiering.kv_snapshots import RemoteKvSnapshots, read_snapshot_rows

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()), pa.field("score", pa.int64())])


@pytest.fixture
def store(object_store):
    return object_store


def open_tablet(path) -> KvTablet:
    return KvTablet.open(path, SCHEMA, KeyLayout(SCHEMA, ["id"]), MergeSpec.of(SCHEMA, ["id"], None, None))


def write(tablet: KvTablet, ids, score: int, offset: int) -> None:
    rows = pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids],
                                       "score": pa.array(np.full(len(ids), score), pa.int64())}, schema=SCHEMA)
    tablet.apply(tablet.prepare(rows), offset)


def state(tablet: KvTablet) -> dict:
    return {r["id"]: r for b in tablet.scan() for r in b.to_pylist()}


def upload(tablet: KvTablet, local: SnapshotStore, remote: RemoteKvSnapshots, scratch):
    info = local.take(tablet)
    view, offset = tablet.snapshot()
    return remote.upload(info.path / "db", offset, tablet.scan(view=view), tablet.schema, scratch)


def test_upload_restore_and_rows(store, tmp_path):
    tablet = open_tablet(tmp_path / "kv")
    write(tablet, range(60_000), 1, 10)
    write(tablet, range(0, 60_000, 2), 2, 20)
    local = SnapshotStore(tmp_path / "snaps")
    remote = RemoteKvSnapshots(store, "kv/t-abc/0", retain=2)
    assert remote.list() == [] and remote.latest() is None
    snap = upload(tablet, local, remote, tmp_path / "scratch")
    assert snap.log_offset == 20 and snap.rows == 60_000 and snap.files
    expected = state(tablet)
    write(tablet, [1], 9, 21)  # after the snapshot: not in it

    # The whole local state is gone: RocksDB and the local snapshots.
    tablet.close()
    local.delete_all()
    committed = remote.latest(max_offset=20)
    assert committed == snap
    remote.download(committed, tmp_path / "restored")
    restored = open_tablet(tmp_path / "restored")
    assert restored.applied_offset == 20
    assert state(restored) == expected
    restored.close()

    store.stats.reset()
    rows = read_snapshot_rows(store, snap)
    full_bytes = store.stats.bytes_read
    assert {r["id"]: r for r in rows.to_pylist()} == expected
    # A projection of the export fetches only that column's bytes (plus the footer).
    store.stats.reset()
    only_ids = read_snapshot_rows(store, snap, ["score"])
    assert only_ids.column_names == ["score"] and only_ids.num_rows == 60_000
    assert store.stats.bytes_read < full_bytes / 2


def test_retention_and_garbage_collection(store, tmp_path):
    tablet = open_tablet(tmp_path / "kv")
    local = SnapshotStore(tmp_path / "snaps")
    remote = RemoteKvSnapshots(store, "kv/t-abc/1", retain=2)
    offsets = []
    for i in range(4):
        write(tablet, range(i * 10, i * 10 + 10), i, i + 1)
        offsets.append(upload(tablet, local, remote, tmp_path / "scratch").log_offset)
    kept = remote.list()
    assert [s.log_offset for s in kept] == offsets[-2:]
    assert [s.snapshot_id for s in kept] == [3, 4]
    live = {remote.manifest_key} | {k for s in kept for k in s.keys()}
    assert set(store.list("kv/t-abc/1/")) == live
    # An upload cut short (objects stored, manifest not replaced) is collected later.
    store.put("kv/t-abc/1/5-deadbeef/db/000099.sst", b"partial")
    assert remote.latest().snapshot_id == 4
    assert remote.collect_garbage() == 1
    assert set(store.list("kv/t-abc/1/")) == live
    assert remote.latest(max_offset=offsets[-1] - 1).log_offset == offsets[-2]
    assert remote.latest(min_offset=offsets[-1] + 1) is None
    remote.delete_all()
    assert store.list("kv/t-abc/1/") == []
    tablet.close()


def test_missing_or_corrupt_objects_are_clear_errors(store, tmp_path):
    tablet = open_tablet(tmp_path / "kv")
    write(tablet, range(100), 1, 5)
    remote = RemoteKvSnapshots(store, "kv/t-x/0")
    snap = upload(tablet, SnapshotStore(tmp_path / "snaps"), remote, tmp_path / "scratch")
    tablet.close()
    name, size = snap.files[0]
    store.put(f"{snap.prefix}/db/{name}", b"x" * (size + 1))
    with pytest.raises(StorageError, match="corrupt"):
        remote.download(snap, tmp_path / "r1")
    assert not (tmp_path / "r1").exists()  # nothing half-written in its place
    store.delete([f"{snap.prefix}/db/{name}"])
    with pytest.raises(StorageError, match="missing"):
        remote.download(snap, tmp_path / "r2")
    store.put(snap.rows_key, b"not parquet")
    with pytest.raises(StorageError, match="cannot be read"):
        read_snapshot_rows(store, snap)
    store.replace(remote.manifest_key, b"{not json")
    with pytest.raises(StorageError, match="corrupt"):
        remote.list()
    store.replace(remote.manifest_key, json.dumps({"snapshots": []}).encode())
    assert remote.latest() is None


def test_snapshots_past_a_log_end_that_went_back_are_dropped(store, tmp_path):
    tablet = open_tablet(tmp_path / "kv")
    local = SnapshotStore(tmp_path / "snaps")
    remote = RemoteKvSnapshots(store, "kv/t-back/0", retain=3)
    write(tablet, range(100), 1, 10)
    first = upload(tablet, local, remote, tmp_path / "scratch")
    write(tablet, range(50), 2, 20)
    second = upload(tablet, local, remote, tmp_path / "scratch")
    assert remote.discard_after(20) == []
    # The log came back at offset 15: the second snapshot's offsets belong to other changes.
    assert [s.snapshot_id for s in remote.discard_after(15)] == [second.snapshot_id]
    assert [s.snapshot_id for s in remote.list()] == [first.snapshot_id]
    assert not [k for k in store.list("kv/t-back/0/") if k.startswith(second.prefix + "/")]
    assert remote.latest().log_offset == 10


def test_an_upload_drops_snapshots_covering_more_than_it(store, tmp_path):
    """A discard that could not reach the store is done by the next upload: a manifest's
    offsets only grow."""
    tablet = open_tablet(tmp_path / "kv")
    local = SnapshotStore(tmp_path / "snaps")
    remote = RemoteKvSnapshots(store, "kv/t-grow/0", retain=3)
    write(tablet, range(100), 1, 30)
    stale = upload(tablet, local, remote, tmp_path / "scratch")
    tablet.close()
    # After a power loss the log ends at 12; the KV tablet is rebuilt and goes on from there.
    tablet = open_tablet(tmp_path / "kv2")
    write(tablet, range(10), 7, 12)
    fresh = upload(tablet, local, remote, tmp_path / "scratch")
    assert fresh.snapshot_id > stale.snapshot_id
    assert [s.log_offset for s in remote.list()] == [12]
    assert not [k for k in store.list("kv/t-grow/0/") if k.startswith(stale.prefix + "/")]
