"""The bucket's group commit under flush policy `ack`: every append is made durable
promptly without anyone waiting, appends arriving during a flush share the next one, and
readers are woken when the durable offset moves."""
from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from fluvial.broker.log import FlushPolicy
from fluvial.broker.tables import Bucket, Table
from fluvial.errors import StorageError
from tests.unit.test_log_support import meta, open_tablet, records


def make_bucket(tmp_path, executor) -> Bucket:
    table = Table("t", uuid.uuid4(), {}, 0)
    bucket = Bucket(table, 0, open_tablet(tmp_path / "t-0", flush_policy=FlushPolicy.ACK), executor)
    table.buckets.append(bucket)
    return bucket


def test_appends_nobody_waits_for_become_visible_in_few_shared_fsyncs(tmp_path):
    executor = ThreadPoolExecutor(1)

    async def scenario():
        bucket = make_bucket(tmp_path, executor)
        tablet = bucket.tablet
        flushes = []
        original = tablet.flush_up_to

        def counting_flush(offset):
            flushes.append(offset)
            original(offset)

        tablet.flush_up_to = counting_flush
        arrived = bucket.data_arrived()
        for i in range(200):  # acks=0/1 appends: nobody awaits their durability
            bucket.append(records(5, tag=i), meta())
        assert tablet.high_watermark < tablet.log_end_offset == 1000  # not visible before the fsync
        await asyncio.wait_for(arrived.wait(), 10)  # readers are woken by the flush
        while tablet.high_watermark < 1000:
            await asyncio.wait_for(bucket.data_arrived().wait(), 10)
        return flushes

    try:
        flushes = asyncio.run(scenario())
    finally:
        executor.shutdown()
    # The first append started a flush; the 199 that came while it ran shared the next one.
    assert 1 <= len(flushes) <= 3, flushes


def test_a_failed_fsync_fails_every_waiter_and_later_appends(tmp_path, monkeypatch):
    executor = ThreadPoolExecutor(1)

    async def scenario():
        bucket = make_bucket(tmp_path, executor)
        bucket.append(records(3), meta())
        segment = bucket.tablet._view.segments[-1]

        def failing_flush():
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(segment, "flush", failing_flush)
        with pytest.raises(StorageError, match="offline"):
            await bucket.group_commit.wait_durable(3)
        assert bucket.tablet.high_watermark == 0  # nothing of the failed flush became visible
        monkeypatch.undo()  # the disk "works" again: the bucket stays offline (fsyncgate)
        with pytest.raises(StorageError, match="offline"):
            bucket.append(records(1), meta())
        with pytest.raises(StorageError, match="offline"):
            await bucket.group_commit.wait_durable(3)
        with pytest.raises(StorageError, match="offline"):
            bucket.tablet.read(0, 1 << 20)

    try:
        asyncio.run(scenario())
    finally:
        executor.shutdown()


def _record_deferred_starts(loop, commit) -> list[float]:
    """Wraps the loop's call_later so that every flush start the group commit defers for
    the rate bound is recorded (its delay); starts taken in the next loop pass are not."""
    deferred: list[float] = []
    call_later = loop.call_later

    def recording_call_later(delay, callback, *args, **kwargs):
        if getattr(callback, "__self__", None) is commit or getattr(callback, "__name__", "") == "recording_begin":
            deferred.append(delay)
        return call_later(delay, callback, *args, **kwargs)

    loop.call_later = recording_call_later
    return deferred


