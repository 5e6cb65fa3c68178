"""Tables (Kafka topics) and their buckets (partitions): the registry of log tablets.

A table's definition (topic id, bucket count, config overrides) lives in the metadata
store; each bucket owns one `LogTablet` under `<data-dir>/log/<table>-<bucket>/`.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import shutil
import sqlite3
import time
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from fluvial.broker import kafka_batches
from fluvial.broker.config import (TOPIC_CONFIGS, BrokerConfig, check_alterable, check_flush_configs, cleanup_policies,
                                   config_flag,
                                   validate_topic_configs)
from fluvial.broker.log import BatchMeta, FlushPolicy, LogConfig, LogTablet
from fluvial.broker.log_table import LOG_TABLE
from fluvial.broker.table_kind import TableKind
from fluvial.broker.metadata import MetadataStore
from fluvial.errors import (FluvialError, InvalidConfigError, InvalidPartitionsError, InvalidRecordError, InvalidTableError,
                            StorageError, TableExistsError, UnknownTableError)
from fluvial.protocol.errors import ErrorCode
from fluvial.progress import ProgressLog

log = logging.getLogger(__name__)

_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

_DDL = """
CREATE TABLE IF NOT EXISTS tables (
    name TEXT PRIMARY KEY,
    topic_id TEXT NOT NULL UNIQUE,
    buckets INTEGER NOT NULL,
    configs TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
"""


def validate_table_name(name: str) -> None:
    if not name or name in (".", "..") or not _LEGAL_NAME.match(name):
        raise InvalidTableError(
            f"Topic name {name!r} is illegal: it must be 1-249 characters of ASCII letters, digits, '.', '_' or '-'")


# GroupCommit._running while a flush is scheduled but not yet handed to the executor.
_STARTING = object()


class _Flush:
    """GroupCommit._running while a flush is on the executor; its outcome once done."""

    __slots__ = ("failure",)

    def __init__(self) -> None:
        self.failure: BaseException | None = None

# The average least time between the starts of two flushes of one bucket. An fdatasync
# costs about 100 us of CPU and 200-300 us of wall time here: chaining flushes back to back
# gives many small producers about one fsync per request (most of a core at a few thousand
# requests a second). Spacing them bounds a bucket's fsyncs to 1 / FLUSH_SPACING_S a second
# whatever the request rate, for at most this much more wait. The bound is a rate with a
# burst of FLUSH_BURST starts, not a gap after every flush: a steady producer sending every
# 5 ms, or the first request after a slow fsync, never waits for it (with a plain gap, the
# request arriving just after the flush that caught up a slow fsync's backlog waited up to
# 4 ms more, in the tail already the longest).
FLUSH_SPACING_S = 0.004
FLUSH_BURST = 2

# The least average time between the starts of any two flushes of one broker (its I/O
# executor), with a burst of BROKER_FLUSH_BURST. Under many small producers spread over a
# few buckets, every bucket's flush became due in the same loop pass (the one that read a
# burst of requests): eight to sixteen jobs landed on the four I/O threads at once and
# waited for the threads and the GIL behind each other (a flush waited 8-13 ms before it
# ran, then ran 3-5 ms), so a request waited for about three flush cycles. Spread over
# time, the jobs do not queue: 200 producers on 8 buckets with 5,000 idle connections,
# four rounds alternating with the broker without it (`profile-connections-flush-budget.json`,
# load 1.9-2.8, a slow phase of the disk), requests 29-43 ms in the broker against 38-83 and
# ack p99 118-729 ms against 177-1,274, lower in every pair. One bucket's own bound
# (FLUSH_SPACING_S with a burst of two) is stricter, so a single busy bucket never waits for it.
BROKER_FLUSH_SPACING_S = 0.00125
BROKER_FLUSH_BURST = 2


class FlushStartBudget:
    """The broker-wide rate bound of flush starts (a GCRA, reserved when a start is planned)."""

    __slots__ = ("_next_due",)

    def __init__(self) -> None:
        self._next_due = float("-inf")

    def reserve(self, now: float) -> float:
        """The time the next flush may start at (``now`` or later), counted as taken."""
        start = max(now, self._next_due - (BROKER_FLUSH_BURST - 1) * BROKER_FLUSH_SPACING_S)
        self._next_due = max(self._next_due, start) + BROKER_FLUSH_SPACING_S
        return start


# One budget per I/O executor: one per broker, whatever the number of brokers in a process.
_budgets: "weakref.WeakKeyDictionary[Executor, FlushStartBudget]" = weakref.WeakKeyDictionary()


def flush_start_budget(executor: Executor) -> FlushStartBudget:
    budget = _budgets.get(executor)
    if budget is None:
        budget = _budgets[executor] = FlushStartBudget()
    return budget


# Flushes of one bucket under way at once. With one, an append written just after a flush
# began waited for the whole of it and then for its own: a producer keeping a few large
# requests in flight (the Java producer's five) spent most of its time waiting for answers
# while the disk idled between the two. The second flush syncs the newer appends beside
# the first; the log tablet publishes them in the order they began.
MAX_CONCURRENT_FLUSHES = 2


class GroupCommit:
    """Shares one fsync among all appends waiting for durability of a bucket.

    Under flush policy ``ack`` every append asks for a flush (`request`), whatever the
    producer's acks: readers see only what is fsynced, so an append nobody waits for must
    still become durable promptly. One flush runs at a time; appends arriving meanwhile are
    covered together by the next one, which starts as soon as the running one ends.
    `wait_durable(offset)` returns a future that is done once every record below `offset`
    is on disk, and fails with StorageError when the flush failed (the tablet is then
    offline).

    Many small producers mean thousands of waits a second, so a wait is one plain future
    kept in offset order and a flush is one executor job that hands its outcome to the loop
    in one callback: no task, no coroutine, no shield and no asyncio future per wait or per
    flush. `when_durable(offset, callback)` is
    cheaper still: the callback is called by the flush's own completion (no future, no
    loop callback of its own per wait); the one-partition produce answer uses it.
    """

    def __init__(self, tablet: LogTablet, executor: Executor, on_durable: Callable[[], None] | None = None):
        self._tablet = tablet
        self._executor = executor
        self._budget = flush_start_budget(executor)
        self._on_durable = on_durable
        self.durable_offset = tablet.flushed_offset
        # The latest flush: _STARTING, its _Flush while under way, or None.
        self._running: _Flush | object | None = None
        self._in_flight = 0  # flushes handed to the executor and not completed
        self._covering = self.durable_offset  # the offset the latest flush begun makes durable
        # Rate bound of flush starts (a GCRA): the loop time the next start is due at when
        # starts come at exactly one per FLUSH_SPACING_S; one may start up to
        # (FLUSH_BURST - 1) spacings before it.
        self._next_due = float("-inf")
        # (offset, future or callback) in the order the waits were asked for; appends come
        # in offset order, so the front is always the first to complete (a duplicate's wait
        # for an older offset may sit behind a newer one: completed by the same pass).
        self._waiters: collections.deque[tuple[int, asyncio.Future | Callable]] = collections.deque()

    def request(self) -> None:
        """Make everything appended so far durable soon, without waiting for it."""
        if self._running is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return  # not on the event loop (tools, tests): the next wait_durable flushes
            self._start()

    def _start(self) -> None:
        # The flush starts at the end of this loop pass, so every append made during the
        # pass (other connections' requests read together) shares it, or, when flushes
        # started faster than one per FLUSH_SPACING_S (beyond a burst of FLUSH_BURST),
        # once the rate allows it.
        self._running = _STARTING
        loop = asyncio.get_running_loop()
        now = loop.time()
        wait = max(self._next_due - (FLUSH_BURST - 1) * FLUSH_SPACING_S, self._budget.reserve(now)) - now
        if wait > 0:
            loop.call_later(wait, self._begin)
        else:
            loop.call_soon(self._begin)

    def _begin(self) -> None:
        # The coalesced appends of this flush window are written (as one message) by the
        # executor job, just before its fsync: the loop only closes the window, and appends
        # arriving meanwhile join the next one, after it in the log.
        target = self._tablet.take_pending()
        loop = asyncio.get_running_loop()
        self._next_due = max(self._next_due, loop.time()) + FLUSH_SPACING_S
        self._covering = max(self._covering, target)
        self._in_flight += 1
        self._running = flush = _Flush()
        self._executor.submit(self._write, loop, target, flush)

    def _write(self, loop: asyncio.AbstractEventLoop, target: int, flush: "_Flush") -> None:
        """The executor's job: write and fsync up to ``target``, then hand the outcome to
        the loop in one callback (`_flushed`). Through `run_in_executor` the completion took
        two loop passes (the executor future's state copied into an asyncio future, whose
        done-callback then ran in the next pass), each pass behind every frame the I/O
        thread delivered meanwhile: under many small producers most of a flush's wall time."""
        try:
            self._tablet.write_taken(target)
        except BaseException as exc:  # noqa: BLE001 - the waiters learn every failure
            flush.failure = exc
        try:
            loop.call_soon_threadsafe(self._flushed, target, flush)
        except RuntimeError:
            pass  # the loop is closed (the broker stopped): nobody waits any more

    def wait_durable(self, offset: int) -> asyncio.Future:
        """A future done when every record below `offset` is durable (StorageError if it cannot be)."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        if self.durable_offset >= offset:
            waiter.set_result(None)
            return waiter
        try:
            self._tablet.check_online()
        except StorageError as exc:
            waiter.set_exception(exc)
            return waiter
        self._waiters.append((offset, waiter))
        self._start_for(offset)
        return waiter

    def _start_for(self, offset: int) -> None:
        """Start a flush for a wait on ``offset`` unless one begun or about to begin covers it."""
        running = self._running
        if running is None or (running is not _STARTING and offset > self._covering
                               and self._in_flight < MAX_CONCURRENT_FLUSHES):
            self._start()

    def when_durable(self, offset: int, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback(None)`` on the loop once every record below `offset` is durable,
        or ``callback(failure)`` when it cannot be (StorageError; CancelledError when the
        loop stops first). Called at once when it is durable already or the tablet is offline."""
        if self.durable_offset >= offset:
            callback(None)
            return
        try:
            self._tablet.check_online()
        except StorageError as exc:
            callback(exc)
            return
        self._waiters.append((offset, callback))
        self._start_for(offset)

    @staticmethod
    def _complete(waiter: asyncio.Future | Callable, failure: BaseException | None) -> None:
        if isinstance(waiter, asyncio.Future):
            if waiter.done():
                return
            if failure is None:
                waiter.set_result(None)
            elif isinstance(failure, asyncio.CancelledError):
                waiter.cancel()
            else:
                waiter.set_exception(failure)
            return
        try:
            waiter(failure)
        except Exception:  # noqa: BLE001 - one waiter's fault must not keep the others waiting
            log.exception("durability callback failed")

    def _fail_waiters(self, failure: BaseException) -> None:
        waiters, self._waiters = self._waiters, collections.deque()
        for _, waiter in waiters:
            self._complete(waiter, failure)

    def _flushed(self, target: int, flush: "_Flush") -> None:
        # Runs on the loop when the executor's flush ends. `_running` is cleared before any
        # waiter resumes, so a waiter never sees a finished flush as still running (a later
        # flush may still be under way: it stays the running one).
        self._in_flight -= 1
        if self._running is flush:
            self._running = None
        failure = flush.failure
        if failure is not None:
            # The tablet is offline now (or the loop is stopping): every waiter learns it,
            # none is acknowledged.
            self._fail_waiters(failure)
            return
        # flush_up_to may have covered appends made after `target` was read.
        durable = max(target, min(self._tablet.flushed_offset, self._tablet.log_end_offset))
        if durable > self.durable_offset:
            self.durable_offset = durable
            if self._on_durable is not None:
                self._on_durable()
        waiters = self._waiters
        if waiters:
            # Taken out first: a callback may ask for another wait meanwhile.
            complete = self._complete
            self._waiters = collections.deque()
            if waiters[-1][0] <= durable:
                for _, waiter in waiters:
                    complete(waiter, None)
            else:
                still = collections.deque()
                for offset, waiter in waiters:
                    if offset <= durable:
                        complete(waiter, None)
                    else:
                        still.append((offset, waiter))
                still.extend(self._waiters)
                self._waiters = still
        if self._waiters and self._tablet.closed:
            # Deleted (or closed on a failing disk) with appends not made durable: no flush
            # will cover them, so their waits fail instead of waiting forever.
            self._fail_waiters(StorageError(f"the log of {self._tablet.directory} was closed before "
                                            f"offset {self._waiters[-1][0]} was durable"))
            return
        if self._running is None and self._tablet.log_end_offset > self.durable_offset and (
                self._waiters or self._tablet.config.flush_policy is FlushPolicy.ACK):
            # Appends that came in during this flush: the next group starts now.
            self._start()
        elif self._waiters:
            self._start_for(self._waiters[-1][0])


