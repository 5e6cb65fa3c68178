"""Lookups that read a KV tablet as of its durable changelog, without waiting for an fsync.

Under flush policy ``ack`` a write is applied to RocksDB right after its changelog is
appended, before the changelog's fsync ends: the next write merges against it while the
fsync runs, and writes of a bucket stay amortised over one fsync. Readers must not see
such a row (a power loss would take it back), but they need not wait for the fsync either:
what a key held before the first write that is not yet durable is its durable value.

`DurableView` keeps, for every write applied to RocksDB whose changelog is not yet
durable, the values its keys had before it (its before-images). A lookup reads RocksDB
as it is, then puts back the before-image of every key that a write not yet durable
changed: the answer holds only durable rows, and comes at once. Before-images are
registered before the write reaches RocksDB, so a read that sees a write always finds
its before-images; they are dropped once the bucket's durable offset passes the write.
Keys a pending write touched are few (the writes of about one fsync), so putting them
back costs one hash lookup per key asked (vectorised) and nothing when nothing is pending.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

# Lookups of at most this many keys probe the pending keys one by one.
_FEW_KEYS = 32


class DurableView:
    """The before-images of a KV tablet's writes that are not yet durable.

    `durable_offset()` is the bucket's durable changelog offset (read from any thread);
    `start_offset` the tablet's applied offset when tracking began: a durable offset below
    it means the tablet holds rows this view has no before-images for (the caller then
    waits for durability as before)."""

    def __init__(self, durable_offset: Callable[[], int], start_offset: int):
        self._durable_offset = durable_offset
        self.start_offset = start_offset
        self._lock = threading.Lock()
        # (next offset after the write, {key: value before the write (None: absent)}),
        # in write order.
        self._writes: deque[tuple[int, dict[bytes, bytes | None]]] = deque()
        # Every pending key's value before the first pending write of it, and the same as
        # Arrow arrays for vectorised reads (built by the first read after a change).
        self._by_key: dict[bytes, bytes | None] = {}
        self._arrays: tuple[pa.Array, pa.Array] | None = None

    def add(self, next_offset: int, keys: list[bytes], before: list[bytes | None]) -> None:
        """Register a write before it reaches RocksDB: its keys' current values."""
        with self._lock:
            self._prune()
            images = dict(zip(keys, before))
            self._writes.append((next_offset, images))
            self._publish({**images, **self._by_key})  # an earlier pending write's image wins

    def clear(self) -> None:
        """Forget every pending write (the flush policy no longer holds readers back)."""
        with self._lock:
            self._writes.clear()
            self._publish({})

    def _prune(self) -> None:
        durable = self._durable_offset()
        if not self._writes or self._writes[0][0] > durable:
            return
        while self._writes and self._writes[0][0] <= durable:
            self._writes.popleft()
        merged: dict[bytes, bytes | None] = {}
        for _, images in reversed(self._writes):
            merged.update(images)  # earlier writes last: their images win
        self._publish(merged)

    def _publish(self, merged: dict[bytes, bytes | None]) -> None:
        self._by_key = merged
        self._arrays = None

    def usable(self) -> bool:
        """The durable offset covers everything the tablet held when tracking began."""
        return self._durable_offset() >= self.start_offset

    def rewind(self, keys: pa.Array, values: pa.Array) -> pa.Array:
        """`values` read from RocksDB for `keys` (storage keys), with every key a pending
        write changed put back to its durable value. Call after the read."""
        with self._lock:
            self._prune()
            if not self._by_key:
                return values
            if len(keys) <= _FEW_KEYS:
                # A few keys (single-key lookups): dict probes, no Arrow arrays of every
                # pending key to build after each write.
                pending = self._by_key
                hits = [(i, pending[k]) for i, k in enumerate(keys.to_pylist()) if k in pending]
                if not hits:
                    return values
                out = values.to_pylist()
                for i, v in hits:
                    out[i] = v
                return pa.array(out, pa.binary())
            if self._arrays is None:
                self._arrays = (pa.array(list(self._by_key), pa.binary()),
                                pa.array(list(self._by_key.values()), pa.binary()))
            pending_keys, pending_values = self._arrays
        at = pc.index_in(keys, value_set=pending_keys)
        if at.null_count == len(at):
            return values
        return pc.if_else(at.is_valid(), pending_values.take(at), values)

    def rewind_one(self, key: bytes, value: bytes | None) -> bytes | None:
        """`rewind` of one key's value (None: no row): a dict probe."""
        with self._lock:
            self._prune()
            pending = self._by_key
        return pending[key] if key in pending else value

    def rewind_prefix(self, prefix: bytes, found: dict[bytes, bytes]) -> dict[bytes, bytes]:
        """Rows read by a prefix scan (key -> value), with the pending writes of keys under
        `prefix` undone (rows they added dropped, rows they changed or deleted put back)."""
        with self._lock:
            self._prune()
            pending = self._by_key
        for key, value in pending.items():
            if key.startswith(prefix):
                if value is None:
                    found.pop(key, None)
                else:
                    found[key] = value
        return found
