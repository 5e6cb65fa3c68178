"""Log tablet throughput: append (small and large batches), fsync per ack, tail reads, projected scans, recovery."""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from fluvial.broker.log import BatchMeta, FlushPolicy, LogConfig, LogTablet

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def batch(rows: int, value_size: int) -> pa.RecordBatch:
    return pa.record_batch({
        "_timestamp": pa.array(np.arange(rows, dtype=np.int64) + 1_700_000_000_000).cast(pa.timestamp("ms", tz="UTC")),
        "_change": pa.array(np.zeros(rows, np.int8)),
        "_key": pa.array([b"k%08d" % i for i in range(rows)], pa.binary()),
        "_headers": pa.array([[]] * rows, HEADERS),
        "value": pa.array([b"v" * value_size] * rows, pa.binary()),
        "amount": pa.array(np.arange(rows, dtype=np.int64)),
    })


def timed(label: str, count: int, unit: str, fn) -> float:
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    print(f"{label:48s} {elapsed / count * 1e6:9.1f} us/{unit}  ({count / elapsed:,.0f} {unit}/s)")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="logbench-"))
    meta = BatchMeta(0, 0, 0, -1, -1)
    try:
        small, large = batch(10, 100), batch(10_000, 100)
        tablet = LogTablet.open(root / "a", LogConfig(flush_policy=FlushPolicy.NONE))
        timed("append 10 rows x 100 B (no fsync)", 5000, "batch", lambda: [tablet.append(small, meta) for _ in range(5000)])
        elapsed = timed("append 10k rows x 100 B (no fsync)", 200, "batch", lambda: [tablet.append(large, meta) for _ in range(200)])
        print(f"{'':48s} {200 * large.nbytes / elapsed / 1e6:9.1f} MB/s")
        acked = LogTablet.open(root / "b", LogConfig(flush_policy=FlushPolicy.ACK))

        def append_and_fsync() -> None:
            for _ in range(300):
                acked.flush_up_to(acked.append(small, meta).next_offset)
        timed("append 10 rows + fsync (acks=all, one producer)", 300, "batch", append_and_fsync)
        end = tablet.log_end_offset
        timed("read 1 batch at the tail", 5000, "read", lambda: [tablet.read(end - 5, 1) for _ in range(5000)])

        def scan(columns) -> None:
            offset = 0
            while offset < end:
                offset = tablet.read(offset, 8 << 20, columns=columns)[-1].meta.next_offset
        rows = end
        timed("full scan, all columns", rows, "row", lambda: scan(None))
        timed("full scan, projected to [_offset, amount]", rows, "row", lambda: scan(["_offset", "amount"]))
        timed("offset_for_timestamp", 1000, "lookup", lambda: [tablet.offset_for_timestamp(1_700_000_000_000 + i) for i in range(1000)])
        size = tablet.size_bytes
        # Recovery: drop the recovery point so every segment is verified, as after a crash.
        (root / "a" / "recovery-point.checkpoint").unlink(missing_ok=True)
        elapsed = timed("recovery scan of the whole log", 1, "open", lambda: LogTablet.open(root / "a", LogConfig()))
        print(f"{'':48s} {size / elapsed / 1e6:9.1f} MB/s verified ({size / 1e6:.0f} MB)")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
