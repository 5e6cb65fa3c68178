"""Spark over Fluvial: `SELECT sum(a), count(b)` through format("fluvial") against the Kafka source with from_avro.

A 20-column table (a: long, b: string, then 6 int, 6 double, 6 string columns; about 200
bytes a row) is filled through the native client, Avro on the Kafka path. One Spark session
(local[2]) then runs the same aggregate over it two ways in the same run: the native source
reading the 2 columns the query needs, and Spark's Kafka source reading every record and
decoding the whole value with from_avro (the registry's schema). Wall-clock per query, the
median of --runs runs after one warm-up. Saves benchmarks/results/spark.json.

    python -m benchmarks.bench_spark [--rows 1000000] [--buckets 2] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import fluvial.client as fc
from benchmarks import machine
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "spark.json"
TABLE = "wide20"
APPEND_ROWS = 100_000
QUERY = "SELECT sum(a), count(b) FROM {view}"


def schema20() -> pa.Schema:
    fields = [pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string(), nullable=True)]
    for i in range(6):
        fields += [pa.field(f"i{i}", pa.int32(), nullable=False), pa.field(f"d{i}", pa.float64(), nullable=False),
                   pa.field(f"s{i}", pa.string(), nullable=False)]
    return pa.schema(fields)


def rows20(rng: np.random.Generator, schema: pa.Schema, start: int, n: int, pool: pa.Array) -> pa.Table:
    cols = []
    for f in schema:
        if f.name == "a":
            cols.append(pa.array(np.arange(start, start + n, dtype=np.int64)))
        elif f.name == "b":
            # Every 10th b is null: count(b) is not simply the row count.
            picks = pool.take(pa.array(rng.integers(0, len(pool), n)))
            cols.append(pa.array(picks.to_numpy(zero_copy_only=False), mask=(np.arange(start, start + n) % 10 == 0)))
        elif f.type == pa.int32():
            cols.append(pa.array(rng.integers(-2**31, 2**31 - 1, n, dtype=np.int64).astype(np.int32)))
        elif f.type == pa.float64():
            cols.append(pa.array(rng.normal(0, 1e6, n)))
        else:
            cols.append(pool.take(pa.array(rng.integers(0, len(pool), n))))
    return pa.Table.from_arrays(cols, schema=schema)


def string_pool(rng: np.random.Generator, size: int = 4096) -> pa.Array:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789 ", np.uint8)
    return pa.array([letters[rng.integers(0, len(letters), int(rng.integers(12, 24)))].tobytes().decode()
                     for _ in range(size)])


def timed(spark, sql: str, runs: int) -> tuple[dict, tuple]:
    spark.sql(sql).collect()  # warm-up: Python workers, JIT, page cache
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = tuple(spark.sql(sql).collect()[0])
        times.append(time.perf_counter() - t0)
    return {"seconds": round(statistics.median(times), 3), "runs": [round(t, 3) for t in times]}, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--buckets", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    import fluvial.spark

    load_before = os.getloadavg()
    rng = np.random.default_rng(7)
    schema = schema20()
    pool = string_pool(rng)
    with tempfile.TemporaryDirectory(prefix="fluvial-bench-spark-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", "--flush-policy", "none").start()
        spark = None
        try:
            client = fc.connect(broker.flight_url)
            table = client.create_table(TABLE, schema, buckets=args.buckets, kafka_format="avro")
            t0 = time.perf_counter()
            expected_sum = expected_count = 0
            for start in range(0, args.rows, APPEND_ROWS):
                rows = rows20(rng, schema, start, min(APPEND_ROWS, args.rows - start), pool)
                expected_sum += int(pa.compute.sum(rows.column("a")).as_py())
                expected_count += rows.num_rows - rows.column("b").null_count
                table.append(rows)
            append_s = time.perf_counter() - t0
            assert sum(o.high_watermark for o in table.offsets()) == args.rows
            print(f"appended {args.rows} rows in {append_s:.1f}s")

            spark = (SparkSession.builder.master("local[2]").appName("fluvial-bench")
                     .config("spark.jars", ",".join(fluvial.spark.kafka_jars()))
                     .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                     .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g")
                     .config("spark.local.dir", str(Path(tmp) / "spark")).getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            fluvial.spark.register(spark)

            (spark.read.format("fluvial").option("url", broker.flight_url).option("table", TABLE)
             .option("columns", "a,b").load().createOrReplaceTempView("native2"))
            (spark.read.format("fluvial").option("url", broker.flight_url).option("table", TABLE)
             .load().createOrReplaceTempView("native20"))
            import urllib.request
            with urllib.request.urlopen(f"{broker.http_url}/subjects/{TABLE}-value/versions/latest") as resp:
                avro_schema = json.loads(resp.read())["schema"]
            (spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
             .option("subscribe", TABLE).option("startingOffsets", "earliest").option("endingOffsets", "latest")
             .load()
             .select(from_avro(F.expr("substring(value, 6, length(value) - 5)"), avro_schema).alias("v"))
             .select("v.*").createOrReplaceTempView("kafka_avro"))

            native2, r1 = timed(spark, QUERY.format(view="native2"), args.runs)
            print("format('fluvial'), 2 columns:", native2, r1)
            native20, r2 = timed(spark, QUERY.format(view="native20"), args.runs)
            print("format('fluvial'), all 20 columns:", native20, r2)
            kafka, r3 = timed(spark, QUERY.format(view="kafka_avro"), args.runs)
            print("format('kafka') + from_avro:", kafka, r3)
            assert r1 == r2 == r3 == (expected_sum, expected_count), (r1, r2, r3, expected_sum, expected_count)
            spark_version = spark.version
            client.close()
        finally:
            if spark is not None:
                spark.stop()
            broker.stop()

    out = {
        "benchmark": "spark",
        "machine": machine.describe(),
        "spark": {"version": spark_version, "master": "local[2]"},
        "query": QUERY.format(view="t"),
        "table": {"rows": args.rows, "columns": 20, "buckets": args.buckets, "kafka_format": "avro",
                  "types": "a long, b string (10% null), 6 int, 6 double, 6 string (12-24 chars)"},
        "append": {"seconds": round(append_s, 1), "rows_per_s": round(args.rows / append_s)},
        "native_2_columns": native2,
        "native_all_columns": native20,
        "kafka_source_from_avro": kafka,
        "result": {"sum_a": expected_sum, "count_b": expected_count},
        "ratios": {
            "kafka_from_avro_vs_native_2col": round(kafka["seconds"] / native2["seconds"], 1),
            "native_20col_vs_native_2col": round(native20["seconds"] / native2["seconds"], 1),
        },
        "load_average_1_5_15": {"before": [round(x, 2) for x in load_before],
                                "after": [round(x, 2) for x in os.getloadavg()]},
        "notes": "Wall-clock per query on one machine (broker and Spark local[2] share it); median of "
                 f"{args.runs} runs after a warm-up. Ratios are times: how many times longer than the native "
                 "2-column read.",
    }
    print(json.dumps(out["ratios"], indent=1))
    if not args.no_save:
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")
        print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
