"""How a Fluvial broker's threads share the cores while confluent-kafka produces 20-field Avro
records into a typed table: per thread role, CPU time, time spent runnable but waiting for a
core (the scheduler's run-queue wait, /proc/<pid>/task/<tid>/schedstat) and context switches
per produce request, with the machine's idle share over the same window.

One broker (flush policy `ack`), one typed table per run, `--records` records of about
`--size` bytes, `--runs` runs on the same broker (the first one warms it and is not counted).
A broker that is short of cores shows run-queue waits near its CPU time; one that waits on
something else (the disk, the client, the next request) shows idle cores and little
run-queue wait. Saves `results/typed-produce-sched-<size>.json` with the machine, the load
average and the kernel command line's scheduler and idle settings.

    python -m benchmarks.probe_typed_produce_sched [--size 200|1000] [--records 300000] [--runs 4]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks import clients, machine
from benchmarks.brokers import FLUVIAL_DEFAULT, make_workdir, remove_workdir, start_system
from benchmarks.profile_typed_produce import thread_roles
from benchmarks.workloads import Scale
from benchmarks.workloads.avro_common import avro_values, create_avro_topic, produce_values

# Kernel command-line settings that decide how runnable threads get a core on a VM.
_KERNEL_FLAGS = ("sched_vcpu_pack", "haltpoll.guest_halt_poll_ns", "cpuidle_haltpoll.force", "idle")


def thread_sched(pid: int) -> dict[int, tuple[int, int, int, int]]:
    """Per thread: CPU ns, run-queue wait ns, voluntary and involuntary context switches."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            cpu_ns, wait_ns, _slices = map(int, Path(f"{base}/schedstat").read_text().split())
            status = Path(f"{base}/status").read_text()
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        voluntary = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        involuntary = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        out[int(tid)] = (cpu_ns, wait_ns, voluntary, involuntary)
    return out


def machine_idle_jiffies() -> tuple[int, int]:
    """(idle + iowait, total) jiffies of all CPUs so far. The total is user to steal: the
    guest fields that follow are counted in user and nice already."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return fields[3] + fields[4], sum(fields)


def kernel_flags() -> dict[str, str]:
    words = Path("/proc/cmdline").read_text().split()
    return {w.split("=", 1)[0]: (w.split("=", 1)[1] if "=" in w else "") for w in words
            if w.split("=", 1)[0] in _KERNEL_FLAGS}


def one_run(broker, data, records: int) -> dict:
    scale = Scale(quick=False)
    topic, values = create_avro_topic(broker, "probe-sched", True, scale, data)
    before, idle_before, client_before = thread_sched(broker.pid), machine_idle_jiffies(), os.times()
    start = time.perf_counter()
    figures = produce_values(broker.bootstrap, topic, values, scale.timeout_s).figures()
    elapsed = time.perf_counter() - start
    after, idle_after, client_after = thread_sched(broker.pid), machine_idle_jiffies(), os.times()
    roles = thread_roles(broker.pid)
    # The client fills requests of about batch.size bytes.
    requests = records * data.mean_size / clients.PRODUCER.batch_size
    by_role: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for tid, now in after.items():
        then = before.get(tid, (0, 0, 0, 0))
        role = roles.get(tid, "native threads")
        acc = by_role[role]
        acc[0] += (now[0] - then[0]) / 1e9 / elapsed
        acc[1] += (now[1] - then[1]) / 1e9 / elapsed
        acc[2] += (now[2] - then[2]) / requests
        acc[3] += (now[3] - then[3]) / requests
    idle = (idle_after[0] - idle_before[0]) / max(1, idle_after[1] - idle_before[1])
    client_cpu = ((client_after.user - client_before.user) + (client_after.system - client_before.system)) / elapsed
    return {
        "records_per_s": round(figures["records/s"]),
        "machine_idle_share": round(idle, 3),
        "client_cores": round(client_cpu, 3),
        "by_role": {role: {"cores": round(v[0], 3), "run_queue_wait_s_per_s": round(v[1], 3),
                           "voluntary_switches_per_request": round(v[2], 2),
                           "involuntary_switches_per_request": round(v[3], 2)}
                    for role, v in sorted(by_role.items()) if v[0] > 0.005},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1000, choices=(200, 1000))
    p.add_argument("--records", type=int, default=300_000)
    p.add_argument("--runs", type=int, default=4)
    args = p.parse_args()
    out = Path(__file__).parent / "results" / f"typed-produce-sched-{args.size}.json"
    data = avro_values(args.size, args.records)
    load_before = os.getloadavg()
    workdir = make_workdir()
    broker = start_system(FLUVIAL_DEFAULT, workdir)
    try:
        runs = [one_run(broker, data, args.records) for _ in range(args.runs)]
    finally:
        broker.stop()
        remove_workdir(workdir)
    counted = runs[1:] or runs
    roles = sorted({role for r in counted for role in r["by_role"]})
    summary = {
        "records_per_s": statistics.median(r["records_per_s"] for r in counted),
        "machine_idle_share": statistics.median(r["machine_idle_share"] for r in counted),
        "client_cores": statistics.median(r["client_cores"] for r in counted),
        "by_role": {role: {key: statistics.median(r["by_role"][role][key] for r in counted if role in r["by_role"])
                           for key in ("cores", "run_queue_wait_s_per_s", "voluntary_switches_per_request",
                                       "involuntary_switches_per_request")}
                    for role in roles},
    }
    broker_cores = sum(v["cores"] for v in summary["by_role"].values())
    broker_wait = sum(v["run_queue_wait_s_per_s"] for v in summary["by_role"].values())
    summary["broker_cores"] = round(broker_cores, 3)
    summary["broker_run_queue_wait_s_per_s"] = round(broker_wait, 3)
    result = {
        "workload": "typed-produce-sched", "machine": machine.describe(), "kernel_flags": kernel_flags(),
        "settings": {"size": args.size, "records": args.records, "runs": args.runs, "counted": len(counted),
                     "mean_value_bytes": round(data.mean_size, 1), "flush_policy": "ack"},
        "summary": summary, "runs": runs, "loadavg_before": load_before, "loadavg": os.getloadavg(),
    }
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
