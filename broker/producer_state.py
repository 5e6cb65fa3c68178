"""Idempotent producers: producer id allocation and per-bucket sequence state.

`ProducerIdManager` hands out producer ids (InitProducerId), monotonic across restarts,
and keeps the transactional id -> (producer id, epoch) mapping in the metadata store.

`ProducerStateManager` is one bucket's memory of each producer's last five batches
(Kafka's rule), used to answer a retried batch with its original offsets and to refuse
gaps (OUT_OF_ORDER_SEQUENCE_NUMBER) and stale epochs (INVALID_PRODUCER_EPOCH). It is
snapshotted to a file in the bucket's directory and rebuilt on open from that snapshot
plus the batch metadata of the log after it. `ProducerStateRegistry` holds one manager
per bucket and is what the produce path calls.
"""
from __future__ import annotations

import asyncio
import logging
import os
import struct
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, NamedTuple

import crc32c

from fluvial.broker.log import BatchMeta
from fluvial.broker.log.checkpoint import fsync_directory
from fluvial.broker.metadata import MetadataStore
from fluvial.errors import FluvialError, OutOfOrderSequenceError, ProducerFencedError, StorageError
from fluvial.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from fluvial.broker.tables import Bucket

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
INT16_MAX = 2**15 - 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
# Kafka keeps this many batches per producer for duplicate detection; clients cap
# max.in.flight.requests.per.connection at the same number when idempotent.
BATCHES_KEPT = 5
SNAPSHOT_SUFFIX = ".snapshot"
# Written by earlier versions (one file per bucket); still read when no newer snapshot exists.
LEGACY_SNAPSHOT_FILE = "producer-state.snapshot"
# Snapshots kept per bucket: the newest, and fallbacks should it be unusable.
SNAPSHOTS_KEPT = 2


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record; sequences wrap from INT32_MAX to 0."""
    return (base_sequence + last_offset_delta) % (INT32_MAX + 1)


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


class BatchSequence(NamedTuple):
    """Where one producer batch went: its sequence range and offset range.

    A named tuple (as `Duplicate`): one is made for every idempotent batch on the event
    loop, and a tuple is made and read in C, where a frozen dataclass sets each field
    through ``object.__setattr__``."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


class Duplicate(NamedTuple):
    """A batch already in the log; the answer to its retry is where it was written."""

    base_offset: int
    last_offset: int


@dataclass
class ProducerEntry:
    epoch: int
    batches: deque[BatchSequence] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find(self, first_seq: int, last_seq: int) -> BatchSequence | None:
        for batch in self.batches:
            if batch[0] == first_seq and batch[1] == last_seq:  # first_seq, last_seq
                return batch
        return None


