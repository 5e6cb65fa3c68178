"""Kafka fetch speed of a typed (Avro) table: a confluent-kafka consumer reading raw value bytes.

A 20-column table (the wide table of bench_projection_scan) is appended through the native
client in large batches, then read from offset 0 by a confluent-kafka consumer that does not
decode the values, so the broker's re-encoding of Avro from the stored columns is what is
measured. Prints rows/s per run and the median.

    python -m benchmarks.bench_typed_fetch [--rows 200000] [--runs 3]
    python -m benchmarks.bench_typed_fetch --bootstrap HOST:PORT --flight grpc://HOST:PORT
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, TopicPartition

import fluvial.client as fc
from benchmarks.bench_projection_scan import APPEND_ROWS, string_pool, wide_rows, wide_schema
from benchmarks.clients import unique_name
from tests.support.broker_process import BrokerProcess


def fill(flight_url: str, table_name: str, rows: int, buckets: int) -> None:
    rng = np.random.default_rng(20)
    schema = wide_schema()
    pool = string_pool(rng)
    client = fc.connect(flight_url)
    table = client.create_table(table_name, schema, buckets=buckets, kafka_format="avro")
    for start in range(0, rows, APPEND_ROWS):
        table.append(wide_rows(rng, schema, start, min(APPEND_ROWS, rows - start), pool))
    client.close()


def consume(bootstrap: str, table_name: str, rows: int, buckets: int, timeout_s: float = 300) -> float:
    """Rows/s of one full read with the consumer's default fetch sizes, values not decoded."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("typed-fetch"),
                  "enable.auto.commit": False, "log_level": 3})
    c.assign([TopicPartition(table_name, b, 0) for b in range(buckets)])
    got = 0
    deadline = time.monotonic() + timeout_s
    t0 = time.perf_counter()
    while got < rows and time.monotonic() < deadline:
        for m in c.consume(10_000, timeout=1):
            if m.error() is None:
                got += 1
    secs = time.perf_counter() - t0
    c.close()
    if got < rows:
        raise RuntimeError(f"{got}/{rows} rows after {timeout_s}s")
    return got / secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--buckets", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bootstrap", help="an already running broker (else one is started)")
    ap.add_argument("--flight")
    args = ap.parse_args()
    table_name = unique_name("typed-fetch")
    with tempfile.TemporaryDirectory(prefix="fluvial-bench-") as tmp:
        broker = None
        if args.bootstrap:
            bootstrap, flight = args.bootstrap, args.flight
        else:
            broker = BrokerProcess(Path(tmp) / "data", "--flush-policy", "none").start()
            bootstrap, flight = broker.bootstrap, broker.flight_url
        try:
            fill(flight, table_name, args.rows, args.buckets)
            rates = []
            for _ in range(args.runs):
                rates.append(consume(bootstrap, table_name, args.rows, args.buckets))
                print(f"{rates[-1]:,.0f} rows/s")
            print(f"median {statistics.median(rates):,.0f} rows/s over {args.runs} runs ({args.rows} rows)")
        finally:
            if broker is not None:
                broker.stop()


if __name__ == "__main__":
    main()
