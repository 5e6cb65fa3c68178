"""Reads of tiered (remote) data: client-side stitching against reads through the broker.

A 20-column table (5 int, 5 long, 5 double, 5 string columns; about 1 KB a row) with remote
storage on is filled through the client; its closed segments move to the object store and
their local copies are deleted. The offsets that are only remote are then read:

1. a 2-of-20-column native scan and a full native scan: the client reads the remote
   segments itself (bytes fetched from the object store, rows/s);
2. a catch-up read of the same offsets with a confluent-kafka consumer, which the broker
   serves from the object store (broker CPU seconds, measured with psutil on the broker
   process), against the full native scan (broker CPU of the same offsets).

Median of `--runs` runs each. The object store is a local folder by default, or a real
moto_server S3 process (`--s3`). Saves benchmarks/results/remote_scan.json (remote_scan_s3.json).

    python -m benchmarks.bench_remote_scan [--rows 300000] [--runs 3] [--s3]
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
import psutil
from confluent_kafka import Consumer, TopicPartition

import fluvial.client as fc
from benchmarks import machine
from benchmarks.bench_projection_scan import APPEND_ROWS, string_pool, wide_rows, wide_schema
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "remote_scan.json"
TABLE = "tiered"
SEGMENT_BYTES = 16 << 20


def broker_cpu(broker: BrokerProcess) -> float:
    times = psutil.Process(broker.proc.pid).cpu_times()
    return times.user + times.system


def wait_tiered(client: fc.Client, buckets: int, timeout: float = 900) -> dict[int, int]:
    """Until every closed segment is remote and its local copy deleted (only the active
    segment is local); the first local offset per bucket."""
    deadline = time.monotonic() + timeout
    while True:
        status = client._action("status", {"name": TABLE})["buckets"]
        if all(b["local"]["segments"] <= 1 and b["remote"]["segments"]
               and b["remote"]["end_offset"] == b["local"]["start_offset"] for b in status):
            return {b["bucket"]: b["local"]["start_offset"] for b in status}
        if time.monotonic() > deadline:
            raise SystemExit(f"tiering did not finish in {timeout}s: {status}")
        time.sleep(0.5)


def native_scan(client: fc.Client, broker: BrokerProcess, columns: list[str], ends: dict[int, int]) -> dict:
    table = client.table(TABLE)
    cpu0 = broker_cpu(broker)
    t0 = time.perf_counter()
    scan = table.scan(columns=columns, start=dict.fromkeys(ends, 0), end=ends)
    rows = scan.to_arrow().num_rows
    secs = time.perf_counter() - t0
    cpu = broker_cpu(broker) - cpu0
    stats = scan.stats
    assert rows == sum(ends.values()), (rows, ends)
    assert stats.remote_rows_sent == rows, stats  # all of it read from the object store
    return {"rows": rows, "seconds": secs, "rows_per_s": rows / secs,
            "store_mb": stats.remote_bytes_read / 1e6, "broker_cpu_s": cpu}


def kafka_catch_up(broker: BrokerProcess, ends: dict[int, int]) -> dict:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-remote", "enable.auto.commit": False,
                  "fetch.max.bytes": 50 << 20, "max.partition.fetch.bytes": 10 << 20,
                  "queued.max.messages.kbytes": 512 * 1024})
    c.assign([TopicPartition(TABLE, b, 0) for b in ends])
    want = sum(ends.values())
    got = value_bytes = 0
    cpu0 = broker_cpu(broker)
    t0 = time.perf_counter()
    deadline = time.monotonic() + 600
    while got < want and time.monotonic() < deadline:
        for m in c.consume(10_000, timeout=5):
            if m.error() is None and m.offset() < ends[m.partition()]:
                value_bytes += len(m.value())
                got += 1
    secs = time.perf_counter() - t0
    cpu = broker_cpu(broker) - cpu0
    c.close()
    assert got == want, (got, want)
    return {"rows": got, "seconds": secs, "rows_per_s": got / secs, "value_mb": value_bytes / 1e6,
            "broker_cpu_s": cpu}


def median_of(runs: list[dict]) -> dict:
    out = {}
    for k in runs[0]:
        values = [r[k] for r in runs]
        out[k] = round(statistics.median(values), 3) if isinstance(values[0], float) else values[0]
    out["runs"] = len(runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--buckets", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--s3", action="store_true", help="a moto_server S3 process instead of a local folder")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    load_before = os.getloadavg()
    rng = np.random.default_rng(21)
    schema = wide_schema()
    pool = string_pool(rng)
    moto = None
    with tempfile.TemporaryDirectory(prefix="fluvial-bench-") as tmp:
        broker_args = ["--flush-policy", "none", "--retention-check-interval-ms", "500", "--remote-log-manager-interval-ms", "500"]
        client_options = None
        if args.s3:
            from tests.support.moto_server import MotoServer
            moto = MotoServer(Path(tmp) / "moto.log").start()
            broker_args += moto.broker_args(moto.create_bucket())
            client_options = moto.options()
        broker = BrokerProcess(Path(tmp) / "data", *broker_args).start()
        try:
            client = fc.connect(broker.flight_url, object_store_options=client_options)
            configs = {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES),
                       "local.retention.ms": "0", "retention.ms": "-1"}
            table = client.create_table(TABLE, schema, buckets=args.buckets, kafka_format="avro", configs=configs)
            for start in range(0, args.rows, APPEND_ROWS):
                table.append(wide_rows(rng, schema, start, min(APPEND_ROWS, args.rows - start), pool))
            t0 = time.perf_counter()
            ends = wait_tiered(client, args.buckets)
            print(f"tiered {sum(ends.values())} of {args.rows} rows in {time.perf_counter() - t0:.1f}s: {ends}")

            narrow, full, kafka = [], [], []
            for run in range(args.runs):
                narrow.append(native_scan(client, broker, ["l0", "d0"], ends))
                full.append(native_scan(client, broker, schema.names, ends))
                kafka.append(kafka_catch_up(broker, ends))
                print(f"run {run}: 2/20 {narrow[-1]}\n  20/20 {full[-1]}\n  kafka {kafka[-1]}")
            client.close()
        finally:
            broker.stop()
            if moto is not None:
                moto.stop()

    narrow, full, kafka = median_of(narrow), median_of(full), median_of(kafka)
    out = {
        "benchmark": "remote_scan",
        "machine": machine.describe(),
        "store": "moto_server S3 on loopback" if args.s3 else "local folder",
        "table": {"rows": args.rows, "rows_read_remote": narrow["rows"], "columns": 20, "buckets": args.buckets,
                  "segment_bytes": SEGMENT_BYTES, "types": "5 int32, 5 int64, 5 double, 5 string (160-200 chars)"},
        "native_2_of_20": narrow,
        "native_20_of_20": full,
        "kafka_consumer_catch_up": kafka,
        "ratios": {
            "store_bytes_2col_vs_20col": round(narrow["store_mb"] / full["store_mb"], 3),
            "rows_per_s_2col_vs_20col": round(narrow["rows_per_s"] / full["rows_per_s"], 1),
            "broker_cpu_kafka_vs_native": round(kafka["broker_cpu_s"] / max(full["broker_cpu_s"], 0.01), 1),
            "rows_per_s_native_vs_kafka": round(full["rows_per_s"] / kafka["rows_per_s"], 1),
        },
        "load_average_1_5_15": {"before": [round(x, 2) for x in load_before],
                                "after": [round(x, 2) for x in os.getloadavg()]},
        "notes": "Only offsets whose local copies were deleted are read. Native scans read the object store "
                 "directly (client-side stitching); the Kafka consumer is served by the broker from the object "
                 "store. Broker CPU: user+system seconds of the broker process during each read (floor 0.01 s "
                 f"for the ratio). Median of {args.runs} runs; client, broker and store on one machine.",
    }
    print(json.dumps(out["ratios"], indent=1))
    if not args.no_save:
        path = RESULTS.with_name("remote_scan_s3.json") if args.s3 else RESULTS
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"saved {path}")


if __name__ == "__main__":
    main()
