"""`fluvial lake tier` (the tiering job) and `fluvial lake status`; `python -m fluvial.tiering.lake` is `tier`."""
from __future__ import annotations

import argparse
import json
import logging
import sys

import pyarrow as pa

from fluvial.broker.cli import key_values, setup_logging, subcommand
from fluvial.client.cli_options import add_connection_arguments, security_from_args
from fluvial.progress import cli_progress

DEFAULT_URL = "grpc://127.0.0.1:8815"


def add_tier_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL, help="the broker's table API (Arrow Flight)")
    p.add_argument("--engine", choices=["spark", "native"], default="spark",
                   help="spark: buckets read and files written by Spark tasks (default); native: in this process")
    p.add_argument("--master", default="local[*]", help="Spark master (spark engine)")
    p.add_argument("--read-mode", choices=["tasks", "source"], default="tasks",
                   help="spark engine, log tables: tasks read with the native client (default) or through "
                        "format('fluvial') and mapInArrow")
    p.add_argument("--spark-conf", action="append", default=[], metavar="K=V", help="extra Spark config (repeatable)")
    p.add_argument("--catalog-option", action="append", default=[], metavar="K=V",
                   help="pyiceberg catalog property added to what the broker gives (secrets such as keys)")
    p.add_argument("--table", action="append", default=None, help="tier only these tables (repeatable)")
    p.add_argument("--job", default=None, help="the job's name in the broker's tiering state")
    p.add_argument("--rounds", type=int, default=None, help="stop after this many rounds")
    p.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                   help="stop once nothing was due for this long (default: run until stopped)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between asks while nothing is due")
    p.add_argument("--log-level", default="info")
    add_connection_arguments(p)


def run_tier(args) -> int:
    setup_logging(args.log_level, "text")
    from fluvial.tiering.lake.job import NativeRoundIO, TieringWorker

    security = security_from_args(args)
    spark = None
    if args.engine == "spark":
        from fluvial.tiering.lake.spark_job import SparkRoundIO, spark_session
        spark = spark_session(args.master, key_values(args.spark_conf, "--spark-conf"))
        io = SparkRoundIO(spark, args.url, read_mode=args.read_mode, security=security)
    else:
        io = NativeRoundIO(args.url, security)
    worker = TieringWorker(args.url, args.job, key_values(args.catalog_option, "--catalog-option"), io,
                           args.table, args.poll, security=security)
    tiered = 0
    try:
        with cli_progress("lake tiering", args.rounds, "rounds") as bar:
            def on_round(result) -> None:
                nonlocal tiered
                tiered += result.rows
                bar.update(description=f"lake tiering ({tiered:,} rows, last: {result.table})")
                bar.advance(1)
            worker.on_round = on_round
            worker.run(rounds=args.rounds, idle_exit_s=args.idle_exit)
    except KeyboardInterrupt:
        pass
    finally:
        if spark is not None:
            spark.stop()
    for r in worker.results:
        print(json.dumps({"table": r.table, "snapshot_id": r.snapshot_id, "rows": r.rows,
                          "seconds": round(r.seconds, 3), "offsets": {str(b): o for b, o in r.offsets.items()}}))
    return 0


def print_status(rows: list[dict]) -> None:
    from fluvial.broker.table_cli import format_rows

    if not rows:
        print("no lake tables")
        return
    print(format_rows(pa.table({
        "table": [r["table"] for r in rows], "state": [r["state"] for r in rows],
        "snapshot": [str(r["snapshot_id"]) for r in rows],
        "tiered": [" ".join(f"{b['bucket']}:{b['tiered']}" for b in r["buckets"]) for r in rows],
        "lag_records": [r["lag_records"] for r in rows], "lag_seconds": [r["lag_seconds"] for r in rows],
        "error": [r["error"] or "" for r in rows]})))


def run_status(args) -> int:
    import fluvial.client as fc

    try:
        with fc.Client(args.url, security=security_from_args(args)) as client:
            rows = client.lake_status(args.table)
    except fc.FluvialError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_status(rows)
    return 0


@subcommand
def register(sub) -> None:
    p = sub.add_parser("lake", help="lake tables (Apache Iceberg): run the tiering job, show tiering status")
    ls = p.add_subparsers(dest="lake_command", required=True)
    t = ls.add_parser("tier", help="run the tiering job (a Spark application by default)")
    add_tier_arguments(t)
    t.set_defaults(run=run_tier)
    s = ls.add_parser("status", help="per lake table: state, lake snapshot, tiered offsets, lag")
    s.add_argument("--url", default=DEFAULT_URL)
    add_connection_arguments(s)
    s.add_argument("--table", default=None)
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=run_status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fluvial.tiering.lake", description="the lake tiering job")
    add_tier_arguments(parser)
    return run_tier(parser.parse_args(argv)) or 0


logging.getLogger("py4j").setLevel(logging.WARNING)
