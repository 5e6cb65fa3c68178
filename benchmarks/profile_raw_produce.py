"""Where a Fluvial broker's time goes while confluent-kafka produces raw values (the
produce-raw workload's librdkafka case), sampled with py-spy.

One broker (`--flush-policy`, default the broker's own), one raw topic, `--records` values
of `--size` bytes produced as fast as the client goes; py-spy samples every thread holding
the GIL (`--gil --format raw`: the interpreter's time, the limit of one broker process) for
`--sample-s` seconds from one second after the first send. Saves the inclusive share of each
function over the busy samples, the throughput and the load average to
`results/profile-raw-produce-<size>[-<label>].json`; the raw py-spy output stays in `benchmarks/.cache/`.

`--client java` produces with Apache Kafka's ProducerPerformance instead, `--kafka` measures
Apache Kafka itself (no profile), `--perf` samples the whole process with Linux perf. Every
run also records the producer's CPU per MB (this process and its children: meaningful with
`--no-profile`, where no sampler runs) and, from the broker's /metrics, the mean produce
request duration (fsync wait included) and the mean fsync: under flush policy `ack` a
producer with few requests in flight (Java's five) goes at the pace of those answers.
`--no-profile --label L` saves its figures too.

    python -m benchmarks.profile_raw_produce [--size 100|1000] [--records 400000] [--client java]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import psutil

from benchmarks import clients, machine
from benchmarks.brokers import KAFKA, FLUVIAL_DEFAULT, FLUVIAL_FLUSH_NONE, make_workdir, remove_workdir, start_system
from benchmarks.profile_typed_produce import busy_shares


# The raw produce path's parts, by function name as py-spy reports it (inclusive shares of
# the samples holding the GIL; a part made of several functions takes the largest).
PARTS = {
    "frame_reading": ("StreamReader.readexactly (asyncio/streams.py)", "FrameReader.read_frame (broker/frames.py)"),
    "socket_data": ("StreamReader.feed_data (asyncio/streams.py)", "FrameReader.buffer_updated (broker/frames.py)"),
    "produce_handler": ("produce (broker/handlers/produce.py)",),
    "conversion": ("to_arrow (broker/kafka_batches.py)",),
    "log_tablet_append": ("LogTablet.append (broker/log/tablet.py)",),
    "ipc_encoding": ("encode_batch (broker/log/segment_format.py)",),
    "executor_hand_off": ("BaseEventLoop.run_in_executor (asyncio/base_events.py)",),
}


def parts_pct(top: dict[str, float]) -> dict[str, float]:
    return {part: max(top.get(name, 0.0) for name in names) for part, names in PARTS.items()}


def _minor_faults(pid: int) -> int:
    """Minor page faults of the process so far (/proc/<pid>/stat, field 10): each fresh page a
    buffer touches costs one, in kernel time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])


def _latency_sums(broker) -> dict[str, float]:
    """Sums and counts of the broker's produce request durations (read to answer ready, the
    fsync wait included) and of its fsyncs, from its /metrics page; empty for Apache Kafka."""
    if "--http-port" not in getattr(broker, "listeners", {}):
        return {}
    text = urllib.request.urlopen(f"{broker.http_url}/metrics", timeout=10).read().decode()
    wanted = {'fluvial_kafka_request_duration_seconds_sum{api="produce"}': "produce_s",
              'fluvial_kafka_request_duration_seconds_count{api="produce"}': "produce_n",
              "fluvial_log_fsync_duration_seconds_sum": "fsync_s", "fluvial_log_fsync_duration_seconds_count": "fsync_n"}
    sums = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in wanted:
            sums[wanted[name]] = float(value)
    return sums


