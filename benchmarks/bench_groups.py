"""group-consume and commit-rate, Fluvial side by side with Apache Kafka.

group-consume: 3 confluent-kafka members (one process each) subscribe to a 6-partition topic
of 100 B records in one fresh group and read it to the end, committing (sync) after every
consume() batch of up to 1,000 records; timed from the first record any member received to
the last record (the group join before the first record is not counted).
commit-rate: 3 processes, each with its own group and 6 assigned partitions, commit one
partition's offset synchronously in a loop for a fixed time; commits acknowledged per second.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import clients  # noqa: E402
from benchmarks.brokers import FLUVIAL_DEFAULT, KAFKA, make_workdir, remove_workdir, start_system  # noqa: E402

RECORDS = 300_000
SIZE = 100
PARTITIONS = 6
MEMBERS = 3
COMMIT_SECONDS = 10


def member(bootstrap, topic, group, total, done, out):
    from confluent_kafka import Consumer
    c = Consumer({**clients.confluent_consumer_config(bootstrap, group), "session.timeout.ms": 10000})
    c.subscribe([topic])
    first = last = None
    n = 0
    deadline = time.monotonic() + 300
    while done.value < total and time.monotonic() < deadline:
        batch = c.consume(num_messages=1000, timeout=0.2)
        if not batch:
            continue
        now = time.time()
        first = first or now
        last = now
        n += len(batch)
        with done.get_lock():
            done.value += len(batch)
        c.commit(asynchronous=False)
    c.close()
    out.put((first, last, n))


def committer(bootstrap, topic, group, seconds, out):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer(clients.confluent_consumer_config(bootstrap, group))
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        c.commit(offsets=[TopicPartition(topic, n % PARTITIONS, 1 + n // PARTITIONS)], asynchronous=False)
        n += 1
    out.put(n / (time.perf_counter() - t0))
    c.close()


def run_system(spec, rounds: int):
    workdir = make_workdir()
    broker = start_system(spec, workdir)
    results = {"group-consume records/s": [], "commit-rate commits/s": []}
    try:
        topic = clients.unique_name("group-consume")
        clients.create_topic(broker.bootstrap, topic, PARTITIONS)
        clients.produce_confluent(broker.bootstrap, topic, RECORDS, SIZE, 300)
        ctx = mp.get_context("spawn")
        for r in range(rounds + 1):
            done, out = ctx.Value("q", 0), ctx.Queue()
            group = clients.unique_name("g")
            procs = [ctx.Process(target=member, args=(broker.bootstrap, topic, group, RECORDS, done, out))
                     for _ in range(MEMBERS)]
            for p in procs:
                p.start()
            got = [out.get(timeout=400) for _ in procs]
            for p in procs:
                p.join()
            firsts = [f for f, _, n in got if n]
            lasts = [l for _, l, n in got if n]
            total = sum(n for *_, n in got)
            rate = total / (max(lasts) - min(firsts))
            out2 = ctx.Queue()
            procs = [ctx.Process(target=committer, args=(broker.bootstrap, topic, clients.unique_name("c"),
                                                         COMMIT_SECONDS, out2)) for _ in range(MEMBERS)]
            for p in procs:
                p.start()
            commits = sum(out2.get(timeout=120) for _ in procs)
            for p in procs:
                p.join()
            print(f"{spec.name} round {r}{' (warm-up)' if r == 0 else ''}: group consume {rate:,.0f} records/s "
                  f"({total} records), commits {commits:,.0f}/s", flush=True)
            if r > 0:
                results["group-consume records/s"].append(rate)
                results["commit-rate commits/s"].append(commits)
    finally:
        broker.stop()
        remove_workdir(workdir)
    return results


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    summary = {}
    for spec in (KAFKA, FLUVIAL_DEFAULT):
        summary[spec.name] = run_system(spec, rounds)
    print(json.dumps(summary, indent=1))
    out = Path(__file__).parent / "results" / "groups.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rounds": rounds, "figures": summary}, indent=1))
