"""Remote log segments (Parquet) written from a log of coalesced messages."""
from __future__ import annotations

from fluvial.tiering.remote_segment import local_segment_batches
from tests.unit.test_log_coalesced import append_all, everything, open_log


def test_remote_segment_of_coalesced_messages_reads_back_each_kafka_batch(tmp_path):
    """Uploaded as a Parquet remote segment (a local object store) and read back from any
    offset, also inside a coalesced message: the Kafka batches and rows of the local log,
    with the statistics of the message they came from."""
    from fluvial.tiering.object_store import LocalObjectStore
    from fluvial.tiering.remote_segment import read_remote_batches, remote_batch_statistics, upload_segment

    specs = [([b"a", b"b", b"c"][: 1 + i % 3], 7 * i, i % 3, 2 if i % 4 else 0, i % 6 == 5) for i in range(36)]
    tablet = open_log(tmp_path / "log", segment_bytes=1 << 20)
    append_all(tablet, specs, coalesce=True)
    assert any(h.parts for s in tablet._view.segments for h in s.headers_from(len(s.schema_message), s.state))
    end = tablet.log_end_offset
    store = LocalObjectStore(tmp_path / "store")
    segment = upload_segment(store, "t/0/0", local_segment_batches(tablet, 0, end), tmp_path / "staging")
    assert (segment.base_offset, segment.next_offset) == (0, end)
    local = everything(tablet)
    for start in range(0, end, 5):
        remote = [(s.meta, s.batch) for s in read_remote_batches(store, segment, start)]
        want = [(m, b) for m, b in local if m.next_offset > start]
        assert [m for m, _ in remote] == [m for m, _ in want], start
        assert all(a.equals(b) for (_, a), (_, b) in zip(remote, want)), start
    assert [m for m, _ in remote_batch_statistics(store, segment)] == [m for m, _ in local]
