"""Log tables: what producers send is what the log tablets store and what fetches return.

The `TableKind` of every table without a primary key. A produced batch is converted to
Arrow columns (`kafka_batches.to_arrow`) and appended as is; its bytes go to the wire
cache, so that a tailing consumer gets the producer's own batch back with no
re-encoding. Fetches re-encode stored batches from their columns otherwise, and slice a
stored batch too large for the request's limits.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from fluvial.broker import kafka_batches
from fluvial.broker.log import BatchMeta, StoredBatch
from fluvial.broker.table_kind import TableKind
from fluvial.protocol.records import set_base_offset


def stored_batches(broker, bucket, offset: int, max_bytes: int) -> list[StoredBatch]:
    """Stored batches from `offset`, from the object store when the remote log holds it
    (blocking then: the caller is off the loop) and from the log tablet otherwise."""
    remote_log = broker.remote_log
    if remote_log.serves(bucket, offset):
        return remote_log.read_batches(bucket, offset, max_bytes)
    return bucket.tablet.read(offset, max_bytes)


def _cache_wire(broker, bucket, written: BatchMeta, wire: bytearray | None) -> None:
    if wire is not None:
        set_base_offset(wire, written.base_offset, bucket.leader_epoch)
        # The batch is not changed after this: cached as is, without a copy.
        broker.wire_cache.put(bucket.table.name, bucket.index, written.base_offset, wire)


class LogTable(TableKind):
    """A table whose log is what was produced."""

    # -- Kafka writes ---------------------------------------------------------------------
    def decode_produced(self, bucket, wire: memoryview, header, *, log_append_time_ms: int | None,
                        coalesced: bool = False):
        table = bucket.table
        if (coalesced and log_append_time_ms is None and table.value_format is kafka_batches.RAW
                and not table.compacted):
            # Only checked here: the log tablet converts it to Arrow together with the
            # other batches of its flush window.
            return kafka_batches.to_wire_records(wire, header)
        return kafka_batches.to_arrow(wire, header, log_append_time_ms=log_append_time_ms,
                                      value_format=table.value_format, tombstones=table.compacted)

    async def hold_transactional(self, broker, bucket, meta: BatchMeta, wire: bytes) -> bool:
        # Appended now; the bucket's transaction index (last stable offset, aborted
        # transactions) must be ready before the append is recorded in it.
        index = broker.extensions["txn_index"]
        if not index.ready(bucket):
            await asyncio.get_running_loop().run_in_executor(broker.io_executor, index.prepare, bucket)
        return False

    async def append_produced(self, broker, bucket, write, meta: BatchMeta, *, wire: bytearray | None,
                              acks: int, on_append: Callable[[BatchMeta], None] | None) -> BatchMeta:
        # acks=all: the answer waits for the fsync, so the batch may be written together
        # with the others of the same flush window (one message, one write).
        written = bucket.append(write, meta, coalesce=acks == -1)
        if on_append is not None:
            on_append(written)
        _cache_wire(broker, bucket, written, wire)
        return written

    def append_in_thread(self, bucket, write, meta: BatchMeta) -> BatchMeta | None:
        # A large batch: its Arrow IPC encoding, checksums and page-cache write (none of
        # which hold the GIL) run on the executor that decoded it, while the loop receives
        # the next request. A compacted log's key check stays with Bucket.append.
        if bucket.table.compacted:
            return None
        return bucket.tablet.append(write, meta, leader_epoch=bucket.leader_epoch)

    def appends_in_thread(self, table) -> bool:
        return not table.compacted

    def appended_in_thread(self, broker, bucket, written: BatchMeta, *, wire: bytearray | None) -> None:
        bucket.appended_off_loop()
        _cache_wire(broker, bucket, written, wire)

    # -- Kafka reads ----------------------------------------------------------------------
    def read_kafka(self, broker, bucket, offset: int, max_bytes: int, min_one: bool = True) -> tuple[list[bytes], int]:
        """Encoded batches from `offset`, at most `max_bytes`, Kafka's way: only the first
        partition with data in a response (`min_one`) may return a batch larger than the
        limit, and a stored batch whose encoding is larger than the limit (a big table-API
        append) is sent in slices of its rows that fit, so no response grows without bound."""
        cache = broker.wire_cache
        compression = bucket.table.config("compression.type")
        out: list[bytes] = []
        size = 0
        for stored in stored_batches(broker, bucket, offset, max_bytes):
            wire = None
            value_format = kafka_batches.format_of(stored, bucket.table.value_format)
            if compression == "producer":
                wire = cache.get(bucket.table.name, bucket.index, stored.meta.base_offset)
            if wire is None:
                wire = kafka_batches.to_wire(stored, compression_type=compression, leader_epoch=bucket.leader_epoch,
                                             value_format=value_format)
                if value_format.name == "avro" and compression == "producer" and \
                        broker.tables.tables.get(bucket.table.name) is bucket.table:
                    # Re-encoding Avro from columns is the costly part of a fetch, and its bytes never change
                    # (each record's own writer schema): the next reader of this batch reuses them.
                    cache.put(bucket.table.name, bucket.index, stored.meta.base_offset, wire)
            if not out and len(wire) > max_bytes and stored.batch.num_rows > 1:
                part = _slice_to_fit(stored, offset, max_bytes, compression, bucket.leader_epoch,
                                     value_format, len(wire))
                if part is not None:
                    if not min_one and len(part) > max_bytes:
                        break
                    # The rest of the batch comes with the next fetch, from the slice's end.
                    return [part], len(part)
            if (out or not min_one) and size + len(wire) > max_bytes:
                break
            out.append(wire)
            size += len(wire)
        return out, size

    def cached_tail(self, broker, bucket, offset: int, end: int, limit: int) -> tuple[list[bytes], int] | None:
        if bucket.table.config("compression.type") != "producer":
            return None
        return broker.wire_cache.tail(bucket.table.name, bucket.index, offset, end, limit)

    def caches_reencoded(self, table) -> bool:
        return getattr(table.value_format, "name", "raw") == "avro" and table.config("compression.type") == "producer"

    def prepares_reads(self, table) -> bool:
        return not self.caches_reencoded(table)


def _slice_to_fit(stored, offset: int, room: int, compression: str, leader_epoch: int, value_format,
                  whole_size: int) -> bytes | None:
    """The rows of a too-large stored batch from `offset` on, as many as fit in `room`
    (at least one), as one Kafka batch: its base offset is the first row's and its last
    offset delta the last row's, so a client continues right after it."""
    batch = stored.batch
    offsets = batch.column("_offset").to_numpy(zero_copy_only=False)
    first = int(np.searchsorted(offsets, offset))
    rows = batch.num_rows - first
    if rows <= 0:
        return None  # the offset lies in a compacted gap at the batch's end: send it whole
    per_row = max(1, whole_size // max(1, batch.num_rows))
    take = max(1, min(rows, room // per_row))
    while True:
        part = batch.slice(first, take)
        base = int(offsets[first])
        meta = stored.meta
        last = meta.last_offset if first + take == batch.num_rows else int(offsets[first + take - 1])
        sliced = BatchMeta(base_offset=base, last_offset_delta=last - base,
                           record_count=take, base_timestamp=meta.base_timestamp,
                           max_timestamp=meta.max_timestamp, attributes=meta.attributes,
                           partition_leader_epoch=meta.partition_leader_epoch, schema_id=meta.schema_id)
        wire = kafka_batches.to_wire(StoredBatch(sliced, part), compression_type=compression,
                                     leader_epoch=leader_epoch, value_format=value_format)
        if len(wire) <= room or take == 1:
            return wire
        take = max(1, take * room // len(wire) - 1)


LOG_TABLE = LogTable()
