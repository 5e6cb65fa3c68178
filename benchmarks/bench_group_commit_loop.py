"""group-commit-loop: event-loop time the group commit takes per flush window and per record.

Many small producers under flush policy `ack`: P producers (coroutines on one event loop)
each append one-record Kafka batches (100 B, kept as checked wire records as the produce
handler keeps them) with acks=all to 8 buckets and wait for durability before the next,
so the records of a flush window are coalesced. Measured on the event-loop thread: the
wall time of each `GroupCommit._begin` (the loop's part of starting a flush) and the loop
thread's CPU time per record (`time.thread_time`, appends + waits + flush bookkeeping;
no network). `_begin` is reported as wall time (which includes waits for the GIL while
the executor's threads run Python) and as the loop thread's CPU time. The flushes' writes and fsyncs run on a thread pool as in the broker.

Run: `python benchmarks/bench_group_commit_loop.py [--rounds 3] [--records 4000]
[--baseline REV]`. `--baseline REV` runs the same probe against the code of an older
commit (exported as bench_small_requests does), rounds alternating. Results:
benchmarks/results/group-commit-loop.json (median of the rounds, with the load average).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BUCKETS = 8


def _wire_batch() -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=int(time.time() * 1000), key=b"k", value=b"x" * 100, headers=[])
    return bytes(b.build())


def probe(producers: int, records: int) -> dict:
    """One round in this process (whatever `fluvial` resolves to)."""
    import numpy as np

    import fluvial
    from fluvial.broker import kafka_batches
    from fluvial.broker.log import FlushPolicy, LogConfig, LogTablet
    from fluvial.broker.tables import Bucket, GroupCommit, Table
    from fluvial.protocol.records import parse_batch_header

    wire = _wire_batch()
    header = parse_batch_header(wire)
    begins: list[float] = []
    begin_cpu: list[float] = []
    original = GroupCommit._begin

    def timed_begin(self):
        # Wall time includes waits for the GIL while executor threads run Python; the
        # thread's CPU time is the loop's own work.
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            original(self)
        finally:
            begins.append(time.perf_counter() - started)
            begin_cpu.append(time.thread_time() - cpu)

    GroupCommit._begin = timed_begin
    workdir = Path(tempfile.mkdtemp(prefix="gc-loop-"))
    executor = ThreadPoolExecutor(4)
    try:
        async def scenario() -> dict:
            table = Table("t", uuid.uuid4(), {}, 0)
            for i in range(BUCKETS):
                tablet = LogTablet.open(workdir / f"t-{i}", LogConfig(flush_policy=FlushPolicy.ACK))
                table.buckets.append(Bucket(table, i, tablet, executor))
            per_producer = records // producers

            async def producer(n: int) -> None:
                bucket = table.buckets[n % BUCKETS]
                for _ in range(per_producer):
                    rows, meta = kafka_batches.to_wire_records(memoryview(wire), header)
                    written = bucket.append(rows, meta, coalesce=True)
                    await bucket.group_commit.wait_durable(written.next_offset)

            cpu, wall = time.thread_time(), time.perf_counter()
            await asyncio.gather(*(producer(n) for n in range(producers)))
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            done = per_producer * producers
            assert sum(b.tablet.high_watermark for b in table.buckets) == done
            for b in table.buckets:
                b.tablet.close()
            return {"records": done, "records_per_s": round(done / wall), "loop_cpu_us_per_record":
                    round(1e6 * cpu / done, 2), "windows": len(begins),
                    "fluvial": list(fluvial.__path__)[0]}

        result = asyncio.run(scenario())
        ms, cpu_ms = np.array(begins) * 1e3, np.array(begin_cpu) * 1e3
        result.update(begin_p50_ms=round(float(np.percentile(ms, 50)), 4),
                      begin_p99_ms=round(float(np.percentile(ms, 99)), 4),
                      begin_cpu_p50_ms=round(float(np.percentile(cpu_ms, 50)), 4),
                      begin_cpu_p99_ms=round(float(np.percentile(cpu_ms, 99)), 4),
                      begin_loop_us_per_record=round(1e3 * float(ms.sum()) / result["records"], 2),
                      begin_cpu_us_per_record=round(1e3 * float(cpu_ms.sum()) / result["records"], 2))
        return result
    finally:
        GroupCommit._begin = original
        executor.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--records", type=int, default=4000)
    p.add_argument("--producers", type=int, default=64)
    p.add_argument("--baseline", default=None, help="git revision to compare with, rounds alternating")
    p.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "group-commit-loop.json")
    args = p.parse_args()
    if args.one_round:
        print(json.dumps(probe(args.producers, args.records)))
        return
    variants = [("fluvial", None)]
    if args.baseline:
        # Only here: a round's process must find `fluvial` on PYTHONPATH (a baseline's) or
        # as installed, never as this checkout's `fluvial/` folder.
        sys.path.insert(0, str(ROOT))
        from benchmarks.bench_small_requests import baseline_checkout
        variants.append((f"fluvial@{args.baseline}", baseline_checkout(args.baseline)))
    rounds: dict[str, list[dict]] = {name: [] for name, _ in variants}
    for _ in range(args.rounds):
        for name, path in variants:
            env = dict(os.environ)
            if path is not None:
                env["PYTHONPATH"] = str(path)
            done = subprocess.run([sys.executable, __file__, "--one-round", "--records", str(args.records),
                                   "--producers", str(args.producers)], env=env, cwd=tempfile.gettempdir(), check=True,
                                  capture_output=True, text=True)
            rounds[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(name, rounds[name][-1], "load", os.getloadavg(), flush=True)
    summary = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "fluvial"}
               for name, rs in rounds.items()}
    report = {"benchmark": "group-commit-loop", "producers": args.producers, "records": args.records,
              "rounds": args.rounds, "load_average": [round(x, 2) for x in os.getloadavg()],
              "median": summary, "runs": rounds}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
