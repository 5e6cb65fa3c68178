"""Kafka fetches of remote offsets, bounded in time as Kafka's delayed remote fetch is.

A fetch waits at most `remote_fetch_max_wait_ms` for the object store; past that the
partition is answered with no records and no error (every Kafka client then fetches the
same offset again), instead of holding the response, which would delay the request's
other partitions and, with a store that hangs, run into the client's request timeout.
The read goes on in the background: the next fetch of the same offset joins it, or takes
its result if it finished in between, so a slow store is read once per offset rather than
once per retry, and reads never pile up behind a frozen store on the read executor.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from typing import Callable

# A finished read nobody came back for (the consumer moved or went away) is dropped after this.
UNCLAIMED_TTL_S = 10.0


class RemoteFetches:
    """Remote reads in progress or finished but not yet claimed, by (tablet, offset); the key holds the tablet, so it names one tablet only. Event loop only."""

    def __init__(self, executor: Executor, max_wait_s: float):
        self.executor = executor
        self.max_wait_s = max_wait_s
        self._reads: dict[tuple[object, int], tuple[asyncio.Future, float]] = {}

    def __len__(self) -> int:
        return len(self._reads)

    async def read(self, key: tuple[object, int], read: Callable[[], tuple[list[bytes], int]]) -> tuple[list[bytes], int]:
        """``read()``'s result, or ``([], 0)`` when it takes longer than the bound; raises what it raised."""
        loop = asyncio.get_running_loop()
        self._drop_unclaimed(loop.time())
        entry = self._reads.get(key)
        if entry is None:
            future = loop.run_in_executor(self.executor, read)
            future.add_done_callback(_mark_retrieved)
            self._reads[key] = (future, loop.time())
        else:
            future = entry[0]
        try:
            result = await asyncio.wait_for(asyncio.shield(future), self.max_wait_s)
        except asyncio.TimeoutError:
            return [], 0
        except BaseException:
            self._claim(key, future)
            raise
        self._claim(key, future)
        return result

    def _claim(self, key: tuple[object, int], future: asyncio.Future) -> None:
        entry = self._reads.get(key)
        if entry is not None and entry[0] is future:
            del self._reads[key]

    def _drop_unclaimed(self, now: float) -> None:
        stale = [k for k, (f, started) in self._reads.items() if f.done() and now - started > UNCLAIMED_TTL_S]
        for k in stale:
            del self._reads[k]


def _mark_retrieved(future: asyncio.Future) -> None:
    # A read whose waiters gave up is not an unhandled error: its fetch answers it, or it expires.
    if not future.cancelled():
        future.exception()
