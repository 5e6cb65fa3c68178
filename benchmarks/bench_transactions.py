"""Transactional produce and read_committed consume, Fluvial side by side with Apache Kafka.

txn-produce: one confluent-kafka transactional producer writes 100 B records to a
3-partition topic in transactions of 1,000 records (begin, 1,000 produce calls, commit),
TXNS transactions per round; records committed per second, from the first begin to the
last commit acknowledged.
read-committed-consume: one confluent-kafka consumer with isolation.level=read_committed
reads everything written (committed transactions plus one aborted transaction in ten) from
the start to the end; records delivered per second. Median of the rounds after a warm-up
round; the load average is recorded with the figures.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import clients  # noqa: E402
from benchmarks.brokers import FLUVIAL_DEFAULT, KAFKA, make_workdir, remove_workdir, start_system  # noqa: E402

PER_TXN = 1000
TXNS = 60
SIZE = 100
PARTITIONS = 3
ABORT_EVERY = 10


def txn_produce(bootstrap: str, topic: str, tid: str) -> tuple[float, int]:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5,
                  "log_level": 3})
    p.init_transactions(30)
    value = clients.payload(SIZE)
    committed = 0
    t0 = time.perf_counter()
    for t in range(TXNS):
        p.begin_transaction()
        for i in range(PER_TXN):
            while True:
                try:
                    p.produce(topic, value=value, partition=i % PARTITIONS)
                    break
                except BufferError:
                    p.poll(0.01)
        if (t + 1) % ABORT_EVERY == 0:
            p.flush(60)  # every record delivered first: the aborted data is in the log, as readers face it
            p.abort_transaction(60)
        else:
            p.commit_transaction(60)
            committed += PER_TXN
    elapsed = time.perf_counter() - t0
    return committed / elapsed, committed


def read_committed(bootstrap: str, topic: str, expected: int) -> float:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({**clients.confluent_consumer_config(bootstrap, clients.unique_name("rc")),
                  "isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    n = 0
    first = None
    deadline = time.monotonic() + 300
    while n < expected and time.monotonic() < deadline:
        batch = c.consume(num_messages=1000, timeout=0.5)
        good = sum(1 for m in batch if m.error() is None)
        if good and first is None:
            first = time.perf_counter()
        n += good
    elapsed = time.perf_counter() - (first or time.perf_counter())
    c.close()
    if n != expected:
        raise RuntimeError(f"read_committed consumer got {n} records, expected {expected}")
    return n / elapsed if elapsed > 0 else float("nan")


def run_system(spec, rounds: int) -> dict:
    workdir = make_workdir()
    broker = start_system(spec, workdir)
    figures = {"txn_produce_records_per_s": [], "read_committed_consume_records_per_s": []}
    try:
        for r in range(rounds + 1):
            topic = clients.unique_name("txn")
            clients.create_topic(broker.bootstrap, topic, PARTITIONS)
            rate, committed = txn_produce(broker.bootstrap, topic, clients.unique_name("tid"))
            consume = read_committed(broker.bootstrap, topic, committed)
            print(f"{spec.name} round {r}{' (warm-up)' if r == 0 else ''}: transactional produce "
                  f"{rate:,.0f} records/s, read_committed consume {consume:,.0f} records/s", flush=True)
            if r > 0:
                figures["txn_produce_records_per_s"].append(rate)
                figures["read_committed_consume_records_per_s"].append(consume)
    finally:
        broker.stop()
        remove_workdir(workdir)
    return {name: {"median": statistics.median(v), "rounds": v} for name, v in figures.items()}


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 3
    load_before = os.getloadavg()
    summary = {spec.name: run_system(spec, rounds) for spec in (KAFKA, FLUVIAL_DEFAULT)}
    result = {"rounds": rounds, "records_per_transaction": PER_TXN, "transactions_per_round": TXNS,
              "record_bytes": SIZE, "partitions": PARTITIONS, "abort_every": ABORT_EVERY,
              "systems": {KAFKA.name: KAFKA.label, FLUVIAL_DEFAULT.name: FLUVIAL_DEFAULT.label},
              "durability": {KAFKA.name: KAFKA.durability, FLUVIAL_DEFAULT.name: FLUVIAL_DEFAULT.durability},
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "figures": summary}
    print(json.dumps(result, indent=1))
    out = Path(__file__).parent / "results" / "transactions.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
