"""Projected scans through the native client against a Kafka consumer, on one wide table.

A 20-column table (5 int, 5 long, 5 double, 5 string columns; about 1 KB a row) is filled
through the client (Avro on the Kafka path). The same run then reads it three ways:
2 of 20 columns and all 20 columns with `fluvial.client` (buckets in parallel), and every
record with a confluent-kafka consumer decoding each value with the Avro deserializer
(what a Kafka application must do to get at any column). Wall-clock time on loopback;
client scans: median of 3 runs. Saves benchmarks/results/projection_scan.json.

    python -m benchmarks.bench_projection_scan [--rows 1000000] [--buckets 2]
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
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

import fluvial.client as fc
from benchmarks import machine
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "projection_scan.json"
TABLE = "wide"
APPEND_ROWS = 50_000


def wide_schema() -> pa.Schema:
    fields = []
    for i in range(5):
        fields += [pa.field(f"i{i}", pa.int32(), nullable=False), pa.field(f"l{i}", pa.int64(), nullable=False),
                   pa.field(f"d{i}", pa.float64(), nullable=False), pa.field(f"s{i}", pa.string(), nullable=False)]
    return pa.schema(fields)


def wide_rows(rng: np.random.Generator, schema: pa.Schema, start: int, n: int, pool: pa.Array) -> pa.Table:
    """Rows of about 1 KB: the strings (about 180 bytes each) come from a pool of random text."""
    cols = []
    for f in schema:
        if f.type == pa.int32():
            cols.append(pa.array(rng.integers(-2**31, 2**31 - 1, n, dtype=np.int64).astype(np.int32)))
        elif f.type == pa.int64():
            cols.append(pa.array(np.arange(start, start + n, dtype=np.int64) * 7 + rng.integers(0, 7, n)))
        elif f.type == pa.float64():
            cols.append(pa.array(rng.normal(0, 1e6, n)))
        else:
            cols.append(pool.take(pa.array(rng.integers(0, len(pool), n))))
    return pa.Table.from_arrays(cols, schema=schema)


def string_pool(rng: np.random.Generator, size: int = 4096) -> pa.Array:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789 ", np.uint8)
    return pa.array([letters[rng.integers(0, len(letters), int(rng.integers(160, 200)))].tobytes().decode()
                     for _ in range(size)])


def timed_scan(table: fc.Table, columns: list[str], runs: int) -> dict:
    times, stats, rows = [], None, 0
    for _ in range(runs):
        t0 = time.perf_counter()
        scan = table.scan(columns=columns)
        result = scan.to_arrow()
        times.append(time.perf_counter() - t0)
        rows, stats = result.num_rows, scan.stats
    secs = statistics.median(times)
    return {"columns": len(columns), "rows": rows, "seconds": round(secs, 3), "runs": runs,
            "rows_per_s": round(rows / secs), "mb_received": round(stats.bytes_sent / 1e6, 1),
            "mb_per_s": round(stats.bytes_sent / 1e6 / secs, 1)}


def kafka_consume(bootstrap: str, registry_url: str, buckets: int, rows: int) -> dict:
    de = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    ctx = SerializationContext(TABLE, MessageField.VALUE)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-projection", "enable.auto.commit": False,
                  "fetch.max.bytes": 50 << 20, "max.partition.fetch.bytes": 10 << 20,
                  "queued.max.messages.kbytes": 512 * 1024})
    c.assign([TopicPartition(TABLE, b, 0) for b in range(buckets)])
    got = value_bytes = checksum = 0
    t0 = time.perf_counter()
    while got < rows:
        for m in c.consume(10_000, timeout=5):
            if m.error() is not None:
                continue
            value = m.value()
            value_bytes += len(value)
            checksum += de(value, ctx)["l0"]  # an application touches what it decoded
            got += 1
    secs = time.perf_counter() - t0
    c.close()
    return {"rows": got, "seconds": round(secs, 3), "rows_per_s": round(got / secs),
            "mb_received": round(value_bytes / 1e6, 1), "mb_per_s": round(value_bytes / 1e6 / secs, 1),
            "checksum_l0": checksum}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--buckets", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    load_before = os.getloadavg()
    rng = np.random.default_rng(20)
    schema = wide_schema()
    pool = string_pool(rng)
    with tempfile.TemporaryDirectory(prefix="fluvial-bench-") as tmp:
        # The flush policy does not change reads; `none` keeps the fill short.
        broker = BrokerProcess(Path(tmp) / "data", "--flush-policy", "none").start()
        try:
            client = fc.connect(broker.flight_url)
            table = client.create_table(TABLE, schema, buckets=args.buckets, kafka_format="avro")
            t0 = time.perf_counter()
            stored_bytes = 0
            for start in range(0, args.rows, APPEND_ROWS):
                rows = wide_rows(rng, schema, start, min(APPEND_ROWS, args.rows - start), pool)
                stored_bytes += rows.nbytes
                table.append(rows)
            append_s = time.perf_counter() - t0
            total = sum(o.high_watermark for o in table.offsets())
            assert total == args.rows, total
            print(f"appended {total} rows ({stored_bytes / total:.0f} B/row) in {append_s:.1f}s")

            narrow = timed_scan(table, ["l0", "d0"], args.runs)
            print("2 of 20 columns:", narrow)
            full = timed_scan(table, schema.names, args.runs)
            print("20 of 20 columns:", full)
            kafka = kafka_consume(broker.bootstrap, broker.http_url, args.buckets, args.rows)
            print("confluent-kafka + Avro:", kafka)
            client.close()
        finally:
            broker.stop()

    out = {
        "benchmark": "projection_scan",
        "machine": machine.describe(),
        "table": {"rows": args.rows, "columns": 20, "buckets": args.buckets, "kafka_format": "avro",
                  "bytes_per_row": round(stored_bytes / args.rows),
                  "types": "5 int32, 5 int64, 5 double, 5 string (160-200 chars)"},
        "append": {"seconds": round(append_s, 1), "rows_per_s": round(args.rows / append_s),
                   "mb_per_s": round(stored_bytes / 1e6 / append_s, 1)},
        "client_2_of_20": narrow,
        "client_20_of_20": full,
        "kafka_consumer_avro": kafka,
        "ratios": {
            "rows_per_s_2col_vs_kafka": round(narrow["rows_per_s"] / kafka["rows_per_s"], 1),
            "rows_per_s_20col_vs_kafka": round(full["rows_per_s"] / kafka["rows_per_s"], 1),
            "rows_per_s_2col_vs_20col": round(narrow["rows_per_s"] / full["rows_per_s"], 1),
            "bytes_2col_vs_20col": round(narrow["mb_received"] / full["mb_received"], 3),
        },
        "load_average_1_5_15": {"before": [round(x, 2) for x in load_before],
                                "after": [round(x, 2) for x in os.getloadavg()]},
        "notes": "Wall-clock on loopback, client and broker on the same machine; client scans are the median of "
                 f"{args.runs} runs, the Kafka consumer one run (each value decoded with AvroDeserializer).",
    }
    print(json.dumps(out["ratios"], indent=1))
    if not args.no_save:
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")
        print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
