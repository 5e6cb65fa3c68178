"""Where a Fluvial broker's CPU goes while confluent-kafka produces 20-field Avro records into
a typed table, by Linux perf over the whole process (every thread, native code included:
what py-spy's GIL sampling cannot see, such as the compiled decoder and zstd running
without the GIL).

One broker (flush policy `ack`), one typed table, `--records` records of about `--size`
bytes produced as fast as the client goes; `perf record --call-graph dwarf` samples the
broker for `--sample-s` seconds from 0.7 s after the start. Each sample is put in the first
category (below) that a frame of its stack matches, leaf first, and counted for the event
loop thread or for the other threads. Saves the shares with the load average to
`results/perf-typed-produce-<size>.json`; perf's data stays in `benchmarks/.cache/`.

    python -m benchmarks.perf_typed_produce [--size 200|1000] [--records 400000] [--sample-s 1.5]
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
from benchmarks.brokers import FLUVIAL_DEFAULT, make_workdir, remove_workdir, start_system
from benchmarks.workloads.avro_common import avro_values, produce_values, register_value_schema

# Categories by a frame's symbol or library, tried from the leaf outwards.
CATEGORIES = [
    ("zstd", r"ZSTD|HUF_|FSE_|HIST_"),
    ("avro_decode_c", r"_avro\.cpython"),
    ("kafka_records_c", r"_records\.cpython"),
    ("crc32c", r"crc32c"),
    ("arrow_validation", r"Validat"),
    ("arrow_ipc", r"arrow::ipc"),
    ("arrow_other", r"libarrow"),
    ("numpy", r"_multiarray_umath"),
    ("file_write_and_fsync", r"pwritev|fdatasync|fsync|ext4"),
    ("socket_receive", r"sock_recv|tcp_recvmsg|recvfrom"),
    ("socket_send", r"sock_send|tcp_sendmsg|sendto"),
    ("frame_buffers", r"bytearray_|PyByteArray"),
    ("thread_wakeups", r"futex|schedule|finish_task_switch|pthread_cond"),
    ("epoll", r"epoll"),
]


def categorize(script: str, pid: int) -> tuple[dict[str, int], dict[str, dict[str, float]], float]:
    """Samples per thread kind, per thread kind each category's share of all samples, and
    the share of all samples in the kernel's page-fault handler (fresh pages mapped and
    zeroed, whichever category the sample went to)."""
    shares: collections.Counter = collections.Counter()
    per_thread: collections.Counter = collections.Counter()
    faulting = 0
    for sample in script.split("\n\n"):
        lines = [line for line in sample.strip().split("\n") if line.strip()]
        if len(lines) < 2:
            continue
        ids = lines[0].split()[0]
        tid = int(ids.split("/")[1]) if "/" in ids else int(ids)
        kind = "event_loop" if tid == pid else "other_threads"
        category = next((name for line in lines[1:] for name, rx in CATEGORIES if re.search(rx, line)),
                        "interpreter_and_other")
        shares[kind, category] += 1
        per_thread[kind] += 1
        faulting += any("exc_page_fault" in line for line in lines[1:])
    total = sum(per_thread.values()) or 1
    nested: dict[str, dict[str, float]] = {kind: {} for kind in ("other_threads", "event_loop")}
    for (kind, category), n in shares.most_common():
        nested[kind][category] = round(100 * n / total, 1)
    return dict(per_thread), nested, round(100 * faulting / total, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=200, choices=(200, 1000))
    p.add_argument("--records", type=int, default=400_000)
    p.add_argument("--sample-s", type=float, default=1.5)
    args = p.parse_args()
    cache = Path(__file__).parent / ".cache"
    cache.mkdir(exist_ok=True)
    data_path = cache / f"perf-typed-produce-{args.size}.data"
    out = Path(__file__).parent / "results" / f"perf-typed-produce-{args.size}.json"
    data = avro_values(args.size, args.records)
    load_before = os.getloadavg()
    workdir = make_workdir()
    broker = start_system(FLUVIAL_DEFAULT, workdir)
    try:
        topic = clients.unique_name("perf-typed")
        values = data.framed_for(register_value_schema(broker, topic))
        clients.create_topic(broker.bootstrap, topic, 1)

        def sample() -> None:
            time.sleep(0.7)
            subprocess.run(["perf", "record", "-q", "-F", "499", "--call-graph", "dwarf,16384", "-p", str(broker.pid),
                            "-o", str(data_path), "--", "sleep", str(args.sample_s)], check=True, capture_output=True)

        sampler = threading.Thread(target=sample)
        sampler.start()
        figures = produce_values(broker.bootstrap, topic, values, 300).figures()
        sampler.join()
        pid = broker.pid
    finally:
        broker.stop()
        remove_workdir(workdir)
    script = subprocess.run(["perf", "script", "-i", str(data_path), "-F", "tid,pid,ip,sym,dso"],
                            capture_output=True, text=True, check=True).stdout
    per_thread, shares, page_fault_pct = categorize(script, pid)
    result = {
        "workload": "perf-typed-produce", "machine": machine.describe(),
        "settings": {"size": args.size, "records": args.records, "sample_s": args.sample_s,
                     "mean_value_bytes": round(data.mean_size, 1)},
        "produce": figures, "samples": per_thread, "share_pct": shares,
        "page_fault_pct": page_fault_pct,
        "loadavg_before": load_before, "loadavg": os.getloadavg(),
    }
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(shares, indent=1))
    print(f"{figures}\nsamples {per_thread}, in page faults {page_fault_pct}%\nsaved {out}")


if __name__ == "__main__":
    main()
