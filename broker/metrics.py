"""Prometheus metrics at `/metrics` on the broker's HTTP listener.

One custom collector reads the broker's current state when scraped (offsets, sizes,
lags, counters the hot paths keep as plain integers), so serving Kafka clients costs no
metric objects and no locks. The scrape itself runs on a worker thread: RocksDB
properties and the lake state row are read there, never on the event loop.
Names follow Prometheus conventions (`fluvial_` prefix, base units, `_total` counters);
docs/operations.md lists them.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from fluvial.broker import status
from fluvial.broker.broker import on_http_app, on_start, on_stop
from fluvial.broker.handlers.fetch import prepared_reads_counts
from fluvial.broker.latency import FSYNC_LATENCY, LOOP_LAG_BOUNDS, LatencyStats
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey

if TYPE_CHECKING:
    from fluvial.broker.broker import Broker

log = logging.getLogger(__name__)

# The loop-lag probe's period: a timer due every 250 ms reports how late it fired.
LOOP_PROBE_INTERVAL_S = 0.25


def api_name(key: int) -> str:
    try:
        return ApiKey(key).name.lower()
    except ValueError:
        return "unknown"   # RequestStats counts every key that names no API under one


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.lower()
    except ValueError:
        return str(code)


def _histogram(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _add_histogram(family: HistogramMetricFamily, values: list[str], stats: LatencyStats) -> None:
    family.add_metric(values, stats.cumulative(), stats.total)


class LoopLagProbe:
    """How late the event loop runs a timer: the lag every callback and client waits."""

    def __init__(self) -> None:
        self.stats = LatencyStats(LOOP_LAG_BOUNDS)
        self.last = 0.0
        self.max_recent = 0.0  # the largest lag since the history last sampled it

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LOOP_PROBE_INTERVAL_S
            await asyncio.sleep(LOOP_PROBE_INTERVAL_S)
            lag = max(0.0, loop.time() - due)
            self.last = lag
            self.max_recent = max(self.max_recent, lag)
            self.stats.observe(lag)


class BrokerCollector:
    """Every fluvial_* metric, read from the broker's state at scrape time."""

    def __init__(self, broker: "Broker", loop_lag: LoopLagProbe):
        self.broker = broker
        self.loop_lag = loop_lag

    def collect(self) -> Iterable[Metric]:
        yield from self._requests()
        yield from self._buckets()
        yield from self._groups()
        yield from self._kv()
        yield from self._lake()
        yield from self._broker()

    def _requests(self) -> Iterable[Metric]:
        stats = self.broker.kafka.request_stats
        requests = CounterMetricFamily("fluvial_kafka_requests", "Kafka requests answered, per API.", labels=["api"])
        latency = _histogram("fluvial_kafka_request_duration_seconds",
                             "Time from reading a Kafka request to its response being ready (fsync and "
                             "long-poll waits included), per API.", ["api"])
        for key, s in sorted(dict(stats.latency).items()):
            requests.add_metric([api_name(key)], s.count)
            _add_histogram(latency, [api_name(key)], s)
        failed = CounterMetricFamily("fluvial_kafka_request_failures",
                                     "Kafka requests that could not be answered (the connection was closed), "
                                     "per API.", labels=["api"])
        for key, n in sorted(dict(stats.failures).items()):
            failed.add_metric([api_name(key)], n)
        errors = CounterMetricFamily("fluvial_kafka_response_errors",
                                     "Partition error codes in Produce and Fetch responses, per API and error.",
                                     labels=["api", "error"])
        for (key, code), n in sorted(dict(stats.error_codes).items()):
            errors.add_metric([api_name(key), error_name(code)], n)
        yield from (requests, latency, failed, errors)
        connections = GaugeMetricFamily("fluvial_kafka_connections", "Open Kafka client connections.")
        connections.add_metric([], self.broker.kafka.connection_count)
        idle = CounterMetricFamily("fluvial_kafka_idle_connections_closed",
                                   "Connections closed for being idle longer than connections.max.idle.ms.")
        idle.add_metric([], self.broker.kafka.idle_closed)
        yield from (connections, idle)
        auth = CounterMetricFamily("fluvial_kafka_sasl_authentications",
                                   "SASL authentications on the Kafka listener by mechanism and outcome "
                                   "(authenticated, reauthenticated, failed).", labels=["mechanism", "outcome"])
        for (mechanism, outcome), n in sorted(self.broker.kafka.auth_counts.items()):
            auth.add_metric([mechanism, outcome], n)
        tls_failed = CounterMetricFamily("fluvial_kafka_tls_handshake_failures",
                                         "TLS handshakes on the Kafka listener that failed or timed out.")
        tls_failed.add_metric([], self.broker.kafka.tls_handshake_failures)
        yield from (auth, tls_failed)
        started, used = prepared_reads_counts(self.broker)
        ahead = CounterMetricFamily("fluvial_fetch_reads_ahead",
                                    "Large fetches of a table's segments that read the next batches ahead while "
                                    "their response travelled (started), and next fetches answered with such a "
                                    "read (used).",
                                    labels=["outcome"])
        ahead.add_metric(["started"], started)
        ahead.add_metric(["used"], used)
        yield ahead
        fsync = _histogram("fluvial_log_fsync_duration_seconds",
                           "Duration of one log tablet flush (fsync of its segments and directories).", [])
        _add_histogram(fsync, [], FSYNC_LATENCY)
        lag = _histogram("fluvial_event_loop_lag_seconds",
                         "How late the event loop ran a timer due every 250 ms.", [])
        _add_histogram(lag, [], self.loop_lag.stats)
        last = GaugeMetricFamily("fluvial_event_loop_lag_last_seconds", "The event loop's most recent timer lag.")
        last.add_metric([], self.loop_lag.last)
        yield from (fsync, lag, last)

    def _buckets(self) -> Iterable[Metric]:
        labels = ["table", "bucket"]
        g = {name: GaugeMetricFamily(f"fluvial_bucket_{name}", doc, labels=labels) for name, doc in (
            ("log_start_offset", "First offset a Kafka client can read (remote or local)."),
            ("local_log_start_offset", "First offset in the local log."),
            ("log_end_offset", "Offset the next appended record gets."),
            ("high_watermark", "End of what readers see: the durable (fsynced) end under flush policy ack."),
            ("online", "1 while the bucket serves, 0 after a write or fsync failure took it offline."),
        )}
        segments = GaugeMetricFamily("fluvial_bucket_segments", "Log segments per bucket and tier.",
                                     labels=[*labels, "tier"])
        size = GaugeMetricFamily("fluvial_bucket_size_bytes", "Bytes of log segments per bucket and tier.",
                                 labels=[*labels, "tier"])
        tiering_lag = GaugeMetricFamily("fluvial_remote_log_lag_records",
                                        "Records below the high watermark not yet in the remote log "
                                        "(tables with remote storage).", labels=labels)
        failures = GaugeMetricFamily("fluvial_remote_log_upload_failures",
                                     "Consecutive failed uploads of a bucket's segments.", labels=labels)
        per_table = {name: CounterMetricFamily(f"fluvial_table_{name}", doc, labels=["table"]) for name, doc in (
            ("records_in", "Records appended to the table's log since the broker started."),
            ("bytes_in", "Bytes appended to the table's log (stored Arrow IPC) since the broker started."),
            ("records_out", "Records sent to Kafka consumers since the broker started."),
            ("bytes_out", "Bytes of record batches sent to Kafka consumers since the broker started."),
            ("scan_records_out", "Rows sent by table API (Arrow Flight) scans since the broker started."),
            ("scan_bytes_out", "Bytes of Arrow batches sent by table API scans since the broker started."),
        )}
        for table in status.tables(self.broker):
            totals = dict.fromkeys(per_table, 0)
            for bucket in list(table.buckets):
                s = status.bucket_status(self.broker, bucket)
                values = [table.name, str(bucket.index)]
                g["log_start_offset"].add_metric(values, s["log_start_offset"])
                g["local_log_start_offset"].add_metric(values, s["local_start_offset"])
                g["log_end_offset"].add_metric(values, s["log_end_offset"])
                g["high_watermark"].add_metric(values, s["high_watermark"])
                g["online"].add_metric(values, 1 if s["online"] else 0)
                segments.add_metric([*values, "local"], s["segments"])
                size.add_metric([*values, "local"], s["bytes"])
                remote = s["remote"]
                if remote is not None:
                    segments.add_metric([*values, "remote"], remote["segments"])
                    size.add_metric([*values, "remote"], remote["bytes"])
                    tiering_lag.add_metric(values, s["tiering_lag"])
                    failures.add_metric(values, remote["upload_failures"])
                for name in totals:
                    totals[name] += s[name]
            for name, family in per_table.items():
                family.add_metric([table.name], totals[name])
        yield from g.values()
        yield from (segments, size, tiering_lag, failures)
        yield from per_table.values()

    def _groups(self) -> Iterable[Metric]:
        labels = ["group", "table", "bucket"]
        committed = GaugeMetricFamily("fluvial_consumer_group_committed_offset",
                                      "A group's committed offset per bucket.", labels=labels)
        lag = GaugeMetricFamily("fluvial_consumer_group_lag_records",
                                "High watermark minus the group's committed offset, per bucket.", labels=labels)
        for p in status.group_lags(self.broker):
            values = [p.group, p.table, str(p.bucket)]
            committed.add_metric(values, p.committed)
            lag.add_metric(values, p.lag)
        members = GaugeMetricFamily("fluvial_consumer_group_members", "Members of each consumer group.",
                                    labels=["group", "state"])
        for g in status.groups(self.broker):
            members.add_metric([g["group"], g["state"]], len(g["members"]))
        yield from (committed, lag, members)

    def _kv(self) -> Iterable[Metric]:
        labels = ["table", "bucket", "merge_engine"]
        keys = GaugeMetricFamily("fluvial_kv_tablet_keys", "Estimated rows (keys) in a KV tablet (RocksDB).",
                                 labels=labels)
        size = GaugeMetricFamily("fluvial_kv_tablet_size_bytes",
                                 "Merge-engine state of a KV tablet: RocksDB SST files and memtables.",
                                 labels=[*labels, "part"])
        applied = GaugeMetricFamily("fluvial_kv_tablet_applied_offset",
                                    "Changelog offset up to which the KV tablet has applied rows.", labels=labels)
        lookups = CounterMetricFamily("fluvial_kv_lookups", "Primary-key lookup requests per table.",
                                      labels=["table"])
        lookup_keys = CounterMetricFamily("fluvial_kv_lookup_keys", "Keys asked for by primary-key lookups.",
                                          labels=["table"])
        for table in status.tables(self.broker):
            buckets = status.kv_status(table)
            if buckets is None:
                continue
            for b in buckets:
                values = [table.name, str(b["bucket"]), b["engine"]]
                keys.add_metric(values, b["keys"])
                size.add_metric([*values, "sst"], b["sst_bytes"])
                size.add_metric([*values, "memtable"], b["memtable_bytes"])
                applied.add_metric(values, b["applied_offset"])
            lookups.add_metric([table.name], table.pk.lookups)
            lookup_keys.add_metric([table.name], table.pk.lookup_keys)
        yield from (keys, size, applied, lookups, lookup_keys)

    def _lake(self) -> Iterable[Metric]:
        lag = GaugeMetricFamily("fluvial_lake_lag_records", "Records of a lake table not yet in the lake.",
                                labels=["table"])
        lag_s = GaugeMetricFamily("fluvial_lake_lag_seconds",
                                  "Age of the newest lake snapshot while records wait to be tiered (0: caught up).",
                                  labels=["table"])
        rounds = CounterMetricFamily("fluvial_lake_tiering_rounds", "Lake tiering rounds committed.",
                                     labels=["table"])
        for table in status.tables(self.broker):
            try:
                lake = status.lake_status(self.broker, table)
            except Exception as exc:  # noqa: BLE001 - a table dropped during the scrape
                log.debug("lake status of %s: %s", table.name, exc)
                continue
            if lake is None:
                continue
            lag.add_metric([table.name], lake["lag_records"])
            lag_s.add_metric([table.name], lake["lag_seconds"])
            rounds.add_metric([table.name], lake["rounds"])
        yield from (lag, lag_s, rounds)

    def _broker(self) -> Iterable[Metric]:
        tables = GaugeMetricFamily("fluvial_tables", "Tables (topics) on the broker.")
        tables.add_metric([], len(self.broker.tables.tables))
        started = GaugeMetricFamily("fluvial_broker_start_time_seconds", "When the broker started (Unix time).")
        started.add_metric([], self.broker.started_ms / 1000)
        yield from (tables, started)


