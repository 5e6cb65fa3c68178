"""Read-ahead of fetches: typed tables' one task per bucket, waited for, failures kept out of
the way; raw tables' held reads, taken only by the fetch that asks for exactly them."""
from __future__ import annotations

import asyncio

from fluvial.broker.read_ahead import PreparedReads, ReadAhead, next_offset
from tests.unit.test_wire_cache import batch


def test_next_offset_follows_the_last_record_of_a_batch():
    assert next_offset(batch(0, 1)) == 1
    assert next_offset(batch(1234, 7)) == 1241
    assert next_offset(bytearray(batch(2**40, 3))) == 2**40 + 3


def test_one_task_per_bucket_and_settled_waits_for_it():
    async def scenario():
        loop = asyncio.get_running_loop()
        ahead = ReadAhead()
        gate = asyncio.Event()
        launched = []

        def launch(tag):
            async def work():
                await gate.wait()
                launched.append(f"{tag} done")
            launched.append(tag)
            return loop.create_task(work())

        ahead.start("t", 0, lambda: launch("first"))
        ahead.start("t", 0, lambda: launch("second"))  # the first still runs: not launched
        ahead.start("t", 1, lambda: launch("other bucket"))
        assert launched == ["first", "other bucket"]
        waiter = loop.create_task(ahead.settled("t", 0))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        gate.set()
        await asyncio.wait_for(waiter, 1)
        assert "first done" in launched
        await asyncio.sleep(0)
        ahead.start("t", 0, lambda: launch("third"))  # the bucket is free again
        assert launched[-1] == "third"

    asyncio.run(scenario())


def test_a_failed_read_ahead_does_not_fail_the_next_fetch():
    async def scenario():
        loop = asyncio.get_running_loop()
        ahead = ReadAhead()

        async def boom():
            raise RuntimeError("offset out of range")

        ahead.start("t", 0, lambda: loop.create_task(boom()))
        await asyncio.wait_for(ahead.settled("t", 0), 1)  # returns, does not raise
        await asyncio.sleep(0)
        await asyncio.wait_for(ahead.settled("t", 0), 1)

    asyncio.run(scenario())


# ---------------------------------------------------------------- held reads (PreparedReads)

def _done(loop, value) -> asyncio.Future:
    future = loop.create_future()
    future.set_result(value)
    return future


class _Bucket:
    pass


def test_a_held_read_is_taken_once_by_the_fetch_that_asks_for_exactly_it():
    async def scenario():
        loop = asyncio.get_running_loop()
        reads = PreparedReads()
        bucket, other = _Bucket(), _Bucket()
        result = ([batch(100, 10)], 1)
        reads.start(bucket, 100, 1 << 20, 3, 0.0, lambda: _done(loop, result))
        assert reads.started == 1 and len(reads) == 1
        assert reads.take(other, 100, 1 << 20, 3, 0.1) is None  # another bucket
        assert reads.take(bucket, 101, 1 << 20, 3, 0.1) is None  # another offset
        assert reads.take(bucket, 100, 1 << 19, 3, 0.1) is None  # another limit
        assert reads.take(bucket, 100, 1 << 20, 4, 0.1) is None  # another leader epoch
        held = reads.take(bucket, 100, 1 << 20, 3, 0.1)
        assert await held == result
        assert reads.take(bucket, 100, 1 << 20, 3, 0.1) is None and len(reads) == 0  # taken

    asyncio.run(scenario())


def test_held_reads_are_replaced_bounded_and_expire():
    async def scenario():
        loop = asyncio.get_running_loop()
        reads = PreparedReads()
        limit = PreparedReads.MAX_READ_BYTES
        buckets = [_Bucket() for _ in range(PreparedReads.MAX_HELD_BYTES // limit + 2)]
        first = buckets[0]
        reads.start(first, 0, limit, 0, 0.0, lambda: _done(loop, ([], 0)))
        reads.start(first, 50, limit, 0, 0.0, lambda: _done(loop, ([], 0)))  # replaces the bucket's read
        assert len(reads) == 1 and reads.take(first, 0, limit, 0, 0.0) is None
        for i, b in enumerate(buckets):
            reads.start(b, i, limit, 0, float(i) / 100, lambda: _done(loop, ([], 0)))
        # No more than MAX_HELD_BYTES of limits: the oldest went.
        assert len(reads) == PreparedReads.MAX_HELD_BYTES // limit
        assert reads.take(buckets[0], 0, limit, 0, 1.0) is None
        assert reads.take(buckets[-1], len(buckets) - 1, limit, 0, 1.0) is not None
        # A read larger than MAX_READ_BYTES is not held; one older than HOLD_S is not used.
        big = _Bucket()
        reads.start(big, 0, limit + 1, 0, 1.0, lambda: _done(loop, ([], 0)))
        assert reads.take(big, 0, limit + 1, 0, 1.0) is None
        late = _Bucket()
        reads.start(late, 7, 1024, 0, 2.0, lambda: _done(loop, ([], 0)))
        assert reads.take(late, 7, 1024, 0, 2.0 + PreparedReads.HOLD_S + 0.1) is None
        assert reads.take(late, 7, 1024, 0, 2.0) is None  # dropped when found stale

    asyncio.run(scenario())
