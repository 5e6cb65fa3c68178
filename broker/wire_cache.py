"""Kafka batches kept as wire bytes: recently produced ones, and typed batches once re-encoded.

A consumer that reads what was just produced gets the producer's own batch (base offset
already patched) instead of one re-encoded from the Arrow columns; a typed table's batch
that had to be re-encoded for a fetch (Avro or JSON from the stored columns, the costly
part of a typed fetch) is kept too, so other consumers of the same batch reuse it.
Bounded by bytes (an entry's batch and a fixed overhead), least recently inserted out first. Fetches fill it from the CPU executor
while the event loop reads it: changes hold a lock.
"""
from __future__ import annotations

import struct
import threading
from collections import OrderedDict

from fluvial.broker.gc_untracked import untracked_tuple

# lastOffsetDelta of a v2 batch: after baseOffset, length, leader epoch, magic, CRC, attributes.
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23
# What an entry costs beside its batch bytes: its key, the dict's link, and the view and
# request frame a batch used in place is kept in. Counted against the bound, so that a
# cache of one-record batches stays within its bytes (a 70 B batch costs over 400 B).
ENTRY_OVERHEAD = 512
# A batch up to this size that comes as a view of its request frame is kept as a bytes copy:
# a view is two objects the garbage collector tracks (the view and its buffer), and under
# many one-record producers the cache holds ~100,000 of them, walked by every full
# collection; bytes are not tracked, and the copy is a small memcpy. Larger batches stay
# views (no copy of a large request).
COPY_BELOW_BYTES = 16 * 1024


class WireCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def put(self, table: str, bucket: int, base_offset: int, batch: bytes | bytearray) -> None:
        if self.max_bytes <= 0 or len(batch) > self.max_bytes // 4:
            return
        if type(batch) is memoryview and batch.nbytes <= COPY_BELOW_BYTES:
            batch = bytes(batch)
        # Untracked at once: the collector would untrack a tuple of atoms itself, but only
        # after walking it in a young collection; the cache holds tens of thousands.
        key = untracked_tuple((table, bucket, base_offset))
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old) + ENTRY_OVERHEAD
            self._entries[key] = batch
            self._bytes += len(batch) + ENTRY_OVERHEAD
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted) + ENTRY_OVERHEAD

    def get(self, table: str, bucket: int, base_offset: int) -> bytes | None:
        batch = self._entries.get((table, bucket, base_offset))
        if batch is None:
            self.misses += 1
        else:
            self.hits += 1
        return batch

    def tail(self, table: str, bucket: int, offset: int, end: int, max_bytes: int) -> tuple[list[bytes], int] | None:
        """The cached batches from the one starting at `offset`, in order, up to `end` (the log
        end) and about `max_bytes` (at least one); None when the batch at `offset` is not here.

        A tailing consumer is served without reading the log tablet: each batch's last
        offset delta names the next batch's base offset. A hole ends the run early; the
        consumer's next fetch starts there.
        """
        entries = self._entries
        batch = entries.get((table, bucket, offset))
        if batch is None:
            self.misses += 1
            return None
        out = [batch]
        size = len(batch)
        unpack = _LAST_OFFSET_DELTA.unpack_from
        while True:
            offset += unpack(batch, _LAST_OFFSET_DELTA_AT)[0] + 1
            if offset >= end:
                break
            batch = entries.get((table, bucket, offset))
            if batch is None or size + len(batch) > max_bytes:
                break
            out.append(batch)
            size += len(batch)
        self.hits += len(out)
        return out, size

    def drop_bucket_below(self, table: str, bucket: int, offset: int) -> None:
        """Forget a bucket's batches below ``offset`` (log compaction rewrote them)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == table and k[1] == bucket and k[2] < offset]:
                self._bytes -= len(self._entries.pop(key)) + ENTRY_OVERHEAD

    def drop_table(self, table: str) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == table]:
                self._bytes -= len(self._entries.pop(key)) + ENTRY_OVERHEAD
