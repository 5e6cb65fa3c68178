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
            if not f.cancelled():
                f.exception()  # retrieved: a failed read-ahead only costs the next fetch its own read

        task.add_done_callback(done)
