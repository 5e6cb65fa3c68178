"""Bytes on disk and CPU of the typed storage codecs, zstd against zstd-delta, in process.

The stored batch of 20-field Avro records (the produce-avro workload's values, as the log
tablet stores them) written by `encode_batch` (statistics, IPC with buffer compression,
checksum) with each codec, and read back by `read_batch` whole and as a 2-column
projection; bytes per record against the Kafka batch's. CPU time (process_time) per record, median of --runs,
the two codecs alternated (and their order swapped every run) so both see the same load.
Saves results/storage-codecs.json.

    python -m benchmarks.bench_storage_codecs [--runs 15]
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
from benchmarks.bench_typed_produce_path import stored_batch, typed_value_format
from benchmarks.workloads.avro_common import PAD_BY_SIZE
from fluvial.broker.log.segment_format import _stored_schema, encode_batch, parse_batch_header, read_batch
from fluvial.broker.log.statistics import compute_stats
from fluvial.schema.value_format import TypedValueFormat

RESULTS = Path(__file__).parent / "results" / "storage-codecs.json"
CODECS = ("zstd", "zstd-delta")


def _messages(batches, schema, codec: str) -> list:
    out = []
    for batch, meta in batches:
        encoded = encode_batch(batch, meta, compute_stats(batch), schema=schema, compression=codec)
        message = pa.py_buffer(encoded.header + encoded.body.to_pybytes())
        out.append((message, parse_batch_header(memoryview(message), 0, message.size)))
    return out


def run_case(size: int, rows: int, batch_count: int, runs: int, fmt: TypedValueFormat, sid: int) -> dict:
    rng = random.Random(size + rows)
    batches = []
    for k in range(batch_count):
        values = confluent_wire(SCHEMA20, sid, [make_record(rng, k * rows + i, PAD_BY_SIZE[size]) for i in range(rows)])
        raw, stored, meta = stored_batch(values, fmt)
        batches.append((stored, meta, len(raw)))
    schema = batches[0][0].schema
    batches = [(b if b.schema.equals(schema) else pa.RecordBatch.from_arrays(b.columns, schema=schema), m, n)
               for b, m, n in batches]
    pairs = [(b, m) for b, m, _ in batches]
    kafka_bytes = sum(n for _, _, n in batches)
    records = rows * batch_count
    schema_message = _stored_schema(schema).message
    projection = [schema.get_field_index("_offset"), schema.get_field_index("name")]
    encode: dict[str, list[float]] = {c: [] for c in CODECS}
    read: dict[str, list[float]] = {c: [] for c in CODECS}
    scan: dict[str, list[float]] = {c: [] for c in CODECS}
    written = {c: _messages(pairs, schema, c) for c in CODECS}
    for run in range(runs):
        for codec in (CODECS if run % 2 == 0 else CODECS[::-1]):
            t = time.process_time()
            for batch, meta in pairs:
                encode_batch(batch, meta, compute_stats(batch), schema=schema, compression=codec)
            encode[codec].append(time.process_time() - t)
            t = time.process_time()
            for message, header in written[codec]:
                read_batch(message, header, schema)
            read[codec].append(time.process_time() - t)
            t = time.process_time()
            for message, header in written[codec]:
                read_batch(message, header, schema, projection, schema_message)
            scan[codec].append(time.process_time() - t)
    for codec in CODECS:  # what was written reads back as the batch
        for (message, header), (batch, _) in zip(written[codec], pairs):
            assert read_batch(message, header, schema).equals(batch)
    out: dict = {"rows_per_batch": rows, "batches": batch_count,
                 "kafka_bytes_per_record": round(kafka_bytes / records, 1)}
    for codec in CODECS:
        stored = sum(message.size for message, _ in written[codec])
        out[codec] = {
            "bytes_per_record": round(stored / records, 1),
            "ratio_to_kafka_bytes": round(stored / kafka_bytes, 3),
            "encode_us_per_record": round(1e6 * statistics.median(encode[codec]) / records, 3),
            "read_us_per_record": round(1e6 * statistics.median(read[codec]) / records, 3),
            "read_2_columns_us_per_record": round(1e6 * statistics.median(scan[codec]) / records, 3),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        fmt, sid = typed_value_format(tmp)
        cases = {
            "200_bytes_5000_rows": run_case(200, 5000, 4, args.runs, fmt, sid),
            "200_bytes_500_rows": run_case(200, 500, 20, args.runs, fmt, sid),
            "1_kb_1000_rows": run_case(1000, 1000, 4, args.runs, fmt, sid),
        }
    result = {"workload": "storage-codecs", "machine": machine.describe(),
              "what": "bytes per record and CPU per record of the typed storage codecs (in process)",
              **cases, "loadavg_before": load_before, "loadavg": os.getloadavg()}
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
