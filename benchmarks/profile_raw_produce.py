"""Where a Fluvial broker's time goes while confluent-kafka produces raw values (the
produce-raw workload's librdkafka case), sampled with py-spy.

One broker (`--flush-policy`, default the broker's own), one raw topic, `--records` values
of `--size` bytes produced as fast as the client goes; py-spy samples every thread holding
the GIL (`--gil --format raw`: the interpreter's time, the limit of one broker process) for
`--sample-s` seconds from one second after the first send. Saves the inclusive share of each
function over the busy samples, the throughput and the load average to
`results/profile-raw-produce-<size>.json`; the raw py-spy output stays in `benchmarks/.cache/`.

    python -m benchmarks.profile_raw_produce [--size 100|1000] [--records 400000]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import psutil

from benchmarks import clients, machine
from benchmarks.brokers import FLUVIAL_DEFAULT, FLUVIAL_FLUSH_NONE, make_workdir, remove_workdir, start_system
from benchmarks.profile_typed_produce import busy_shares


def _minor_faults(pid: int) -> int:
    """Minor page faults of the process so far (/proc/<pid>/stat, field 10): each fresh page a
    buffer touches costs one, in kernel time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1000, choices=(100, 1000))
    p.add_argument("--records", type=int, default=0, help="default: 1,000,000 at 100 B, 300,000 at 1 KB")
    p.add_argument("--sample-s", type=float, default=3)
    p.add_argument("--flush-policy", choices=("ack", "none"), default="ack")
    p.add_argument("--no-profile", action="store_true", help="measure throughput only")
    p.add_argument("--perf", action="store_true",
                   help="sample with Linux perf instead (kernel and native frames: benchmarks/.cache/*.perf.txt)")
    args = p.parse_args()
    records = args.records or (1_000_000 if args.size == 100 else 300_000)
    cache = Path(__file__).parent / ".cache"
    cache.mkdir(exist_ok=True)
    raw_path = cache / f"profile-raw-produce-{args.size}.txt"
    out = Path(__file__).parent / "results" / f"profile-raw-produce-{args.size}.json"
    load_before = os.getloadavg()
    workdir = make_workdir()
    broker = start_system(FLUVIAL_DEFAULT if args.flush_policy == "ack" else FLUVIAL_FLUSH_NONE, workdir)
    try:
        topic = clients.unique_name("profile-raw")
        clients.create_topic(broker.bootstrap, topic, 1)

        def sample() -> None:
            time.sleep(1.0)
            if args.perf:
                data = cache / f"profile-raw-produce-{args.size}.perf"
                subprocess.run(["perf", "record", "-F", "499", "-g", "-p", str(broker.pid), "-o", str(data), "--",
                                "sleep", str(args.sample_s)], check=True, capture_output=True)
                with open(f"{data}.txt", "w") as report:
                    subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--percent-limit", "0.7",
                                    "--stdio", "-g", "none", "--sort", "dso,sym"], stdout=report, check=True)
                return
            subprocess.run(["py-spy", "record", "--pid", str(broker.pid), "--format", "raw", "--threads", "--gil",
                            "-r", "100", "-d", str(int(args.sample_s)), "-o", str(raw_path), "--nonblocking"],
                           check=True, capture_output=True)

        sampler = threading.Thread(target=sample)
        if not args.no_profile:
            sampler.start()
        process = psutil.Process(broker.pid)
        before, faults_before = process.cpu_times(), _minor_faults(broker.pid)
        figures = clients.produce_confluent(broker.bootstrap, topic, records, args.size, 300).figures()
        after = process.cpu_times()
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
    if args.no_profile or args.perf:
        print(json.dumps({"produce": figures, "loadavg": os.getloadavg()}))
        return
    total, shares = busy_shares(raw_path.read_text())
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:45]
    result = {
        "workload": "profile-raw-produce", "machine": machine.describe(),
        "settings": {"size": args.size, "records": records, "flush_policy": args.flush_policy,
                     "sample_s": args.sample_s},
        "produce": figures, "busy_samples": total,
        "top_inclusive_pct": {name: round(100 * share, 1) for name, share in top},
        "loadavg_before": load_before, "loadavg": os.getloadavg(),
    }
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["top_inclusive_pct"], indent=1))
    print(f"{figures}\nsaved {out}")


if __name__ == "__main__":
    main()