class BrokerMetrics:
    """The broker's metrics registry, its loop-lag probe and its metrics history."""

    def __init__(self, broker: "Broker"):
        from fluvial.broker.metrics_history import MetricsHistory
        self.broker = broker
        self.loop_lag = LoopLagProbe()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(broker, self.loop_lag))
        # process_* (memory, CPU, open files), python_gc_*, python_info.
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.history = MetricsHistory(broker, self.loop_lag, broker.config.metrics_sample_interval_ms / 1000)
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self.loop_lag.run(), name="loop-lag-probe"),
                       asyncio.create_task(self.history.run(), name="metrics-history")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def exposition(self) -> bytes:
        # Off the loop: the collector reads RocksDB properties and SQLite state rows.
        started = time.perf_counter()
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, self.registry)
        log.debug("metrics scrape: %d bytes in %.1f ms", len(body), (time.perf_counter() - started) * 1000)
        return body


async def serve_metrics(request: web.Request) -> web.Response:
    metrics: BrokerMetrics = request.app[METRICS_KEY]
    body = await metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


METRICS_KEY = web.AppKey("metrics", BrokerMetrics)


@on_start
async def start_metrics(broker: "Broker") -> None:
    metrics = BrokerMetrics(broker)
    broker.extensions["metrics"] = metrics
    metrics.start()


@on_http_app
def add_metrics_route(broker: "Broker", app: web.Application) -> None:
    app[METRICS_KEY] = broker.extensions["metrics"]
    app.router.add_get("/metrics", serve_metrics)


@on_stop
async def stop_metrics(broker: "Broker") -> None:
    metrics = broker.extensions.get("metrics")
    if metrics is not None:
        await metrics.stop()
