"""The group commit writes a flush window of coalesced appends off the event loop: the loop
only closes the window (`LogTablet.take_pending`), the executor job writes it and fsyncs
(`LogTablet.write_taken`). Appends arriving meanwhile land after it, in order; a write
failure fails every waiter of the window and takes the tablet offline."""
from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from fluvial.broker.log import FlushPolicy
from fluvial.broker.tables import Bucket, Table
from fluvial.errors import StorageError
from tests.unit.test_log_support import all_rows, meta, open_tablet, records

# Only bounds a hang should the code under test deadlock; nothing is timed.
HANG_BOUND_S = 30


def make_bucket(tmp_path, executor) -> Bucket:
    table = Table("t", uuid.uuid4(), {}, 0)
    bucket = Bucket(table, 0, open_tablet(tmp_path / "t-0", flush_policy=FlushPolicy.ACK), executor)
    table.buckets.append(bucket)
    return bucket


def gate_window_writes(tablet, monkeypatch):
    """Hold the first window write (in the executor thread) until released: returns
    (started, release) events."""
    started, release = threading.Event(), threading.Event()
    original = tablet._write_coalesced

    def gated(window):
        if not started.is_set():
            started.set()
            assert release.wait(HANG_BOUND_S), "the window write was never released"
        original(window)

    monkeypatch.setattr(tablet, "_write_coalesced", gated)
    return started, release


def test_appends_during_an_off_loop_window_write_land_after_it_in_order(tmp_path, monkeypatch):
    executor = ThreadPoolExecutor(1)
    appended: list[pa.RecordBatch] = []

    async def scenario():
        bucket = make_bucket(tmp_path, executor)
        tablet = bucket.tablet
        bucket.append(records(2, tag=0), meta())  # a plain append: the segment exists
        appended.append(records(2, tag=0))
        started, release = gate_window_writes(tablet, monkeypatch)
        waits = []
        for tag in range(1, 4):
            batch = records(1 + tag % 2, tag=tag)
            written = bucket.append(batch, meta(), coalesce=True)
            appended.append(batch)
            waits.append(bucket.group_commit.wait_durable(written.next_offset))
        first_window_end = tablet.log_end_offset
        # The window is closed on the loop and written by the executor, which holds the
        # write lock meanwhile.
        assert await asyncio.get_running_loop().run_in_executor(None, started.wait, HANG_BOUND_S)
        assert tablet._write_lock.locked() and tablet.written_end_offset == 2
        # Appends arriving meanwhile are not held up by the write: they get the offsets
        # after the window's, into the next window.
        for tag in range(4, 8):
            batch = records(1 + tag % 3, tag=tag)
            written = bucket.append(batch, meta(), coalesce=True)
            appended.append(batch)
            waits.append(bucket.group_commit.wait_durable(written.next_offset))
            assert written.base_offset >= first_window_end
        assert tablet.written_end_offset == 2  # nothing of either window is readable yet
        assert tablet.read(2, 1 << 20, uncommitted=True) == []
        release.set()
        await asyncio.wait_for(asyncio.gather(*waits), HANG_BOUND_S)
        assert tablet.high_watermark == tablet.log_end_offset == sum(b.num_rows for b in appended)
        assert tablet.pending_records == 0

        rows = all_rows(tablet)
        expected = pa.Table.from_batches(appended)
        assert rows.column("_offset").to_pylist() == list(range(rows.num_rows))
        for name in expected.column_names:
            assert rows.column(name).combine_chunks().equals(expected.column(name).combine_chunks()), name
        # Byte-identical after a restart too (what a fetch reads from the files).
        tablet.close()
        reopened = open_tablet(tmp_path / "t-0", flush_policy=FlushPolicy.ACK)
        try:
            again = all_rows(reopened)
            assert again.equals(rows)
        finally:
            reopened.close()

    try:
        asyncio.run(scenario())
    finally:
        executor.shutdown()


def test_a_failed_off_loop_window_write_fails_its_waiters_and_takes_the_tablet_offline(tmp_path, monkeypatch):
    executor = ThreadPoolExecutor(1)

    async def scenario():
        bucket = make_bucket(tmp_path, executor)
        tablet = bucket.tablet
        bucket.append(records(2), meta())
        await bucket.group_commit.wait_durable(2)
        segment = tablet._view.segments[-1]
        started, release = gate_window_writes(tablet, monkeypatch)

        def failing_append(*args, **kwargs):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(segment, "append", failing_append)
        waits = [bucket.group_commit.wait_durable(bucket.append(records(1, tag=t), meta(), coalesce=True).next_offset)
                 for t in range(3)]
        assert await asyncio.get_running_loop().run_in_executor(None, started.wait, HANG_BOUND_S)
        # Arriving while the failing window is written: waits on the next window.
        late = bucket.append(records(1, tag=9), meta(), coalesce=True)
        waits.append(bucket.group_commit.wait_durable(late.next_offset))
        release.set()
        results = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), HANG_BOUND_S)
        assert all(isinstance(r, StorageError) for r in results), results
        assert tablet.failure is not None and "No space left" in tablet.failure
        assert tablet.high_watermark == 2 and tablet.written_end_offset == 2  # nothing half-written shows
        monkeypatch.undo()
        with pytest.raises(StorageError, match="offline"):
            bucket.append(records(1), meta(), coalesce=True)
        with pytest.raises(StorageError, match="offline"):
            bucket.append(records(1), meta())
        with pytest.raises(StorageError, match="offline"):
            await bucket.group_commit.wait_durable(tablet.log_end_offset)
        with pytest.raises(StorageError, match="offline"):
            tablet.read(0, 1 << 20)

    try:
        asyncio.run(scenario())
    finally:
        executor.shutdown()


