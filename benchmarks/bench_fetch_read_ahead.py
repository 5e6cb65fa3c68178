"""Catch-up reads of a raw topic from the segments: Fluvial with and without its fetch
read-ahead (`--fetch-read-ahead on|off`, broker/read_ahead.py PreparedReads) beside Apache
Kafka, the three brokers side by side.

Each broker gets the consume-raw workload's 1 KB topic (`--records` values of 1,000 bytes,
produced as produce-raw does: about 205 MB, so most of it is read back from the segments
rather than Fluvial's 64 MiB wire cache); then `--rounds` rounds each read the topic once
with confluent-kafka on every broker, in an order that rotates round by round. Figures:
records/s per read (timed as consume-raw times them), the median per system, the median of
the per-round ratios (Fluvial with read-ahead / Kafka, with / without), and Fluvial's
`fluvial_fetch_reads_ahead_total` counts; also the CPU per record read (user + system) of
each broker process and of this process (the consumer, librdkafka's threads included) over
each read, the median per system: which side a read is bound by. Saves
results/fetch-read-ahead.json.

    python -m benchmarks.bench_fetch_read_ahead [--records 200000] [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks import clients, machine
from benchmarks.brokers import FLUVIAL_DEFAULT, KAFKA, make_workdir, remove_workdir, start_fluvial, start_system

RESULTS = Path(__file__).parent / "results" / "fetch-read-ahead.json"
SIZE = 1000
SYSTEMS = ("kafka", "fluvial", "fluvial-no-read-ahead")


def reads_ahead(http_url: str) -> dict[str, float]:
    """The broker's `fluvial_fetch_reads_ahead_total` by outcome."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {sample.labels["outcome"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "fluvial_fetch_reads_ahead_total"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    load_before = os.getloadavg()
    brokers = {}
    workdirs = []
    try:
        for name in SYSTEMS:
            workdir = make_workdir()
            workdirs.append(workdir)
            if name == "kafka":
                brokers[name] = start_system(KAFKA, workdir)
            else:
                extra = ("--fetch-read-ahead", "off") if name == "fluvial-no-read-ahead" else ()
                brokers[name] = start_fluvial(workdir, FLUVIAL_DEFAULT, extra_args=extra)
        topics = {}
        for name, broker in brokers.items():
            topic = clients.unique_name("read-ahead")
            clients.create_topic(broker.bootstrap, topic, 1, 60)
            clients.produce_confluent(broker.bootstrap, topic, args.records, SIZE, 300)
            topics[name] = topic
        rounds: dict[str, list[float]] = {name: [] for name in SYSTEMS}
        cpu_us: dict[str, dict[str, list[float]]] = {name: {"broker": [], "consumer": []} for name in SYSTEMS}
        consumer = os.getpid()
        for r in range(args.rounds):
            order = SYSTEMS[r % len(SYSTEMS):] + SYSTEMS[:r % len(SYSTEMS)]
            for name in order:
                pid = brokers[name].pid
                broker_before, consumer_before = machine.process_cpu_s(pid), machine.process_cpu_s(consumer)
                figures = clients.consume_confluent(brokers[name].bootstrap, topics[name], args.records, 1, 300).figures()
                cpu_us[name]["broker"].append((machine.process_cpu_s(pid) - broker_before) / args.records * 1e6)
                cpu_us[name]["consumer"].append((machine.process_cpu_s(consumer) - consumer_before) / args.records * 1e6)
                rounds[name].append(figures["records/s"])
            print(f"round {r}: " + ", ".join(f"{n} {rounds[n][-1]:,.0f}" for n in SYSTEMS), flush=True)
        counts = {name: reads_ahead(brokers[name].http_url)
                  for name in SYSTEMS if name != "kafka"}
    finally:
        for broker in brokers.values():
            broker.stop()
        for workdir in workdirs:
            remove_workdir(workdir)

    def ratios(a: str, b: str) -> dict:
        values = [x / y for x, y in zip(rounds[a], rounds[b])]
        return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                "max": round(max(values), 3)}

    result = {
        "workload": "fetch-read-ahead", "machine": machine.describe(),
        "settings": {"records": args.records, "value_bytes": SIZE, "rounds": args.rounds, "client": "confluent-kafka",
                     "consumer": "defaults (1 MiB per partition), partitions assigned from the beginning"},
        "records_per_s": {name: {"rounds": [round(v) for v in values], "median": round(statistics.median(values)),
                                 "min": round(min(values)), "max": round(max(values))}
                          for name, values in rounds.items()},
        "ratio_fluvial_to_kafka": ratios("fluvial", "kafka"),
        "ratio_no_read_ahead_to_kafka": ratios("fluvial-no-read-ahead", "kafka"),
        "ratio_read_ahead_on_to_off": ratios("fluvial", "fluvial-no-read-ahead"),
        "reads_ahead": counts,
        "cpu_us_per_record": {name: {side: round(statistics.median(values), 3) for side, values in sides.items()}
                              for name, sides in cpu_us.items()},
        "loadavg_before": load_before, "loadavg": os.getloadavg(),
    }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
