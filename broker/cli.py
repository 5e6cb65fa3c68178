"""The `fluvial` command: `fluvial broker ...` runs the broker; other subcommands are tools."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from pathlib import Path

from fluvial.broker import event_loop
from fluvial.broker.config import BrokerConfig
from fluvial.broker.malloc_settings import keep_freed_memory
from fluvial.client.grpc_io import inline_io
from fluvial.errors import BrokerStartError
from fluvial.security.options import add_security_arguments, expand_config_file, security_from_args


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
                 "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)


def add_broker_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("broker", help="run the broker")
    d = BrokerConfig()
    p.add_argument("--data-dir", type=Path, default=d.data_dir)
    p.add_argument("--host", default=d.host)
    p.add_argument("--kafka-port", type=int, default=d.kafka_port)
    p.add_argument("--http-port", type=int, default=d.http_port, help="schema registry (HTTP) port; 0 = any free port")
    p.add_argument("--flight-port", type=int, default=d.flight_port, help="table API (Arrow Flight) port; 0 = any free port")
    p.add_argument("--advertised-host", default=None, help="host name given to clients (default: --host)")
    p.add_argument("--node-id", type=int, default=d.node_id)
    p.add_argument("--auto-create-topics", choices=["true", "false"], default="true")
    p.add_argument("--default-partitions", type=int, default=d.default_partitions)
    p.add_argument("--max-request-bytes", type=int, default=d.max_request_bytes)
    p.add_argument("--connections-max-idle-ms", type=int, default=d.connections_max_idle_ms,
                   help="close connections idle for this long (Kafka's connections.max.idle.ms)")
    p.add_argument("--slow-callback-ms", type=int, default=d.slow_callback_ms,
                   help="diagnostics: log every event-loop step longer than this, naming it (asyncio debug "
                        "mode, slower); 0 = off")
    p.add_argument("--event-loop", choices=["auto", "uvloop", "asyncio"], default=d.event_loop,
                   help="the broker's event loop: asyncio's (default) or uvloop's (libuv, in C); "
                        "auto = uvloop when installed and no listener uses TLS")
    p.add_argument("--kafka-io", choices=["thread", "asyncio"], default=d.kafka_io,
                   help="PLAINTEXT Kafka listener's socket I/O: thread = a compiled I/O thread (default; "
                        "asyncio when not built), asyncio = the event loop's transports")
    p.add_argument("--flush-policy", choices=["ack", "interval", "none"], default=d.flush_policy,
                   help="ack: acks=all produce is fsynced before acknowledged (default); interval: every "
                        "--flush-interval-ms; none: left to the OS, like Kafka's default")
    p.add_argument("--flush-interval-ms", type=int, default=d.flush_interval_ms)
    p.add_argument("--fetch-read-ahead", choices=["on", "off"], default="on" if d.fetch_read_ahead else "off",
                   help="on: a large fetch of a raw table's segments reads the next batches while its "
                        "response travels, for the consumer's next fetch (default); off: each fetch reads "
                        "for itself")
    p.add_argument("--retention-check-interval-ms", type=int, default=d.retention_check_interval_ms)
    p.add_argument("--log-cleaner-backoff-ms", type=int, default=d.log_cleaner_backoff_ms,
                   help="how often compacted tables are checked for cleaning (Kafka's log.cleaner.backoff.ms)")
    p.add_argument("--group-initial-rebalance-delay-ms", type=int, default=d.group_initial_rebalance_delay_ms)
    p.add_argument("--group-min-session-timeout-ms", type=int, default=d.group_min_session_timeout_ms)
    p.add_argument("--group-max-session-timeout-ms", type=int, default=d.group_max_session_timeout_ms)
    p.add_argument("--group-consumer-session-timeout-ms", type=int, default=d.group_consumer_session_timeout_ms)
    p.add_argument("--group-consumer-heartbeat-interval-ms", type=int, default=d.group_consumer_heartbeat_interval_ms)
    p.add_argument("--group-consumer-assignors", default=d.group_consumer_assignors,
                   help="server-side assignors of consumer groups, the first is the default (uniform,range)")
    p.add_argument("--group-share-session-timeout-ms", type=int, default=d.group_share_session_timeout_ms)
    p.add_argument("--group-share-heartbeat-interval-ms", type=int, default=d.group_share_heartbeat_interval_ms)
    p.add_argument("--group-share-record-lock-duration-ms", type=int,
                   default=d.group_share_record_lock_duration_ms)
    p.add_argument("--group-share-delivery-count-limit", type=int, default=d.group_share_delivery_count_limit)
    p.add_argument("--share-auto-offset-reset", choices=("latest", "earliest"), default=d.share_auto_offset_reset,
                   help="where a share group starts reading a partition it has not read before")
    p.add_argument("--offsets-retention-minutes", type=int, default=d.offsets_retention_minutes)
    p.add_argument("--transaction-max-timeout-ms", type=int, default=d.transaction_max_timeout_ms)
    p.add_argument("--transactional-id-expiration-ms", type=int, default=d.transactional_id_expiration_ms)
    p.add_argument("--lake-catalog-option", action="append", default=[], metavar="K=V",
                   help="pyiceberg catalog property of the lake (repeatable), e.g. type=rest, uri=...; "
                        "default: an SQLite catalog and a warehouse folder under <data-dir>/lake")
    p.add_argument("--lake-tiering", action="store_true",
                   help="tier lake tables inside the broker (no Spark job needed on a single machine)")
    p.add_argument("--lake-lease-ms", type=int, default=d.lake_lease_ms,
                   help="how long a tiering job's lease lasts without a heartbeat")
    p.add_argument("--object-store", default=None,
                   help="where tiered data goes: file:///path or s3://bucket/prefix (default: <data-dir>/remote)")
    p.add_argument("--object-store-option", action="append", default=[], metavar="KEY=VALUE",
                   help="object store option (repeatable): endpoint_url, region, access_key_id, secret_access_key")
    p.add_argument("--remote-storage-enable", choices=["true", "false"], default="false",
                   help="default of the topic config remote.storage.enable")
    p.add_argument("--remote-log-manager-interval-ms", type=int, default=d.remote_log_manager_interval_ms)
    p.add_argument("--remote-upload-concurrency", type=int, default=d.remote_upload_concurrency)
    p.add_argument("--remote-read-cache-bytes", type=int, default=d.remote_read_cache_bytes)
    p.add_argument("--remote-fetch-max-wait-ms", type=int, default=d.remote_fetch_max_wait_ms,
                   help="longest a Fetch waits for remote data before answering the partition with no records")
    p.add_argument("--metrics-sample-interval-ms", type=int, default=d.metrics_sample_interval_ms,
                   help="how often the console's throughput and lag charts take a sample")
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-format", choices=["json", "text"], default="json")
    p.add_argument("--config", metavar="FILE",
                   help="Kafka-style properties file (key=value; every flag with dots, e.g. security.protocol); "
                        "flags given on the command line win")
    add_security_arguments(p)
    return p


def config_from_args(args, parser: argparse.ArgumentParser | None = None) -> BrokerConfig:
    return BrokerConfig(security=security_from_args(args, parser or argparse.ArgumentParser("fluvial broker")),
                        data_dir=args.data_dir, host=args.host, kafka_port=args.kafka_port,
                        http_port=args.http_port, flight_port=args.flight_port,
                        advertised_host=args.advertised_host, node_id=args.node_id,
                        auto_create_topics=args.auto_create_topics == "true",
                        default_partitions=args.default_partitions, max_request_bytes=args.max_request_bytes,
                        connections_max_idle_ms=args.connections_max_idle_ms,
                        slow_callback_ms=args.slow_callback_ms, event_loop=args.event_loop,
                        kafka_io=args.kafka_io,
                        flush_policy=args.flush_policy, flush_interval_ms=args.flush_interval_ms,
                        fetch_read_ahead=args.fetch_read_ahead == "on",
                        retention_check_interval_ms=args.retention_check_interval_ms,
                        log_cleaner_backoff_ms=args.log_cleaner_backoff_ms,
                        group_initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
                        group_min_session_timeout_ms=args.group_min_session_timeout_ms,
                        group_max_session_timeout_ms=args.group_max_session_timeout_ms,
                        group_consumer_session_timeout_ms=args.group_consumer_session_timeout_ms,
                        group_consumer_heartbeat_interval_ms=args.group_consumer_heartbeat_interval_ms,
                        group_consumer_assignors=args.group_consumer_assignors,
                        group_share_session_timeout_ms=args.group_share_session_timeout_ms,
                        group_share_heartbeat_interval_ms=args.group_share_heartbeat_interval_ms,
                        group_share_record_lock_duration_ms=args.group_share_record_lock_duration_ms,
                        group_share_delivery_count_limit=args.group_share_delivery_count_limit,
                        share_auto_offset_reset=args.share_auto_offset_reset,
                        offsets_retention_minutes=args.offsets_retention_minutes,
                        transaction_max_timeout_ms=args.transaction_max_timeout_ms,
                        transactional_id_expiration_ms=args.transactional_id_expiration_ms,
                        lake_catalog_options=key_values(args.lake_catalog_option, "--lake-catalog-option"),
                        lake_tiering=args.lake_tiering, lake_lease_ms=args.lake_lease_ms,
                        object_store_url=args.object_store,
                        object_store_options=key_values(args.object_store_option, "--object-store-option"),
                        remote_storage_enable=args.remote_storage_enable == "true",
                        remote_log_manager_interval_ms=args.remote_log_manager_interval_ms,
                        remote_upload_concurrency=args.remote_upload_concurrency,
                        remote_read_cache_bytes=args.remote_read_cache_bytes,
                        remote_fetch_max_wait_ms=args.remote_fetch_max_wait_ms,
                        metrics_sample_interval_ms=args.metrics_sample_interval_ms)


def key_values(items: list[str], option: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{option} takes K=V, not {item!r}")
        out[key.strip()] = value
    return out


async def run_broker(config: BrokerConfig) -> None:
    from fluvial.broker.broker import Broker

    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if config.slow_callback_ms > 0:
        # asyncio logs "Executing <Task ...> took 0.123 seconds" at WARNING on the asyncio logger.
        loop.set_debug(True)
        loop.slow_callback_duration = config.slow_callback_ms / 1000
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await broker.start()
    logging.getLogger("fluvial").info("event loop: %s", event_loop.running_loop_name())
    # A line tests and scripts can wait for.
    print(json.dumps({"event": "ready", "kafka_port": broker.kafka_port, **broker.ports}), flush=True)
    await stop.wait()
    logging.getLogger("fluvial").info("shutting down")
    await broker.stop()


def main(argv: list[str] | None = None) -> int:
    inline_io()  # before gRPC starts (the table API's Flight server): see client/grpc_io.py
    parser = argparse.ArgumentParser(prog="fluvial", description="Fluvial: a Kafka-compatible table broker")
    sub = parser.add_subparsers(dest="command", required=True)
    broker_parser = add_broker_parser(sub)
    import importlib
    for tool in TOOL_MODULES:
        try:
            importlib.import_module(tool)
        except ModuleNotFoundError as exc:
            if exc.name != tool:
                raise
    for register in _SUBCOMMANDS:
        register(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["broker"]:
        argv = expand_config_file(argv, broker_parser)
    args = parser.parse_args(argv)
    if args.command == "broker":
        config = config_from_args(args, broker_parser)
        setup_logging(args.log_level, args.log_format)
        keep_freed_memory()
        try:
            sec = config.security
            event_loop.run(run_broker(config), config.event_loop, debug=config.slow_callback_ms > 0,
                           tls=sec.kafka_tls or sec.http_tls or sec.flight_tls)
        except BrokerStartError as exc:
            logging.getLogger("fluvial").error("cannot start: %s", exc)
            return 1
        return 0
    return args.run(args) or 0


# Tool subcommands (topic, group, schema, table, ...) register themselves here:
# each is `register(subparsers)` that sets `run=fn(args) -> int` on its parser.
_SUBCOMMANDS: list = []
TOOL_MODULES = ["fluvial.broker.admin_cli", "fluvial.broker.acl_cli", "fluvial.broker.user_cli", "fluvial.schema.cli", "fluvial.broker.table_cli",
                "fluvial.tiering.lake.cli"]


def subcommand(register):
    _SUBCOMMANDS.append(register)
    return register


if __name__ == "__main__":
    # Run through the imported module so that tool registrations land in one place.
    from fluvial.broker.cli import main as _main
    sys.exit(_main())
