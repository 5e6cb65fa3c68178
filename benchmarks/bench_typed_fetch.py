"""Kafka fetch speed of a typed (Avro) table: a confluent-kafka consumer reading raw value bytes.

A 20-column table (the wide table of bench_projection_scan) is appended through the native
client in large batches, then read from offset 0 by a confluent-kafka consumer that does not
decode the values, so the broker's re-encoding of Avro from the stored columns is what is
measured. Prints rows/s per run and the median.

    python -m benchmarks.bench_typed_fetch [--rows 200000] [--runs 3]
    python -m benchmarks.bench_typed_fetch --schema20   # the 20-field records of the schema tests
    python -m benchmarks.bench_typed_fetch --bootstrap HOST:PORT --flight grpc://HOST:PORT --registry URL
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import fluvial.client as fc
from benchmarks.avro_records import SCHEMA20, make_record
from benchmarks.bench_projection_scan import APPEND_ROWS, string_pool, wide_rows, wide_schema
from benchmarks.clients import unique_name
from tests.support.broker_process import BrokerProcess


def fill(flight_url: str, table_name: str, rows: int, buckets: int, append_rows: int = APPEND_ROWS) -> None:
    rng = np.random.default_rng(20)
    schema = wide_schema()
    pool = string_pool(rng)
    client = fc.connect(flight_url)
    table = client.create_table(table_name, schema, buckets=buckets, kafka_format="avro")
    for start in range(0, rows, append_rows):
        table.append(wide_rows(rng, schema, start, min(append_rows, rows - start), pool))
    client.close()


def fill_schema20(bootstrap: str, registry_url: str, flight_url: str, table_name: str, rows: int,
                  buckets: int, append_rows: int = APPEND_ROWS, pad: int = 0) -> None:
    """The 20-field Avro records of the schema tests: produced through Kafka into a staging
    table (typed by its registered schema), read back as Arrow and appended through the
    native client in large batches, so that fetches re-encode rather than hit the wire cache."""
    staging = f"{table_name}-staging"
    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA20))
    ctx = SerializationContext(staging, MessageField.VALUE)
    rng = random.Random(8)
    values = [ser(make_record(rng, i, pad), ctx) for i in range(rows)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(staging, 1, 1)])[staging].result(10)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
    for v in values:
        p.produce(staging, v)
        p.poll(0)
    assert p.flush(120) == 0
    client = fc.connect(flight_url)
    data = client.table(staging).scan().to_arrow()
    user = data.select([n for n in data.column_names if not n.startswith("_")])
    table = client.create_table(table_name, user.schema, buckets=buckets, kafka_format="avro")
    for start in range(0, rows, append_rows):
        table.append(user.slice(start, append_rows))
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
    ap.add_argument("--pad", type=int, default=0, help="--schema20: widen each record by about this many bytes")
    ap.add_argument("--append-rows", type=int, default=APPEND_ROWS, help="rows per native append (stored batch)")
    ap.add_argument("--flight")
    ap.add_argument("--registry", help="the running broker's schema registry URL")
    ap.add_argument("--schema20", action="store_true",
                    help="the 20-field Avro records of the schema tests instead of the wide table")
    args = ap.parse_args()
    table_name = unique_name("typed-fetch")
    with tempfile.TemporaryDirectory(prefix="fluvial-bench-") as tmp:
        broker = None
        if args.bootstrap:
            bootstrap, flight, registry = args.bootstrap, args.flight, args.registry
        else:
            broker = BrokerProcess(Path(tmp) / "data", "--flush-policy", "none").start()
            bootstrap, flight, registry = broker.bootstrap, broker.flight_url, broker.http_url
        try:
            if args.schema20:
                fill_schema20(bootstrap, registry, flight, table_name, args.rows, args.buckets, args.append_rows, args.pad)
            else:
                fill(flight, table_name, args.rows, args.buckets, args.append_rows)
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
