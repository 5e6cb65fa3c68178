"""Remote fetches are bounded in time; a fetch again of the same offset joins the read."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from fluvial.broker.remote_fetches import RemoteFetches
from fluvial.errors import StorageError


def test_a_slow_read_is_answered_empty_then_joined_then_claimed():
    release = threading.Event()
    calls = []

    def slow_read():
        calls.append(1)
        release.wait(10)
        return [b"batch"], 5

    async def main():
        fetches = RemoteFetches(ThreadPoolExecutor(2), max_wait_s=0.05)
        key = (object(), 0)
        started = time.monotonic()
        assert await fetches.read(key, slow_read) == ([], 0)
        assert time.monotonic() - started < 1
        assert await fetches.read(key, slow_read) == ([], 0)  # joins: no second read
        assert len(calls) == 1 and len(fetches) == 1
        release.set()
        await asyncio.sleep(0.2)  # done, not yet claimed: the next fetch takes the result
        assert await fetches.read(key, slow_read) == ([b"batch"], 5)
        assert len(calls) == 1 and len(fetches) == 0

    asyncio.run(main())


def test_a_failed_read_raises_to_the_fetch_that_claims_it():
    def failing_read():
        time.sleep(0.1)
        raise StorageError("store down")

    async def main():
        fetches = RemoteFetches(ThreadPoolExecutor(1), max_wait_s=0.01)
        key = (object(), 7)
        assert await fetches.read(key, failing_read) == ([], 0)
        await asyncio.sleep(0.3)
        with pytest.raises(StorageError):
            await fetches.read(key, failing_read)
        assert len(fetches) == 0

    asyncio.run(main())
