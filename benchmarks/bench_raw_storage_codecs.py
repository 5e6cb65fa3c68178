"""Bytes on disk and produce speed of a raw table for each storage codec
(`fluvial.storage.compression` none / lz4 / zstd), against Apache Kafka's log of the same records.

confluent-kafka produces `--records` values of `--size` bytes (random upper-case letters as
ProducerPerformance sends, but a pool of distinct values rather than one value repeated, so
that a codec does not see the same bytes over and over) into a fresh one-partition topic of a
fresh broker; bytes on disk are the topic's data files (`*.arrows`, `*.log`) divided by the
record count. The median over `--rounds` of each figure is saved with the load average to
`results/raw-storage-codecs-<size>.json`.

    python -m benchmarks.bench_raw_storage_codecs [--size 100|1000] [--records N] [--rounds 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import psutil
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks import clients, machine
from benchmarks.brokers import FLUVIAL_DEFAULT, KAFKA, SystemSpec, make_workdir, remove_workdir, start_system

CODECS = ("none", "lz4", "zstd")


def _run(spec: SystemSpec, configs: dict[str, str], suffix: str, values: list[bytes], count: int) -> dict[str, float]:
    workdir = make_workdir()
    broker = start_system(spec, workdir)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        topic = clients.unique_name("raw-codecs")
        admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(30)
        time.sleep(0.5)
        process = psutil.Process(broker.pid)
        before = process.cpu_times()
        producer = Producer(clients.PRODUCER.confluent(broker.bootstrap))
        start = time.perf_counter()
        for i in range(count):
            while True:
                try:
                    producer.produce(topic, values[i % len(values)])
                    break
                except BufferError:
                    producer.poll(0.005)
            if i & 0x3FF == 0:
                producer.poll(0)
        if producer.flush(120):
            raise clients.CaseFailed(f"records of {topic} not acknowledged")
        elapsed = time.perf_counter() - start
        after = process.cpu_times()
        size = len(values[0])
        data = sum(f.stat().st_size for f in Path(workdir).rglob(f"*{suffix}") if topic in str(f))
        cpu_s = (after.user - before.user) + (after.system - before.system)
        return {"bytes_per_record": data / count, "MB/s": count * size / elapsed / 1e6,
                "broker_cpu_ms_per_mb": 1000 * cpu_s / (count * size / 1e6)}
    finally:
        broker.stop()
        remove_workdir(workdir)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1000, choices=(100, 1000))
    p.add_argument("--records", type=int, default=0, help="default: 1,000,000 at 100 B, 200,000 at 1 KB")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    count = args.records or (1_000_000 if args.size == 100 else 200_000)
    values = [bytes(65 + b % 26 for b in os.urandom(args.size)) for _ in range(4_000_000 // args.size)]
    load_before = os.getloadavg()
    systems = {"kafka": (KAFKA, {}, ".log")} | {
        f"fluvial_{codec}": (FLUVIAL_DEFAULT, {"fluvial.storage.compression": codec}, ".arrows") for codec in CODECS}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    for _ in range(args.rounds):
        for name, (spec, configs, suffix) in systems.items():
            rounds[name].append(_run(spec, configs, suffix, values, count))
    result = {
        "workload": "raw-storage-codecs", "machine": machine.describe(),
        "settings": {"size": args.size, "records": count, "rounds": args.rounds, "distinct_values": len(values)},
        "systems": {name: {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]}
                    for name, runs in rounds.items()},
        "loadavg_before": load_before, "loadavg": os.getloadavg(),
    }
    kafka_bytes = result["systems"]["kafka"]["bytes_per_record"]
    for name, figures in result["systems"].items():
        figures["bytes_to_kafka"] = round(figures["bytes_per_record"] / kafka_bytes, 3)
    out = Path(__file__).parent / "results" / f"raw-storage-codecs-{args.size}.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["systems"], indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
