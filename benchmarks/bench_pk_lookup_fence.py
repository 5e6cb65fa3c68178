"""Single-key lookup latency of a primary-key table while it is being written.

Under flush policy `ack` a lookup gives out only rows whose changelog is fsynced. It reads
the durable state (RocksDB with the writes not yet durable put back, `kv/durable_view.py`)
and answers at once; `ack-wait` is the former read path (`FLUVIAL_KV_LOOKUPS_WAIT_FOR_FSYNC=1`):
the lookup waits for the group commit running for the writes it may have seen. Under `none`
it answers at once with no durability check. A broker process with a table of `--keys`
keys in one bucket, one writer thread upserting `--write-rows` rows back to back, one
reader doing single-key lookups for `--seconds`; p50/p99/p99.9 lookup latency and the
write rate, per mode, median over `--runs` runs, modes interleaved run by run. Loopback,
client and broker on the same machine. Saves benchmarks/results/pk_lookup_fence.json
(`--label X`: pk_lookup_fence-X.json).

    python -m benchmarks.bench_pk_lookup_fence [--keys 10000] [--seconds 8] [--runs 3] [--policies ack,ack-wait,none]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import fluvial.client as fc
from benchmarks import machine
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "pk_lookup_fence.json"
WAIT_ENV = "FLUVIAL_KV_LOOKUPS_WAIT_FOR_FSYNC"
SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.int64())])


def run_once(mode: str, keys: int, seconds: float, write_rows: int) -> dict:
    rng = np.random.default_rng(3)
    policy, _, wait = mode.partition("-")
    with tempfile.TemporaryDirectory() as tmp:
        old = os.environ.pop(WAIT_ENV, None)
        if wait:
            os.environ[WAIT_ENV] = "1"
        try:
            broker = BrokerProcess(Path(tmp) / "data", "--flush-policy", policy).start()
        finally:
            os.environ.pop(WAIT_ENV, None)
            if old is not None:
                os.environ[WAIT_ENV] = old
        try:
            with fc.connect(broker.flight_url) as client:
                t = client.create_table("fence", SCHEMA, primary_key=["id"])
                t.upsert(pa.table({"id": np.arange(keys), "v": np.zeros(keys, np.int64)}, schema=SCHEMA))
            stop = threading.Event()
            writes = [0]

            def writer() -> None:
                with fc.connect(broker.flight_url) as wc:
                    wt = wc.table("fence")
                    n = 0
                    while not stop.is_set():
                        ids = rng.integers(0, keys, write_rows)
                        wt.upsert(pa.table({"id": ids, "v": np.full(write_rows, n, np.int64)}, schema=SCHEMA))
                        n += 1
                    writes[0] = n

            thread = threading.Thread(target=writer)
            thread.start()
            latencies = []
            with fc.connect(broker.flight_url) as client:
                t = client.table("fence")
                deadline = time.perf_counter() + seconds
                while time.perf_counter() < deadline:
                    key = pa.table({"id": pa.array([int(rng.integers(0, keys))], pa.int64())})
                    s = time.perf_counter()
                    assert t.lookup(key).num_rows == 1
                    latencies.append(time.perf_counter() - s)
            stop.set()
            thread.join()
        finally:
            broker.stop()
    lat = np.array(latencies) * 1000
    return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "p999_ms": float(np.percentile(lat, 99.9)),
            "lookups": len(latencies), "writes_per_s": writes[0] / seconds,
            "load_average_1m": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--write-rows", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--policies", default="ack,ack-wait,none",
                    help="modes to measure, comma-separated: a flush policy, or ack-wait (the former read path)")
    ap.add_argument("--label", default="", help="what this run measures (e.g. the commit), saved with it")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    out = {"benchmark": "pk-lookup-fence", "keys": args.keys, "buckets": 1, "write_rows": args.write_rows,
           "seconds_per_run": args.seconds, "runs": args.runs, "policies": {}}
    out["label"] = args.label
    modes = args.policies.split(",")
    by_mode: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for mode in modes:  # interleaved: a change of the machine's load hits every mode alike
            by_mode[mode].append(run_once(mode, args.keys, args.seconds, args.write_rows))
    for policy, runs in by_mode.items():
        out["policies"][policy] = {
            "lookup_p50_ms": round(statistics.median(r["p50_ms"] for r in runs), 3),
            "lookup_p99_ms": round(statistics.median(r["p99_ms"] for r in runs), 3),
            "lookup_p999_ms": round(statistics.median(r["p999_ms"] for r in runs), 3),
            "worst_p99_ms": round(max(r["p99_ms"] for r in runs), 3),
            "writes_per_s": round(statistics.median(r["writes_per_s"] for r in runs), 1),
            "runs": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in runs],
        }
    # The machine may be shared: the load average says how much CPU the runs had.
    out["load_average_1m"] = round(os.getloadavg()[0], 2)
    out["machine"] = machine.describe()
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=1))
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        target = RESULTS.with_name(f"pk_lookup_fence-{args.label}.json") if args.label else RESULTS
        target.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
