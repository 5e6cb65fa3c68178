"""Read-ahead for typed-table fetches: the next batches are encoded while the consumer takes in the last ones.

A Kafka consumer keeps one fetch per broker in flight, so re-encoding Avro from the stored
columns and the client's own work would take turns. After a fetch that stopped short of the
log end, the batches from where it stopped are encoded (and left in the wire cache) on the
CPU executor while the response travels; the consumer's next fetch waits for that work
instead of repeating it, then finds the batches in the cache. One task per bucket at a time.
"""
from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import NamedTuple

_BASE_OFFSET = struct.Struct(">q")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23  # after baseOffset, length, leader epoch, magic, CRC, attributes


def next_offset(batch: bytes | bytearray | memoryview) -> int:
    """The offset after the last record of a v2 batch."""
    return _BASE_OFFSET.unpack_from(batch, 0)[0] + _LAST_OFFSET_DELTA.unpack_from(batch, _LAST_OFFSET_DELTA_AT)[0] + 1


class ReadAhead:
    def __init__(self) -> None:
        self._pending: dict[tuple[str, int], asyncio.Future] = {}

    async def settled(self, table: str, bucket: int) -> None:
        """Returns once no read-ahead of this bucket is running (its errors are the next fetch's to meet)."""
        pending = self._pending.get((table, bucket))
        if pending is not None:
            await asyncio.wait([pending])

    def start(self, table: str, bucket: int, launch: Callable[[], asyncio.Future]) -> None:
        key = (table, bucket)
        if key in self._pending:
            return
        task = launch()
        self._pending[key] = task

        def done(f: asyncio.Future) -> None:
            if self._pending.get(key) is f:
                del self._pending[key]
            _retrieve(f)

        task.add_done_callback(done)


class PreparedReads:
    """Read-ahead for fetches that read a table's segments without caching what they encode
    (raw tables: the wire cache holds the producers' own batches for tailing consumers).

    A consumer catching up keeps one fetch per broker in flight, so reading and encoding the
    next megabyte took turns with the response's trip and the client's own work. After such a
    fetch stopped short of the high watermark, the batches from where it stopped are read on
    the CPU executor while its response travels, and held here, one read per bucket, outside
    the wire cache (a catch-up read would otherwise evict what tailing consumers use). The
    next fetch takes it only when it asks for exactly that read: the same offset and limit,
    under the same leader epoch. Below the high watermark a read's batches do not change;
    one that does not start where the fetch asks (the log's start moved past it) is not used.
    At most MAX_HELD_BYTES of limits are held (the oldest reads are dropped), each at most
    MAX_READ_BYTES, and none for longer than HOLD_S."""

    MAX_READ_BYTES = 8 << 20
    MAX_HELD_BYTES = 64 << 20
    HOLD_S = 5.0

    def __init__(self) -> None:
        self._reads: dict[int, _HeldRead] = {}  # by id(bucket)
        self._held = 0
        self.started = 0  # reads started ahead
        self.used = 0  # fetches answered with one (counted by the fetch, once the read checked out)

    def take(self, bucket, offset: int, limit: int, leader_epoch: int, now: float) -> asyncio.Future | None:
        """The read held for this fetch, or None."""
        held = self._reads.get(id(bucket))
        if held is None or held.bucket is not bucket:
            return None
        if now - held.started > self.HOLD_S:
            self._drop(id(bucket))
            return None
        if (held.offset, held.limit, held.leader_epoch) != (offset, limit, leader_epoch):
            return None
        self._drop(id(bucket))
        return held.future

    def start(self, bucket, offset: int, limit: int, leader_epoch: int, now: float,
              launch: Callable[[], asyncio.Future]) -> None:
        """Read ``limit`` bytes from ``offset`` ahead (``launch``), in place of the bucket's
        earlier read if any."""
        if limit > self.MAX_READ_BYTES:
            return
        self._drop(id(bucket))
        while self._reads and self._held + limit > self.MAX_HELD_BYTES:
            self._drop(next(iter(self._reads)))  # the oldest
        future = launch()
        future.add_done_callback(_retrieve)
        self.started += 1
        self._reads[id(bucket)] = _HeldRead(bucket, offset, limit, leader_epoch, now, future)
        self._held += limit

    def _drop(self, key: int) -> None:
        held = self._reads.pop(key, None)
        if held is not None:
            self._held -= held.limit

    def __len__(self) -> int:
        return len(self._reads)


class _HeldRead(NamedTuple):
    bucket: object
    offset: int
    limit: int
    leader_epoch: int
    started: float  # loop time
    future: asyncio.Future


def _retrieve(future: asyncio.Future) -> None:
    """Retrieve a read-ahead's failure: it only costs the next fetch its own read."""
    if not future.cancelled():
        future.exception()
