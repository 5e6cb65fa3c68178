"""Transactional writes to primary-key tables, held until their transaction ends.

A primary-key table applies each write to its KV state (and changelog) at once, so a
transaction's batches cannot go into it as they arrive: they are appended, as produced
(the v2 batch), to `txn-pending/<producer id>.batches` in the bucket's tablet directory
and fsynced before the produce is acknowledged. When the transaction commits the
coordinator applies them in order, like ordinary writes (without producer fields), then
deletes the file; an abort deletes it. Nothing of an aborted transaction ever reaches the
KV state, lookups or the changelog.

Applying is exactly once, also across kill -9 and power loss, for every merge engine (an
aggregation or retract table would count a write applied twice). Before the i-th held batch
is applied, holding the bucket's write lock, `<producer id>.applied` gets the entry
(i, log end offset L) and is fsynced; the batch is then applied and, under flush policy ack,
made durable before the next entry. The first append to the bucket after L is therefore the
i-th batch's own (no other write of the bucket can come between), so a later process knows:
the log it found at open ends past L → batch i was applied (a batch that changed nothing
appends nothing, and applying it again would change nothing either, as nothing came after it);
otherwise batch i is applied again, from the same state as the first time.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import struct
from pathlib import Path

from fluvial.kv import pk_tables
from fluvial.broker.log.batch_meta import ATTR_CONTROL, ATTR_TRANSACTIONAL
from fluvial.broker.log.checkpoint import fsync_directory
from fluvial.protocol.records import parse_batch_header

PENDING_DIR = "txn-pending"
_LEN = struct.Struct(">I")
# One progress entry: index of the held batch about to be applied, the log end before it.
_PROGRESS = struct.Struct(">Iq")


def pending_path(bucket, producer_id: int) -> Path:
    return Path(bucket.tablet.directory) / PENDING_DIR / f"{producer_id}.batches"


def progress_path(bucket, producer_id: int) -> Path:
    return Path(bucket.tablet.directory) / PENDING_DIR / f"{producer_id}.applied"


class PendingPkWrites:
    """Held batches per (bucket, producer). File I/O runs in the I/O threads."""

    def __init__(self, io_executor, cpu_executor) -> None:
        self._io = io_executor
        self._cpu = cpu_executor
        # (table, bucket index, producer id) -> (epoch, base sequence) of the batches held:
        # a retried batch is held once.
        self._seen: dict[tuple[str, int, int], set[tuple[int, int]]] = {}
        # (table, bucket index, producer id) -> held batches applied by this process so far (an
        # apply that failed half-way and is retried in the same process goes on from there).
        self._applied: dict[tuple[str, int, int], int] = {}

    async def hold(self, bucket, meta, wire: bytes) -> None:
        key = (bucket.table.name, bucket.index, meta.producer_id)
        seen = self._seen.setdefault(key, set())
        ident = (meta.producer_epoch, meta.base_sequence)
        if meta.base_sequence >= 0 and ident in seen:
            return
        await asyncio.get_running_loop().run_in_executor(self._io, _append, pending_path(bucket, meta.producer_id),
                                                         wire, progress_path(bucket, meta.producer_id))
        seen.add(ident)

    async def finish(self, broker, bucket, producer_id: int, commit: bool) -> None:
        """Apply (commit) or drop (abort) the producer's held batches of this bucket."""
        loop = asyncio.get_running_loop()
        path = pending_path(bucket, producer_id)
        self._seen.pop((bucket.table.name, bucket.index, producer_id), None)
        progress = progress_path(bucket, producer_id)
        if commit:
            batches = await loop.run_in_executor(self._io, _read, path)
            key = (bucket.table.name, bucket.index, producer_id)
            first = await loop.run_in_executor(self._io, _first_unapplied, progress,
                                               bucket.tablet.opened_end_offset)
            first = max(first, self._applied.get(key, 0))
            durable = broker.config.flush_policy == "ack"
            for i in range(first, len(batches)):
                wire = batches[i]
                header = parse_batch_header(wire)
                write, meta = await loop.run_in_executor(
                    self._cpu, lambda w=wire, h=header: pk_tables.to_write(bucket, memoryview(w), h))
                meta = dataclasses.replace(meta, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                           attributes=meta.attributes & ~(ATTR_TRANSACTIONAL | ATTR_CONTROL))

                async def record_progress(i=i) -> None:
                    end = bucket.tablet.log_end_offset
                    await loop.run_in_executor(self._io, _append_progress, progress, i, end)

                written = await pk_tables.produce(bucket, write, meta, before=record_progress)
                self._applied[key] = i + 1
                if i == 0 and len(batches) > 1:
                    from fluvial.broker.transactions import _crash_point
                    _crash_point("pk-apply")  # crash tests: between two held batches
                if written.record_count and durable:
                    # Durable before the next progress entry: an entry never outlives (power
                    # loss) the applies before it.
                    await bucket.group_commit.wait_durable(written.base_offset + written.record_count)
            self._applied.pop(key, None)
        await loop.run_in_executor(self._io, _remove, path)
        await loop.run_in_executor(self._io, _remove, progress)


def _append(path: Path, wire: bytes, progress: Path) -> None:
    new_dir = not path.parent.exists()
    path.parent.mkdir(exist_ok=True)
    if not path.exists() and progress.exists():
        # Left by an earlier transaction of this producer whose held writes were all applied
        # and removed (a crash came before this file was): it must not steer this one's apply.
        progress.unlink()
        fsync_directory(path.parent)
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


def _append_progress(path: Path, index: int, log_end: int) -> None:
    with open(path, "ab") as f:
        f.write(_PROGRESS.pack(index, log_end))
        f.flush()
        os.fsync(f.fileno())


def _first_unapplied(path: Path, opened_end_offset: int) -> int:
    """The first held batch an earlier process did not apply (0 when nothing was started)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    whole = len(data) // _PROGRESS.size
    if whole == 0:
        return 0
    index, log_end = _PROGRESS.unpack_from(data, (whole - 1) * _PROGRESS.size)
    return index + 1 if opened_end_offset > log_end else index


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
