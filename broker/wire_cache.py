"""Recently produced Kafka batches, kept as the bytes that were written, for tailing consumers.

A consumer that reads what was just produced gets the producer's own batch (base offset
already patched) instead of one re-encoded from the Arrow columns. Bounded by bytes,
least recently inserted out first.
"""
from __future__ import annotations

from collections import OrderedDict


class WireCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def put(self, table: str, bucket: int, base_offset: int, batch: bytes) -> None:
        if self.max_bytes <= 0 or len(batch) > self.max_bytes // 4:
            return
        key = (table, bucket, base_offset)
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        self._entries[key] = batch
        self._bytes += len(batch)
        while self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= len(evicted)

    def get(self, table: str, bucket: int, base_offset: int) -> bytes | None:
        batch = self._entries.get((table, bucket, base_offset))
        if batch is None:
            self.misses += 1
        else:
            self.hits += 1
        return batch

    def drop_table(self, table: str) -> None:
        for key in [k for k in self._entries if k[0] == table]:
            self._bytes -= len(self._entries.pop(key))