class Bucket:
    """One partition of a table: its log tablet, its durability and its waiting readers."""

    def __init__(self, table: "Table", index: int, tablet: LogTablet, io_executor: Executor):
        self.table = table
        self.index = index
        self.tablet = tablet
        self.group_commit = GroupCommit(tablet, io_executor, self._wake_readers)
        self._data_arrived = asyncio.Event()
        # The first offset of the remote log when the bucket has one (set by the remote log
        # manager from the committed manifest); None: everything is local.
        self.remote_log_start: int | None = None
        if table.remote_storage_enabled:
            # Nothing local may go before it is remote: the remote log manager moves this
            # limit to the committed remote end.
            tablet.retention_limit_offset = tablet.log_start_offset
        tablet.start_leader_epoch(self.leader_epoch)

    # A single-node broker is the only leader a bucket ever has: its epoch stays 0.
    leader_epoch = 0
    # What Kafka fetches sent of this bucket, for the metrics (bytes in: the log tablet's),
    # and what table API scans sent.
    bytes_out = 0
    records_out = 0
    scan_records_out = 0
    scan_bytes_out = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.table.name, self.index)

    @property
    def log_start_offset(self) -> int:
        """The bucket's log start as Kafka clients see it: the remote one when data is tiered."""
        local = self.tablet.log_start_offset
        remote = self.remote_log_start
        return local if remote is None else min(remote, local)

    def append(self, records: pa.RecordBatch, meta: BatchMeta, *, coalesce: bool = False) -> BatchMeta:
        """Append a batch. ``coalesce`` (a small batch whose answer waits for its fsync, under
        flush policy ``ack``): written together with the others of the same flush window,
        as one message, just before that flush."""
        if self.table.compacted and hasattr(records, "convert_together"):
            records = records.convert_together([records])
        if self.table.compacted and records.column("_key").null_count:
            keyless = np.flatnonzero(records.column("_key").is_null().to_numpy(zero_copy_only=False))
            message = (f"Compacted topic cannot accept message without key in topic partition "
                       f"{self.table.name}-{self.index}.")
            raise InvalidRecordError(message, record_errors=[(int(i), message) for i in keyless])
        ack = self.tablet.config.flush_policy is FlushPolicy.ACK
        written = self.tablet.append(records, meta, leader_epoch=self.leader_epoch,
                                     coalesce=coalesce and ack)
        if ack:
            # Readers see it once fsynced: the group commit wakes them then.
            self.group_commit.request()
        else:
            self._wake_readers()
        return written

    def appended_off_loop(self) -> None:
        """Called on the event loop after a batch was appended to the tablet from another
        thread (a large produce batch, `LogTable.append_in_thread`): what ``append`` does
        after its tablet append."""
        if self.tablet.config.flush_policy is FlushPolicy.ACK:
            self.group_commit.request()
        else:
            self._wake_readers()

    def _wake_readers(self) -> None:
        # Wake long-polling fetches and follows, then arm a fresh event for the next ones.
        self._data_arrived.set()
        self._data_arrived = asyncio.Event()

    def data_arrived(self) -> asyncio.Event:
        """Set when more records become visible to readers (appended, or under flush policy
        ``ack`` made durable)."""
        return self._data_arrived


