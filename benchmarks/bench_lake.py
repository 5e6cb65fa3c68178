"""Lake tiering: throughput of a tiering round on Spark local[2] (and in one process), and the
freshness lag (produce -> visible in the Iceberg table) under a steady produce load.

Throughput: a log table of 2 buckets and 10 columns is filled with `--rows` rows through the
native client; one tiering round then tiers all of them into Iceberg (the embedded SQLite
catalog and a local warehouse), timed from the lease to the report; median of `--runs`
rounds on fresh tables, for the Spark job (local[2], the SparkSession started beforehand)
and for the in-process engine.

Freshness: a confluent-kafka producer writes `--rate` records/s for `--seconds` to a
lake table at the default freshness (30 s) while the Spark tiering job runs as its own
process (`python -m fluvial.tiering.lake --master local[2]`). Afterwards each record's lag
is the commit time of the first lake snapshot whose `fluvial.offsets` cover it minus its
produce timestamp (Kafka CreateTime): p50/p99/max. Loopback, one machine (producer, broker
and Spark share its cores). Saves benchmarks/results/lake.json.

    python -m benchmarks.bench_lake [--rows 1000000] [--runs 3] [--rate 10000] [--seconds 150]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import fluvial.client as fc
from benchmarks import machine
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "lake.json"
COLUMNS = 10


def wide_rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    cols = {"id": ids}
    for i in range(1, COLUMNS):
        cols[f"c{i}"] = (ids * (i + 1)) % 10_007 if i % 3 else pa.array(np.char.add("v", (ids % 997).astype(str)))
    return pa.table(cols)


def fill(client: fc.Client, name: str, rows: int) -> None:
    table = client.table(name)
    chunk = 100_000
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        table.append(wide_rows(start, n), bucket=(start // chunk) % 2)


def throughput(broker: BrokerProcess, rows: int, runs: int, engine: str, spark=None) -> dict:
    from fluvial.tiering.lake.job import NativeRoundIO, TieringWorker

    rates = []
    load_start = os.getloadavg()
    with fc.connect(broker.flight_url) as client:
        for run in range(runs):
            name = f"thr-{engine}-{run}"
            schema = wide_rows(0, 1).schema
            name += f"-{rows}"
            client.create_table(name, schema, buckets=2, lake=True)
            fill(client, name, rows)
            if engine.startswith("spark"):
                from fluvial.tiering.lake.spark_job import SparkRoundIO
                io = SparkRoundIO(spark, broker.flight_url, read_mode="tasks" if engine == "spark-tasks" else "source")
            else:
                io = NativeRoundIO(broker.flight_url)
            worker = TieringWorker(broker.flight_url, job=f"bench-{engine}", io=io, tables=[name])
            result = worker.run_once()
            assert result is not None and result.rows == rows, result
            rates.append(rows / result.seconds)
            print(f"  {engine} run {run}: {rows:,} rows in {result.seconds:.2f} s = {rows / result.seconds:,.0f} rows/s"
                  f" (load {os.getloadavg()[0]:.1f})", flush=True)
    return {"rows": rows, "runs": [round(r) for r in rates], "median_rows_per_s": round(statistics.median(rates)),
            "loadavg_start": load_start, "loadavg_end": os.getloadavg()}


def _wait_tiered(client: fc.Client, name: str, timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    hw = {str(o.bucket): o.high_watermark for o in client.table(name).offsets()}
    while client.lake_info(name)["offsets"] != hw and time.monotonic() < deadline:
        time.sleep(0.5)
    return hw


def freshness(broker: BrokerProcess, rate: int, seconds: int, master: str, engine: str) -> dict:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from fluvial.tiering.lake.catalog import open_catalog

    name = f"fresh-{engine}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 2, 1, config={"fluvial.lake.enable": "true"})])[name].result(10)
    job_log = open(broker.data_dir.parent / f"lake-job-{engine}.log", "wb")
    job = subprocess.Popen([sys.executable, "-m", "fluvial.tiering.lake", "--url", broker.flight_url,
                            "--engine", engine, "--master", master, "--table", name, "--poll", "0.5"],
                           stdout=job_log, stderr=job_log)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "acks": "all"})
    payload = b"x" * 100
    try:
        with fc.connect(broker.flight_url) as client:
            # Warm-up: the job's first round (Spark's start, imports) is not steady state.
            for _ in range(1000):
                producer.produce(name, value=payload)
            producer.flush(30)
            warm = _wait_tiered(client, name, 300)
            began = time.monotonic()
            sent = 0
            loads = []
            while (now := time.monotonic()) - began < seconds:
                due = int((now - began) * rate)
                for _ in range(due - sent):
                    producer.produce(name, value=payload)
                    sent += 1
                producer.poll(0)
                if not loads or now - began > 10 * len(loads):
                    loads.append(round(os.getloadavg()[0], 1))
                time.sleep(0.005)
            producer.flush(30)
            # Let the last rows be tiered (at most one freshness interval and a round).
            _wait_tiered(client, name, 180)
            info = client.lake_info(name)
    finally:
        job.terminate()
        job.wait(60)
    lake = open_catalog(info["catalog"]).load_table(tuple(info["identifier"]))
    snapshots = sorted(lake.snapshots(), key=lambda s: s.timestamp_ms)
    data = lake.scan(selected_fields=("_bucket", "_offset", "_timestamp")).to_arrow()
    lags, round_ms = [], []
    for bucket in (0, 1):
        part = data.filter(pa.compute.and_(pa.compute.equal(data.column("_bucket"), bucket),
                                        pa.compute.greater_equal(data.column("_offset"), warm[str(bucket)])))
        offsets = part.column("_offset").to_numpy()
        produced = part.column("_timestamp").cast(pa.int64()).to_numpy() / 1000  # us -> ms
        ends = np.maximum.accumulate([json.loads(s.summary["fluvial.offsets"]).get(str(bucket), 0) for s in snapshots])
        commit = np.array([s.timestamp_ms for s in snapshots])
        first = np.searchsorted(ends, offsets, side="right")
        lags.append((commit[first] - produced) / 1000)
    lag = np.concatenate(lags)
    return {"engine": engine, "rate": rate, "seconds": seconds, "records": int(lag.size), "rounds": len(snapshots),
            "lag_p50_s": round(float(np.percentile(lag, 50)), 2), "lag_p99_s": round(float(np.percentile(lag, 99)), 2),
            "lag_max_s": round(float(lag.max()), 2), "freshness_s": 30, "loadavg_during": loads}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate", type=int, default=10_000)
    p.add_argument("--seconds", type=int, default=150)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--skip-freshness", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--engines", default="spark,native", help="tiering engines of the freshness runs")
    args = p.parse_args(argv)
    # Parts run separately update their own keys of the results file.
    out: dict = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    out.update({"machine": machine.describe(), "loadavg_start": os.getloadavg()})
    with tempfile.TemporaryDirectory(prefix="bench-lake-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            if not args.skip_throughput:
                measure_throughput(broker, args, out)
            if not args.skip_freshness:
                print(f"freshness lag at {args.rate:,} rec/s for {args.seconds} s", flush=True)
                for engine in args.engines.split(","):
                    out[f"freshness-{engine}"] = freshness(broker, args.rate, args.seconds, args.master, engine)
                    print(out[f"freshness-{engine}"], flush=True)
        finally:
            broker.stop()
    out["loadavg_end"] = os.getloadavg()
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=1))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1))
    return 0


def measure_throughput(broker: BrokerProcess, args, out: dict) -> None:
    from fluvial.tiering.lake.spark_job import spark_session

    spark = spark_session(args.master, {"spark.ui.enabled": "false", "spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    print("tiering throughput, Spark", args.master, flush=True)
    # One warm-up round first: Python workers and imports start once per Spark application.
    throughput(broker, 100_000, 1, "spark-tasks", spark)
    out["spark-tasks"] = throughput(broker, args.rows, args.runs, "spark-tasks", spark)
    out["spark-source"] = throughput(broker, args.rows, args.runs, "spark", spark)
    spark.stop()
    print("tiering throughput, in one process", flush=True)
    out["native"] = throughput(broker, args.rows, args.runs, "native")

if __name__ == "__main__":
    sys.exit(main())