def test_a_plain_append_writes_a_taken_window_first(tmp_path):
    """Another writer of the segments (a large batch appended from a thread) between the
    window's closing and its write writes the window first: the log stays in offset order."""
    tablet = open_tablet(tmp_path / "t-0", flush_policy=FlushPolicy.ACK)
    try:
        first = [records(1, tag=t) for t in range(3)]
        for batch in first:
            tablet.append(batch, meta(), coalesce=True)
        target = tablet.take_pending()
        assert target == 3 and tablet.written_end_offset == 0
        later = records(1, tag=5)
        tablet.append(later, meta(), coalesce=True)  # the next window
        big = records(4, tag=7)
        written = tablet.append(big, meta())  # a plain append: both windows go first
        assert written.base_offset == 4 and tablet.written_end_offset == 8
        tablet.write_taken(target)  # the group commit's job: nothing left to write, fsyncs
        assert tablet.flushed_offset == 8 and tablet.pending_records == 0
        # A window taken with nothing pending after it: a plain append writes it first too.
        second = [records(1, tag=t) for t in range(10, 13)]
        for batch in second:
            tablet.append(batch, meta(), coalesce=True)
        target = tablet.take_pending()
        assert target == 11 and tablet.written_end_offset == 8 and not tablet._pending
        other = records(2, tag=20)
        written = tablet.append(other, meta())
        assert written.base_offset == 11 and tablet.written_end_offset == 13
        tablet.write_taken(target)
        rows = all_rows(tablet)
        expected = pa.Table.from_batches([*first, later, big, *second, other])
        assert rows.column("_offset").to_pylist() == list(range(13))
        for name in expected.column_names:
            assert rows.column(name).combine_chunks().equals(expected.column(name).combine_chunks()), name
    finally:
        tablet.close()


def test_coalesced_appends_on_the_loop_and_plain_appends_from_a_thread_keep_their_offsets(tmp_path):
    """Many producers' coalesced appends on the loop, windows written off the loop, and
    large plain appends from another thread (the produce path's `append_in_thread`) all at
    once: every batch is read back at the offsets its append answered, nothing lost or
    reordered, and all of it durable."""
    executor = ThreadPoolExecutor(2)
    appender = ThreadPoolExecutor(1)

    async def scenario():
        bucket = make_bucket(tmp_path, executor)
        tablet = bucket.tablet
        loop = asyncio.get_running_loop()
        answered: list[tuple[int, pa.RecordBatch]] = []

        async def producer(p: int) -> None:
            for i in range(40):
                batch = records(1 + i % 2, tag=p * 1000 + i)
                written = bucket.append(batch, meta(), coalesce=True)
                answered.append((written.base_offset, batch))
                await bucket.group_commit.wait_durable(written.next_offset)

        def plain_appends() -> None:
            for i in range(20):
                batch = records(50, tag=900_000 + i)
                written = tablet.append(batch, meta(), leader_epoch=bucket.leader_epoch)
                answered.append((written.base_offset, batch))
                loop.call_soon_threadsafe(bucket.appended_off_loop)

        thread_done = loop.run_in_executor(appender, plain_appends)
        await asyncio.wait_for(asyncio.gather(thread_done, *(producer(p) for p in range(8))), HANG_BOUND_S)
        await asyncio.wait_for(bucket.group_commit.wait_durable(tablet.log_end_offset), HANG_BOUND_S)
        total = sum(b.num_rows for _, b in answered)
        assert tablet.log_end_offset == tablet.high_watermark == total and tablet.pending_records == 0
        rows = all_rows(tablet)
        assert rows.column("_offset").to_pylist() == list(range(total))
        answered.sort(key=lambda a: a[0])
        expected = pa.Table.from_batches([b for _, b in answered])
        assert [a[0] for a in answered] == list(
            itertools.accumulate([0] + [b.num_rows for _, b in answered[:-1]]))
        for name in expected.column_names:
            assert rows.column(name).combine_chunks().equals(expected.column(name).combine_chunks()), name

    try:
        asyncio.run(scenario())
    finally:
        appender.shutdown()
        executor.shutdown()