@dataclass
class Table:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    created_ms: int
    buckets: list[Bucket] = field(default_factory=list)
    # How Kafka values map to stored columns: RAW, or a typed (Avro/JSON) format
    # attached by the registry service.
    value_format: object = kafka_batches.RAW
    # Topic config defaults the broker's own settings give (e.g. remote.storage.enable).
    broker_defaults: dict[str, str] = field(default_factory=dict)
    # What the handlers call to write, read and describe it (broker/table_kind.py): a log
    # table's unless the primary-key service attaches its own when the table opens.
    kind: TableKind = LOG_TABLE

    def config(self, name: str) -> str:
        value = self.configs.get(name)
        if value is None:
            value = self.broker_defaults.get(name, TOPIC_CONFIGS[name].default)
        return value

    @property
    def remote_storage_enabled(self) -> bool:
        # A compacted table stays local (as in Kafka): the broker-wide default does not apply to it.
        return config_flag(self.config("remote.storage.enable")) and not self.compacted

    @property
    def compacted(self) -> bool:
        """cleanup.policy holds `compact`: the log keeps the latest record of each key."""
        return "compact" in cleanup_policies(self.config("cleanup.policy"))

    def fixed_buckets_reason(self) -> str | None:
        """Why the bucket count must not change, or None. Log tables may grow; tables whose
        rows are placed by hashing their key (primary-key tables) may not."""
        if self.configs.get("fluvial.primary.key"):
            return "rows are placed in buckets by the hash of their primary key"
        return None

    def bucket(self, index: int) -> Bucket:
        if not 0 <= index < len(self.buckets):
            raise UnknownTableError(f"Table {self.name} has no bucket {index}")
        return self.buckets[index]


