"""zstd's CPU and bytes per buffer of a stored typed batch: which columns the storage
compression spends its time on, and what storing the buffers that barely shrink as they are
would save against the bytes it would add.

The stored batch of `--batch-records` 20-field Avro records (the produce-avro workload's
values, about 200 B or 1 KB) is built as the log tablet builds it; each of its buffers of at
least 64 bytes (the smaller ones are stored as they are) is compressed on its own, as the
broker's zstd writer does (`broker/log/ipc_compression.py`), at level 1 (the writer's) and
at level -1, with one compressor reused: CPU nanoseconds per record (the least of --runs),
bytes per record. `skip_what_if`: for each threshold, the buffers whose level-1 frame is
larger than that share of their size, the bytes per record storing them as they are would
add and the CPU it would save (keyed by how much less than that share: `shrink_under_10pct`). Saves results/typed-zstd-buffers.json.

    python -m benchmarks.bench_typed_zstd_buffers [--batch-records 4300] [--runs 15]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import zstandard

from benchmarks import machine
from benchmarks.avro_records import SCHEMA20, confluent_wire, make_record
from benchmarks.bench_typed_produce_path import stored_batch
from benchmarks.workloads.avro_common import PAD_BY_SIZE
from fluvial.broker.log.ipc_compression import MIN_COMPRESSED_BUFFER_BYTES
from fluvial.broker.metadata import MetadataStore
from fluvial.schema.codecs import value_codec
from fluvial.schema.registry import SchemaRegistry, parse_schema
from fluvial.schema.value_format import TypedValueFormat

RESULTS = Path(__file__).parent / "results" / "typed-zstd-buffers.json"
LEVELS = (1, -1)
THRESHOLDS = (0.95, 0.9, 0.8)


def named_buffers(batch: pa.RecordBatch) -> list[tuple[str, pa.Buffer]]:
    """The batch's buffers in the IPC order, named `column[.child][index]`."""
    out: list[tuple[str, pa.Buffer]] = []

    def walk(arr: pa.Array, name: str) -> None:
        t = arr.type
        own = 1 if pa.types.is_struct(t) else 3 if (pa.types.is_string(t) or pa.types.is_binary(t)) else 2
        for i, buf in enumerate(arr.buffers()[:own]):
            out.append((f"{name}[{i}]", buf))
        if pa.types.is_struct(t):
            for j in range(t.num_fields):
                walk(arr.field(j), f"{name}.{t.field(j).name}")
        elif pa.types.is_map(t):
            walk(arr.keys, f"{name}.key")
            walk(arr.items, f"{name}.value")
        elif pa.types.is_list(t):
            walk(arr.values, f"{name}.item")

    for i, f in enumerate(batch.schema):
        walk(batch.column(i), f.name)
    return out


def measure(size: int, n: int, runs: int, fmt: TypedValueFormat, sid: int) -> dict:
    rng = random.Random(size)
    _, stored, _ = stored_batch(confluent_wire(SCHEMA20, sid, [make_record(rng, i, PAD_BY_SIZE[size])
                                                                for i in range(n)]), fmt)
    compressors = {level: zstandard.ZstdCompressor(level=level) for level in LEVELS}
    rows = {}
    for name, buf in named_buffers(stored):
        if buf is None or buf.size < MIN_COMPRESSED_BUFFER_BYTES:
            continue
        data = bytes(buf)
        row = {"raw_bytes_per_record": round(len(data) / n, 2)}
        for level, c in compressors.items():
            times = []
            for _ in range(runs):
                t = time.perf_counter_ns()
                frame = c.compress(data)
                times.append(time.perf_counter_ns() - t)
            row[f"level_{level}"] = {"bytes_per_record": round(min(len(frame), len(data)) / n, 2),
                                     "cpu_ns_per_record": round(min(times) / n, 2)}
        rows[name] = row
    total = {f"level_{level}": {
        "bytes_per_record": round(sum(r[f"level_{level}"]["bytes_per_record"] for r in rows.values()), 1),
        "cpu_ns_per_record": round(sum(r[f"level_{level}"]["cpu_ns_per_record"] for r in rows.values()), 1)}
        for level in LEVELS}
    what_if = {}
    for threshold in THRESHOLDS:
        skipped = [k for k, r in rows.items()
                   if r["level_1"]["bytes_per_record"] > threshold * r["raw_bytes_per_record"]
                   and r["level_1"]["bytes_per_record"] < r["raw_bytes_per_record"]]
        what_if[f"shrink_under_{round(100 * (1 - threshold))}pct"] = {
            "buffers": skipped,
            "added_bytes_per_record": round(sum(rows[k]["raw_bytes_per_record"] - rows[k]["level_1"]["bytes_per_record"]
                                                for k in skipped), 2),
            "saved_cpu_ns_per_record": round(sum(rows[k]["level_1"]["cpu_ns_per_record"] for k in skipped), 1)}
    return {"records": n, "buffers": rows, "total": total, "skip_what_if": what_if}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-records", type=int, default=4300)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        registry = SchemaRegistry(MetadataStore(os.path.join(tmp, "meta.db")))
        sid = registry.register("bench-value", parse_schema(json.dumps(SCHEMA20)))[0]
        fmt = TypedValueFormat(value_codec(registry, "bench"))
        result = {"workload": "typed-zstd-buffers", "machine": machine.describe(),
                  "about_200_bytes": measure(200, args.batch_records, args.runs, fmt, sid),
                  "about_1_kb": measure(1000, max(1, args.batch_records // 4), args.runs, fmt, sid),
                  "loadavg_before": load_before, "loadavg": os.getloadavg()}
    RESULTS.write_text(json.dumps(result, indent=1))
    for key in ("about_200_bytes", "about_1_kb"):
        part = result[key]
        print(key, part["total"])
        for name, row in sorted(part["buffers"].items(), key=lambda kv: -kv[1]["level_1"]["cpu_ns_per_record"])[:8]:
            print(f"  {name:22} raw {row['raw_bytes_per_record']:7.2f} B  zstd-1 {row['level_1']['bytes_per_record']:6.2f} B"
                  f" {row['level_1']['cpu_ns_per_record']:6.1f} ns")
        print("  skip what-if", part["skip_what_if"])
    print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
