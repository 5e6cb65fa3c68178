"""profile-loop: where the broker's event loop spends its time under many small producers.

Starts Fluvial (flush policy `ack`), runs the Go load generator (`benchmarks/loadgen/`,
built by bench_connections.build_loadgen) with N producers at a total rate, and samples the
broker with py-spy (`--format raw`) for a while in the middle of the run. Only the loop
thread (MainThread) counts: each function's share is the fraction of its samples in which
the function is on the stack (inclusive), so nested shares overlap.

Run: `python benchmarks/profile_loop.py [--producers 200] [--rate 10000] [--seconds 25]`.
Results: benchmarks/results/profile-loop.json (the top functions and a fixed set of the
produce path's parts, with the load average); the raw py-spy output goes to
benchmarks/.cache/profile-loop.txt.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import clients, machine  # noqa: E402
from benchmarks.bench_connections import PARTITIONS, build_loadgen  # noqa: E402
from benchmarks.brokers import FLUVIAL_DEFAULT, make_workdir, remove_workdir, start_system  # noqa: E402

# The produce path's parts, by function name as py-spy reports it.
PARTS = {
    "produce_handler": "produce (broker/handlers/produce.py)",
    "log_tablet_append": "LogTablet.append (broker/log/tablet.py)",
    "records_to_arrow": "to_arrow (broker/kafka_batches.py)",
    "ipc_encoding": "encode_batch (broker/log/segment_format.py)",
    "segment_write": "LogSegment.append (broker/log/segment.py)",
    "stamping": "LogTablet._stamp (broker/log/tablet.py)",
    "socket_writes": "_SelectorSocketTransport.write (asyncio/selector_events.py)",
    "group_commit": "GroupCommit._begin (broker/tables.py)",
    "producer_state": "ProducerStateRegistry.check (broker/producer_state.py)",
    # Coalesced appends: a small raw batch is checked on arrival, converted with the others of
    # its flush window, and the window written as one message before its fsync.
    "records_checked": "to_wire_records (broker/kafka_batches.py)",
    "records_converted_together": "WireRecords.convert_together (broker/kafka_batches.py)",
    "coalesced_write": "LogTablet.write_pending (broker/log/tablet.py)",
    "request_reading": "KafkaServer._read_requests (broker/server.py)",
}


def loop_shares(raw: str) -> tuple[int, dict[str, float]]:
    """Inclusive share of each function in the loop thread's samples."""
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        if not line.startswith("thread") or "MainThread" not in line.split(";", 1)[0]:
            continue
        stack, count = line.rsplit(" ", 1)
        n = int(count)
        total += n
        for name in {re.sub(r" \((.*?):\d+\)", r" (\1)", f) for f in stack.split(";")[1:]}:
            inclusive[name] += n
    return total, {name: n / total for name, n in inclusive.items()} if total else {}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--producers", type=int, default=200)
    p.add_argument("--rate", type=float, default=10_000)
    p.add_argument("--idle", type=int, default=100)
    p.add_argument("--seconds", type=float, default=25)
    p.add_argument("--sample-s", type=float, default=12)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "profile-loop.json")
    args = p.parse_args()
    loadgen = build_loadgen()
    raw_path = Path(__file__).parent / ".cache" / "profile-loop.txt"
    load_before = os.getloadavg()
    workdir = make_workdir()
    broker = start_system(FLUVIAL_DEFAULT, workdir)
    try:
        topic = clients.unique_name("profile")
        clients.create_topic(broker.bootstrap, topic, PARTITIONS)
        gen = subprocess.Popen([str(loadgen), "-bootstrap", broker.bootstrap, "-topic", topic,
                                "-producers", str(args.producers), "-rate", str(args.rate), "-idle", str(args.idle),
                                "-seconds", str(args.seconds)], stdout=subprocess.PIPE, text=True)
        done = None
        for line in gen.stdout:
            event = json.loads(line)
            if event["event"] == "producing":
                time.sleep(min(5.0, args.seconds / 4))
                subprocess.run(["py-spy", "record", "--pid", str(broker.pid), "--format", "raw", "--threads",
                                "-r", "200", "-d", str(int(args.sample_s)), "-o", str(raw_path), "--nonblocking"],
                               check=True, capture_output=True)
            elif event["event"] == "done":
                done = event
                break
        gen.wait(120)
    finally:
        broker.stop()
        remove_workdir(workdir)
    total, shares = loop_shares(raw_path.read_text())
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:40]
    result = {
        "workload": "profile-loop", "machine": machine.describe(),
        "settings": {"producers": args.producers, "rate": args.rate, "idle": args.idle, "partitions": PARTITIONS,
                     "flush_policy": "ack", "sample_s": args.sample_s},
        "loop_samples": total,
        "parts_pct": {name: round(100 * shares.get(fn, 0.0), 1) for name, fn in PARTS.items()},
        "top_pct": {name: round(100 * share, 1) for name, share in top},
        "ack_ms": (done or {}).get("ack_ms"), "loadavg_before": load_before, "loadavg": os.getloadavg(),
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["parts_pct"], indent=1))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
