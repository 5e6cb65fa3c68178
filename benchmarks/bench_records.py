"""Records/s of record batch v2 parsing and building: compiled codec, pure-Python fallback, aiokafka.

20,000 records (10-byte keys, 100-byte values, no headers; a second case adds two
headers per record) cut into batches of 500 and, separately, one batch of 20,000.
Parse = split + header + CRC check + decode to Arrow columns (aiokafka: CRC check +
iterate records, reading key, value, timestamp and headers of each). Build = encode
the columns into batches with CRC (aiokafka: append each record, then build).
Median of 5 runs. Prints a table and saves benchmarks/results/records.json.

Time is this process's CPU time by default: the work is single-threaded, so on an idle
machine it equals wall time, and on a shared one it does not count the time spent
waiting for a core. ``--clock wall`` measures wall time instead.

    python benchmarks/bench_records.py [--runs 5] [--records 20000] [--clock cpu|wall]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from fluvial.protocol import records as R
from fluvial.protocol.compression import Compression
from fluvial.protocol.records import RecordColumns

RESULTS = Path(__file__).parent / "results" / "records.json"
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]
BASE_TIMESTAMP = 1_700_000_000_000


def make_columns(count: int, with_headers: bool, seed: int = 7) -> RecordColumns:
    rng = np.random.default_rng(seed)
    # Values half random, half repeated text: compressible like real payloads.
    values = [rng.bytes(50) + b"payload-" * 6 + b"xx" for _ in range(count)]
    keys = [b"key-%06d" % (i % 100_000) for i in range(count)]
    headers = [[("trace-id", b"%016x" % i), ("source", b"bench")] for i in range(count)] if with_headers else None
    return RecordColumns.from_lists(keys, values, headers, timestamp_delta=np.arange(count) % 1000)


def slice_columns(columns: RecordColumns, start: int, stop: int) -> RecordColumns:
    return RecordColumns(
        timestamp_delta=columns.timestamp_delta[start:stop],
        offset_delta=columns.offset_delta[start:stop] - start,
        keys=columns.keys.slice(start, stop - start),
        values=columns.values.slice(start, stop - start),
        headers=columns.headers.slice(start, stop - start),
    )


def build_set(parts: list[RecordColumns], compression: Compression, implementation: str) -> list[bytes]:
    return [
        R.build_batch(
            base_offset=0, partition_leader_epoch=-1, attributes=0, base_timestamp=BASE_TIMESTAMP,
            max_timestamp=BASE_TIMESTAMP + 999, producer_id=-1, producer_epoch=-1, base_sequence=-1,
            columns=part, compression=compression, implementation=implementation,
        )
        for part in parts
    ]


def parse_set(records_field: bytes, implementation: str) -> int:
    n = 0
    for batch in R.split_batches(records_field):
        header = R.parse_batch_header(batch)
        R.verify_crc(batch, header)
        n += len(R.decode_records(batch, header, implementation))
    return n


def aiokafka_build_set(rows: list[list[tuple]], compression: Compression) -> list[bytes]:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    out = []
    for part in rows:
        builder = DefaultRecordBatchBuilder(2, int(compression), 0, -1, -1, -1, 1 << 30)
        for offset, timestamp, key, value, headers in part:
            builder.append(offset, timestamp, key, value, headers)
        out.append(bytes(builder.build()))
    return out


def aiokafka_parse_set(batches: list[bytes]) -> int:
    from aiokafka.record.default_records import DefaultRecordBatch

    n = 0
    for data in batches:
        batch = DefaultRecordBatch(data)
        if not batch.validate_crc():
            raise AssertionError("aiokafka reports a CRC mismatch")
        for record in batch:
            record.key, record.value, record.timestamp, record.headers  # noqa: B018  (what a consumer reads)
            n += 1
    return n


def median_rates(tasks: dict[str, Callable[[], object]], records: int, runs: int) -> dict[str, float]:
    """Records/s per task, median of ``runs``; tasks run round-robin so load drift on a
    shared machine hits each of them alike and the ratios stay meaningful."""
    for fn in tasks.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in tasks}
    for _ in range(runs):
        for name, fn in tasks.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: records / statistics.median(t) for name, t in times.items()}


def measure(count: int, per_batch: int, with_headers: bool, runs: int, codecs: list[Compression]) -> list[dict]:
    columns = make_columns(count, with_headers)
    parts = [slice_columns(columns, s, min(s + per_batch, count)) for s in range(0, count, per_batch)]
    rows = [
        [
            (off, BASE_TIMESTAMP + int(ts), key, value, [(h["key"], h["value"]) for h in hdrs])
            for off, ts, key, value, hdrs in zip(
                part.offset_delta.tolist(), part.timestamp_delta.tolist(), part.keys.to_pylist(),
                part.values.to_pylist(), part.headers.to_pylist(),
            )
        ]
        for part in parts
    ]
    results = []
    for codec in codecs:
        field = b"".join(build_set(parts, codec, "native" if R.HAS_NATIVE else "python"))
        ai_batches = aiokafka_build_set(rows, codec)
        implementations = ["native"] if R.HAS_NATIVE else []
        if codec is Compression.NONE:
            implementations.append("python")  # the fallback's cost is its record loop; codecs are shared
        parse_tasks: dict[str, Callable[[], object]] = {}
        build_tasks: dict[str, Callable[[], object]] = {}
        for impl in implementations:
            assert parse_set(field, impl) == count
            parse_tasks[impl] = lambda impl=impl: parse_set(field, impl)
            build_tasks[impl] = lambda impl=impl: build_set(parts, codec, impl)
        parse_tasks["aiokafka"] = lambda: aiokafka_parse_set(ai_batches)
        build_tasks["aiokafka"] = lambda: aiokafka_build_set(rows, codec)
        parse = median_rates(parse_tasks, count, runs)
        build = median_rates(build_tasks, count, runs)
        for impl in parse:
            results.append(dict(codec=codec.name.lower(), implementation=impl, parse=parse[impl], build=build[impl],
                                compressed_bytes=len(field)))
    for r in results:
        r.update(records=count, records_per_batch=per_batch, headers_per_record=2 if with_headers else 0)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]

    results = []
    results += measure(args.records, 500, False, args.runs, list(Compression))
    results += measure(args.records, args.records, False, args.runs, [Compression.NONE])
    results += measure(args.records, 500, True, args.runs, [Compression.NONE])

    peer = {(r["codec"], r["records_per_batch"], r["headers_per_record"]): r
            for r in results if r["implementation"] == "aiokafka"}
    print(f"{'codec':6} {'batch':>6} {'hdrs':>4} {'impl':9} {'parse rec/s':>13} {'build rec/s':>13} {'vs aiokafka':>16}")
    for r in results:
        p = peer[(r["codec"], r["records_per_batch"], r["headers_per_record"])]
        r["parse_vs_aiokafka"] = r["parse"] / p["parse"]
        r["build_vs_aiokafka"] = r["build"] / p["build"]
        print(f"{r['codec']:6} {r['records_per_batch']:>6} {r['headers_per_record']:>4} {r['implementation']:9} "
              f"{r['parse']:>13,.0f} {r['build']:>13,.0f} {r['parse_vs_aiokafka']:>7.2f}x {r['build_vs_aiokafka']:>6.2f}x")
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(dict(
            benchmark="record batch v2 parse/build",
            value_bytes=100, key_bytes=10, runs=args.runs, statistic="median", clock=args.clock,
            python=platform.python_version(), pyarrow=pa.__version__, machine=platform.machine(),
            cpus=os.cpu_count(), load_average_1min=round(os.getloadavg()[0], 2), compiled_codec=R.HAS_NATIVE,
            results=results,
        ), indent=2) + "\n")
        print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