def broker_topic_defaults(broker: BrokerConfig) -> dict[str, str]:
    remote = {"remote.storage.enable": "true"} if broker.remote_storage_enable else {}
    return {**broker.topic_defaults, **remote}


def log_config_for(table_configs: dict[str, str], broker: BrokerConfig) -> LogConfig:
    def get(name: str) -> int:
        return int(table_configs.get(name, TOPIC_CONFIGS[name].default))

    retention_ms, retention_bytes = get("retention.ms"), get("retention.bytes")
    policies = cleanup_policies(table_configs.get("cleanup.policy", TOPIC_CONFIGS["cleanup.policy"].default))
    remote = "compact" not in policies and config_flag(table_configs.get(
        "remote.storage.enable", broker_topic_defaults(broker).get(
            "remote.storage.enable", TOPIC_CONFIGS["remote.storage.enable"].default)))
    if remote:
        # The local tablet keeps copies for local.retention.*; retention.* covers the whole
        # log and is enforced on the remote log by the remote log manager.
        local_ms, local_bytes = get("local.retention.ms"), get("local.retention.bytes")
        retention_ms = retention_ms if local_ms == -2 else local_ms
        retention_bytes = retention_bytes if local_bytes == -2 else local_bytes
    segment_ms = get("segment.ms")
    if "compact" in policies:
        # A record must become cleanable within max.compaction.lag.ms: the active segment rolls by then.
        segment_ms = min(segment_ms, get("max.compaction.lag.ms"))
    if "delete" not in policies:
        retention_ms, retention_bytes = -1, -1  # compact only: records go by compaction alone
    return LogConfig(
        segment_bytes=get("segment.bytes"),
        segment_ms=segment_ms,
        segment_index_bytes=get("segment.index.bytes"),
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        index_interval_bytes=get("index.interval.bytes"),
        flush_policy=FlushPolicy(broker.flush_policy),
        flush_interval_ms=broker.flush_interval_ms,
        compression=table_configs.get("fluvial.storage.compression",
                                      TOPIC_CONFIGS["fluvial.storage.compression"].default),
    )


