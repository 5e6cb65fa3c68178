"""append-coalescing: what storing many small producer batches as one stored batch would save.

Many small producers send one-record Kafka batches; each becomes its own Arrow batch and
its own IPC message in the log tablet (conversion, stamping, encoding, checksum, write,
index entry). This measures, in this process on one core, the CPU per record of
converting and appending K one-record batches one by one against one K-record batch
converted and appended once: the ceiling of what coalescing a loop pass's appends to one
bucket could save per request, and (`coalesced`) what the broker's coalesced appends do:
the K batches checked one by one, converted and written together as one message. Flush
policy `none` (no fsync), 100 B values.

Run: `python benchmarks/bench_append_coalescing.py [--k 12] [--rounds 5]`. Results:
benchmarks/results/append-coalescing.json (median of the rounds, with the load average).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import machine  # noqa: E402


def _wire(count: int) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=5,
                                  producer_epoch=0, base_sequence=0, batch_size=1 << 20)
    for i in range(count):
        b.append(i, timestamp=int(time.time() * 1000), key=b"k", value=b"x" * 100, headers=[])
    return bytes(b.build())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=12, help="batches one loop pass appends to one bucket")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--number", type=int, default=300)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "append-coalescing.json")
    args = p.parse_args()
    from fluvial.broker import kafka_batches
    from fluvial.broker.log import FlushPolicy, LogConfig, LogTablet
    from fluvial.protocol.records import parse_batch_header

    one, many = _wire(1), _wire(args.k)
    h1, hk = parse_batch_header(one), parse_batch_header(many)
    workdir = Path(tempfile.mkdtemp(prefix="fluvial-coalesce-"))
    try:
        tablet = LogTablet.open(workdir / "t-0", LogConfig(flush_policy=FlushPolicy.NONE))

        def separate() -> None:
            for _ in range(args.k):
                records, meta = kafka_batches.to_arrow(memoryview(bytearray(one)), h1)
                tablet.append(records, meta, leader_epoch=0)

        def coalesced() -> None:
            # What the broker does now: each one-record batch checked and given its offsets
            # on arrival (coalesced append), the K converted and written together as one message.
            for _ in range(args.k):
                records, meta = kafka_batches.to_wire_records(memoryview(bytearray(one)), h1)
                tablet.append(records, meta, leader_epoch=0, coalesce=True)
            tablet.write_pending()

        def together() -> None:
            records, meta = kafka_batches.to_arrow(memoryview(bytearray(many)), hk)
            tablet.append(records, meta, leader_epoch=0)

        load_before = os.getloadavg()
        figures = {}
        for name, fn in (("separate", separate), ("coalesced", coalesced), ("together", together)):
            fn()  # warm
            runs = timeit.repeat(fn, number=args.number, repeat=args.rounds)
            figures[name] = {"us_per_record": round(statistics.median(runs) / args.number / args.k * 1e6, 1),
                             "rounds_us_per_record": [round(r / args.number / args.k * 1e6, 1) for r in runs]}
        tablet.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {"workload": "append-coalescing", "machine": machine.describe(),
              "settings": {"k": args.k, "rounds": args.rounds, "number": args.number, "value_bytes": 100,
                           "flush_policy": "none"},
              "figures": figures, "loadavg_before": load_before, "loadavg": os.getloadavg()}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(figures))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
