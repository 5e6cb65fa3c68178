"""CPU time of each step of the typed produce path, in process: a Kafka batch of 20-field
Avro records (the produce-avro workload's values) -> the stored Arrow batch -> the segment
bytes, for the compiled and the NumPy Avro decoder and each storage codec.

Steps: `whole_job` (what a CPU executor thread does for one produce request of a typed
table, in one thread of this process: the batch's CRC check, `to_arrow`, and
`LogTablet.append` into a log tablet in a temporary directory, that is statistics, the
zstd IPC write, checksum and page-cache write; no fsync), `records` (Kafka records -> columns, `decode_records`), `avro` (values -> typed
columns, `TypedValueFormat.to_columns`; `avro_compiled_one_pass` against
`avro_compiled_general_path`: the one compiled pass over framed values of one writer schema
against the general path that mixed or faulty batches take, measured alternately), `to_arrow` (the whole conversion, both of those
included), `statistics` (the batch's column bounds alone), `encode-<codec>` (statistics, Arrow
IPC with buffer compression, checksum: what the log tablet writes), with the bytes written per record for each codec, the IPC
write alone at other zstd levels and lz4 (`codec_choices`, bytes against the Kafka
batch's), zstd through Arrow's IPC writer (a context per buffer) against the broker's
(`broker/log/ipc_compression.py`, one context per batch; `zstd_writers`), and zstd with a
context per buffer against one block (`zstd_context_per_buffer`), and the same two writers
on small batches of 20 and 200 records (`small_batches_zstd`), and zstd writes of several
batches with buffers that did not shrink left untried against every buffer tried each time
(`incompressible_skip`). CPU time (process_time) per batch, median of --runs. Saves results/typed-produce-path.json.

    python -m benchmarks.bench_typed_produce_path [--batch-records 5000] [--runs 7]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from benchmarks import machine
from benchmarks.avro_records import SCHEMA20, confluent_wire, make_record
from benchmarks.workloads.avro_common import PAD_BY_SIZE as PADS  # values of about 200 B and 1 KB
from fluvial.broker import kafka_batches
from fluvial.broker.log.batch_meta import BatchMeta
from fluvial.broker.log.config import LogConfig
from fluvial.broker.log import ipc_compression
from fluvial.broker.log.ipc_compression import compress_record_batch
from fluvial.broker.log.segment_format import encode_batch
from fluvial.broker.log.statistics import compute_stats, stats_columns
from fluvial.broker.log.tablet import LogTablet
from fluvial.broker.metadata import MetadataStore
from fluvial.protocol.records import (Compression, RecordColumns, build_batch, decode_records, parse_batch_header,
                                     verify_crc)
from fluvial.schema import avro_binary
from fluvial.schema.codecs import value_codec
from fluvial.schema.registry import SchemaRegistry, parse_schema
from fluvial.schema.value_format import TypedValueFormat

RESULTS = Path(__file__).parent / "results" / "typed-produce-path.json"


def cpu_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return 1000 * statistics.median(times)


def kafka_batch(values: list[bytes]) -> bytes:
    cols = RecordColumns.from_lists([None] * len(values), values)
    return build_batch(base_offset=0, partition_leader_epoch=0, attributes=0, base_timestamp=1_700_000_000_000,
                       max_timestamp=1_700_000_000_000, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                       columns=cols, compression=Compression.NONE)


def stored_batch(values: list[bytes], fmt: TypedValueFormat) -> tuple[bytes, pa.RecordBatch, BatchMeta]:
    """The Kafka batch of ``values`` and the batch the log tablet stores for it."""
    raw = kafka_batch(values)
    view, header = memoryview(raw), parse_batch_header(raw)
    batch, meta = kafka_batches.to_arrow(view, header, value_format=fmt)
    stored = batch.add_column(0, "_offset", pa.array(range(len(values)), pa.int64()))
    return raw, stored, dataclasses.replace(meta, base_offset=0)


def small_batches(runs: int, fmt: TypedValueFormat, sid: int) -> dict:
    """zstd writes of small stored batches (a few producers' records each): Arrow's stream
    writer kept open across batches (as the log tablet kept it) against the broker's writer,
    CPU microseconds per batch, runs interleaved."""
    rng = random.Random(7)
    out = {}
    for n in (20, 200):
        _, stored, _ = stored_batch(confluent_wire(SCHEMA20, sid, [make_record(rng, i, PADS[200]) for i in range(n)]), fmt)
        writer = ipc.new_stream(pa.BufferOutputStream(), stored.schema,
                                options=ipc.IpcWriteOptions(use_threads=False, compression="zstd"))
        times: dict[str, list[float]] = {"arrow_writer": [], "broker_writer": []}
        for _ in range(30 * runs):
            for label, fn in (("arrow_writer", lambda: writer.write_batch(stored)),
                              ("broker_writer", lambda: compress_record_batch(stored, {}))):
                t = time.process_time()
                fn()
                times[label].append(time.process_time() - t)
        out[f"rows_{n}"] = {"buffer_bytes": stored.get_total_buffer_size(),
                            **{f"{label}_cpu_us": round(1e6 * statistics.median(v), 1) for label, v in times.items()}}
    return out


def incompressible_skip(size: int, n: int, runs: int, fmt: TypedValueFormat, sid: int, schema: pa.Schema) -> dict:
    """The stored batch written with zstd (`encode_batch`) over four different batches of
    one schema, with buffers that did not shrink left untried for the next batches (the
    broker's writer) and with every buffer tried each time: CPU ms per batch, bytes per
    record; runs interleaved."""
    rng = random.Random(size + 1)
    batches = [stored_batch(confluent_wire(SCHEMA20, sid, [make_record(rng, k * n + i, PADS[size])
                                                          for i in range(n)]), fmt)[1:] for k in range(4)]
    batches = [(b if b.schema.equals(schema) else pa.RecordBatch.from_arrays(b.columns, schema=schema), m)
               for b, m in batches]
    saved = ipc_compression.INCOMPRESSIBLE_SKIP_BATCHES
    times: dict[str, list[float]] = {"skip": [], "always": []}
    written: dict[str, int] = {}
    try:
        for _ in range(2 * runs):
            for label, skip in (("skip", saved), ("always", 0)):
                ipc_compression.INCOMPRESSIBLE_SKIP_BATCHES = skip
                ipc_compression._incompressible.by_schema.clear()
                t = time.process_time()
                total = sum(encode_batch(b, m, b"", schema=schema, compression="zstd").size
                            for _ in range(4) for b, m in batches)
                times[label].append((time.process_time() - t) / 16)
                written[label] = total
    finally:
        ipc_compression.INCOMPRESSIBLE_SKIP_BATCHES = saved
    return {**{f"{label}_cpu_ms": round(1000 * statistics.median(v), 3) for label, v in times.items()},
            **{f"{label}_bytes_per_record": round(written[label] / (16 * n), 1) for label in written}}


def run_size(size: int, n: int, runs: int, fmt: TypedValueFormat, sid: int) -> dict:
    rng = random.Random(size)
    values = confluent_wire(SCHEMA20, sid, [make_record(rng, i, PADS[size]) for i in range(n)])
    raw = kafka_batch(values)
    view, header = memoryview(raw), parse_batch_header(raw)
    cols = decode_records(view, header)
    out: dict = {"value_bytes_avg": round(sum(map(len, values)) / n, 1), "records": n}
    steps: dict = {}
    with tempfile.TemporaryDirectory() as tablet_dir:
        tablet = LogTablet.open(Path(tablet_dir) / "bucket-0", LogConfig())

        def whole_job() -> None:
            verify_crc(view, header)
            tablet.append(*kafka_batches.to_arrow(view, header, value_format=fmt), leader_epoch=0)

        try:
            whole_job()  # the segment's creation, the stored schema's first sight
            steps["whole_job"] = cpu_ms(whole_job, runs)
        finally:
            tablet.close()
    steps["records"] = cpu_ms(lambda: decode_records(view, header), runs)
    for label, native in (("compiled", True), ("numpy", False)):
        saved, avro_binary.USE_NATIVE = avro_binary.USE_NATIVE, native and avro_binary._native is not None
        try:
            steps[f"avro_{label}"] = cpu_ms(lambda: fmt.to_columns(cols.values), runs)
            steps[f"to_arrow_{label}"] = cpu_ms(lambda: kafka_batches.to_arrow(view, header, value_format=fmt), runs)
        finally:
            avro_binary.USE_NATIVE = saved
    # The one-pass decode of framed values (the usual batch: one writer schema) against the
    # general path (NumPy header parsing, grouping by schema id, then the compiled decoder),
    # which batches of several writer schemas or with a problem take: measured alternately.
    one_pass, general = [], []
    for _ in range(3 * runs):
        one_pass.append(cpu_ms(lambda: fmt.to_columns(cols.values), 1))
        fmt.codec._decode_uniform = lambda values: None
        try:
            general.append(cpu_ms(lambda: fmt.to_columns(cols.values), 1))
        finally:
            del fmt.codec._decode_uniform
    steps["avro_compiled_one_pass"] = statistics.median(one_pass)
    steps["avro_compiled_general_path"] = statistics.median(general)
    batch, meta = kafka_batches.to_arrow(view, header, value_format=fmt)
    stored = batch.add_column(0, "_offset", pa.array(range(n), pa.int64()))
    meta = dataclasses.replace(meta, base_offset=0)
    stat_columns = stats_columns(stored.schema)
    steps["statistics"] = cpu_ms(lambda: compute_stats(stored, stat_columns), runs)
    bytes_per_record = {}
    for codec in ("none", "lz4", "zstd"):
        def write() -> int:
            stats = compute_stats(stored)
            return encode_batch(stored, meta, stats, compression=codec).size

        steps[f"encode_{codec}"] = cpu_ms(write, runs)
        bytes_per_record[codec] = round(write() / n, 1)
    # Other zstd levels and lz4 against the default (zstd level 1): the IPC write alone as
    # the broker does it (zstd through its own writer, lz4 through Arrow's), the stored
    # batch's bytes against the Kafka batch's.
    lz4_options = ipc.IpcWriteOptions(use_threads=False, compression="lz4")

    def lz4_write() -> int:
        sink = pa.BufferOutputStream()
        ipc.new_stream(sink, stored.schema, options=lz4_options).write_batch(stored)
        return sink.getvalue().size

    levels = {"lz4": {"cpu_ms": round(cpu_ms(lz4_write, runs), 3), "ratio_to_kafka_bytes": round(lz4_write() / len(raw), 3)}}
    for level in (-5, -1, 1, 2, 3):
        def zstd_write() -> int:
            message = compress_record_batch(stored, {}, level=level)
            return len(message.header) + len(message.body)

        levels[f"zstd_level_{level}"] = {"cpu_ms": round(cpu_ms(zstd_write, runs), 3),
                                         "ratio_to_kafka_bytes": round(zstd_write() / len(raw), 3)}
    out["codec_choices"] = levels
    # zstd through Arrow's IPC writer (a context per buffer) against the broker's (one
    # context per batch), runs interleaved so that both see the same load.
    zstd_options = ipc.IpcWriteOptions(use_threads=False, compression="zstd")

    def arrow_write() -> int:
        sink = pa.BufferOutputStream()
        ipc.new_stream(sink, stored.schema, options=zstd_options).write_batch(stored)
        return sink.getvalue().size

    def broker_write() -> int:
        message = compress_record_batch(stored, {})
        return len(message.header) + len(message.body)

    times: dict[str, list[float]] = {"arrow_writer": [], "broker_writer": []}
    for _ in range(3 * runs):
        for label, fn in (("arrow_writer", arrow_write), ("broker_writer", broker_write)):
            t = time.process_time()
            fn()
            times[label].append(time.process_time() - t)
    out["zstd_writers"] = {
        **{f"{label}_cpu_ms": round(1000 * statistics.median(v), 3) for label, v in times.items()},
        "arrow_writer_bytes": arrow_write(), "broker_writer_bytes": broker_write(),
    }
    # Arrow compresses each buffer of the batch with a zstd context of its own: the same
    # buffers compressed one by one (as the IPC writer does) against as one block, which is
    # what a context reused across buffers would come close to.
    buffers = [b for column in stored.columns for b in column.buffers() if b is not None and b.size]
    whole = pa.py_buffer(b"".join(b.to_pybytes() for b in buffers))
    zstd = pa.Codec("zstd", compression_level=1)
    out["zstd_context_per_buffer"] = {
        "buffers": len(buffers),
        "per_buffer_cpu_ms": round(cpu_ms(lambda: [zstd.compress(b) for b in buffers], runs), 3),
        "one_block_cpu_ms": round(cpu_ms(lambda: zstd.compress(whole), runs), 3),
    }
    out["incompressible_skip"] = incompressible_skip(size, n, runs, fmt, sid, stored.schema)
    out["cpu_ms_per_batch"] = {k: round(v, 3) for k, v in steps.items()}
    out["records_per_cpu_s"] = {k: round(n / (v / 1000)) for k, v in steps.items() if v > 0}
    out["stored_bytes_per_record"] = bytes_per_record
    out["kafka_bytes_per_record"] = round(len(raw) / n, 1)
    return out


def typed_value_format(tmp: str) -> tuple[TypedValueFormat, int]:
    """The 20-field schema registered in a registry under ``tmp``: its value format and schema id."""
    registry = SchemaRegistry(MetadataStore(os.path.join(tmp, "meta.db")))
    sid = registry.register("bench-value", parse_schema(json.dumps(SCHEMA20)))[0]
    return TypedValueFormat(value_codec(registry, "bench")), sid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-records", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        fmt, sid = typed_value_format(tmp)
        result = {
            "workload": "typed-produce-path", "machine": machine.describe(),
            "what": "CPU ms per Kafka batch of 20-field Avro records, each step of the typed produce path",
            "about_200_bytes": run_size(200, args.batch_records, args.runs, fmt, sid),
            "about_1_kb": run_size(1000, max(1, args.batch_records // 5), args.runs, fmt, sid),
            "small_batches_zstd": small_batches(args.runs, fmt, sid),
            "loadavg_before": load_before, "loadavg": os.getloadavg(),
        }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
