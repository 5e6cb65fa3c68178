"""The transaction coordinator: transactional ids, their producer epochs and transactions.

Each transactional id has one durable row in the metadata store (SQLite, fsynced on
every change): producer id and epoch, the transaction's state, its timeout and start,
the partitions and groups it touched and the offsets it committed (held until the
transaction commits). The state machine is Kafka's: Empty -> Ongoing -> PrepareCommit /
PrepareAbort -> CompleteCommit / CompleteAbort. A prepared state is written before any
marker, so a restart completes it (markers are written again: a second marker for a
producer with nothing open is harmless), and an Ongoing transaction past its timeout is
aborted by the broker with a bumped epoch, which fences its producer.

Markers are control batches (transactional + control attribute bits, one record whose
key is the control type) appended by the broker to every partition of the transaction;
read_committed readers use them through `TransactionIndex` (the last stable offset and
the aborted transactions of each bucket).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from fluvial.broker import kafka_batches
from fluvial.broker.log.batch_meta import ATTR_CONTROL, ATTR_TRANSACTIONAL
from fluvial.broker.metadata import MetadataStore
from fluvial.broker.txn_index import ABORT, COMMIT, TransactionIndex
from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.records import Compression, RecordColumns, build_batch, parse_batch_header, set_base_offset

log = logging.getLogger(__name__)

EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
STATES = (EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT)
INT16_MAX = 2**15 - 1
# A prepared transaction whose markers could not all be written is retried this often.
RETRY_COMPLETION_MS = 5000

_DDL = """
CREATE TABLE IF NOT EXISTS transaction_state (
    transactional_id TEXT PRIMARY KEY,
    state TEXT NOT NULL
);
"""


class TxnError(FluvialError):
    """A transactional request refused with one of Kafka's codes."""

    def __init__(self, code: ErrorCode, message: str = ""):
        super().__init__(message or code.name)
        self.code = code


@dataclass
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str = EMPTY
    start_ms: int = -1
    updated_ms: int = 0
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    # group -> "topic\0partition" -> [offset, leader epoch, metadata]
    offsets: dict[str, dict[str, list]] = field(default_factory=dict)

    def encode(self) -> str:
        return json.dumps({"pid": self.producer_id, "epoch": self.producer_epoch, "timeout": self.timeout_ms,
                           "state": self.state, "start": self.start_ms, "updated": self.updated_ms,
                           "partitions": sorted(self.partitions), "groups": sorted(self.groups),
                           "offsets": self.offsets})

    @classmethod
    def decode(cls, tid: str, text: str) -> "TxnMetadata":
        d = json.loads(text)
        return cls(tid, d["pid"], d["epoch"], d["timeout"], d["state"], d["start"], d["updated"],
                   {(t, p) for t, p in d["partitions"]}, set(d["groups"]), d["offsets"])


def now_ms() -> int:
    return int(time.time() * 1000)


def control_batch(producer_id: int, producer_epoch: int, kind: int, coordinator_epoch: int = 0) -> bytes:
    """A marker as Kafka writes it: one record, key = (version 0, type), value =
    (version 0, coordinator epoch)."""
    ts = now_ms()
    key = (0).to_bytes(2, "big") + kind.to_bytes(2, "big")
    value = (0).to_bytes(2, "big") + coordinator_epoch.to_bytes(4, "big", signed=True)
    headers = pa.array([[]], type=kafka_batches.HEADERS_TYPE)
    columns = RecordColumns(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int32),
                            pa.array([key], pa.binary()), pa.array([value], pa.binary()), headers)
    return build_batch(base_offset=0, partition_leader_epoch=0, attributes=ATTR_TRANSACTIONAL | ATTR_CONTROL,
                       base_timestamp=ts, max_timestamp=ts, producer_id=producer_id, producer_epoch=producer_epoch,
                       base_sequence=-1, columns=columns, compression=Compression.NONE)


