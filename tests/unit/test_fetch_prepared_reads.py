"""Large fetches of a raw table's segments: the next read is started as the response leaves,
and the consumer's next fetch is answered with it only when it is still what that fetch's
own read would give (same offset, limit and leader epoch; the offset still in the log)."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from fluvial.broker.handlers import fetch
from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from tests.unit.test_wire_cache import batch

PER_READ = 10  # records in each read's one batch
LIMIT = 1 << 20


class _Kind:
    def __init__(self, tablet) -> None:
        self.tablet = tablet
        self.reads: list[int] = []
        self.fail_at: set[int] = set()

    def prepares_reads(self, table) -> bool:
        return True

    def read_kafka(self, broker, bucket, offset, max_bytes, min_one=True):
        self.reads.append(offset)
        if offset in self.fail_at:
            raise FluvialError("disk failed", code=ErrorCode.KAFKA_STORAGE_ERROR)
        if offset < self.tablet.log_start_offset:
            raise FluvialError("below the log start", code=ErrorCode.OFFSET_OUT_OF_RANGE)
        start = offset - offset % PER_READ
        wire = batch(start, PER_READ)
        return [wire], len(wire)


class _Cache:
    """The broker's wire cache stands for the broker (held reads are kept per cache)."""


def _setup():
    tablet = SimpleNamespace(log_start_offset=0)
    kind = _Kind(tablet)
    bucket = SimpleNamespace(table=SimpleNamespace(kind=kind), tablet=tablet, leader_epoch=0)
    broker = SimpleNamespace(cpu_executor=ThreadPoolExecutor(1), wire_cache=_Cache(),
                             config=SimpleNamespace(fetch_read_ahead=True))
    return SimpleNamespace(broker=broker), bucket, kind


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.005)


def test_the_next_fetch_is_answered_with_the_read_started_ahead():
    async def scenario():
        loop = asyncio.get_running_loop()
        ctx, bucket, kind = _setup()
        first, _ = await fetch._read_large(ctx, bucket, 0, LIMIT, True, 100, loop)
        assert fetch.next_offset(first[-1]) == 10
        await _settle()
        assert kind.reads == [0, 10]  # its own read, then the next one ahead
        second, _ = await fetch._read_large(ctx, bucket, 10, LIMIT, True, 100, loop)
        assert second[0] == batch(10, PER_READ)
        await _settle()
        assert kind.reads == [0, 10, 20]  # 10 was not read again; 20 ahead of the next fetch
        assert fetch.prepared_reads_counts(ctx.broker) == (2, 1)
        # Not started past the end of what readers may see.
        await fetch._read_large(ctx, bucket, 20, LIMIT, True, 30, loop)
        await _settle()
        assert kind.reads == [0, 10, 20]

    asyncio.run(scenario())


def test_a_held_read_that_no_longer_stands_is_not_used():
    async def scenario():
        loop = asyncio.get_running_loop()
        ctx, bucket, kind = _setup()
        await fetch._read_large(ctx, bucket, 0, LIMIT, True, 100, loop)
        await _settle()
        # The log's start moved past the held read (DeleteRecords, retention): the fetch's
        # own read says so.
        bucket.tablet.log_start_offset = 15
        with pytest.raises(FluvialError) as failed:
            await fetch._read_large(ctx, bucket, 10, LIMIT, True, 100, loop)
        assert failed.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert kind.reads == [0, 10, 10]
        # A new leader epoch (stamped into the batches), another limit: read again.
        bucket.tablet.log_start_offset = 0
        await fetch._read_large(ctx, bucket, 20, LIMIT, True, 100, loop)
        await _settle()
        bucket.leader_epoch = 1
        await fetch._read_large(ctx, bucket, 30, LIMIT, True, 100, loop)
        await _settle()
        await fetch._read_large(ctx, bucket, 40, LIMIT // 2, True, 100, loop)
        assert kind.reads == [0, 10, 10, 20, 30, 30, 40, 40]
        # A fetch that may not return more than its limit (not the response's first
        # partition with data) reads for itself and leaves nothing behind.
        await _settle()
        await fetch._read_large(ctx, bucket, 50, LIMIT // 2, False, 100, loop)
        await _settle()
        assert kind.reads == [0, 10, 10, 20, 30, 30, 40, 40, 50, 50]

    asyncio.run(scenario())


def test_a_held_read_that_failed_is_read_again():
    async def scenario():
        loop = asyncio.get_running_loop()
        ctx, bucket, kind = _setup()
        kind.fail_at.add(10)
        await fetch._read_large(ctx, bucket, 0, LIMIT, True, 100, loop)
        await _settle()
        kind.fail_at.clear()  # failed ahead, fine now
        second, _ = await fetch._read_large(ctx, bucket, 10, LIMIT, True, 100, loop)
        assert second[0] == batch(10, PER_READ)
        assert kind.reads[:3] == [0, 10, 10]

    asyncio.run(scenario())
