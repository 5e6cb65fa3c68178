"""Union read of a lake-enabled table on Spark: 2 of 20 columns through format("fluvial")
(Iceberg files for the tiered rows + the broker's log for the live tail) against Spark's
Kafka source + from_avro over the same records.

A 20-column table (bench_spark's: a long, b string, 6 int, 6 double, 6 string columns) with
Avro on the Kafka path and `fluvial.lake.enable=true` is filled through the native client;
the real tiering round (the broker's coordinator, pyiceberg writing Parquet) copies it into
its Iceberg table, then a live tail (--tail rows) is appended that only the broker holds.
One Spark session (local[2]) runs `SELECT sum(a), count(b)` over: the union read of the 2
columns, the same through `fluvial.spark.read_table` (lake files read by Spark's Parquet
reader, the log after them by format("fluvial")), the same through Spark's Kafka source decoding every value with from_avro, and
(for reference) the log-only native read. The client's own union read (no Spark) is timed
too. Wall-clock medians of --runs runs after one warm-up; results must agree.

    python -m benchmarks.bench_union_read [--rows 1000000] [--tail 50000] [--buckets 2] [--runs 3] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import fluvial.client as fc
from benchmarks import machine
from benchmarks.bench_spark import APPEND_ROWS, QUERY, rows20, schema20, string_pool, timed
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "union_read.json"
TABLE = "wide20lake"


def tier_all(url: str, table: fc.Table) -> tuple[float, int]:
    """Tiering rounds until the lake covers every offset the table holds now; (seconds, rounds)."""
    from fluvial.tiering.lake.job import TieringWorker

    worker = TieringWorker(url, job="bench", tables=[table.name], poll_s=0.1)
    want = {o.bucket: o.high_watermark for o in table.offsets()}
    t0, rounds = time.perf_counter(), 0
    while True:
        info = table.lake_info()
        if info is not None and all(info.offsets.get(b, 0) >= e for b, e in want.items()):
            return time.perf_counter() - t0, rounds
        if worker.run_once() is None:
            time.sleep(0.2)
        else:
            rounds += 1
        if time.perf_counter() - t0 > 900:
            raise RuntimeError(f"tiering did not catch up with {want} in 15 minutes")


def client_union(table: fc.Table, runs: int) -> tuple[dict, tuple]:
    def once():
        t = table.scan(columns=["a", "b"]).to_arrow()
        return int(pc.sum(t.column("a")).as_py()), t.num_rows - t.column("b").null_count
    once()
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = once()
        times.append(time.perf_counter() - t0)
    return {"seconds": round(statistics.median(times), 3), "runs": [round(t, 3) for t in times]}, result


def timed_fn(query, runs: int) -> tuple[dict, tuple]:
    """Like bench_spark.timed, for a read built in Python per run."""
    query()  # warm-up
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = query()
        times.append(time.perf_counter() - t0)
    return {"seconds": round(statistics.median(times), 3), "runs": [round(t, 3) for t in times]}, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows tiered into the lake")
    ap.add_argument("--tail", type=int, default=50_000, help="rows appended after tiering (log only)")
    ap.add_argument("--buckets", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--out", default=str(RESULTS), help="where the figures are saved")
    args = ap.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    import fluvial.spark

    load_before = os.getloadavg()
    rng = np.random.default_rng(7)
    schema = schema20()
    pool = string_pool(rng)
    total = args.rows + args.tail
    with tempfile.TemporaryDirectory(prefix="fluvial-bench-union-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", "--flush-policy", "none").start()
        spark = None
        try:
            client = fc.connect(broker.flight_url)
            table = client.create_table(TABLE, schema, buckets=args.buckets, kafka_format="avro",
                                        configs={"fluvial.lake.enable": "true"})
            expected_sum = expected_count = 0

            def fill(lo: int, hi: int) -> None:
                nonlocal expected_sum, expected_count
                for start in range(lo, hi, APPEND_ROWS):
                    rows = rows20(rng, schema, start, min(APPEND_ROWS, hi - start), pool)
                    expected_sum += int(pc.sum(rows.column("a")).as_py())
                    expected_count += rows.num_rows - rows.column("b").null_count
                    table.append(rows)

            fill(0, args.rows)
            table = client.table(TABLE)
            tier_s, rounds = tier_all(broker.flight_url, table)
            print(f"tiered {args.rows} rows in {tier_s:.1f}s ({rounds} rounds)")
            fill(args.rows, total)
            info = table.lake_info()
            assert sum(info.offsets.values()) == args.rows and sum(o.high_watermark for o in table.offsets()) == total

            native_client, r0 = client_union(table, args.runs)
            print("client union read, 2 columns:", native_client, r0)

            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import this checkout's code
            spark = (SparkSession.builder.master("local[2]").appName("fluvial-bench-union")
                     .config("spark.jars", ",".join(fluvial.spark.kafka_jars()))
                     .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                     .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g")
                     .config("spark.local.dir", str(Path(tmp) / "spark")).getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            fluvial.spark.register(spark)

            base = spark.read.format("fluvial").option("url", broker.flight_url).option("table", TABLE)
            base.option("columns", "a,b").load().createOrReplaceTempView("union2")
            base.option("columns", "a,b").option("source", "log").load().createOrReplaceTempView("log2")
            import urllib.request
            with urllib.request.urlopen(f"{broker.http_url}/subjects/{TABLE}-value/versions/latest") as resp:
                avro_schema = json.loads(resp.read())["schema"]
            (spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
             .option("subscribe", TABLE).option("startingOffsets", "earliest").option("endingOffsets", "latest")
             .load()
             .select(from_avro(F.expr("substring(value, 6, length(value) - 5)"), avro_schema).alias("v"))
             .select("v.*").createOrReplaceTempView("kafka_avro"))

            union2, r1 = timed(spark, QUERY.format(view="union2"), args.runs)
            print("format('fluvial') union read, 2 columns:", union2, r1)

            def read_table_query() -> tuple:
                # Planned per run (lake snapshot pinned, files listed), as format("fluvial") is.
                df = fluvial.spark.read_table(spark, TABLE, url=broker.flight_url, columns=["a", "b"])
                return tuple(df.agg(F.sum("a"), F.count("b")).collect()[0])

            parquet2, r4 = timed_fn(read_table_query, args.runs)
            print("fluvial.spark.read_table (Spark Parquet reader + log), 2 columns:", parquet2, r4)
            log2, r2 = timed(spark, QUERY.format(view="log2"), args.runs)
            print("format('fluvial') log-only read, 2 columns:", log2, r2)
            kafka, r3 = timed(spark, QUERY.format(view="kafka_avro"), args.runs)
            print("format('kafka') + from_avro:", kafka, r3)
            want = (expected_sum, expected_count)
            assert r0 == r1 == r2 == r3 == r4 == want, (r0, r1, r2, r3, r4, want)
            spark_version = spark.version
            client.close()
        finally:
            if spark is not None:
                spark.stop()
            broker.stop()

    out = {
        "benchmark": "union_read",
        "machine": machine.describe(),
        "spark": {"version": spark_version, "master": "local[2]"},
        "query": QUERY.format(view="t"),
        "table": {"rows": total, "tiered_rows": args.rows, "live_tail_rows": args.tail, "columns": 20,
                  "buckets": args.buckets, "kafka_format": "avro",
                  "types": "a long, b string (10% null), 6 int, 6 double, 6 string (12-24 chars)"},
        "tiering": {"seconds": round(tier_s, 1), "rounds": rounds, "rows_per_s": round(args.rows / tier_s)},
        "client_union_2_columns": native_client,
        "spark_union_2_columns": union2,
        "spark_log_only_2_columns": log2,
        "spark_read_table_2_columns": parquet2,
        "kafka_source_from_avro": kafka,
        "result": {"sum_a": expected_sum, "count_b": expected_count},
        "ratios": {"kafka_from_avro_vs_union_2col": round(kafka["seconds"] / union2["seconds"], 1),
                   "log_only_vs_union_2col": round(log2["seconds"] / union2["seconds"], 2),
                   "kafka_from_avro_vs_read_table_2col": round(kafka["seconds"] / parquet2["seconds"], 1),
                   "union_vs_read_table_2col": round(union2["seconds"] / parquet2["seconds"], 1)},
        "load_average_1_5_15": {"before": [round(x, 2) for x in load_before],
                                "after": [round(x, 2) for x in os.getloadavg()]},
        "notes": "Wall-clock per query on one machine (broker and Spark local[2] share it); median of "
                 f"{args.runs} runs after a warm-up. Tiering here is the native round in this process "
                 "(not the Spark tiering job).",
    }
    print(json.dumps(out["ratios"], indent=1))
    if not args.no_save:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        print(f"saved {args.out}")


if __name__ == "__main__":
    main()
