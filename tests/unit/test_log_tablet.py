"""Log tablet: appends, reads, projection, segment rolls and timestamp lookups."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from fluvial.broker.log import BatchMeta, LogConfig, LogTablet, TimestampType
from fluvial.broker.log.batch_meta import ATTR_LOG_APPEND_TIME
from fluvial.errors import InvalidRecordError, InvalidRequestError, OffsetOutOfRangeError
from tests.unit.test_log_support import TIMESTAMP_TYPE, all_rows, meta, open_tablet, records


def test_append_assigns_offsets_and_fills_meta(tmp_path):
    tablet = open_tablet(tmp_path)
    first = tablet.append(records(3, first_timestamp=1000), meta(producer_id=7, producer_epoch=2, base_sequence=0))
    second = tablet.append(records(5, timestamps=[50, 40, 90, 10, 20]), meta(base_timestamp=50))

    assert (first.base_offset, first.last_offset, first.record_count) == (0, 2, 3)
    assert (first.base_timestamp, first.max_timestamp) == (1000, 1002)
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (7, 2, 0)
    assert (second.base_offset, second.last_offset_delta, second.next_offset) == (3, 4, 8)
    assert (second.base_timestamp, second.max_timestamp) == (50, 90)
    assert tablet.log_end_offset == tablet.high_watermark == 8
    assert tablet.log_start_offset == 0


def test_read_round_trip_returns_stored_columns_and_meta(tmp_path):
    tablet = open_tablet(tmp_path)
    batch = records(4, tag=1)
    written = tablet.append(batch, meta(producer_id=11, attributes=0x14, schema_id=3, partition_leader_epoch=2))

    [stored] = tablet.read(0, 1 << 20)

    assert stored.meta == written
    assert stored.meta.is_transactional and stored.meta.compression_codec == 4
    assert stored.batch.schema.names == ["_offset", *batch.schema.names]
    assert stored.batch.schema.field("_offset").type == pa.int64()
    assert stored.batch.column("_offset").to_pylist() == [0, 1, 2, 3]
    assert stored.batch.drop_columns(["_offset"]).equals(batch)


def test_meta_and_rows_survive_reopen(tmp_path):
    tablet = open_tablet(tmp_path)
    written = [tablet.append(records(2, tag=i), meta(producer_id=i, base_sequence=i * 2)) for i in range(5)]
    tablet.close()

    reopened = open_tablet(tmp_path)
    metas = [s.meta for s in reopened.read(0, 1 << 30)]
    assert metas == written
    assert all_rows(reopened).column("amount").to_pylist() == [
        v for i in range(5) for v in (i * 1000, i * 1000 + 1)
    ]


def test_read_starts_with_the_batch_holding_the_offset(tmp_path):
    tablet = open_tablet(tmp_path)
    for i in range(4):
        tablet.append(records(10, tag=i), meta())

    stored = tablet.read(25, 1 << 20)

    assert [s.meta.base_offset for s in stored] == [20, 30]
    assert stored[0].batch.column("_offset")[0].as_py() == 20


def test_read_returns_at_least_one_batch_and_stops_at_max_bytes(tmp_path):
    tablet = open_tablet(tmp_path)
    for i in range(10):
        tablet.append(records(10, value_size=1000, tag=i), meta())

    assert len(tablet.read(0, 1)) == 1
    one_batch = tablet.read(0, 1)[0].batch.get_total_buffer_size()
    few = tablet.read(0, 3 * one_batch + one_batch // 2)
    assert 2 <= len(few) <= 4
    assert len(tablet.read(0, 1 << 30)) == 10


def test_read_at_log_end_is_empty_and_beyond_is_out_of_range(tmp_path):
    tablet = open_tablet(tmp_path)
    assert tablet.read(0, 100) == []
    with pytest.raises(OffsetOutOfRangeError):
        tablet.read(1, 100)
    tablet.append(records(3), meta())
    assert tablet.read(3, 100) == []
    with pytest.raises(OffsetOutOfRangeError):
        tablet.read(4, 100)
    with pytest.raises(OffsetOutOfRangeError):
        tablet.read(-1, 100)


def test_max_offset_bounds_the_read(tmp_path):
    tablet = open_tablet(tmp_path)
    for i in range(5):
        tablet.append(records(10, tag=i), meta())

    assert [s.meta.base_offset for s in tablet.read(0, 1 << 30, max_offset=25)] == [0, 10, 20]
    assert [s.meta.base_offset for s in tablet.read(0, 1 << 30, max_offset=20)] == [0, 10]
    assert tablet.read(30, 1 << 30, max_offset=30) == []


def test_projection_returns_only_requested_columns_without_copying(tmp_path):
    tablet = open_tablet(tmp_path)
    for i in range(20):
        tablet.append(records(1000, value_size=500, tag=i), meta())
    tablet.close()

    allocated_before = pa.total_allocated_bytes()
    tablet = open_tablet(tmp_path)
    stored = tablet.read(0, 1 << 30, columns=["_offset", "amount"])
    allocated_after = pa.total_allocated_bytes()

    assert len(stored) == 20
    assert all(s.batch.schema.names == ["_offset", "amount"] for s in stored)
    amounts = pa.concat_arrays([s.batch.column("amount") for s in stored])
    assert amounts.to_pylist() == [i * 1000 + j for i in range(20) for j in range(1000)]
    # Column buffers are slices of the memory-mapped segment, not copies in Arrow's pool.
    assert allocated_after - allocated_before < 10_000


def test_projection_of_unknown_column_is_a_clear_error(tmp_path):
    tablet = open_tablet(tmp_path)
    tablet.append(records(2), meta())
    with pytest.raises(InvalidRequestError):
        tablet.read(0, 100, columns=["nope"])


def test_rolls_by_size_and_reads_across_segments(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=8 * 1024)
    expected = []
    for i in range(40):
        batch = records(7, value_size=100, tag=i)
        tablet.append(batch, meta())
        expected += batch.column("amount").to_pylist()

    infos = tablet.segment_infos()
    assert len(infos) > 5
    assert all(info.size_bytes <= 8 * 1024 for info in infos)
    assert [i.base_offset for i in infos[1:]] == [i.next_offset for i in infos[:-1]]
    assert all_rows(tablet).column("amount").to_pylist() == expected
    assert all_rows(tablet).column("_offset").to_pylist() == list(range(280))
    # A read crossing a segment boundary continues in the next segment.
    boundary = infos[1].base_offset
    stored = tablet.read(boundary - 1, 1 << 30)
    assert stored[0].meta.base_offset < boundary <= stored[1].meta.base_offset
    assert tablet.size_bytes == sum(i.size_bytes for i in infos)


def test_rolls_when_schema_changes_and_keeps_each_segment_one_schema(tmp_path):
    tablet = open_tablet(tmp_path)
    tablet.append(records(3), meta())
    tablet.append(records(3, extra_column=True), meta())
    tablet.append(records(3, extra_column=True), meta())

    assert [i.base_offset for i in tablet.segment_infos()] == [0, 3]
    stored = tablet.read(0, 1 << 30)
    assert [s.batch.num_columns for s in stored] == [7, 8, 8]


def test_rolls_by_time_between_batch_timestamps(tmp_path):
    tablet = open_tablet(tmp_path, segment_ms=60_000)
    tablet.append(records(2, first_timestamp=0), meta())
    tablet.append(records(2, first_timestamp=30_000), meta())
    tablet.append(records(2, first_timestamp=61_000), meta())

    assert [i.base_offset for i in tablet.segment_infos()] == [0, 4]


def test_segment_files_are_plain_arrow_ipc_streams(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4096)
    for i in range(10):
        tablet.append(records(5, tag=i), meta(producer_id=i))
    tablet.close()

    files = sorted(tmp_path.glob("*.arrows"))
    assert len(files) > 1
    assert files[0].name == "00000000000000000000.arrows"
    offsets = []
    for path in files:
        assert path.with_suffix(".index").exists() and path.with_suffix(".timeindex").exists()
        reader = ipc.open_stream(path)
        schema = reader.schema
        assert schema.field("_offset").type == pa.int64()
        assert schema.field("_timestamp").type == TIMESTAMP_TYPE
        assert schema.field("_change").type == pa.int8()
        assert schema.field("_key").type == pa.binary()
        assert schema.field("_headers").type == pa.list_(
            pa.struct([("key", pa.string()), ("value", pa.binary())])
        )
        for batch, custom in reader.iter_batches_with_custom_metadata():
            stored_meta = BatchMeta.decode(custom[b"fluvial.batch"])
            assert stored_meta.base_offset == batch.column("_offset")[0].as_py()
            offsets += batch.column("_offset").to_pylist()
        assert int(path.stem) == ipc.open_stream(path).read_next_batch().column("_offset")[0].as_py()
    assert offsets == list(range(50))


def test_offset_for_timestamp_matches_a_brute_force_search(tmp_path):
    rng = np.random.default_rng(7)
    tablet = open_tablet(tmp_path, segment_bytes=6000, index_interval_bytes=512)
    all_timestamps = []
    for _ in range(60):
        timestamps = rng.integers(0, 10_000, size=int(rng.integers(1, 12)))
        tablet.append(records(len(timestamps), timestamps=timestamps), meta())
        all_timestamps.extend(timestamps.tolist())
    stamps = np.array(all_timestamps)

    for target in [-5, 0, 1, 4999, 5000, 9998, 9999, 10_000, *rng.integers(0, 10_000, 40).tolist()]:
        hits = np.flatnonzero(stamps >= target)
        expected = (int(hits[0]), int(stamps[hits[0]])) if len(hits) else None
        assert tablet.offset_for_timestamp(int(target)) == expected, target

    best = int(np.argmax(stamps))
    assert tablet.max_timestamp() == (best, int(stamps[best]))


def test_timestamp_lookups_skip_records_below_log_start(tmp_path):
    tablet = open_tablet(tmp_path)
    tablet.append(records(5, timestamps=[100, 500, 200, 300, 400]), meta())
    tablet.append(records(5, timestamps=[150, 160, 170, 180, 190]), meta())
    tablet.advance_log_start(3)

    assert tablet.offset_for_timestamp(0) == (3, 300)
    assert tablet.max_timestamp() == (4, 400)
    assert tablet.offset_for_timestamp(401) is None


def test_empty_tablet_lookups(tmp_path):
    tablet = open_tablet(tmp_path)
    assert tablet.offset_for_timestamp(0) is None
    assert tablet.max_timestamp() is None
    assert tablet.size_bytes == 0


def test_log_append_time_overrides_record_timestamps(tmp_path):
    tablet = LogTablet.open(tmp_path, LogConfig(message_timestamp_type=TimestampType.LOG_APPEND_TIME))
    written = tablet.append(records(3, first_timestamp=5), meta(), now_ms=123_456)

    assert written.attributes & ATTR_LOG_APPEND_TIME
    assert (written.base_timestamp, written.max_timestamp) == (123_456, 123_456)
    [stored] = tablet.read(0, 1000, columns=["_timestamp"], uncommitted=True)
    assert stored.batch.column(0).cast(pa.int64()).to_pylist() == [123_456] * 3


def test_rejects_batches_the_log_cannot_store(tmp_path):
    tablet = open_tablet(tmp_path)
    with pytest.raises(InvalidRecordError):
        tablet.append(records(0), meta())
    with pytest.raises(InvalidRecordError):
        tablet.append(records(2).drop_columns(["_timestamp"]), meta())
    with pytest.raises(InvalidRecordError):
        batch = records(2)
        tablet.append(batch.add_column(0, "_offset", pa.array([1, 2])), meta())
    assert tablet.log_end_offset == 0


def test_leader_epoch_of_appends_is_recorded(tmp_path):
    tablet = open_tablet(tmp_path)
    tablet.append(records(2), meta(partition_leader_epoch=0))
    tablet.append(records(2), meta(partition_leader_epoch=3))
    tablet.append(records(2), meta(partition_leader_epoch=3))
    tablet.close()

    reopened = open_tablet(tmp_path)
    assert reopened.leader_epochs.entries() == [(0, 0), (3, 2)]
    assert reopened.leader_epochs.end_offset_for(0, reopened.log_end_offset) == (0, 2)
    assert reopened.leader_epochs.end_offset_for(3, reopened.log_end_offset) == (3, 6)


def test_batch_metas_walk_headers_from_an_offset(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4096)
    written = [tablet.append(records(4, tag=i), meta(producer_id=5, base_sequence=4 * i)) for i in range(30)]

    assert list(tablet.batch_metas()) == written
    assert list(tablet.batch_metas(41)) == written[10:]
    tablet.advance_log_start(60)
    assert next(tablet.batch_metas()) == written[15]


def test_the_leaders_epoch_replaces_the_producers_and_starts_before_appends(tmp_path):
    tablet = open_tablet(tmp_path)
    tablet.start_leader_epoch(0)
    assert tablet.leader_epochs.end_offset_for(0, tablet.log_end_offset) == (0, 0)
    written = tablet.append(records(2), meta(partition_leader_epoch=-1), leader_epoch=0)
    assert written.partition_leader_epoch == 0
    assert tablet.leader_epochs.end_offset_for(0, tablet.log_end_offset) == (0, 2)

    tablet.start_leader_epoch(1)
    tablet.start_leader_epoch(1)
    tablet.append(records(3), meta(), leader_epoch=1)
    assert tablet.leader_epochs.entries() == [(0, 0), (1, 2)]
    assert tablet.read(2, 100)[0].meta.partition_leader_epoch == 1