def _latency_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean produce request duration and mean fsync between two scrapes, and the fsyncs per request."""
    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)
    out = {}
    if delta("produce_n") > 0:
        out["produce_request_mean_ms"] = 1000 * delta("produce_s") / delta("produce_n")
        out["produce_requests"] = delta("produce_n")
    if delta("fsync_n") > 0:
        out["fsync_mean_ms"] = 1000 * delta("fsync_s") / delta("fsync_n")
        out["fsyncs"] = delta("fsync_n")
    return out


def _client_cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1000, choices=(100, 1000))
    p.add_argument("--records", type=int, default=0, help="default: 1,000,000 at 100 B, 300,000 at 1 KB")
    p.add_argument("--sample-s", type=float, default=3)
    p.add_argument("--flush-policy", choices=("ack", "none"), default="ack")
    p.add_argument("--client", choices=("confluent", "java"), default="confluent",
                   help="librdkafka (confluent-kafka) or Apache Kafka's Java producer (ProducerPerformance)")
    p.add_argument("--label", default="", help="saved as profile-raw-produce-<size>-<label>.json")
    p.add_argument("--no-profile", action="store_true", help="measure throughput only")
    p.add_argument("--native", action="store_true",
                   help="sample every busy thread with its native frames (py-spy --native), not only the GIL's holder")
    p.add_argument("--kafka", action="store_true",
                   help="measure Apache Kafka instead (throughput and CPU per MB only, for comparison)")
    p.add_argument("--perf", action="store_true",
                   help="sample with Linux perf instead (kernel and native frames: benchmarks/.cache/*.perf.txt)")
    args = p.parse_args()
    records = args.records or (1_000_000 if args.size == 100 else 300_000)
    cache = Path(__file__).parent / ".cache"
    cache.mkdir(exist_ok=True)
    raw_path = cache / f"profile-raw-produce-{args.size}.txt"
    suffix = ("-java" if args.client == "java" else "") + (f"-{args.label}" if args.label else "")
    out = Path(__file__).parent / "results" / f"profile-raw-produce-{args.size}{suffix}.json"
    load_before = os.getloadavg()
    workdir = make_workdir()
    if args.kafka:
        args.no_profile = True
    broker = start_system(KAFKA if args.kafka else FLUVIAL_DEFAULT if args.flush_policy == "ack" else FLUVIAL_FLUSH_NONE,
                          workdir)
    try:
        topic = clients.unique_name("profile-raw")
        clients.create_topic(broker.bootstrap, topic, 1)

        def sample() -> None:
            time.sleep(1.0 if args.client == "confluent" else 3.0)  # the JVM starts first
            if args.perf:
                data = cache / f"profile-raw-produce-{args.size}.perf"
                subprocess.run(["perf", "record", "-F", "1999", "-g", "-p", str(broker.pid), "-o", str(data), "--",
                                "sleep", str(args.sample_s)], check=True, capture_output=True)
                with open(f"{data}.txt", "w") as report:
                    subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--percent-limit", "0.7",
                                    "--stdio", "-g", "none", "--sort", "dso,sym"], stdout=report, check=True)
                return
            mode = ["--native"] if args.native else ["--gil", "--nonblocking"]
            subprocess.run(["py-spy", "record", "--pid", str(broker.pid), "--format", "raw", "--threads", *mode,
                            "-r", "100", "-d", str(int(args.sample_s)), "-o", str(raw_path)],
                           check=True, capture_output=True)

        sampler = threading.Thread(target=sample)
        if not args.no_profile:
            sampler.start()
        process = psutil.Process(broker.pid)
        before, faults_before = process.cpu_times(), _minor_faults(broker.pid)
        client_before = _client_cpu_s()
        latency_before = _latency_sums(broker)
        produce = clients.produce_confluent if args.client == "confluent" else clients.produce_java
        figures = produce(broker.bootstrap, topic, records, args.size, 300).figures()
        after = process.cpu_times()
        figures |= _latency_figures(latency_before, _latency_sums(broker))
        # The producer's CPU (this process for librdkafka, the JVM child for Java): on two
        # shared cores, what the broker takes is what the client cannot have.
        figures["client_cpu_ms_per_mb"] = 1000 * (_client_cpu_s() - client_before) / (records * args.size / 1e6)
        figures["broker_minor_faults_per_mb"] = (_minor_faults(broker.pid) - faults_before) / (records * args.size / 1e6)
        # The broker's own CPU time per MB produced: less sensitive to other load on the
        # machine than the throughput is.
        figures["broker_cpu_ms_per_mb"] = 1000 * ((after.user - before.user) + (after.system - before.system)) / (
            records * args.size / 1e6)
        figures["broker_sys_share"] = (after.system - before.system) / max(
            1e-9, (after.user - before.user) + (after.system - before.system))
        if not args.no_profile:
            sampler.join()
    finally:
        broker.stop()
        remove_workdir(workdir)
    if args.no_profile:
        result = {"workload": "profile-raw-produce", "sampler": None, "machine": machine.describe(),
                  "settings": {"size": args.size, "records": records, "flush_policy": args.flush_policy,
                               "client": args.client, "system": "kafka" if args.kafka else "fluvial"},
                  "produce": figures, "loadavg_before": load_before, "loadavg": os.getloadavg()}
        print(json.dumps(result))
        if args.label:  # saved only when labelled: a plain run is a quick look
            out.write_text(json.dumps(result, indent=1))
        return
    if args.perf:
        # Whole-process CPU samples (kernel included) by symbol: "28.52%  [kernel.kallsyms]  [k] name".
        top = {}
        for line in (cache / f"profile-raw-produce-{args.size}.perf.txt").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 4 and fields[0].endswith("%") and fields[2] in ("[k]", "[.]"):
                top[f"{fields[3]} ({fields[1].strip('[]')})"] = float(fields[0][:-1])
        result = {"workload": "profile-raw-produce", "sampler": "perf", "machine": machine.describe(),
                  "settings": {"size": args.size, "records": records, "flush_policy": args.flush_policy,
                               "sample_s": args.sample_s, "client": args.client},
                  "produce": figures, "top_self_pct": top, "loadavg_before": load_before, "loadavg": os.getloadavg()}
        out = out.with_name(out.stem + "-perf.json")
        out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
        return
    total, shares = busy_shares(raw_path.read_text())
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:45]
    result = {
        "workload": "profile-raw-produce", "machine": machine.describe(),
        "settings": {"size": args.size, "records": records, "flush_policy": args.flush_policy,
                     "sample_s": args.sample_s, "client": args.client},
        "produce": figures, "busy_samples": total,
        # Interpreter (GIL) time per MB produced: samples at 100 Hz are 10 ms each.
        "gil_ms_per_mb": round(total * 10 / (figures["MB/s"] * args.sample_s), 2),
        "top_inclusive_pct": {name: round(100 * share, 1) for name, share in top},
        "parts_pct": parts_pct({name: round(100 * share, 1) for name, share in shares.items()}),
        "loadavg_before": load_before, "loadavg": os.getloadavg(),
    }
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["top_inclusive_pct"], indent=1))
    print(f"{figures}\nsaved {out}")


if __name__ == "__main__":
    main()
