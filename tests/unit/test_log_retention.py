"""Log tablet retention: old segments deleted by time and size, DeleteRecords, topic deletion."""
from __future__ import annotations

import pytest

from fluvial.errors import OffsetOutOfRangeError
from tests.unit.test_log_support import all_rows, meta, open_tablet, records

HOUR_MS = 3_600_000


def fill(tablet, batches: int, *, first_timestamp: int = 0, step_ms: int = 0) -> None:
    for i in range(batches):
        tablet.append(records(5, value_size=200, first_timestamp=first_timestamp + i * step_ms, tag=i), meta())


def test_retention_by_time_deletes_expired_segments_but_never_the_active_one(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4096, retention_ms=10 * HOUR_MS)
    fill(tablet, 30, step_ms=HOUR_MS)  # record timestamps 0h .. 29h
    infos = tablet.segment_infos()
    assert len(infos) > 4

    now = 29 * HOUR_MS + 5  # only what is newer than 19h stays
    deleted = tablet.enforce_retention(now)

    remaining = tablet.segment_infos()
    assert deleted == len(infos) - len(remaining) > 0
    assert all(now - s.max_timestamp <= 10 * HOUR_MS for s in remaining[:-1])
    assert remaining[0].base_offset == tablet.log_start_offset
    # The newest deleted segment was expired; the oldest kept one was not.
    assert now - infos[deleted - 1].max_timestamp > 10 * HOUR_MS
    assert now - infos[deleted].max_timestamp <= 10 * HOUR_MS
    assert not any(tmp_path.glob(f"{infos[0].base_offset:020d}.*"))
    with pytest.raises(OffsetOutOfRangeError):
        tablet.read(0, 100)
    assert tablet.read(tablet.log_start_offset, 100)[0].meta.base_offset == tablet.log_start_offset

    # Far in the future everything but the active segment goes.
    tablet.enforce_retention(10**12)
    assert len(tablet.segment_infos()) == 1
    assert tablet.log_end_offset == 150


def test_retention_forever_keeps_everything(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4096, retention_ms=-1)
    fill(tablet, 20)
    assert tablet.enforce_retention(10**15) == 0
    assert tablet.log_start_offset == 0


def test_retention_by_size_keeps_at_least_the_limit(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4096, retention_ms=-1, retention_bytes=10_000)
    fill(tablet, 40)
    before = tablet.size_bytes
    assert before > 20_000

    deleted = tablet.enforce_retention(0)

    assert deleted > 0
    assert tablet.size_bytes >= 10_000
    # Deleting one more segment would have gone below the limit.
    assert tablet.size_bytes - tablet.segment_infos()[0].size_bytes < 10_000
    assert all_rows(tablet).column("_offset")[0].as_py() == tablet.log_start_offset


def test_retention_survives_reopen(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4096, retention_ms=-1, retention_bytes=8_000)
    fill(tablet, 40)
    tablet.enforce_retention(0)
    start, end = tablet.log_start_offset, tablet.log_end_offset
    tablet.close()

    reopened = open_tablet(tmp_path, segment_bytes=4096)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (start, end)
    assert all_rows(reopened).column("_offset").to_pylist() == list(range(start, end))


def test_advance_log_start_hides_records_and_is_persisted(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4096)
    fill(tablet, 20)
    assert tablet.advance_log_start(42) == 42

    with pytest.raises(OffsetOutOfRangeError):
        tablet.read(41, 100)
    # Reads return whole batches: the one holding 42 starts at 40.
    assert tablet.read(42, 100)[0].meta.base_offset == 40
    assert tablet.segment_infos()[0].base_offset <= 42
    # Moving backwards is a no-op; beyond the high watermark is an error.
    assert tablet.advance_log_start(10) == 42
    with pytest.raises(OffsetOutOfRangeError):
        tablet.advance_log_start(tablet.high_watermark + 1)

    # Without a clean close, as after a crash.
    reopened = open_tablet(tmp_path, segment_bytes=4096)
    assert reopened.log_start_offset == 42
    with pytest.raises(OffsetOutOfRangeError):
        reopened.read(41, 100)


def test_advance_log_start_to_the_end_then_append(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4096)
    fill(tablet, 10)
    tablet.advance_log_start(50)
    assert tablet.read(50, 100) == []
    tablet.append(records(1), meta())
    assert tablet.read(50, 100)[0].meta.base_offset == 50
    tablet.close()

    reopened = open_tablet(tmp_path)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (50, 51)


def test_delete_removes_the_bucket_files(tmp_path):
    bucket = tmp_path / "topic-0"
    tablet = open_tablet(bucket, segment_bytes=4096)
    fill(tablet, 10)
    tablet.delete()
    assert not bucket.exists()
