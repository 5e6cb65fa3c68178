"""Remote segment layout: exact round trip, column projection by ranged reads, statistics, corruption."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from fluvial.broker.log import BatchMeta, LogConfig, LogTablet
from fluvial.errors import CorruptRemoteDataError, InvalidRequestError, ObjectNotFound
from fluvial.tiering.remote_log_manifest import ManifestConflict, ManifestStore, RemoteLogManifest, segment_key
from fluvial.tiering.remote_segment import (
    RemoteSegment, RemoteSegmentReader, local_segment_batches, read_remote_batches, remote_batch_statistics,
    upload_segment,
)
from fluvial.broker.metadata import MetadataStore

TS = pa.timestamp("ms", tz="UTC")
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


@pytest.fixture
def store(object_store):
    return object_store


def wide_batch(rows: int, seed: int, columns: int = 20) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    data = {
        "_timestamp": pa.array(np.arange(seed * 1000, seed * 1000 + rows, dtype=np.int64)).cast(TS),
        "_change": pa.array(np.zeros(rows, np.int8)),
        "_key": pa.array([b"k%d" % i for i in range(rows)], pa.binary()),
        "_headers": pa.array([[{"key": "h", "value": b"v"}] if i % 3 == 0 else [] for i in range(rows)], HEADERS),
    }
    for c in range(columns):
        data[f"c{c}"] = pa.array(rng.integers(0, 1 << 40, rows), pa.int64())
    return pa.RecordBatch.from_pydict(data)


def fill_tablet(path, batches: int = 12, rows: int = 2000) -> LogTablet:
    tablet = LogTablet.open(path, LogConfig(segment_bytes=1 << 30))
    for i in range(batches):
        tablet.append(wide_batch(rows, i), BatchMeta(-1, 0, 0, -1, -1, producer_id=40 + i, producer_epoch=1,
                                                       base_sequence=i * rows, attributes=2, schema_id=-1))
    tablet.flush()  # only durable data is tiered
    return tablet


def upload_all(tablet: LogTablet, store, tmp_path) -> RemoteSegment:
    key = segment_key("t", "id", 0, 0, tablet.log_end_offset)
    return upload_segment(store, key, local_segment_batches(tablet, 0, tablet.log_end_offset), tmp_path / "staging")


def test_round_trip_is_exact(store, tmp_path):
    tablet = fill_tablet(tmp_path / "log")
    segment = upload_all(tablet, store, tmp_path)
    assert (segment.base_offset, segment.next_offset, segment.batch_count) == (0, tablet.log_end_offset, 12)
    local = tablet.read(0, 1 << 40)
    remote = list(read_remote_batches(store, segment, 0))
    assert [r.meta for r in remote] == [l.meta for l in local]
    for r, l in zip(remote, local):
        assert r.batch.equals(l.batch), r.meta
    # From the middle of a batch: whole batches from the one holding the offset.
    mid = list(read_remote_batches(store, segment, 2000 * 5 + 17))
    assert mid[0].meta.base_offset == 2000 * 5 and len(mid) == 7
    assert remote_batch_statistics(store, segment)[3][1]["c0"].null_count == 0
    assert RemoteSegment.from_json(segment.to_json()) == segment


def test_projection_fetches_only_the_asked_columns(store, tmp_path):
    tablet = fill_tablet(tmp_path / "log")
    segment = upload_all(tablet, store, tmp_path)
    reader = RemoteSegmentReader(cache_bytes=0)
    reader.batch_metas(store, segment)  # footer read once, as every reader does
    store.stats.reset()
    full = list(reader.read_batches(store, segment, 0))
    full_bytes = store.stats.bytes_read
    store.stats.reset()
    two = list(reader.read_batches(store, segment, 0, columns=["c3", "c17"]))
    two_bytes = store.stats.bytes_read
    assert [b.batch.schema.names for b in two[:1]] == [["c3", "c17"]]
    assert pa.Table.from_batches([b.batch for b in two]).column("c17").equals(
        pa.Table.from_batches([b.batch for b in full]).column("c17"))
    # 2 of 24 columns of similar size: well under a fifth of the full read.
    assert two_bytes < full_bytes * 0.2, (two_bytes, full_bytes)
    with pytest.raises(InvalidRequestError):
        list(reader.read_batches(store, segment, 0, columns=["nope"]))


def test_corrupt_or_missing_object_is_an_error_not_wrong_data(store, tmp_path):
    tablet = fill_tablet(tmp_path / "log", batches=3)
    segment = upload_all(tablet, store, tmp_path)
    data = bytearray(store.get(segment.key))
    # Flip a byte in the middle of the data pages (not the footer).
    data[len(data) // 3] ^= 0xFF
    store.put(segment.key, bytes(data))
    with pytest.raises(CorruptRemoteDataError):
        list(RemoteSegmentReader().read_batches(store, segment, 0))
    store.put(segment.key, bytes(data[:-100]))
    with pytest.raises(CorruptRemoteDataError):
        list(RemoteSegmentReader().read_batches(store, segment, 0))
    store.delete([segment.key])
    with pytest.raises(ObjectNotFound):
        list(RemoteSegmentReader().read_batches(store, segment, 0))


def test_manifest_commits_are_versioned_and_contiguous(tmp_path):
    manifests = ManifestStore(MetadataStore(tmp_path / "m.db"))
    m = manifests.load("t", "id", 0)
    assert m.segments == () and m.version == 0
    a = RemoteSegment(0, 10, 100, 5, "a")
    b = RemoteSegment(10, 25, 100, 9, "b")
    m1 = manifests.commit(m.appended(a))
    m2 = manifests.commit(m1.appended(b))
    with pytest.raises(ManifestConflict):
        manifests.commit(m1.appended(b))
    loaded = manifests.load("t", "id", 0)
    assert loaded == m2 and loaded.end_offset == 25 and loaded.segment_for(12) == b
    truncated, dropped = loaded.truncated_to(12)
    assert dropped == (a,) and truncated.log_start_offset == 12 and truncated.segment_for(11) is None
    with pytest.raises(Exception):
        m2.appended(RemoteSegment(30, 40, 1, 1, "gap"))
