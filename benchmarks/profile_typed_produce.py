"""Where a Fluvial broker's time goes while confluent-kafka produces 20-field Avro records
into a typed table (the produce-avro workload's typed case), sampled with py-spy.

One broker (`--flush-policy`, default the broker's own), one typed table, `--records`
records of about `--size` bytes produced as fast as the client goes; py-spy samples every
thread holding the GIL (`--gil --format raw`: where the interpreter's time goes, the
limit of one broker process) for `--sample-s` seconds from one second after the first
send. Saves the inclusive share of each function over those samples with the load average to `results/profile-typed-produce-<size>.json`; the raw py-spy output stays in
`benchmarks/.cache/`. Also the broker's CPU time per record (user + system, from /proc) of
its event-loop thread and of its other threads together; with `--sample-s 0` py-spy does not
run (it slows the broker) and only that accounting is saved, to
`results/typed-produce-cpu-<size>.json`. Also the broker's CPU per record by thread role
(the event loop, each thread pool, the threads Python does not know, such as Arrow's),
from one `py-spy dump` naming the threads, and this process's own CPU per record while
producing (the client's).

    python -m benchmarks.profile_typed_produce [--size 200|1000] [--records 400000] [--sample-s 0]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

from benchmarks import clients, machine
from benchmarks.brokers import FLUVIAL_DEFAULT, FLUVIAL_FLUSH_NONE, make_workdir, remove_workdir, start_system
from benchmarks.workloads.avro_common import avro_values, produce_values, register_value_schema

# Frames that mean a thread is waiting, not working.
_IDLE = re.compile(r"\b(select|poll|epoll_wait|wait|_wait_for_tstate_lock|acquire|get|_worker|sleep)\b \(")


def busy_shares(raw: str) -> tuple[int, dict[str, float]]:
    """Inclusive share of each function over the samples whose innermost frame is not a wait."""
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        if not line.startswith("thread"):
            continue
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")[1:]
        if not frames or _IDLE.search(frames[-1]):
            continue
        n = int(count)
        total += n
        for name in {re.sub(r" \((.*?):\d+\)", r" (\1)", f) for f in frames}:
            inclusive[name] += n
    return total, {name: n / total for name, n in inclusive.items()} if total else {}


# The steps of the typed produce path quoted in docs/architecture.md, by the function whose
# inclusive share stands for each (a step absent from the samples took 0%).
KEY_STEPS = {
    "request_read": "KafkaServer._read_requests (broker/server.py)",
    "produce_handler": "produce (broker/handlers/produce.py)",
    "to_arrow": "to_arrow (broker/kafka_batches.py)",
    "avro_decode": "AvroValueCodec.decode (schema/codecs.py)",
    "log_append": "LogTablet.append (broker/log/tablet.py)",
    "statistics": "compute_stats (broker/log/statistics.py)",
    "ipc_encode_and_compress": "encode_batch (broker/log/segment_format.py)",
    "executor_handoff": "BaseEventLoop.run_in_executor (asyncio/base_events.py)",
}


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of a process's event-loop thread (its main
    thread) and of all its other threads together (executors, fsync, Arrow's pool); under
    `minor_faults`, the page faults of all its threads (fresh pages the kernel maps and zeroes)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"event_loop": 0.0, "other_threads": 0.0, "minor_faults": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        out["event_loop" if int(tid) == pid else "other_threads"] += (int(fields[11]) + int(fields[12])) / tick
        out["minor_faults"] += int(fields[7])
    return out


def thread_cpu_by_tid(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) so far of each thread of a process."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


_THREAD_LINE = re.compile(r'^Thread (\d+) \([^)]*\): "([^"]*)"', re.M)


def thread_roles(pid: int) -> dict[int, str]:
    """The Python threads of a process by OS thread id, named by their role (the thread
    name without its pool index: `fluvial-cpu`, `fluvial-io`, ...; the main thread is the
    event loop), from one `py-spy dump`; {} when py-spy is not there."""
    try:
        dump = subprocess.run(["py-spy", "dump", "--pid", str(pid), "--nonblocking"], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(tid): "event_loop" if int(tid) == pid else re.sub(r"[_-]?\d+$", "", name)
            for tid, name in _THREAD_LINE.findall(dump)}


def key_steps(top_inclusive_pct: dict[str, float]) -> dict[str, float]:
    """Inclusive % of the GIL-holding samples for each step of KEY_STEPS."""
    return {step: top_inclusive_pct.get(name, 0.0) for step, name in KEY_STEPS.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=200, choices=(200, 1000))
    p.add_argument("--records", type=int, default=300_000)
    p.add_argument("--sample-s", type=float, default=3, help="0: no py-spy, only the CPU accounting")
    p.add_argument("--flush-policy", choices=("ack", "none"), default="ack")
    args = p.parse_args()
    cache = Path(__file__).parent / ".cache"
    cache.mkdir(exist_ok=True)
    raw_path = cache / f"profile-typed-produce-{args.size}.txt"
    out = Path(__file__).parent / "results" / f"profile-typed-produce-{args.size}.json"
    data = avro_values(args.size, args.records)
    load_before = os.getloadavg()
    workdir = make_workdir()
    broker = start_system(FLUVIAL_DEFAULT if args.flush_policy == "ack" else FLUVIAL_FLUSH_NONE, workdir)
    try:
        topic = clients.unique_name("profile-typed")
        values = data.framed_for(register_value_schema(broker, topic))
        clients.create_topic(broker.bootstrap, topic, 1)

        def sample() -> None:
            time.sleep(1.0)
            subprocess.run(["py-spy", "record", "--pid", str(broker.pid), "--format", "raw", "--threads", "--gil",
                            "-r", "100", "-d", str(int(args.sample_s)), "-o", str(raw_path), "--nonblocking"],
                           check=True, capture_output=True)

        sampler = threading.Thread(target=sample)
        if args.sample_s > 0:
            sampler.start()
        cpu_before, by_tid_before, client_before = thread_cpu_s(broker.pid), thread_cpu_by_tid(broker.pid), os.times()
        figures = produce_values(broker.bootstrap, topic, values, 300).figures()
        cpu_after, by_tid_after, client_after = thread_cpu_s(broker.pid), thread_cpu_by_tid(broker.pid), os.times()
        roles = thread_roles(broker.pid)
        if args.sample_s > 0:
            sampler.join()
    finally:
        broker.stop()
        remove_workdir(workdir)
    # Broker CPU per record by thread (sampling included when py-spy ran).
    faults = cpu_before.pop("minor_faults"), cpu_after.pop("minor_faults")
    cpu_us = {k: round(1e6 * (cpu_after[k] - cpu_before[k]) / args.records, 3) for k in cpu_before}
    by_role: dict[str, float] = collections.defaultdict(float)
    for tid, seconds in by_tid_after.items():
        by_role[roles.get(tid, "native threads")] += seconds - by_tid_before.get(tid, 0.0)
    cpu_us_by_role = {role: round(1e6 * seconds / args.records, 3) for role, seconds in sorted(by_role.items())}
    # This process's CPU while producing: the client (librdkafka's threads and the Python
    # loop that hands it the values).
    client_us = round(1e6 * ((client_after.user - client_before.user) + (client_after.system - client_before.system))
                      / args.records, 3)
    faults_per_1000 = round(1000 * (faults[1] - faults[0]) / args.records, 2)
    total, shares = busy_shares(raw_path.read_text()) if args.sample_s > 0 else (0, {})
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:45]
    result = {
        "workload": "profile-typed-produce", "machine": machine.describe(),
        "settings": {"size": args.size, "records": args.records, "flush_policy": args.flush_policy,
                     "sample_s": args.sample_s, "mean_value_bytes": round(data.mean_size, 1)},
        "produce": figures, "broker_cpu_us_per_record": cpu_us,
        "broker_cpu_us_per_record_by_thread": cpu_us_by_role, "client_cpu_us_per_record": client_us,
        "broker_minor_faults_per_1000_records": faults_per_1000, "busy_samples": total,
        "top_inclusive_pct": {name: round(100 * share, 1) for name, share in top},
        "steps_pct": key_steps({name: round(100 * share, 1) for name, share in shares.items()}),
        "loadavg_before": load_before, "loadavg": os.getloadavg(),
    }
    if args.sample_s <= 0:
        out = out.with_name(f"typed-produce-cpu-{args.size}.json")
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["top_inclusive_pct"], indent=1))
    print(f"broker CPU us per record by thread: {cpu_us_by_role}, client: {client_us}")
    print(f"{figures}\nbroker CPU us per record: {cpu_us}, minor faults per 1000 records: {faults_per_1000}\nsaved {out}")


if __name__ == "__main__":
    main()
