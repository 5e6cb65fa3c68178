"""Transactional writes to primary-key tables, held until their transaction ends.

A primary-key table applies each write to its KV state (and changelog) at once, so a
transaction's batches cannot go into it as they arrive: they are appended, as produced
(the v2 batch), to `txn-pending/<producer id>.batches` in the bucket's tablet directory
and fsynced before the produce is acknowledged. When the transaction commits the
coordinator applies them in order, like ordinary writes (without producer fields), then
deletes the file; an abort deletes it. Nothing of an aborted transaction ever reaches the
KV state, lookups or the changelog. A restart in the middle of applying applies the file
again: upserts and deletes of the same rows are no-ops the second time (the default merge
engine), which is why the file is removed only once every write is durable.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import struct
from pathlib import Path

from fluvial.broker import pk_tables
from fluvial.broker.log.batch_meta import ATTR_CONTROL, ATTR_TRANSACTIONAL
from fluvial.broker.log.checkpoint import fsync_directory
from fluvial.protocol.records import parse_batch_header

PENDING_DIR = "txn-pending"
_LEN = struct.Struct(">I")


def pending_path(bucket, producer_id: int) -> Path:
    return Path(bucket.tablet.directory) / PENDING_DIR / f"{producer_id}.batches"


class PendingPkWrites:
    """Held batches per (bucket, producer). File I/O runs in the I/O threads."""

    def __init__(self, io_executor, cpu_executor) -> None:
        self._io = io_executor
        self._cpu = cpu_executor
        # (table, bucket index, producer id) -> (epoch, base sequence) of the batches held:
        # a retried batch is held once.
        self._seen: dict[tuple[str, int, int], set[tuple[int, int]]] = {}

    async def hold(self, bucket, meta, wire: bytes) -> None:
        key = (bucket.table.name, bucket.index, meta.producer_id)
        seen = self._seen.setdefault(key, set())
        ident = (meta.producer_epoch, meta.base_sequence)
        if meta.base_sequence >= 0 and ident in seen:
            return
        await asyncio.get_running_loop().run_in_executor(self._io, _append, pending_path(bucket, meta.producer_id),
                                                         wire)
        seen.add(ident)

    async def finish(self, broker, bucket, producer_id: int, commit: bool) -> None:
        """Apply (commit) or drop (abort) the producer's held batches of this bucket."""
        loop = asyncio.get_running_loop()
        path = pending_path(bucket, producer_id)
        self._seen.pop((bucket.table.name, bucket.index, producer_id), None)
        if commit:
            batches = await loop.run_in_executor(self._io, _read, path)
            last = None
            for wire in batches:
                header = parse_batch_header(wire)
                write, meta = await loop.run_in_executor(
                    self._cpu, lambda w=wire, h=header: pk_tables.to_write(bucket, memoryview(w), h))
                meta = dataclasses.replace(meta, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                           attributes=meta.attributes & ~(ATTR_TRANSACTIONAL | ATTR_CONTROL))
                written = await pk_tables.produce(bucket, write, meta)
                if written.record_count:
                    last = written
            if last is not None and broker.config.flush_policy == "ack":
                await bucket.group_commit.wait_durable(last.base_offset + last.record_count)
        await loop.run_in_executor(self._io, _remove, path)


def _append(path: Path, wire: bytes) -> None:
    new_dir = not path.parent.exists()
    path.parent.mkdir(exist_ok=True)
    with open(path, "ab") as f:
        f.write(_LEN.pack(len(wire)))
        f.write(wire)
        f.flush()
        os.fsync(f.fileno())
    if new_dir:
        fsync_directory(path.parent.parent)


def _read(path: Path) -> list[bytes]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out, pos = [], 0
    while pos + 4 <= len(data):
        (n,) = _LEN.unpack_from(data, pos)
        if pos + 4 + n > len(data):
            break  # a torn last append (its produce was never acknowledged)
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
