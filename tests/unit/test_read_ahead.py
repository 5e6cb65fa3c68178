"""Read-ahead of typed-table fetches: one task per bucket, waited for, failures kept out of the way."""
from __future__ import annotations

import asyncio

from fluvial.broker.read_ahead import ReadAhead, next_offset
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
