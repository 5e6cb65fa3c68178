"""flush-job: CPU of one group-commit flush job of a raw table (the I/O thread's work).

Many small producers: each flush window holds ``--per-flush`` produced batches of one
record (``--value-size`` bytes), appended as Kafka records checked but not converted
(`to_wire_records`, as the produce path does), then written and fsynced by
`LogTablet.write_taken` (convert, encode, segment write, sparse indexes, fsync, recovery
checkpoint). Reports the thread CPU per flush job, in its two steps: the write (convert,
encode, segment and index writes; Python holding the GIL) and the flush (the fsync, during
which the GIL is released, and the recovery checkpoint); the appends are not counted.
Median of ``--rounds``. With ``--baseline REV`` the same runs alternate with
the code of an older commit (exported as bench_small_requests.py does).

Run: `python benchmarks/bench_flush_job.py [--flushes 4000] [--rounds 5] [--baseline REV]`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_CHILD = r'''
import json, os, shutil, sys, tempfile, time
import numpy as np
from fluvial.broker.kafka_batches import to_wire_records
from fluvial.broker.log import FlushPolicy, LogConfig, LogTablet
from fluvial.protocol.records import RecordColumns, build_batch, parse_batch_header
from fluvial.protocol.compression import Compression

flushes, per_flush, value_size, where = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
now = int(time.time() * 1000)
raw = build_batch(base_offset=0, partition_leader_epoch=-1, attributes=0, base_timestamp=now, max_timestamp=now,
                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                  columns=RecordColumns.from_lists([None], [b"v" * value_size]), compression=Compression.NONE)
view = memoryview(raw)
header = parse_batch_header(view)
directory = tempfile.mkdtemp(dir=where)
tablet = LogTablet.open(__import__("pathlib").Path(directory) / "t-0", LogConfig(flush_policy=FlushPolicy.ACK))
write = sync = 0.0
for i in range(flushes):
    for _ in range(per_flush):
        records, meta = to_wire_records(view, header)
        tablet.append(records, meta, coalesce=True)
    target = tablet.take_pending()
    # write_taken's two steps, timed apart: the write (convert, encode, segment and index
    # writes: under the GIL) and the flush (fsync, which releases it, and the checkpoint).
    t0 = time.thread_time()
    tablet.write_pending()
    t1 = time.thread_time()
    tablet.flush_up_to(target)
    write += t1 - t0
    sync += time.thread_time() - t1
tablet.close()
shutil.rmtree(directory)
print(json.dumps({"write_us": write / flushes * 1e6, "flush_us": sync / flushes * 1e6}))
'''


def run(pythonpath: str, args) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", _CHILD, str(args.flushes), str(args.per_flush), str(args.value_size),
                          args.dir], env=env, check=True, capture_output=True, text=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flushes", type=int, default=4000)
    parser.add_argument("--per-flush", type=int, default=12, help="produced batches (one record each) per flush")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default=None, help="git revision to alternate with")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "flush-job.json")
    args = parser.parse_args()
    variants = {"current": ""}  # this checkout, as installed
    if args.baseline:
        from benchmarks.bench_small_requests import baseline_checkout
        variants = {"baseline": str(baseline_checkout(args.baseline)), **variants}
    figures: dict[str, list[dict]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, path in variants.items():
            load = os.getloadavg()[0]
            us = run(path, args)
            us["loadavg_before"] = load
            figures[name].append(us)
            print(f"round {r + 1} {name:9s} write {us['write_us']:6.1f} us, flush {us['flush_us']:6.1f} us CPU "
                  f"per flush job  (load {load:.2f})", flush=True)
    medians = {}
    for name, values in figures.items():
        medians[name] = {key: round(statistics.median(v[key] for v in values), 1) for key in ("write_us", "flush_us")}
        print(f"{name:9s} median write {medians[name]['write_us']:6.1f} us, "
              f"flush {medians[name]['flush_us']:6.1f} us CPU per flush job")
    from benchmarks import machine
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.out.write_text(json.dumps({"workload": "flush-job", "machine": machine.describe(), "settings": settings,
                                    "figures": figures, "medians": medians}, indent=1) + "\n")


if __name__ == "__main__":
    main()
