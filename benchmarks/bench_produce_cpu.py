"""CPU per record of the broker and of the producing client, Fluvial and Apache Kafka side by
side: where the produce throughput of a 2-core machine goes, since the client (confluent-kafka)
runs on the same cores as the broker.

`--case typed200`: the produce-avro workload's 20-field Avro values of about 200 B, into a
typed table on Fluvial and into a plain topic of the same bytes on Kafka. `--case raw1000`:
the produce-raw workload's 1 KB values into a raw topic on both. Each round starts a fresh
broker, produces 100,000 values to warm it (and Kafka's JIT) up, then `--records` values as
fast as the client goes (settings as produce-raw, acks=all); the systems alternate, Kafka
first in even pairs. Per round: records/s, the broker process's CPU per record (user + system
of all its threads, from /proc), this process's own CPU per record (the client's), and the
1-minute load average. Saves results/produce-cpu-<case>.json with each round and the medians.

    python -m benchmarks.bench_produce_cpu [--case typed200|raw1000] [--records 500000] [--pairs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from benchmarks import clients, machine
from benchmarks.brokers import FLUVIAL_DEFAULT, KAFKA, make_workdir, remove_workdir, start_system
from benchmarks.profile_typed_produce import thread_cpu_s
from benchmarks.workloads.avro_common import avro_values, produce_values, register_value_schema

WARM_UP_RECORDS = 100_000


def one_round(spec, case: str, values: list[bytes], data) -> dict:
    workdir = make_workdir()
    broker = start_system(spec, workdir)
    try:
        topic = clients.unique_name("produce-cpu")
        if case == "typed200" and spec.product == "fluvial":
            values = data.framed_for(register_value_schema(broker, topic))
        clients.create_topic(broker.bootstrap, topic, 1)
        produce_values(broker.bootstrap, topic, values[:WARM_UP_RECORDS], 300)
        cpu_before, client_before = thread_cpu_s(broker.pid), os.times()
        figures = produce_values(broker.bootstrap, topic, values, 300).figures()
        cpu_after, client_after = thread_cpu_s(broker.pid), os.times()
    finally:
        broker.stop()
        remove_workdir(workdir)
    n = len(values)
    broker_s = sum(cpu_after[k] - cpu_before[k] for k in ("event_loop", "other_threads"))
    client_s = (client_after.user - client_before.user) + (client_after.system - client_before.system)
    return {"system": spec.product, "records_per_s": round(figures["records/s"]),
            "broker_cpu_us_per_record": round(1e6 * broker_s / n, 3),
            "client_cpu_us_per_record": round(1e6 * client_s / n, 3),
            "load_1min": round(os.getloadavg()[0], 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=("typed200", "raw1000"), default="typed200")
    p.add_argument("--records", type=int, default=500_000)
    p.add_argument("--pairs", type=int, default=3)
    args = p.parse_args()
    data = None
    if args.case == "typed200":
        data = avro_values(200, args.records)
        values = data.values
    else:
        one = [clients.payload(1000) for _ in range(1000)]
        values = [one[i % len(one)] for i in range(args.records)]
    load_before = os.getloadavg()
    rounds = []
    for pair in range(args.pairs):
        for spec in ((KAFKA, FLUVIAL_DEFAULT) if pair % 2 == 0 else (FLUVIAL_DEFAULT, KAFKA)):
            row = one_round(spec, args.case, values, data)
            rounds.append(row)
            print(row, flush=True)
    medians = {}
    for system in ("kafka", "fluvial"):
        rows = [r for r in rounds if r["system"] == system]
        medians[system] = {k: statistics.median(r[k] for r in rows)
                           for k in ("records_per_s", "broker_cpu_us_per_record", "client_cpu_us_per_record")}
    result = {"workload": "produce-cpu", "case": args.case, "machine": machine.describe(),
              "settings": {"records": args.records, "pairs": args.pairs, "warm_up_records": WARM_UP_RECORDS},
              "rounds": rounds, "medians": medians, "loadavg_before": load_before, "loadavg": os.getloadavg()}
    out = Path(__file__).parent / "results" / f"produce-cpu-{args.case}.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(medians, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
