"""The broker process: owns the metadata store, the tables and the listeners."""
from __future__ import annotations

import asyncio
import gc
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fluvial.broker import handlers
from fluvial.broker.config import BrokerConfig, new_cluster_id
from fluvial.broker.metadata import MetadataStore
from fluvial.broker.server import KafkaServer
from fluvial.broker.tables import TableManager
from fluvial.broker.wire_cache import WireCache
from fluvial.security.acl_store import AclStore
from fluvial.security.authorizer import Authorizer
from fluvial.security.options import warn_if_open
from fluvial.security.users import UserStore
from fluvial.tiering.object_store import open_object_store
from fluvial.tiering.remote_log_manager import RemoteLogManager

log = logging.getLogger(__name__)

_DDL = "CREATE TABLE IF NOT EXISTS cluster (key TEXT PRIMARY KEY, value TEXT NOT NULL);"


class Broker:
    """A single-node Fluvial broker. `start()` opens storage and listens; `stop()` closes."""

    def __init__(self, config: BrokerConfig):
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = MetadataStore(self.data_dir / "metadata.db")
        self.store.ensure_schema(_DDL)
        self.cluster_id = self._cluster_id()
        # fsyncs wait on the disk: a few threads so one slow bucket does not hold others.
        self.io_executor = ThreadPoolExecutor(4, thread_name_prefix="fluvial-io")
        # Batch conversion and encoding: C code that releases the GIL where it can.
        self.cpu_executor = ThreadPoolExecutor(2, thread_name_prefix="fluvial-cpu")
        self.tables = TableManager(config, self.store, self.io_executor)
        self.wire_cache = WireCache(config.wire_cache_bytes)
        # Whichever path deletes a table (Kafka, table API), its cached batches go with it.
        self.tables.deleted_hooks.append(lambda table: self.wire_cache.drop_table(table.name))
        # Internal tiering: closed segments of tables with remote storage go to this store.
        self.object_store = open_object_store(config.object_store_url or (self.data_dir / "remote").absolute().as_uri(),
                                              config.object_store_options or None)
        self.remote_log = RemoteLogManager(self, self.object_store)
        # ACL decisions for every listener (always 'allowed' when the authorizer is off).
        self.authorizer = Authorizer(config.security)
        # Users and their SCRAM credentials (SASL on the Kafka listener, basic auth elsewhere).
        self.users = UserStore.in_data_dir(self.data_dir)
        if not self.users.hold_lock():
            log.warning("another process holds %s.lock: user changes made there and here may overwrite "
                        "each other", self.users.path.with_suffix(""))
        # The ACLs, durable in the data directory (loaded into the authorizer here).
        self.acl_store = AclStore(self.data_dir, self.authorizer, self.io_executor)
        self.kafka = KafkaServer(self)
        self.kafka_port: int | None = None
        self._background: list[asyncio.Task] = []
        self.started_ms = int(time.time() * 1000)
        self.extensions: dict[str, object] = {}
        # Ports of the other listeners, filled by their start hooks ("http_port", "flight_port").
        self.ports: dict[str, int] = {}
        # Services first, so their start hooks run in SERVICES order before any a handler adds.
        load_services()
        handlers.load_all()

    def _cluster_id(self) -> str:
        rows = self.store.query("SELECT value FROM cluster WHERE key = 'cluster_id'")
        if rows:
            return rows[0]["value"]
        cid = new_cluster_id()
        with self.store.transaction() as conn:
            conn.execute("INSERT INTO cluster (key, value) VALUES ('cluster_id', ?)", (cid,))
        return cid

    async def start(self) -> None:
        raise_open_files_limit()
        warn_without_compiled_codec()
        self.tables.open_all()
        if self.config.security.bootstrap_users:
            await asyncio.get_running_loop().run_in_executor(self.io_executor, self.users.bootstrap,
                                                             self.config.security.bootstrap_users)
        for hook in _START_HOOKS:
            await hook(self)
        self.kafka_port = await self.kafka.start(self.config.host, self.config.kafka_port)
        warn_if_open(self.config.host, self.config.security)
        self._background.append(asyncio.create_task(self._retention_loop(), name="retention"))
        self._background.append(asyncio.create_task(self.remote_log.run(), name="remote-log"))
        if self.config.flush_policy == "interval":
            self._background.append(asyncio.create_task(self._flush_loop(), name="interval-flush"))
        settle_garbage_collector()
        log.info("fluvial broker listening for Kafka clients on %s:%d (data in %s)",
                 self.config.host, self.kafka_port, self.data_dir)

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.kafka.stop()
        for hook in _STOP_HOOKS:
            await hook(self)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.io_executor, self._flush_all)
        self.remote_log.close()
        self.tables.close()
        self.io_executor.shutdown(wait=True)
        self.cpu_executor.shutdown(wait=True)
        self.store.close()
        self.users.release_lock()
        log.info("fluvial broker stopped")

    def _flush_all(self) -> None:
        for bucket in self.tables.all_buckets():
            if bucket.tablet.failure is not None:
                continue  # offline: logged when it failed; recovery decides on the next start
            try:
                bucket.tablet.flush()
            except Exception as exc:
                # An offline bucket or a full disk: what is on disk is recovered on the next start.
                log.error("flushing %s-%d at shutdown failed: %s", bucket.table.name, bucket.index, exc)

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.config.flush_interval_ms / 1000)
            await loop.run_in_executor(self.io_executor, self._flush_due)

    def _flush_due(self) -> None:
        for bucket in self.tables.all_buckets():
            bucket.tablet.maybe_flush()

    async def _retention_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.config.retention_check_interval_ms / 1000)
            now = int(time.time() * 1000)
            for bucket in list(self.tables.all_buckets()):
                try:
                    await loop.run_in_executor(self.io_executor, bucket.tablet.enforce_retention, now)
                except Exception:
                    log.exception("retention of %s-%d failed", bucket.table.name, bucket.index)