class ProducerStateManager:
    """One bucket's producer state. Not thread-safe: used from the event loop."""

    def __init__(self, directory: Path | None = None):
        self.directory = Path(directory) if directory is not None else None
        self.producers: dict[int, ProducerEntry] = {}
        # The log offset up to which this state covers the bucket's batches.
        self.next_offset = 0
        # Changed since the last snapshot was taken.
        self.dirty = False
        self._version = 0           # of the newest prepared snapshot (event loop)
        self._written_version = 0   # of the newest written one (I/O threads, under the lock)
        self._write_lock = threading.Lock()

    # -- the produce path -------------------------------------------------------------

    def check(self, producer_id: int, epoch: int, base_seq: int, last_seq: int) -> Duplicate | None:
        """Validate a batch before it is appended.

        Returns the original offsets for a retried batch, None for a batch to append;
        raises ProducerFencedError (stale epoch) or OutOfOrderSequenceError.
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            # Kafka 2.5+: a producer this bucket does not know (new, or its state expired
            # with retention) may start at any sequence; the client handles gaps itself.
            return None
        if epoch < entry.epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {epoch} is older than the current epoch {entry.epoch}")
        if epoch > entry.epoch:
            if base_seq != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} starts epoch {epoch} at sequence {base_seq}, not 0")
            return None
        original = entry.find(base_seq, last_seq)
        if original is not None:
            return Duplicate(original.base_offset, original.last_offset)
        if not in_sequence(entry.last_seq, base_seq):
            raise OutOfOrderSequenceError(
                f"out of order sequence for producer {producer_id}: got {base_seq}, expected "
                f"{(entry.last_seq + 1) % (INT32_MAX + 1)}")
        return None

    def update(self, producer_id: int, epoch: int, base_seq: int, last_seq: int,
               base_offset: int, last_offset: int, timestamp: int = -1) -> None:
        """Remember an appended batch."""
        entry = self.producers.get(producer_id)
        if entry is None or entry.epoch != epoch:
            entry = self.producers[producer_id] = ProducerEntry(epoch)
        entry.batches.append(BatchSequence(base_seq, last_seq, base_offset, last_offset))
        if timestamp > entry.last_timestamp:
            entry.last_timestamp = timestamp
        if last_offset >= self.next_offset:
            self.next_offset = last_offset + 1
        self.dirty = True

    def check_meta(self, meta: BatchMeta) -> Duplicate | None:
        return self.check(meta.producer_id, meta.producer_epoch, meta.base_sequence,
                          last_sequence(meta.base_sequence, meta.last_sequence_delta))

    def apply(self, meta: BatchMeta, now_ms: int | None = None) -> None:
        """Take an appended (or replayed) batch into the state.

        A producer's age is the append time when known: record timestamps are the
        producer's (CreateTime) and may be far in the past for replayed data.
        """
        if meta.producer_id < 0 or meta.base_sequence < 0:
            self.next_offset = max(self.next_offset, meta.next_offset)
            return
        self.update(meta.producer_id, meta.producer_epoch, meta.base_sequence,
                    last_sequence(meta.base_sequence, meta.last_sequence_delta),
                    meta.base_offset, meta.last_offset, meta.max_timestamp if now_ms is None else now_ms)

    def rebuild(self, metas: Iterable[BatchMeta], now_ms: int | None = None) -> int:
        """Replay batch metadata from the log; returns how many batches were replayed.

        With `now_ms`, replayed producers count as seen at that time, so a restart does
        not expire producers whose records carry old CreateTime timestamps.
        """
        n = 0
        for meta in metas:
            if meta.next_offset <= self.next_offset:
                continue
            self.apply(meta, now_ms)
            n += 1
        return n

    def forget(self, producer_id: int, epoch: int, first_seq: int) -> None:
        """Take back the producer's newest batch if it is the one starting at `first_seq`."""
        entry = self.producers.get(producer_id)
        if entry is not None and entry.epoch == epoch and entry.batches and entry.batches[-1].first_seq == first_seq:
            entry.batches.pop()
            if not entry.batches:
                del self.producers[producer_id]

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers silent for longer than producer.id.expiration.ms."""
        stale = [pid for pid, e in self.producers.items() if e.last_timestamp + expiration_ms < now_ms]
        for pid in stale:
            del self.producers[pid]
        return len(stale)

    def truncate_before(self, log_start_offset: int) -> None:
        """Drop batches below the log start (retention, DeleteRecords)."""
        for pid in list(self.producers):
            entry = self.producers[pid]
            kept = [b for b in entry.batches if b.last_offset >= log_start_offset]
            if not kept:
                del self.producers[pid]
            elif len(kept) != len(entry.batches):
                entry.batches = deque(kept, maxlen=BATCHES_KEPT)

    # -- snapshots ----------------------------------------------------------------------

    _HEAD = struct.Struct(">hqi")          # format version, next offset, producer count
    _PRODUCER = struct.Struct(">qhqb")     # producer id, epoch, last timestamp, batch count
    _BATCH = struct.Struct(">iiqq")        # first seq, last seq, base offset, last offset
    _VERSION = 1

    def encode_snapshot(self) -> bytes:
        parts = [self._HEAD.pack(self._VERSION, self.next_offset, len(self.producers))]
        for pid, entry in self.producers.items():
            parts.append(self._PRODUCER.pack(pid, entry.epoch, entry.last_timestamp, len(entry.batches)))
            parts.extend(self._BATCH.pack(b.first_seq, b.last_seq, b.base_offset, b.last_offset)
                         for b in entry.batches)
        body = b"".join(parts)
        return struct.pack(">I", crc32c.crc32c(body)) + body

    @classmethod
    def decode_snapshot(cls, data: bytes) -> tuple[int, dict[int, ProducerEntry]]:
        if len(data) < 4 + cls._HEAD.size:
            raise ValueError("producer state snapshot too short")
        (crc,) = struct.unpack_from(">I", data, 0)
        body = memoryview(data)[4:]
        if crc32c.crc32c(body) != crc:
            raise ValueError("producer state snapshot checksum mismatch")
        version, next_offset, count = cls._HEAD.unpack_from(body, 0)
        if version != cls._VERSION:
            raise ValueError(f"unknown producer state snapshot version {version}")
        pos = cls._HEAD.size
        producers: dict[int, ProducerEntry] = {}
        for _ in range(count):
            pid, epoch, last_ts, n = cls._PRODUCER.unpack_from(body, pos)
            pos += cls._PRODUCER.size
            entry = ProducerEntry(epoch, last_timestamp=last_ts)
            for _ in range(n):
                entry.batches.append(BatchSequence(*cls._BATCH.unpack_from(body, pos)))
                pos += cls._BATCH.size
            producers[pid] = entry
        if pos != len(body):
            raise ValueError("trailing bytes in producer state snapshot")
        return next_offset, producers

    def prepare_snapshot(self) -> PreparedSnapshot:
        """Encode the state as it is now (on the event loop, where it changes)."""
        self._version += 1
        self.dirty = False
        return PreparedSnapshot(self, self.next_offset, self._version, self.encode_snapshot())

    def write_snapshot(self, prepared: PreparedSnapshot | None = None) -> bool:
        """Write a snapshot atomically (temp file, fsync, rename, directory fsync) as
        `<next offset>.snapshot`, then drop all but the newest few. Blocking: run it in an
        I/O thread. A snapshot older than one already written is skipped; returns whether
        this one was written."""
        if self.directory is None:
            return False
        if prepared is None:
            prepared = self.prepare_snapshot()
        with self._write_lock:
            if prepared.version <= self._written_version:
                return False
            path = snapshot_path(self.directory, prepared.next_offset)
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(prepared.data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_directory(self.directory)
            self._written_version = prepared.version
            # Older snapshots are only a fallback for a newer one that turns out unusable.
            for offset, old in list_snapshots(self.directory)[:-SNAPSHOTS_KEPT]:
                old.unlink(missing_ok=True)
            (self.directory / LEGACY_SNAPSHOT_FILE).unlink(missing_ok=True)
            return True

    def load_snapshot(self, log_start_offset: int, log_end_offset: int) -> bool:
        """Load the newest usable snapshot for a log spanning [start, end)."""
        if self.directory is None:
            return False
        candidates = [path for _, path in list_snapshots(self.directory)]
        candidates.insert(0, self.directory / LEGACY_SNAPSHOT_FILE)
        for path in reversed(candidates):
            try:
                next_offset, producers = self.decode_snapshot(path.read_bytes())
            except FileNotFoundError:
                continue
            except (ValueError, struct.error) as exc:
                log.warning("ignoring producer state snapshot %s: %s", path, exc)
                continue
            if next_offset > log_end_offset:
                # The log lost its tail (unflushed data after a power loss): the snapshot saw
                # batches that are gone. An older snapshot, or the log, is the truth.
                log.warning("ignoring producer state snapshot %s: it covers offsets up to %d, the log ends at %d",
                            path, next_offset, log_end_offset)
                path.unlink(missing_ok=True)
                continue
            self.producers = producers
            self.next_offset = max(next_offset, log_start_offset)
            self.truncate_before(log_start_offset)
            return True
        return False


@dataclass(frozen=True, slots=True)
class PreparedSnapshot:
    """A producer state encoded on the event loop, to be written by an I/O thread."""

    manager: ProducerStateManager
    next_offset: int
    version: int
    data: bytes


def snapshot_path(directory: Path, offset: int) -> Path:
    """Kafka's name: the offset the state covers up to, 20 digits, `.snapshot`."""
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """The bucket's producer state snapshots, oldest first."""
    found = []
    for path in directory.glob("*" + SNAPSHOT_SUFFIX):
        stem = path.name[: -len(SNAPSHOT_SUFFIX)]
        if stem.isdigit():
            found.append((int(stem), path))
    return sorted(found)