def test_flushes_of_a_busy_bucket_start_spaced_apart_and_a_lone_one_at_once(tmp_path):
    """Many small producers: appends trickling in while a flush runs are covered by flushes
    that start at least FLUSH_SPACING_S apart (not one fsync per request); after a quiet
    spell the next flush starts in the same loop pass. Every acknowledgement still waits
    for the flush covering its records."""
    from fluvial.broker import tables

    executor = ThreadPoolExecutor(1)

    async def scenario():
        loop = asyncio.get_running_loop()
        bucket = make_bucket(tmp_path, executor)
        tablet = bucket.tablet
        deferred = _record_deferred_starts(loop, bucket.group_commit)
        starts: list[tuple[float, int]] = []
        original = tablet.flush_up_to

        def recording_flush(offset):
            starts.append((loop.time(), offset))
            original(offset)

        tablet.flush_up_to = recording_flush
        # A lone append after a quiet spell: its flush is not deferred by the rate bound.
        written = bucket.append(records(1), meta())
        await bucket.group_commit.wait_durable(written.next_offset)
        assert starts and deferred == []
        # A steady trickle: one append every 0.5 ms for 0.2 s, each waited for.
        waits = []
        end = loop.time() + 0.2
        while loop.time() < end:
            written = bucket.append(records(1, tag=len(waits)), meta())
            waits.append((written.next_offset, bucket.group_commit.wait_durable(written.next_offset)))
            await asyncio.sleep(0.0005)
        for offset, wait in waits:
            await wait
            assert tablet.flushed_offset >= offset  # acknowledged only once fsynced
        return starts, len(waits), deferred

    try:
        starts, appended, deferred = asyncio.run(scenario())
    finally:
        executor.shutdown()
    # Requests came faster than the bound: some starts were deferred, none by more than one
    # spacing beyond the burst.
    assert deferred and max(deferred) <= tables.FLUSH_SPACING_S * tables.FLUSH_BURST, deferred
    gaps = sorted(b[0] - a[0] for a, b in zip(starts[1:], starts[2:]))
    # Measured where the executor thread starts the flush (its pick-up time varies a little
    # around the loop's spacing): back to back would be a fraction of a millisecond. A lower
    # bound: a loaded machine only makes the gaps longer.
    assert gaps and gaps[len(gaps) // 2] >= tables.FLUSH_SPACING_S * 0.9, gaps
    # At most one flush per spacing, and fewer flushes than requests (on a loaded machine the
    # trickle itself may come slower than one request per 0.5 ms).
    assert len(starts) - 1 <= 0.2 / tables.FLUSH_SPACING_S + 3, (len(starts), appended)
    assert len(starts) < appended, (len(starts), appended)


def test_a_steady_producer_and_the_request_after_a_caught_up_backlog_never_wait_for_the_spacing(tmp_path):
    """The spacing bounds the rate of flush starts (with a burst of FLUSH_BURST), not the gap
    after each one: a request arriving right after a flush started (the one that covered a
    slow fsync's backlog) has its own flush started at once, and a producer sending every
    8 ms (slower than the bound) never waits. Checked on the scheduling decision itself
    (deferred by the rate bound or started in the next loop pass), not on wall-clock delays
    that a loaded machine stretches."""
    executor = ThreadPoolExecutor(1)

    async def scenario():
        loop = asyncio.get_running_loop()
        bucket = make_bucket(tmp_path, executor)
        commit = bucket.group_commit
        deferred = _record_deferred_starts(loop, commit)
        started = 0
        original = commit._begin

        def recording_begin():
            nonlocal started
            started += 1
            original()

        commit._begin = recording_begin
        for i in range(20):
            for _ in range(2):  # two requests back to back: the second waits for no spacing
                written = bucket.append(records(1, tag=i), meta())
                await commit.wait_durable(written.next_offset)
            await asyncio.sleep(0.008)  # slower than one flush per FLUSH_SPACING_S, burst included
        return started, deferred

    try:
        started, deferred = asyncio.run(scenario())
    finally:
        executor.shutdown()
    assert started == 40
    assert deferred == [], deferred


def test_durability_callbacks_are_called_once_in_order_with_futures_alike(tmp_path):
    """`when_durable` (the one-partition produce answer's wait): each callback is called
    exactly once, only after the flush covering its offset, in the order asked, mixed with
    future waits; one already durable is called at once."""
    executor = ThreadPoolExecutor(1)

    async def scenario():
        bucket = make_bucket(tmp_path, executor)
        tablet, commit = bucket.tablet, bucket.group_commit
        calls: list[tuple[int, object, int]] = []
        futures = []
        for i in range(50):
            written = bucket.append(records(1, tag=i), meta())
            end = written.next_offset
            if i % 3 == 0:
                futures.append((end, commit.wait_durable(end)))
            else:
                commit.when_durable(end, lambda failure, end=end: calls.append((end, failure, tablet.flushed_offset)))
        assert calls == []  # nothing durable before a flush ran
        for end, wait in futures:
            await asyncio.wait_for(wait, 10)
            assert tablet.flushed_offset >= end
        while len(calls) < 50 - len(futures):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        ends = [end for end, _, _ in calls]
        assert ends == sorted(ends) and len(set(ends)) == len(ends)  # once each, in order
        assert all(failure is None and flushed >= end for end, failure, flushed in calls)
        now: list = []
        commit.when_durable(tablet.log_end_offset, now.append)
        assert now == [None]  # durable already: called at once

    try:
        asyncio.run(scenario())
    finally:
        executor.shutdown()


def test_a_failed_fsync_fails_every_durability_callback(tmp_path, monkeypatch):
    executor = ThreadPoolExecutor(1)

    async def scenario():
        bucket = make_bucket(tmp_path, executor)
        bucket.append(records(3), meta())
        segment = bucket.tablet._view.segments[-1]

        def failing_flush():
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(segment, "flush", failing_flush)
        outcomes: list = []
        bucket.group_commit.when_durable(3, outcomes.append)
        bucket.group_commit.when_durable(3, outcomes.append)
        while len(outcomes) < 2:
            await asyncio.sleep(0.01)
        assert all(isinstance(o, StorageError) for o in outcomes), outcomes
        later: list = []
        bucket.group_commit.when_durable(4, later.append)  # offline: told at once, never acknowledged
        assert len(later) == 1 and isinstance(later[0], StorageError)

    try:
        asyncio.run(scenario())
    finally:
        executor.shutdown()
