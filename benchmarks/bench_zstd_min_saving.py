"""The zstd writer's minimum saving (`MIN_SAVING_FRACTION` in `broker/log/ipc_compression.py`)
against none (a buffer stored compressed whenever its frame is smaller), in process, on the
stored batches of the produce-avro workload's 20-field records (about 200 B and 1 KB).

Each run writes `--cycle` batches in a row (one try of a skipped buffer and the batches
that skip it), with the two settings alternated run by run under schema objects of their
own: CPU nanoseconds per record (process time) and stored bytes per record (headers and
bodies), the median of --runs pairs and the median of the pairs' CPU ratios. Saves
results/zstd-min-saving.json.

    python -m benchmarks.bench_zstd_min_saving [--batch-records 4300] [--runs 9]

With `--loop-s S` it only writes the 200 B batch over and over for S seconds, for a profiler
(`perf record -g python -m benchmarks.bench_zstd_min_saving --loop-s 6`: where zstd's time
goes by function).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from benchmarks import machine
from benchmarks.avro_records import SCHEMA20, confluent_wire, make_record
from benchmarks.bench_typed_produce_path import stored_batch
from benchmarks.workloads.avro_common import PAD_BY_SIZE
from fluvial.broker.log import ipc_compression
from fluvial.broker.metadata import MetadataStore
from fluvial.schema.codecs import value_codec
from fluvial.schema.registry import SchemaRegistry, parse_schema
from fluvial.schema.value_format import TypedValueFormat

RESULTS = Path(__file__).parent / "results" / "zstd-min-saving.json"
# A fraction this large makes the minimum saving zero: any smaller frame is kept.
SETTINGS = {"no_minimum": 1 << 62, "minimum": ipc_compression.MIN_SAVING_FRACTION}


def measure(batch: pa.RecordBatch, runs: int, cycle: int) -> dict:
    n = batch.num_rows
    keys = {name: pa.schema(batch.schema) for name in SETTINGS}  # each setting's own skip state
    cpu: dict[str, list[float]] = {name: [] for name in SETTINGS}
    stored: dict[str, int] = {}
    try:
        for _ in range(runs):
            for name, fraction in SETTINGS.items():
                ipc_compression.MIN_SAVING_FRACTION = fraction
                size = 0
                start = time.process_time()
                for _ in range(cycle):
                    message = ipc_compression.compress_record_batch(batch, {}, schema=keys[name])
                    size += len(message.header) + len(message.body)
                cpu[name].append((time.process_time() - start) / (cycle * n))
                stored[name] = size
    finally:
        ipc_compression.MIN_SAVING_FRACTION = SETTINGS["minimum"]
    ratios = [b / a for a, b in zip(cpu["no_minimum"], cpu["minimum"])]
    return {"records": n, "cycle": cycle,
            **{name: {"cpu_ns_per_record": round(1e9 * statistics.median(cpu[name]), 1),
                      "bytes_per_record": round(stored[name] / (cycle * n), 2)} for name in SETTINGS},
            "cpu_ratio_median_of_pairs": round(statistics.median(ratios), 3),
            "cpu_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-records", type=int, default=4300)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--cycle", type=int, default=ipc_compression.INCOMPRESSIBLE_SKIP_BATCHES + 1)
    ap.add_argument("--loop-s", type=float, default=0)
    args = ap.parse_args()
    load_before = os.getloadavg()
    result = {"workload": "zstd-min-saving", "machine": machine.describe(),
              "min_saving_fraction": ipc_compression.MIN_SAVING_FRACTION}
    with tempfile.TemporaryDirectory() as tmp:
        registry = SchemaRegistry(MetadataStore(os.path.join(tmp, "meta.db")))
        sid = registry.register("bench-value", parse_schema(json.dumps(SCHEMA20)))[0]
        fmt = TypedValueFormat(value_codec(registry, "bench"))
        for key, size, n in (("about_200_bytes", 200, args.batch_records),
                             ("about_1_kb", 1000, max(1, args.batch_records // 4))):
            rng = random.Random(size)
            _, batch, _ = stored_batch(confluent_wire(SCHEMA20, sid, [make_record(rng, i, PAD_BY_SIZE[size])
                                                                       for i in range(n)]), fmt)
            if args.loop_s:
                end = time.monotonic() + args.loop_s
                while time.monotonic() < end:
                    ipc_compression.compress_record_batch(batch, {}, schema=batch.schema)
                return
            result[key] = measure(batch, args.runs, args.cycle)
            print(key, result[key])
    result.update(loadavg_before=load_before, loadavg=os.getloadavg())
    RESULTS.write_text(json.dumps(result, indent=1))
    print(f"load {load_before} -> {result['loadavg']}; saved {RESULTS}")


if __name__ == "__main__":
    main()