def tablet_batch_metas(tablet, from_offset: int) -> Iterator[BatchMeta]:
    """Batch metadata of a log tablet from an offset to its end, from batch headers only."""
    offset = max(from_offset, tablet.log_start_offset)
    if offset >= tablet.log_end_offset:
        return iter(())
    return tablet.batch_metas(offset)


class ProducerStateRegistry:
    """Producer state of every bucket.

    The produce path calls `check(bucket, meta)` before appending an idempotent batch
    and `record(bucket, written)` right after the append, with no await in between, so a
    producer's batches to one bucket are checked and recorded in order and the state
    always covers the log end. Each loaded bucket's state is snapshotted when its log
    rolls a segment (as Kafka does), periodically, after a write that appended nothing
    (a primary-key no-op, which leaves no trace in the log) and on stop; a restart reads
    the newest snapshot and replays only the batch headers after it.
    """

    def __init__(self, expiration_ms: int = 24 * 3600 * 1000, *, io_executor=None,
                 loop: asyncio.AbstractEventLoop | None = None):
        self.expiration_ms = expiration_ms  # producer.id.expiration.ms
        self._managers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._io_executor = io_executor
        self._loop = loop
        # Loads under way (the snapshot and the log after it are read by an I/O thread).
        self._loading: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def manager(self, bucket: "Bucket") -> ProducerStateManager:
        """The bucket's state, loaded here if it is not yet (on the event loop)."""
        manager = self._managers.get(bucket)
        if manager is None:
            manager = self._install(bucket, self.load(bucket))
        return manager

    def _install(self, bucket: "Bucket", loaded: ProducerStateManager) -> ProducerStateManager:
        manager = self._managers.get(bucket)
        if manager is None:
            manager = self._managers[bucket] = loaded
            self._watch_rolls(bucket)
        return manager

    def loaded(self, bucket: "Bucket") -> bool:
        return bucket in self._managers

    def loaded_manager(self, bucket: "Bucket") -> ProducerStateManager | None:
        """The bucket's state when loaded (None: not yet, see `ensure_loaded`)."""
        return self._managers.get(bucket)

    def start_loading(self, buckets: Iterable["Bucket"]) -> None:
        """Load the buckets' states in the background (I/O threads): the listeners need not
        wait for them; a produce to a bucket still loading waits in `ensure_loaded`."""
        for bucket in buckets:
            if bucket not in self._managers and bucket not in self._loading:
                self._loading[bucket] = asyncio.ensure_future(self._load_in_background(bucket))

    async def ensure_loaded(self, bucket: "Bucket") -> None:
        if bucket in self._managers:
            return
        task = self._loading.get(bucket)
        if task is None:
            task = self._loading[bucket] = asyncio.ensure_future(self._load_in_background(bucket))
        await asyncio.shield(task)

    async def _load_in_background(self, bucket: "Bucket") -> None:
        try:
            loaded = await asyncio.get_running_loop().run_in_executor(self._io_executor, self.load, bucket)
            self._install(bucket, loaded)  # on the loop: the managers are only changed here
        finally:
            self._loading.pop(bucket, None)

    def _watch_rolls(self, bucket: "Bucket") -> None:
        listeners = getattr(bucket.tablet, "roll_listeners", None)
        if self._loop is None or listeners is None:
            return
        ref = weakref.ref(bucket)
        loop = self._loop

        def rolled(base_offset: int) -> None:
            # Called by the appending thread under the tablet's lock: the snapshot is taken
            # on the loop once this append (and its record()) is done.
            try:
                loop.call_soon_threadsafe(self._snapshot_after_roll, ref)
            except RuntimeError:
                pass  # the loop is closed (shutting down): the stop hook wrote the snapshots

        listeners.append(rolled)

    def _snapshot_after_roll(self, ref) -> None:
        bucket = ref()
        if bucket is None or bucket not in self._managers:
            return
        prepared = self._prepare(bucket, self._managers[bucket], int(time.time() * 1000))
        future = self._loop.run_in_executor(self._io_executor, self.write_snapshots, [prepared])
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def persist_unlogged(self, bucket: "Bucket", written: BatchMeta) -> None:
        """Make a recorded batch that left nothing in the log (a primary-key write that
        changed nothing) durable: the bucket's snapshot is written before the answer. When
        it cannot be, the batch is forgotten again (a retry is then applied anew, not taken
        for a duplicate) and StorageError is raised: the write is not acknowledged."""
        manager = self.manager(bucket)
        prepared = self._prepare(bucket, manager, int(time.time() * 1000))
        try:
            await asyncio.get_running_loop().run_in_executor(self._io_executor, manager.write_snapshot, prepared)
        except OSError as exc:
            manager.forget(written.producer_id, written.producer_epoch, written.base_sequence)
            manager.dirty = True
            log.error("cannot write the producer state snapshot in %s: %s", manager.directory, exc)
            raise StorageError(f"cannot make the producer state of {bucket.tablet.directory.name} durable: {exc}") from exc

    @staticmethod
    def load(bucket: "Bucket") -> ProducerStateManager:
        """Snapshot plus the log after it; a missing or stale snapshot means a full replay."""
        tablet = bucket.tablet
        manager = ProducerStateManager(tablet.directory)
        start, end = tablet.log_start_offset, tablet.log_end_offset
        if not manager.load_snapshot(start, end):
            manager.next_offset = start
        replayed = manager.rebuild(tablet_batch_metas(tablet, manager.next_offset), int(time.time() * 1000))
        manager.next_offset = max(manager.next_offset, end)
        if replayed:
            log.info("rebuilt producer state of %s from %d batches", tablet.directory.name, replayed)
        return manager

    def check(self, bucket: "Bucket", meta: BatchMeta) -> Duplicate | None:
        if meta.producer_id < 0 or meta.base_sequence < 0:
            return None
        return self.manager(bucket).check_meta(meta)

    def record(self, bucket: "Bucket", written: BatchMeta) -> None:
        self.manager(bucket).apply(written, int(time.time() * 1000))

    def _prepare(self, bucket: "Bucket", manager: ProducerStateManager, now: int) -> PreparedSnapshot:
        manager.remove_expired(now, self.expiration_ms)
        manager.truncate_before(bucket.tablet.log_start_offset)
        # Every idempotent append is recorded right after it, with no await in between:
        # the state covers the log end.
        manager.next_offset = max(manager.next_offset, bucket.tablet.log_end_offset)
        return manager.prepare_snapshot()

    def prepare_snapshots(self, now_ms: int | None = None, *, only_changed: bool = False
                          ) -> list[PreparedSnapshot]:
        """Expire silent producers and encode every loaded bucket's state (on the loop,
        where appends happen, so each snapshot covers exactly the log end it names)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        out = []
        for bucket, manager in list(self._managers.items()):
            if only_changed and not manager.dirty:
                continue
            out.append(self._prepare(bucket, manager, now))
        return out

    @staticmethod
    def write_snapshots(prepared: list[PreparedSnapshot]) -> int:
        """Write encoded snapshots (blocking: run it in an I/O thread)."""
        n = 0
        for snapshot in prepared:
            try:
                n += snapshot.manager.write_snapshot(snapshot)
            except FileNotFoundError:
                pass  # the bucket was deleted meanwhile
            except OSError:
                log.exception("cannot snapshot producer state in %s", snapshot.manager.directory)
        return n


# -- producer ids ---------------------------------------------------------------------

_ID_DDL = """
CREATE TABLE IF NOT EXISTS producer_id_block (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    next_block_start INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS transactional_producers (
    transactional_id TEXT PRIMARY KEY,
    producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    transaction_timeout_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int
    producer_epoch: int


class ProducerIdManager:
    """Allocates producer ids in durable blocks, so ids never repeat after a restart."""

    BLOCK_SIZE = 1000

    def __init__(self, store: MetadataStore, *, max_transaction_timeout_ms: int = 900_000):
        self._store = store
        store.ensure_schema(_ID_DDL)
        self._lock = threading.Lock()
        self._next = 0
        self._block_end = 0  # ids below this are reserved for this process
        self.max_transaction_timeout_ms = max_transaction_timeout_ms  # transaction.max.timeout.ms

    def next_producer_id(self) -> int:
        with self._lock:
            return self._unlocked_next_id()

    def _reserve_block(self) -> None:
        with self._store.transaction() as conn:
            row = conn.execute("SELECT next_block_start FROM producer_id_block WHERE id = 0").fetchone()
            start = row[0] if row else 0
            end = start + self.BLOCK_SIZE
            conn.execute("INSERT INTO producer_id_block (id, next_block_start) VALUES (0, ?)"
                         " ON CONFLICT (id) DO UPDATE SET next_block_start = excluded.next_block_start", (end,))
        self._next, self._block_end = start, end

    def init_producer_id(self, transactional_id: str | None, transaction_timeout_ms: int,
                         producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH
                         ) -> ProducerIdAndEpoch:
        """InitProducerId. Idempotent producers get a fresh id at epoch 0 (as Kafka does,
        whatever id they had); a transactional id keeps its producer id and bumps the
        epoch, which fences the previous instance."""
        if transactional_id is None or transactional_id == "":
            if transactional_id == "":
                raise FluvialError("empty transactional id", code=ErrorCode.INVALID_REQUEST)
            return ProducerIdAndEpoch(self.next_producer_id(), 0)
        if not 0 < transaction_timeout_ms <= self.max_transaction_timeout_ms:
            raise FluvialError(
                f"transaction timeout {transaction_timeout_ms} ms is outside (0, {self.max_transaction_timeout_ms}]",
                code=ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        with self._lock:
            rows = self._store.query(
                "SELECT producer_id, producer_epoch FROM transactional_producers WHERE transactional_id = ?",
                (transactional_id,))
            if rows:
                current = ProducerIdAndEpoch(rows[0]["producer_id"], rows[0]["producer_epoch"])
                if producer_id != NO_PRODUCER_ID and (producer_id, producer_epoch) != (
                        current.producer_id, current.producer_epoch):
                    raise ProducerFencedError(
                        f"producer {producer_id} epoch {producer_epoch} of {transactional_id!r} was fenced by "
                        f"epoch {current.producer_epoch}", code=ErrorCode.PRODUCER_FENCED)
                if current.producer_epoch + 1 >= INT16_MAX:
                    # The epoch would overflow: continue under a fresh producer id.
                    nxt = ProducerIdAndEpoch(self._unlocked_next_id(), 0)
                else:
                    nxt = ProducerIdAndEpoch(current.producer_id, current.producer_epoch + 1)
            else:
                nxt = ProducerIdAndEpoch(self._unlocked_next_id(), 0)
            with self._store.transaction() as conn:
                conn.execute(
                    "INSERT INTO transactional_producers (transactional_id, producer_id, producer_epoch,"
                    " transaction_timeout_ms, updated_ms) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (transactional_id) DO UPDATE SET producer_id = excluded.producer_id,"
                    " producer_epoch = excluded.producer_epoch,"
                    " transaction_timeout_ms = excluded.transaction_timeout_ms, updated_ms = excluded.updated_ms",
                    (transactional_id, nxt.producer_id, nxt.producer_epoch, transaction_timeout_ms,
                     int(time.time() * 1000)))
            return nxt

    def _unlocked_next_id(self) -> int:
        if self._next >= self._block_end:
            self._reserve_block()
        pid = self._next
        self._next += 1
        return pid
