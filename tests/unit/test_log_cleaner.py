"""Log compaction of a log tablet: latest record per key, offsets kept, tombstones, crash safety."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from fluvial.broker import kafka_batches
from fluvial.broker.log import BatchMeta, FlushPolicy, LogConfig, LogTablet
from fluvial.broker.log.cleaner import CompactionConfig, clean, needs_cleaning

SCHEMA = kafka_batches.stored_schema()


def keyed(keys: list[bytes | None], values: list[bytes | None], ts: int = 1000) -> pa.RecordBatch:
    n = len(keys)
    return pa.record_batch([
        pa.array(np.full(n, ts, np.int64)).cast(pa.timestamp("ms", tz="UTC")),
        pa.array(np.zeros(n, np.int8)),
        pa.array(keys, pa.binary()),
        pa.array([[] for _ in range(n)], kafka_batches.HEADERS_TYPE),
        pa.array(values, pa.binary()),
    ], schema=SCHEMA)


def new_meta() -> BatchMeta:
    return BatchMeta(-1, 0, 0, -1, -1)


def open_tablet(path, segment_bytes=4000) -> LogTablet:
    return LogTablet.open(path, LogConfig(segment_bytes=segment_bytes, flush_policy=FlushPolicy.NONE, retention_ms=-1))


def records(tablet: LogTablet, start: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    offset = start
    while offset < tablet.log_end_offset:
        batches = tablet.read(offset, 1 << 20)
        for b in batches:
            out += list(zip(b.batch.column("_offset").to_pylist(), b.batch.column("_key").to_pylist(),
                            b.batch.column("value").to_pylist()))
        offset = batches[-1].meta.next_offset
    return out


def fill(tablet: LogTablet, rounds: int = 20, keys: int = 10) -> dict:
    """Every key updated `rounds` times, a few batches per segment; returns the latest per key."""
    latest = {}
    for r in range(rounds):
        ks = [b"k%d" % k for k in range(keys)]
        vs = [b"v%d-%d" % (k, r) + b"x" * 40 for k in range(keys)]
        tablet.append(keyed(ks, vs), new_meta())
        latest.update(zip(ks, vs))
    return latest


def test_cleaning_keeps_the_latest_record_per_key_at_its_offset(tmp_path):
    tablet = open_tablet(tmp_path)
    before = dict((o, (k, v)) for o, k, v in records_after_fill(tablet))
    end = tablet.log_end_offset
    tablet.roll()
    result = clean(tablet, CompactionConfig(), force=True)
    assert result.segments_rewritten >= 1 and result.records_after == 10
    after = records(tablet)
    # Offsets preserved: each kept record is the one that was at that offset.
    assert all(before[o] == (k, v) for o, k, v in after)
    assert {k: v for _, k, v in after} == {k: v for k, v in (before[o] for o in sorted(before))}
    assert len(after) == 10 and tablet.log_end_offset == end
    # Reading from any offset of a gap continues at the next kept record.
    kept = [o for o, _, _ in after]
    for gap in (0, 5, kept[3] - 1, kept[-1] - 1):
        assert [o for o, _, _ in records(tablet, gap) if o >= gap][0] == min(o for o in kept if o >= gap)
    # Reopened: same records, indexes rebuilt, appends go on at the same end.
    tablet.close()
    again = open_tablet(tmp_path)
    assert records(again) == after
    again.append(keyed([b"k0"], [b"new"]), new_meta())
    assert records(again)[-1] == (end, b"k0", b"new")


def records_after_fill(tablet):
    fill(tablet)
    return records(tablet)


def test_tombstones_kept_for_delete_retention_then_removed(tmp_path):
    tablet = open_tablet(tmp_path)
    fill(tablet, rounds=5)
    tablet.append(keyed([b"k1", b"k2"], [None, None]), new_meta())
    tablet.roll()
    config = CompactionConfig(delete_retention_ms=60_000)
    clean(tablet, config, now_ms=1_000_000, force=True)
    kept = {k: v for _, k, v in records(tablet)}
    assert kept[b"k1"] is None and kept[b"k2"] is None and len(kept) == 10
    # Not due yet: the horizon is one minute after the first cleaning.
    assert not needs_cleaning(tablet, config, 1_030_000)
    assert needs_cleaning(tablet, config, 1_061_000)
    result = clean(tablet, config, now_ms=1_061_000)
    assert result.tombstones_removed == 2
    assert sorted(k for _, k, _ in records(tablet)) == sorted(b"k%d" % i for i in range(10) if i not in (1, 2))


def test_dirty_ratio_and_min_compaction_lag(tmp_path):
    tablet = open_tablet(tmp_path)
    fill(tablet, rounds=10)
    tablet.roll()
    assert needs_cleaning(tablet, CompactionConfig(min_cleanable_dirty_ratio=0.5), 10_000)
    # Records written at t=1000 are younger than a lag of 10 s at t=5000: nothing cleanable.
    assert not needs_cleaning(tablet, CompactionConfig(min_compaction_lag_ms=10_000), 5_000)
    assert clean(tablet, CompactionConfig(min_compaction_lag_ms=10_000), now_ms=5_000, force=True) is None
    clean(tablet, CompactionConfig(), now_ms=10_000, force=True)
    # All cleaned: the dirty part is empty.
    assert not needs_cleaning(tablet, CompactionConfig(min_cleanable_dirty_ratio=0.01), 20_000)


@pytest.mark.parametrize("stage", ["cleaned", "swap", "swap-half-done"])
def test_a_crash_during_the_swap_loses_nothing(tmp_path, stage):
    tablet = open_tablet(tmp_path)
    latest = fill(tablet)
    before = records(tablet)
    tablet.roll()
    tablet.close()
    # A cleaned copy left at each stage of the swap by a crash (one built by a real cleaning
    # of a copy of the directory).
    import shutil
    copy_dir = tmp_path.parent / (tmp_path.name + "-copy")
    shutil.copytree(tmp_path, copy_dir)
    other = open_tablet(copy_dir)
    other.roll()
    clean(other, CompactionConfig(), force=True)
    other.close()
    first = sorted(p.name for p in tmp_path.glob("*.arrows"))[0]
    cleaned = (copy_dir / first).read_bytes()
    target = tmp_path / (first + "." + stage.split("-")[0])
    target.write_bytes(cleaned if stage.startswith("swap") else cleaned[: len(cleaned) // 2])
    if stage == "swap-half-done":
        # Killed while the merged segments were being removed: the second one is gone already.
        second = sorted(p.name for p in tmp_path.glob("*.arrows"))[1]
        (tmp_path / second).unlink()
    reopened = open_tablet(tmp_path)
    got = records(reopened)
    assert {k: v for _, k, v in got} == latest
    if stage == "cleaned":
        assert got == before  # an unfinished copy is dropped
    else:
        assert len(got) < len(before)  # the committed copy replaced the segments it covers
        assert set(got) <= set(before)
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))


def test_a_small_dedupe_buffer_cleans_in_several_passes(tmp_path):
    tablet = open_tablet(tmp_path)
    latest = fill(tablet, rounds=20)
    tablet.roll()
    segments = len(tablet.segment_infos())
    config = CompactionConfig(dedupe_buffer_bytes=1)  # one dirty segment a pass
    passes = 0
    checkpoints = []
    while tablet.cleaner_checkpoint.read(0) < tablet.log_end_offset:
        clean(tablet, config, force=True)
        passes += 1
        checkpoints.append(tablet.cleaner_checkpoint.read(0))
        assert passes <= segments
    # One dirty segment more each pass: the dirty part is covered in as many steps.
    assert passes == segments and checkpoints == sorted(set(checkpoints))
    assert {k: v for _, k, v in records(tablet)} == latest
    assert len(records(tablet)) == 10


def test_small_cleaned_segments_are_merged(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4000)
    latest = fill(tablet, rounds=30)
    tablet.roll()
    before = len(tablet.segment_infos())
    clean(tablet, CompactionConfig(), force=True)
    after = tablet.segment_infos()
    assert len(after) < before / 3
    # Still contiguous: each segment starts where the previous one ends.
    assert all(a.next_offset == b.base_offset for a, b in zip(after, after[1:]))
    assert {k: v for _, k, v in records(tablet)} == latest
    tablet.close()
    again = open_tablet(tmp_path)
    assert {k: v for _, k, v in records(again)} == latest
    assert [s.base_offset for s in again.segment_infos()] == [s.base_offset for s in after]
