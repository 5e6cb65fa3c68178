"""Primary-key tables: upsert throughput, batched and single-key lookups, on a table of 1M keys.

A broker process (flush policy `ack`: every acknowledged write is fsynced) holds a
primary-key table (id int64 key, name string, amount double, updated timestamp). Through
the native client it is filled with upserts of `--batch` rows, each batch 80% new keys and
20% updates of keys already written, until `--keys` keys exist; then batched lookups of
1,000 random keys, then single-key lookups one after another (p50/p99 latency). Loopback,
wall clock, client and broker on the same machine. Saves benchmarks/results/pk.json.

    python -m benchmarks.bench_pk [--keys 1000000] [--batch 50000] [--buckets 2]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import fluvial.client as fc
from benchmarks import machine
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "pk.json"
SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()),
                    pa.field("amount", pa.float64()), pa.field("updated", pa.timestamp("ms", tz="UTC"))])


def rows(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    n = ids.size
    names = pa.array(np.char.add("customer-", (ids % 100_000).astype(str)))
    return pa.table({"id": ids, "name": names, "amount": rng.normal(100, 30, n),
                     "updated": pa.array(np.full(n, int(time.time() * 1000)), pa.timestamp("ms", tz="UTC"))},
                    schema=SCHEMA)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--buckets", type=int, default=2)
    ap.add_argument("--lookup-batches", type=int, default=200)
    ap.add_argument("--single-lookups", type=int, default=2000)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data", "--flush-policy", "ack").start()
        try:
            with fc.connect(broker.flight_url) as client:
                t = client.create_table("accounts", SCHEMA, buckets=args.buckets, kafka_format="avro",
                                        primary_key=["id"])
                written = 0
                upserted = 0
                inserts_per_batch = args.batch * 8 // 10
                start = time.perf_counter()
                while written < args.keys:
                    new = np.arange(written, min(written + inserts_per_batch, args.keys), dtype=np.int64)
                    old = rng.integers(0, max(written, 1), args.batch - new.size) if written else \
                        np.zeros(0, np.int64)
                    t.upsert(rows(rng, np.concatenate([new, old])))
                    written += new.size
                    upserted += new.size + old.size
                upsert_s = time.perf_counter() - start

                lookup_keys = [pa.table({"id": rng.integers(0, args.keys, 1000)}) for _ in range(args.lookup_batches)]
                start = time.perf_counter()
                found = 0
                for keys in lookup_keys:
                    found += t.lookup(keys).num_rows
                batched_s = time.perf_counter() - start
                assert found == 1000 * args.lookup_batches, found

                singles = [pa.table({"id": pa.array([int(k)], pa.int64())})
                           for k in rng.integers(0, args.keys, args.single_lookups)]
                latencies = []
                for keys in singles:
                    s = time.perf_counter()
                    t.lookup(keys)
                    latencies.append(time.perf_counter() - s)
                lat = np.array(latencies) * 1000
                data_bytes = sum(f.stat().st_size for f in (Path(tmp) / "data" / "kv").rglob("*") if f.is_file())
        finally:
            broker.stop()
    out = {
        "benchmark": "pk",
        "keys": args.keys,
        "buckets": args.buckets,
        "upsert_batch_rows": args.batch,
        "upsert_rows": upserted,
        "upsert_rows_per_s": round(upserted / upsert_s),
        "upsert_seconds": round(upsert_s, 2),
        "lookup_batch_keys": 1000,
        "batched_lookup_keys_per_s": round(1000 * args.lookup_batches / batched_s),
        "single_lookup_ms": {"p50": round(float(np.percentile(lat, 50)), 3),
                             "p99": round(float(np.percentile(lat, 99)), 3),
                             "count": args.single_lookups},
        "kv_bytes_on_disk": data_bytes,
        "flush_policy": "ack",
        # The machine may be shared: the load average says how much CPU the run had.
        "load_average_1m": round(os.getloadavg()[0], 2),
        "machine": machine.describe(),
    }
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=1))
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
