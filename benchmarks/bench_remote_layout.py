"""Remote segment layout: bytes fetched from the object store for a 2-of-20-column read vs all columns.

A log tablet is filled with the wide 20-column rows of `bench_projection_scan` (5 int,
5 long, 5 double, 5 string; about 1 KB a row) in batches of 1,000 rows; the closed segment
is rewritten into the remote Parquet layout and uploaded. It is then read back through
`RemoteSegmentReader` (no row-group cache) with all columns and with 2 columns (one long,
one string), counting the bytes the object store returned (ranged gets) and timing the
reads. Stores: a local folder and, when moto_server is installed, a moto_server S3 process
on loopback. Median of 3 runs. Saves benchmarks/results/remote_layout.json.

    python -m benchmarks.bench_remote_layout [--rows 200000]
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

from benchmarks.bench_projection_scan import wide_rows, wide_schema
from fluvial.broker.log import BatchMeta, LogConfig, LogTablet
from fluvial.tiering.object_store import open_object_store
from fluvial.tiering.remote_log_manifest import segment_key
from fluvial.tiering.remote_segment import RemoteSegmentReader, local_segment_batches, upload_segment

RESULTS = Path(__file__).parent / "results" / "remote_layout.json"
TS = pa.timestamp("ms", tz="UTC")
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
BATCH_ROWS = 1000


def fill(path: Path, rows: int) -> LogTablet:
    rng = np.random.default_rng(1)
    schema = wide_schema()
    pool = pa.array(["".join(map(chr, rng.integers(97, 123, 180))) for _ in range(1000)])
    tablet = LogTablet.open(path, LogConfig(segment_bytes=1 << 40))
    for start in range(0, rows, BATCH_ROWS):
        user = wide_rows(rng, schema, start, BATCH_ROWS, pool)
        system = {"_timestamp": pa.array(np.arange(start, start + BATCH_ROWS, dtype=np.int64)).cast(TS),
                  "_change": pa.array(np.zeros(BATCH_ROWS, np.int8)),
                  "_key": pa.nulls(BATCH_ROWS, pa.binary()),
                  "_headers": pa.array([[]] * BATCH_ROWS, HEADERS)}
        arrays = list(system.values()) + list(user.columns)
        names = list(system) + user.schema.names
        tablet.append(pa.RecordBatch.from_arrays([a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
                                                  for a in arrays], names=names), BatchMeta(-1, 0, 0, -1, -1))
    tablet.flush()  # only durable data is tiered
    return tablet


def measure(store, segment, columns, runs: int = 3) -> dict:
    times, read = [], []
    rows = 0
    for _ in range(runs):
        reader = RemoteSegmentReader(cache_bytes=0)
        reader.batch_metas(store, segment)
        store.stats.reset()
        t0 = time.perf_counter()
        rows = sum(b.batch.num_rows for b in reader.read_batches(store, segment, 0, columns=columns))
        times.append(time.perf_counter() - t0)
        read.append(store.stats.bytes_read)
    seconds = statistics.median(times)
    return {"bytes_read": int(statistics.median(read)), "seconds": seconds, "rows_per_s": rows / seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    results = {"rows": args.rows, "loadavg_before": os.getloadavg(), "stores": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tablet = fill(tmp / "log", args.rows)
        stores = {"local": (open_object_store(str(tmp / "remote")), None)}
        try:
            from tests.support.moto_server import MotoServer, moto_server_command
            if moto_server_command():
                server = MotoServer(tmp / "moto.log").start()
                stores["s3 (moto_server)"] = (open_object_store(f"s3://{server.create_bucket()}/b", server.options()),
                                              server)
        except Exception as exc:  # noqa: BLE001 - S3 is optional here
            print("no S3 run:", exc)
        for name, (store, server) in stores.items():
            t0 = time.perf_counter()
            segment = upload_segment(store, segment_key("wide", "id", 0, 0, tablet.log_end_offset),
                                     local_segment_batches(tablet, 0, tablet.log_end_offset), tmp / "staging",
                                     local_bytes=tablet.size_bytes)
            upload_s = time.perf_counter() - t0
            full = measure(store, segment, None)
            two = measure(store, segment, ["l1", "s3"])
            entry = {"local_segment_bytes": tablet.size_bytes, "remote_object_bytes": segment.size_bytes,
                     "upload_seconds": upload_s, "all_columns": full, "two_of_twenty": two,
                     "ratio": two["bytes_read"] / full["bytes_read"]}
            results["stores"][name] = entry
            print(f"{name}: local {tablet.size_bytes/1e6:.1f} MB -> remote {segment.size_bytes/1e6:.1f} MB "
                  f"(upload {upload_s:.2f} s); all columns {full['bytes_read']/1e6:.1f} MB "
                  f"{full['rows_per_s']:.0f} rows/s; 2 of 20 {two['bytes_read']/1e6:.2f} MB "
                  f"{two['rows_per_s']:.0f} rows/s; ratio {entry['ratio']:.3f}")
            if server is not None:
                store.close()
                server.stop()
    results["loadavg_after"] = os.getloadavg()
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print("load average", results["loadavg_before"], results["loadavg_after"])


if __name__ == "__main__":
    main()
