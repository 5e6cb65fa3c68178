"""Kafka consumers catching up on tiered data: the broker serving Fetch from the object store
against the same data served from local segments.

One broker (flush policy ack, local object store folder) holds two raw tables with the same
records (100-byte values, lz4 batches from confluent-kafka): `local` with remote storage off,
`tiered` with remote storage on; 4 MiB segments and local.retention.ms=0, so once the
remote log manager is done every closed segment of `tiered` is in the object store only.
A confluent-kafka consumer then reads each table from offset 0 to its end; wall time and
the broker process's CPU seconds (psutil) are recorded. Median of 3 runs per table, each
against a freshly restarted broker (nothing in the wire cache or the remote read cache:
local batches are re-encoded from their Arrow columns, remote ones read from the store
and re-encoded). Values are 100 hex characters from a pool of random ones.
Saves benchmarks/results/remote_fetch.json.

    python -m benchmarks.bench_remote_fetch [--records 300000]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks import machine
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "remote_fetch.json"


def fill(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4", "acks": "all"})
    pool = [os.urandom(50).hex().encode() for _ in range(1000)]  # 100 bytes, compressible as text
    for i in range(n):
        while True:
            try:
                p.produce(topic, key=b"%d" % i, value=pool[i % 1000], partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


def read_all(bootstrap: str, topic: str, n: int, broker_proc: psutil.Process) -> tuple[float, float]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.monotonic_ns()}",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    cpu0 = sum(broker_proc.cpu_times()[:2])
    t0 = time.perf_counter()
    got = 0
    while got < n:
        for m in c.consume(10_000, timeout=2):
            if m.error() is None:
                got += 1
    elapsed = time.perf_counter() - t0
    cpu = sum(broker_proc.cpu_times()[:2]) - cpu0
    c.close()
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    n = args.records
    results: dict = {"records": n, "value_bytes": 100, "machine": machine.describe(),
                     "loadavg_before": os.getloadavg(), "tables": {}}
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data", "--remote-log-manager-interval-ms", "200",
                               "--retention-check-interval-ms", "200").start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            common = {"segment.bytes": str(4 << 20)}
            admin.create_topics([NewTopic("local", 1, 1, config=common),
                                 NewTopic("tiered", 1, 1, config={**common, "remote.storage.enable": "true",
                                                                 "local.retention.ms": "0"})])["tiered"].result(10)
            for topic in ("local", "tiered"):
                fill(broker.bootstrap, topic, n)
            # Wait until the tiered table keeps only its active segment locally.
            import pyarrow.flight as flight
            client = flight.FlightClient(broker.flight_url)
            deadline = time.monotonic() + 300
            while True:
                [r] = list(client.do_action(flight.Action("status", json.dumps({"name": "tiered"}).encode())))
                status = json.loads(r.body.to_pybytes())["buckets"][0]
                if status["local"]["segments"] == 1 and status["remote"]["segments"]:
                    break
                assert time.monotonic() < deadline, status
                time.sleep(0.2)
            client.close()
            results["tiered_status"] = status
            for topic in ("local", "tiered"):
                runs = []
                for _ in range(args.runs):
                    # A fresh broker process per run: no batch is in the wire cache (the
                    # producers' own bytes) or the remote read cache; every read is cold.
                    broker.restart()
                    runs.append(read_all(broker.bootstrap, topic, n, psutil.Process(broker.proc.pid)))
                wall = statistics.median(r[0] for r in runs)
                cpu = statistics.median(r[1] for r in runs)
                results["tables"][topic] = {"seconds": wall, "records_per_s": n / wall, "broker_cpu_s": cpu,
                                            "runs": runs}
                print(f"{topic}: {n / wall:,.0f} records/s, {wall:.2f} s, broker CPU {cpu:.2f} s")
        finally:
            broker.stop()
    results["loadavg_after"] = os.getloadavg()
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, default=str))
    print("remote objects:", status["remote"]["segments"], "local start", status["local"]["start_offset"])
    print("load average", results["loadavg_before"], results["loadavg_after"])


if __name__ == "__main__":
    main()
