"""Log compaction: how fast one cleaning pass rewrites a bucket (records/s and MB/s read),
for a raw table of keyed updates; median of several runs, with the load average.

    python -m benchmarks.bench_compaction [--records 1000000] [--keys 10000] [--runs 5]

Saves benchmarks/results/compaction.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks import machine
from benchmarks.stats import summarize
from fluvial.broker import kafka_batches
from fluvial.broker.log import BatchMeta, FlushPolicy, LogConfig, LogTablet
from fluvial.broker.log.cleaner import CompactionConfig, clean

RESULTS = Path(__file__).parent / "results" / "compaction.json"


def updates(start: int, rows: int, keys: int, value_size: int) -> pa.RecordBatch:
    ids = np.arange(start, start + rows) % keys
    return pa.record_batch([
        pa.array(np.full(rows, 1_700_000_000_000, np.int64)).cast(pa.timestamp("ms", tz="UTC")),
        pa.array(np.zeros(rows, np.int8)),
        pa.array([b"key-%08d" % k for k in ids], pa.binary()),
        pa.array([[]] * rows, kafka_batches.HEADERS_TYPE),
        pa.array([b"v" * value_size] * rows, pa.binary()),
    ], schema=kafka_batches.stored_schema())


def one_run(root: Path, records: int, keys: int, batch_rows: int, value_size: int) -> dict:
    tablet = LogTablet.open(root, LogConfig(segment_bytes=64 << 20, flush_policy=FlushPolicy.NONE, retention_ms=-1))
    # A cycle of batches that together update every key once; the log holds many cycles.
    cycle = [updates(i * batch_rows, batch_rows, keys, value_size) for i in range(max(1, keys // batch_rows))]
    for i in range(records // batch_rows):
        tablet.append(cycle[i % len(cycle)], BatchMeta(-1, 0, 0, -1, -1))
    tablet.roll()
    size = tablet.size_bytes
    started = time.perf_counter()
    result = clean(tablet, CompactionConfig(), force=True)
    elapsed = time.perf_counter() - started
    tablet.close()
    return {"seconds": elapsed, "records_per_s": result.records_before / elapsed, "mb_per_s": size / elapsed / 1e6,
            "records_before": result.records_before, "records_after": result.records_after,
            "bytes_before": result.bytes_before, "bytes_after": result.bytes_after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch-rows", type=int, default=500)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = []
    for r in range(args.runs):
        root = Path(tempfile.mkdtemp(prefix="compaction-bench-"))
        try:
            load = os.getloadavg()[0]
            run = one_run(root, args.records, args.keys, args.batch_rows, args.value_size)
            run["loadavg_1m"] = load
            runs.append(run)
            print(f"run {r}: {run['records_per_s']:,.0f} records/s, {run['mb_per_s']:.1f} MB/s, "
                  f"{run['records_before']:,} -> {run['records_after']:,} records (load {load:.1f})")
        finally:
            shutil.rmtree(root, ignore_errors=True)
    out = {
        "setup": vars(args),
        "records_per_s": summarize([r["records_per_s"] for r in runs]).to_json(),
        "mb_per_s": summarize([r["mb_per_s"] for r in runs]).to_json(),
        "loadavg_1m": [r["loadavg_1m"] for r in runs],
        "runs": runs,
        "machine": machine.describe(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"median {out['records_per_s']['median']:,.0f} records/s, {out['mb_per_s']['median']:.1f} MB/s -> {RESULTS}")


if __name__ == "__main__":
    main()