def _crash_point(name: str) -> None:
    """Crash tests: `FLUVIAL_TXN_CRASH_AT=<name>` kills the broker (SIGKILL) at that step."""
    if os.environ.get("FLUVIAL_TXN_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class TransactionCoordinator:
    """All transactional ids of this broker. Used from the event loop; durable writes go
    to the I/O threads, one transactional id's requests are handled one at a time."""

    def __init__(self, broker, store: MetadataStore, index: TransactionIndex, *,
                 max_timeout_ms: int = 900_000, id_expiration_ms: int = 7 * 24 * 3600 * 1000):
        self.broker = broker
        self.store = store
        self.index = index
        self.max_timeout_ms = max_timeout_ms          # transaction.max.timeout.ms
        self.id_expiration_ms = id_expiration_ms      # transactional.id.expiration.ms
        store.ensure_schema(_DDL)
        self.txns: dict[str, TxnMetadata] = {}
        self.by_producer: dict[int, TxnMetadata] = {}
        for row in store.query("SELECT transactional_id, state FROM transaction_state"):
            meta = TxnMetadata.decode(row["transactional_id"], row["state"])
            self.txns[meta.transactional_id] = meta
            self.by_producer[meta.producer_id] = meta
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, tid: str) -> asyncio.Lock:
        lock = self._locks.get(tid)
        if lock is None:
            lock = self._locks[tid] = asyncio.Lock()
        return lock

    # -- persistence ---------------------------------------------------------------------

    def _write(self, meta: TxnMetadata | None, tid: str) -> None:
        with self.store.transaction() as conn:
            if meta is None:
                conn.execute("DELETE FROM transaction_state WHERE transactional_id = ?", (tid,))
            else:
                conn.execute("INSERT INTO transaction_state (transactional_id, state) VALUES (?, ?)"
                             " ON CONFLICT (transactional_id) DO UPDATE SET state = excluded.state",
                             (tid, meta.encode()))

    async def persist(self, meta: TxnMetadata) -> None:
        meta.updated_ms = now_ms()
        encoded = TxnMetadata.decode(meta.transactional_id, meta.encode())  # a copy for the thread
        await asyncio.get_running_loop().run_in_executor(self.broker.io_executor, self._write, encoded,
                                                         meta.transactional_id)

    # -- checks ----------------------------------------------------------------------------

    def current(self, tid: str, producer_id: int, producer_epoch: int, *, fenced_code: ErrorCode) -> TxnMetadata:
        """The transaction of `tid` if (producer id, epoch) is its current producer."""
        meta = self.txns.get(tid)
        if meta is None or meta.producer_id != producer_id:
            raise TxnError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                           f"producer id {producer_id} is not the producer of transactional id {tid!r}")
        if meta.producer_epoch != producer_epoch:
            raise TxnError(fenced_code, f"producer epoch {producer_epoch} of {tid!r} is not the current "
                                        f"epoch {meta.producer_epoch}")
        return meta

    def verify_produce(self, tid: str | None, producer_id: int, producer_epoch: int, topic: str,
                       partition: int) -> ErrorCode | None:
        """Partition verification for a transactional batch (Kafka 4.x does it for every
        client): the partition must be in the producer's ongoing transaction."""
        meta = self.txns.get(tid) if tid is not None else None
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING if meta is not None else ErrorCode.INVALID_TXN_STATE
        if producer_epoch < meta.producer_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if meta.state != ONGOING or (topic, partition) not in meta.partitions or producer_epoch != meta.producer_epoch:
            return ErrorCode.INVALID_TXN_STATE
        return None

    async def add_implicitly(self, tid: str | None, producer_id: int, producer_epoch: int, topic: str,
                             partition: int) -> None:
        """Produce v12: add the partition to the producer's transaction (starting it) when
        the producer is the id's current one; anything else is left to `verify_produce`."""
        meta = self.txns.get(tid) if tid is not None else None
        if meta is None or (meta.state == ONGOING and (topic, partition) in meta.partitions):
            return
        async with self.lock(tid):
            if meta.producer_id != producer_id or meta.producer_epoch != producer_epoch:
                return
            if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
                return
            await self.add_partitions(meta, [(topic, partition)])

    # -- InitProducerId ---------------------------------------------------------------------

    async def init_producer_id(self, tid: str, timeout_ms: int, producer_id: int, producer_epoch: int,
                               new_producer_id) -> tuple[int, int]:
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise TxnError(ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                           f"transaction timeout {timeout_ms} ms is outside (0, {self.max_timeout_ms}]")
        async with self.lock(tid):
            meta = self.txns.get(tid)
            if meta is None:
                pid = await asyncio.get_running_loop().run_in_executor(self.broker.io_executor, new_producer_id)
                meta = TxnMetadata(tid, pid, 0, timeout_ms)
                self.txns[tid] = meta
                self.by_producer[pid] = meta
                await self.persist(meta)
                return meta.producer_id, meta.producer_epoch
            if producer_id >= 0 and (producer_id, producer_epoch) != (meta.producer_id, meta.producer_epoch):
                raise TxnError(ErrorCode.PRODUCER_FENCED,
                               f"producer {producer_id} epoch {producer_epoch} of {tid!r} was fenced")
            if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
                await self._complete(meta)
            if meta.state == ONGOING:
                # The previous instance's transaction is aborted under the new epoch: its
                # markers fence the old producer wherever it wrote.
                await self._bump(meta, new_producer_id)
                await self._end(meta, commit=False)
            else:
                await self._bump(meta, new_producer_id)
            meta.timeout_ms = timeout_ms
            meta.state = EMPTY
            await self.persist(meta)
            return meta.producer_id, meta.producer_epoch

    async def _bump(self, meta: TxnMetadata, new_producer_id) -> None:
        if meta.producer_epoch + 1 >= INT16_MAX:
            pid = await asyncio.get_running_loop().run_in_executor(self.broker.io_executor, new_producer_id)
            self.by_producer.pop(meta.producer_id, None)
            meta.producer_id, meta.producer_epoch = pid, 0
            self.by_producer[pid] = meta
        else:
            meta.producer_epoch += 1

    # -- AddPartitionsToTxn / AddOffsetsToTxn / TxnOffsetCommit --------------------------------

    def check_open(self, meta: TxnMetadata) -> None:
        if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
            raise TxnError(ErrorCode.CONCURRENT_TRANSACTIONS, "the previous transaction is still completing")

    async def add_partitions(self, meta: TxnMetadata, partitions: list[tuple[str, int]]) -> None:
        self.check_open(meta)
        new = [tp for tp in partitions if tp not in meta.partitions]
        if not new and meta.state == ONGOING:
            return
        if meta.state != ONGOING:
            meta.state, meta.start_ms = ONGOING, now_ms()
            meta.partitions, meta.groups, meta.offsets = set(), set(), {}
        meta.partitions.update(new)
        await self.persist(meta)

    async def add_group(self, meta: TxnMetadata, group_id: str) -> None:
        self.check_open(meta)
        if meta.state != ONGOING:
            meta.state, meta.start_ms = ONGOING, now_ms()
            meta.partitions, meta.groups, meta.offsets = set(), set(), {}
        if group_id in meta.groups:
            return
        meta.groups.add(group_id)
        await self.persist(meta)

    async def hold_offsets(self, meta: TxnMetadata, group_id: str, offsets: list[tuple[str, int, int, int, str]]
                           ) -> None:
        held = meta.offsets.setdefault(group_id, {})
        for topic, partition, offset, leader_epoch, metadata in offsets:
            held[f"{topic}\0{partition}"] = [offset, leader_epoch, metadata]
        await self.persist(meta)

    # -- EndTxn ------------------------------------------------------------------------------

    async def end_txn(self, meta: TxnMetadata, commit: bool, *, bump: bool = False,
                      new_producer_id=None) -> None:
        """`bump` (EndTxn v5, transactions v2): every end bumps the epoch, and the markers
        carry the new epoch, which fences whatever the old epoch still sends."""
        if meta.state == ONGOING:
            if bump:
                await self._bump(meta, new_producer_id)
            await self._end(meta, commit)
            return
        if meta.state == (PREPARE_COMMIT if commit else PREPARE_ABORT):
            # A retry after markers could not all be written (a bucket offline): try again.
            await self._complete(meta)
            return
        if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
            raise TxnError(ErrorCode.CONCURRENT_TRANSACTIONS, "the transaction is completing")
        if bump:
            # Nothing was added (no partition, no group): an empty transaction ends at once.
            await self._bump(meta, new_producer_id)
            meta.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
            await self.persist(meta)
            return
        done = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        if meta.state == done:
            return  # a retry of the request that completed it
        if meta.state == EMPTY and not commit:
            return  # aborting nothing (the client aborts after a failed start)
        raise TxnError(ErrorCode.INVALID_TXN_STATE,
                       f"cannot {'commit' if commit else 'abort'} transactional id {meta.transactional_id!r} "
                       f"in state {meta.state}")

    def completed_retry(self, tid: str, producer_id: int, producer_epoch: int, commit: bool) -> TxnMetadata | None:
        """EndTxn v5 retried after it completed (and bumped the epoch): the transaction, to
        answer with its current epoch; None when the request is not such a retry."""
        meta = self.txns.get(tid)
        if (meta is not None and meta.producer_id == producer_id and producer_epoch == meta.producer_epoch - 1
                and meta.state == (COMPLETE_COMMIT if commit else COMPLETE_ABORT)):
            return meta
        return None

    async def _end(self, meta: TxnMetadata, commit: bool) -> None:
        meta.state = PREPARE_COMMIT if commit else PREPARE_ABORT
        await self.persist(meta)        # from here a restart completes it
        await self._complete(meta)

    async def _complete(self, meta: TxnMetadata) -> None:
        commit = meta.state == PREPARE_COMMIT
        if commit:
            _crash_point("commit-prepared")
        await self.write_markers(meta.producer_id, meta.producer_epoch, sorted(meta.partitions),
                                 COMMIT if commit else ABORT)
        if commit:
            await self._apply_offsets(meta)
        meta.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        meta.partitions, meta.groups, meta.offsets = set(), set(), {}
        meta.start_ms = -1
        await self.persist(meta)

    async def _apply_offsets(self, meta: TxnMetadata) -> None:
        groups = self.broker.extensions.get("groups")
        for group_id, held in meta.offsets.items():
            entries = []
            for key, (offset, leader_epoch, metadata) in held.items():
                topic, partition = key.split("\0")
                entries.append((topic, int(partition), offset, leader_epoch, metadata))
            await groups.apply_transactional_offsets(group_id, entries)

    async def write_markers(self, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]],
                            kind: int) -> None:
        """Append a marker to each partition and wait until every one is durable."""
        loop = asyncio.get_running_loop()
        waits = []
        lines = []
        for topic, partition in partitions:
            try:
                bucket = self.broker.tables.get(topic).bucket(partition)
            except FluvialError:
                continue  # deleted since: nothing left to mark
            if await bucket.table.kind.end_transaction(self.broker, bucket, producer_id, kind == COMMIT):
                continue  # no marker: the kind applied (commit) or dropped (abort) the writes it held
            wire = bytearray(control_batch(producer_id, producer_epoch, kind))
            header = parse_batch_header(wire)
            records, batch_meta = kafka_batches.to_arrow(memoryview(wire), header)
            if (lines or waits) and kind == COMMIT:
                _crash_point("commit-marker")  # after the first marker, before the others
            written = bucket.append(records, batch_meta)
            line = self.index.on_marker(bucket, producer_id, kind, written.base_offset)
            if line is not None:
                lines.append((bucket, line))
            if bucket.table.config("compression.type") == "producer":
                set_base_offset(wire, written.base_offset, bucket.leader_epoch)
                self.broker.wire_cache.put(topic, partition, written.base_offset, wire)
            if self.broker.config.flush_policy == "ack":
                waits.append(bucket.group_commit.wait_durable(written.base_offset + written.record_count))
        for bucket, line in lines:
            await loop.run_in_executor(self.broker.io_executor, self.index.append_line, bucket, line)
        if waits:
            await asyncio.gather(*waits)

    # -- recovery and timeouts -------------------------------------------------------------------

    async def recover(self) -> None:
        """After a restart: complete prepared transactions."""
        for meta in list(self.txns.values()):
            if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
                async with self.lock(meta.transactional_id):
                    log.info("completing %s of transactional id %s after restart", meta.state, meta.transactional_id)
                    await self._complete(meta)

    async def expire(self, new_producer_id) -> None:
        """Abort transactions past their timeout; forget ids idle past the expiration."""
        now = now_ms()
        for meta in list(self.txns.values()):
            if meta.state in (PREPARE_COMMIT, PREPARE_ABORT) and now - meta.updated_ms > RETRY_COMPLETION_MS:
                # Its markers could not all be written before (a bucket offline): retried here.
                async with self.lock(meta.transactional_id):
                    if meta.state in (PREPARE_COMMIT, PREPARE_ABORT):
                        try:
                            await self._complete(meta)
                        except FluvialError as exc:
                            log.warning("completing the transaction of %s failed again: %s",
                                        meta.transactional_id, exc)
                            meta.updated_ms = now_ms()
                continue
            if meta.state == ONGOING and meta.start_ms >= 0 and now - meta.start_ms > meta.timeout_ms:
                async with self.lock(meta.transactional_id):
                    if meta.state == ONGOING and now_ms() - meta.start_ms > meta.timeout_ms:
                        log.info("aborting the transaction of %s: timed out after %d ms",
                                 meta.transactional_id, meta.timeout_ms)
                        await self._bump(meta, new_producer_id)
                        await self._end(meta, commit=False)
            elif meta.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT) and now - meta.updated_ms > self.id_expiration_ms:
                async with self.lock(meta.transactional_id):
                    if self.txns.get(meta.transactional_id) is meta and meta.state not in (ONGOING, PREPARE_COMMIT,
                                                                                           PREPARE_ABORT):
                        del self.txns[meta.transactional_id]
                        self.by_producer.pop(meta.producer_id, None)
                        await asyncio.get_running_loop().run_in_executor(
                            self.broker.io_executor, self._write, None, meta.transactional_id)