# The most buckets one table may have (Kafka's limit of partitions per request): each is a
# directory, open files and a few objects, so a typo of 2**30 must be refused, not attempted.
MAX_BUCKETS = 10_000


def check_bucket_growth(total: int) -> None:
    """CreatePartitions' limit, answered as Kafka's controller answers an oversized request."""
    if total > MAX_BUCKETS:
        raise FluvialError(f"Excessively large number of partitions per request: {total} requested, "
                           f"limit {MAX_BUCKETS}.", code=ErrorCode.POLICY_VIOLATION)


class TableManager:
    """Creates, opens, alters and deletes tables; finds buckets by name or topic id.

    The maps of tables belong to the event loop. Creating, growing, altering and deleting a
    table touch the disk (SQLite commits with fsync, bucket directories, checkpoint files,
    KV tablets): that work runs on the I/O executor, and only the finished table is
    published on the loop, so a 200-bucket table never holds up other clients. A name with
    a change in progress is reserved until the change is published.
    """

    def __init__(self, config: BrokerConfig, store: MetadataStore, io_executor: Executor):
        self.config = config
        self.store = store
        self.io_executor = io_executor
        self.log_dir = Path(config.data_dir) / "log"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.tables: dict[str, Table] = {}
        self.by_id: dict[uuid.UUID, Table] = {}
        # create_hooks(name, configs, validate_only) may refuse a table (raise) before it
        # exists; they run on the I/O executor and may block.
        self.create_hooks: list = []
        # open_hooks(table) run on the I/O executor for every table created or opened,
        # before it is visible; one may return a callable that publishes what it prepared,
        # run on the event loop when the table is published.
        self.open_hooks: list = []
        # delete_hooks(table) may refuse a deletion (raise), on the loop; deleted_hooks(table)
        # run on the loop after it and may return an awaitable (their own blocking work).
        self.delete_hooks: list = []
        self.deleted_hooks: list = []
        # Names with a creation or deletion in progress, and what finishes it.
        self._changing: dict[str, asyncio.Future] = {}
        # altered_hooks(table) run after a table's configs changed.
        self.altered_hooks: list = []
        store.ensure_schema(_DDL)

    def open_all(self) -> None:
        """Open every table at start-up, before any listener serves (blocking is fine here)."""
        started = time.perf_counter()
        tables = []
        for row in self.store.query("SELECT name, topic_id, buckets, configs, created_ms FROM tables"):
            table = Table(row["name"], uuid.UUID(row["topic_id"]), json.loads(row["configs"]), row["created_ms"],
                          broker_defaults=broker_topic_defaults(self.config))
            tables.append((table, row["buckets"]))
        jobs = [(table, i) for table, count in tables for i in range(count)]

        def open_tablet(job: tuple[Table, int]) -> LogTablet:
            table, i = job
            return LogTablet.open(self._bucket_dir(table.name, i), log_config_for(table.configs, self.config))

        # Buckets recover independently: opened in parallel on the I/O threads (file reads,
        # checksums and fsyncs release the GIL), about twice as fast with many buckets.
        progress = ProgressLog(log, "opening and recovering log tablets", len(jobs), "buckets")
        for (table, i), tablet in zip(jobs, self.io_executor.map(open_tablet, jobs)):
            table.buckets.append(Bucket(table, i, tablet, self.io_executor))
            progress.advance()
        for table, _ in tables:
            self._publish(table, self._prepare_open(table))
        log.info("opened %d tables (%d buckets) in %.3f s", len(self.tables), len(jobs), time.perf_counter() - started)

    def _bucket_dir(self, name: str, index: int) -> Path:
        return self.log_dir / f"{name}-{index}"

    def _open_bucket(self, table: Table, index: int) -> Bucket:
        tablet = LogTablet.open(self._bucket_dir(table.name, index), log_config_for(table.configs, self.config))
        return Bucket(table, index, tablet, self.io_executor)

    def _prepare_open(self, table: Table) -> list:
        """Run the open hooks (blocking); returns their publishers for the loop."""
        return [p for p in (hook(table) for hook in self.open_hooks) if p is not None]

    def _publish(self, table: Table, publishers: list) -> None:
        for publish in publishers:
            publish()
        self.tables[table.name] = table
        self.by_id[table.topic_id] = table

    async def _off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.io_executor, fn, *args)

    def _reserve(self, name: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._changing[name] = future
        return future

    def _release(self, name: str, future: asyncio.Future) -> None:
        if self._changing.get(name) is future:
            del self._changing[name]
        if not future.done():
            future.set_result(None)

    def get(self, name: str) -> Table:
        table = self.tables.get(name)
        if table is None:
            raise UnknownTableError(f"Unknown table {name!r}")
        return table

    def get_by_id(self, topic_id: uuid.UUID) -> Table:
        table = self.by_id.get(topic_id)
        if table is None:
            raise UnknownTableError(f"Unknown topic id {topic_id}")
        return table

    async def create(self, name: str, buckets: int, configs: dict[str, str | None] | None = None,
                     *, validate_only: bool = False) -> Table:
        validate_table_name(name)
        if name in self.tables:
            raise TableExistsError(f"Topic '{name}' already exists.")
        if name in self._changing:
            raise TableExistsError(f"Topic '{name}' is being created or deleted.")
        if buckets <= 0:
            raise InvalidPartitionsError(f"Number of partitions must be larger than 0, got {buckets}")
        if buckets > MAX_BUCKETS:
            raise InvalidPartitionsError(f"Number of partitions {buckets} is above the limit of {MAX_BUCKETS}")
        overrides = validate_topic_configs(configs or {})
        check_flush_configs(overrides, self.config)
        table = Table(name, uuid.uuid4(), overrides, int(time.time() * 1000),
                      broker_defaults=broker_topic_defaults(self.config))
        reserved = self._reserve(name)
        try:
            publishers = await self._off_loop(self._create_on_disk, table, buckets, validate_only)
            if not validate_only:
                self._publish(table, publishers)
                log.info("created table %s with %d buckets", name, buckets)
        finally:
            self._release(name, reserved)
        return table

    def _create_on_disk(self, table: Table, buckets: int, validate_only: bool) -> list:
        """The blocking part of a creation: hooks, bucket directories, KV tablets, and last
        the metadata row, which is the commit point. Everything before it is undone when a
        step fails, so a refused creation leaves nothing behind (not even a registered
        schema), and a crash before the row is written leaves no table to reopen."""
        name = table.name
        undo: list[Callable[[], None]] = []
        try:
            for hook in self.create_hooks:
                # A hook may return what takes back its effect (a schema it registered).
                taken_back = hook(name, table.configs, validate_only)
                if callable(taken_back):
                    undo.append(taken_back)
            if validate_only:
                for step in reversed(undo):
                    step()
                return []
            # Stale directories of an earlier table of the same name must not leak in.
            for i in range(buckets):
                shutil.rmtree(self._bucket_dir(name, i), ignore_errors=True)
            for i in range(buckets):
                table.buckets.append(self._open_bucket(table, i))
            publishers = self._prepare_open(table)
            with self.store.transaction() as conn:
                conn.execute("INSERT INTO tables (name, topic_id, buckets, configs, created_ms) "
                             "VALUES (?, ?, ?, ?, ?)",
                             (name, str(table.topic_id), buckets, json.dumps(table.configs), table.created_ms))
            return publishers
        except BaseException as exc:
            for bucket in table.buckets:
                bucket.tablet.delete()
            table.buckets.clear()
            for step in reversed(undo):
                try:
                    step()
                except Exception:  # noqa: BLE001 - the creation's own error is the one to report
                    log.warning("could not take back part of the failed creation of %s", name, exc_info=True)
            if isinstance(exc, sqlite3.IntegrityError):
                raise TableExistsError(f"Topic '{name}' already exists.") from None
            raise

    async def _settled(self, name: str) -> None:
        """Wait for a change of `name` already under way (changes of one table never overlap)."""
        while (pending := self._changing.get(name)) is not None:
            await asyncio.shield(pending)

    async def get_or_create(self, name: str, buckets: int) -> Table:
        """Auto-creation: the table, created if needed; a creation already under way is awaited."""
        while True:
            table = self.tables.get(name)
            if table is not None:
                return table
            pending = self._changing.get(name)
            if pending is None:
                return await self.create(name, buckets)
            await asyncio.shield(pending)

    async def add_buckets(self, name: str, total: int) -> Table:
        check_bucket_growth(total)
        await self._settled(name)
        table = self.get(name)
        if total <= len(table.buckets):
            raise InvalidPartitionsError(
                f"Topic currently has {len(table.buckets)} partitions, {total} would not be an increase.")
        reserved = self._reserve(name)
        try:
            added = await self._off_loop(self._add_buckets_on_disk, table, len(table.buckets), total)
            if self.tables.get(name) is table:
                table.buckets = table.buckets + added
        finally:
            self._release(name, reserved)
        return table

    def _add_buckets_on_disk(self, table: Table, first: int, total: int) -> list[Bucket]:
        for i in range(first, total):
            shutil.rmtree(self._bucket_dir(table.name, i), ignore_errors=True)
        with self.store.transaction() as conn:
            conn.execute("UPDATE tables SET buckets = ? WHERE name = ?", (total, table.name))
        return [self._open_bucket(table, i) for i in range(first, total)]

    async def alter_configs(self, name: str, overrides: dict[str, str], *, validate_only: bool = False) -> Table:
        """Replace a table's config overrides (checked as a real change is, also when only validating)."""
        table = self.get(name)
        clean = validate_topic_configs(overrides)
        check_alterable(table.configs, clean)
        check_flush_configs(clean, self.config)
        if table.remote_storage_enabled and "compact" in cleanup_policies(clean.get("cleanup.policy", "delete")):
            raise InvalidConfigError(f"Table {name} tiers its segments to remote storage: it cannot become "
                                     f"compacted (remote log storage is not supported for compacted topics)")
        if validate_only:
            return table
        await self._off_loop(self._store_configs, name, clean)
        table.configs = clean
        for bucket in table.buckets:
            bucket.tablet.config = log_config_for(clean, self.config)
        for hook in self.altered_hooks:
            hook(table)
        return table

    def _store_configs(self, name: str, configs: dict[str, str]) -> None:
        with self.store.transaction() as conn:
            conn.execute("UPDATE tables SET configs = ? WHERE name = ?", (json.dumps(configs), name))

    async def delete(self, name: str) -> Table:
        await self._settled(name)
        table = self.get(name)
        for hook in self.delete_hooks:
            hook(table)
        reserved = self._reserve(name)
        try:
            # Gone for clients at once; back if the metadata row cannot be deleted.
            del self.tables[name]
            self.by_id.pop(table.topic_id, None)
            try:
                await self._off_loop(self._delete_row, name)
            except BaseException:
                self._publish(table, [])
                raise
            await self._off_loop(self._delete_files, table)
            for hook in self.deleted_hooks:
                pending = hook(table)
                if pending is not None:
                    await pending
        finally:
            self._release(name, reserved)
        log.info("deleted table %s", name)
        return table

    def _delete_row(self, name: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM tables WHERE name = ?", (name,))

    @staticmethod
    def _delete_files(table: Table) -> None:
        for bucket in table.buckets:
            bucket.tablet.delete()

    def all_buckets(self):
        for table in list(self.tables.values()):
            yield from table.buckets

    def close(self) -> None:
        for bucket in self.all_buckets():
            bucket.tablet.close()