def warn_without_compiled_codec() -> None:
    """Say it once, loudly, when the record codec runs in pure Python: the broker works, but
    producing and fetching cost several times the CPU (see docs/architecture.md)."""
    from fluvial.protocol import records

    if not records.HAS_NATIVE:
        log.warning("the compiled record codec (fluvial.protocol._records) is not loaded (%s): records are "
                    "encoded and decoded in pure Python, several times slower. Build it with a C compiler: "
                    "pip install -e . (or pip install .) in the source checkout.", records.NATIVE_IMPORT_ERROR)


def raise_open_files_limit() -> int:
    """Raise the soft limit of open files to the hard limit; returns the new soft limit.

    Every connection and every segment, index and KV file is a file descriptor; the usual
    soft limit of 1,024 would refuse clients long before memory or CPU run out.
    """
    try:
        import resource
    except ImportError:  # not a POSIX system
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, hard, exc)
    elif hard == resource.RLIM_INFINITY and soft < 1 << 20:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (1 << 20, hard))
            soft = 1 << 20
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d: %s", soft, exc)
    log.info("open files limit: %d", soft)
    return soft


# Young-generation size: requests allocate many short-lived message objects; collecting
# every 700 allocations (the default) costs more than the little garbage it finds.
GC_YOUNG_THRESHOLD = 20_000
_gc_settled = False


def settle_garbage_collector() -> None:
    """Keep full collections off the event loop's latency.

    Startup leaves ~120k long-lived objects (modules, classes, message schemas); each full
    collection would walk them all, a pause of tens of milliseconds (hundreds on a busy
    machine) in the middle of serving. Freezing them once after startup takes them out of
    every later collection. Once per process: a process running several brokers (tests)
    freezes only what the first start left.
    """
    global _gc_settled
    if _gc_settled:
        return
    _gc_settled = True
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


# Services beside the Kafka listener; each registers its start/stop hooks on import.
SERVICES = ["fluvial.broker.metrics", "fluvial.broker.registry_service", "fluvial.broker.console", "fluvial.kv.pk_tables", "fluvial.broker.flight",
            "fluvial.tiering.lake.service", "fluvial.broker.log_cleaner"]


def load_services() -> None:
    import importlib
    for name in SERVICES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


# Later parts (registry, groups, Flight) add start/stop hooks without the broker
# importing them: `on_start(fn)` where fn is `async def fn(broker)`.
_START_HOOKS: list = []
_STOP_HOOKS: list = []
# Routes on the HTTP listener beside the schema registry (metrics, console):
# `fn(broker, app)` adds them to the aiohttp application before it starts serving.
_HTTP_APP_HOOKS: list = []


def on_start(fn):
    _START_HOOKS.append(fn)
    return fn


def on_stop(fn):
    _STOP_HOOKS.append(fn)
    return fn


def on_http_app(fn):
    _HTTP_APP_HOOKS.append(fn)
    return fn


def configure_http_app(broker: "Broker", app) -> None:
    for hook in _HTTP_APP_HOOKS:
        hook(broker, app)
