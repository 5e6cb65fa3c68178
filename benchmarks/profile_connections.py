"""profile-connections: what the many-connections workload costs the broker per produce request.

Starts Fluvial (flush policy `ack`) through a wrapper that records the garbage collector's
collections (`gc.callbacks`: count, wall and thread CPU time, longest, per generation) and
runs the Go load generator (`benchmarks/loadgen/`, as `bench_connections.py --client go`:
200 producers, 10,000 rec/s, 5,000 idle connections by default). Over the measured window
(after the generator's warm-up) it reads the CPU of each broker thread from /proc, and the
broker's own counters from /metrics: produce requests per second, their mean time in the
broker, fsyncs per second. Reported per round: loop-thread and whole-process CPU per produce
request, the collector's share, the tracked objects left outside the frozen startup set
(with the most common types), and the generator's ack latency.

Run: `python benchmarks/profile_connections.py [--rounds 2] [--baseline REV]
[--switch-interval-s S]`. With `--baseline` the broker of an older commit (exported as
bench_small_requests.py does) runs in alternating rounds; with `--switch-interval-s` the
broker with that GIL switch interval does. Results: benchmarks/results/profile-connections.json, with the load
average of each round.

Environment: FLUVIAL_GC_SIZES=1 keeps each collection's size (generation, wall and CPU ms,
objects, collected), =2 also the types and tuples the first ones walked; FLUVIAL_STALLS=1
counts the loop's stalls over 10 ms (a probe posted every 5 ms) and splits their time by the
loop thread's scheduler counters: running, runnable without a core, and neither (the GIL, a
lock, a system call).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import clients, machine  # noqa: E402
from benchmarks.bench_connections import PARTITIONS, build_loadgen  # noqa: E402
from benchmarks.bench_small_requests import baseline_checkout, python_path  # noqa: E402
from benchmarks.brokers import FLUVIAL_DEFAULT, make_workdir, remove_workdir, start_fluvial  # noqa: E402

# The broker, with the collector's callbacks: SIGUSR2 starts counting, SIGUSR1 writes the
# counts (and what is tracked) as JSON to the file named by FLUVIAL_GC_REPORT.
_GC_WRAPPER = r'''
import collections, gc, json, os, signal, sys, time
stats, t = {}, [0.0, 0.0]
each, sizes, detail = [], [0], []
def callback(phase, info):
    if phase == "start":
        sizes[0] = 0
        if os.environ.get("FLUVIAL_GC_SIZES"):
            young = gc.get_objects(info["generation"])
            sizes[0] = len(young)
            if os.environ.get("FLUVIAL_GC_SIZES") == "2" and len(each) < 3:
                refs = sorted(((len(gc.get_referents(o)), type(o).__qualname__) for o in young), reverse=True)
                detail.append({"types": collections.Counter(type(o).__qualname__ for o in young).most_common(15),
                               "referents": sum(r for r, _ in refs), "largest": refs[:15],
                               "tuples": collections.Counter(tuple(type(i).__qualname__ for i in o[:4]) + (len(o),)
                                                             for o in young if type(o) is tuple).most_common(8)})
            del young
        t[0], t[1] = time.perf_counter(), time.thread_time()
        return
    wall = time.perf_counter() - t[0]
    cpu = time.thread_time() - t[1]
    s = stats.setdefault(str(info["generation"]), {"collections": 0, "wall_s": 0.0, "cpu_s": 0.0, "max_ms": 0.0})
    s["collections"] += 1; s["wall_s"] += wall; s["cpu_s"] += cpu
    s["max_ms"] = max(s["max_ms"], wall * 1000)
    if len(each) < 500:
        each.append((info["generation"], round(wall * 1000, 2), round(cpu * 1000, 2), sizes[0], info["collected"]))
gc.callbacks.append(callback)
def report(*_):
    tracked = gc.get_objects()
    types = collections.Counter(type(o).__qualname__ for o in tracked)
    with open(os.environ["FLUVIAL_GC_REPORT"], "w") as f:
        json.dump({"generations": stats, "each": each, "detail": detail, "stalls": stalls, "gc_stats": gc.get_stats(), "threshold": gc.get_threshold(), "tracked": len(tracked), "frozen": gc.get_freeze_count(),
                   "top_types": types.most_common(8)}, f)
signal.signal(signal.SIGUSR1, report)
if os.environ.get("FLUVIAL_SWITCH_INTERVAL_S"):
    sys.setswitchinterval(float(os.environ["FLUVIAL_SWITCH_INTERVAL_S"]))
# With FLUVIAL_STALLS set: a thread asks the loop to run a probe every 5 ms and, for each
# probe that ran over 10 ms late, splits the wait by the loop thread's scheduler counters
# (/proc schedstat): running, runnable without a core, and neither (waiting for the GIL, a
# lock or a system call; an idle loop's epoll wait ends at once on the probe's wake-up).
stalls = []
def _schedstat(tid):
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run), int(wait)
def _watch(loop, tid):
    import threading
    def probe(posted, before):
        late = time.perf_counter() - posted
        if late > 0.010 and len(stalls) < 2000:
            run, wait = _schedstat(tid)
            stalls.append((round(late * 1000, 1), round((run - before[0]) / 1e6, 1), round((wait - before[1]) / 1e6, 1)))
    while True:
        time.sleep(0.005)
        try:
            loop.call_soon_threadsafe(probe, time.perf_counter(), _schedstat(tid))
        except RuntimeError:
            return
def _start(*_):
    stats.clear(); each.clear(); detail.clear(); stalls.clear()
    import asyncio, threading
    loop = asyncio.events._get_running_loop()
    if os.environ.get("FLUVIAL_STALLS") and loop is not None:
        threading.Thread(target=_watch, args=(loop, threading.get_native_id()), daemon=True).start()
signal.signal(signal.SIGUSR2, _start)
sys.argv = ["fluvial", *sys.argv[1:]]
from fluvial.broker.cli import main
sys.exit(main())
'''


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of `pid`, by thread id."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def counters(http_port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
    wanted = ('fluvial_kafka_request_duration_seconds_count{api="produce"}',
              'fluvial_kafka_request_duration_seconds_sum{api="produce"}',
              "fluvial_log_fsync_duration_seconds_count", "fluvial_log_fsync_duration_seconds_sum",
              "fluvial_event_loop_lag_seconds_count", "fluvial_event_loop_lag_seconds_sum")
    out = {}
    for line in text.splitlines():
        for name in wanted:
            if line.startswith(name + " "):
                out[name.split("{")[0]] = float(line.rsplit(" ", 1)[1])
    return out


def run_round(args, loadgen: Path, wrapper: Path) -> dict:
    load_before = os.getloadavg()
    workdir = make_workdir()
    report = workdir / "gc.json"
    os.environ["FLUVIAL_GC_REPORT"] = str(report)
    broker = start_fluvial(workdir, FLUVIAL_DEFAULT, command=[sys.executable, str(wrapper), "broker"])
    try:
        topic = clients.unique_name("profile")
        clients.create_topic(broker.bootstrap, topic, PARTITIONS)
        time.sleep(1)
        gen = subprocess.Popen([str(loadgen), "-bootstrap", broker.bootstrap, "-topic", topic,
                                "-producers", str(args.producers), "-rate", str(args.rate), "-idle", str(args.idle),
                                "-seconds", str(args.seconds), "-warmup", f"{args.warmup}s"],
                               stdout=subprocess.PIPE, text=True)
        http = broker.listeners["--http-port"]
        done = None
        for line in gen.stdout:
            event = json.loads(line)
            if event["event"] == "measuring":
                os.kill(broker.pid, signal.SIGUSR2)
                cpu0, m0, t0 = thread_cpu(broker.pid), counters(http), time.perf_counter()
                time.sleep(args.seconds * 0.8)
                cpu1, m1, wall = thread_cpu(broker.pid), counters(http), time.perf_counter() - t0
                os.kill(broker.pid, signal.SIGUSR1)
            elif event["event"] == "done":
                done = event
                break
        gen.wait(120)
        time.sleep(0.5)
        gc_report = json.loads(report.read_text())
    finally:
        broker.stop()
        remove_workdir(workdir)
    requests = m1["fluvial_kafka_request_duration_seconds_count"] - m0["fluvial_kafka_request_duration_seconds_count"]
    loop = cpu1[str(broker.pid)] - cpu0.get(str(broker.pid), 0.0)
    process = sum(v - cpu0.get(k, 0.0) for k, v in cpu1.items())
    gc_cpu = sum(g["cpu_s"] for g in gc_report["generations"].values())
    return {
        "produce_requests_per_s": round(requests / wall),
        "produce_ms_mean_in_broker": round(1000 * (m1["fluvial_kafka_request_duration_seconds_sum"]
                                                   - m0["fluvial_kafka_request_duration_seconds_sum"]) / requests, 1),
        "fsyncs_per_s": round((m1["fluvial_log_fsync_duration_seconds_count"]
                               - m0["fluvial_log_fsync_duration_seconds_count"]) / wall),
        "fsync_ms_mean": round(1000 * (m1["fluvial_log_fsync_duration_seconds_sum"]
                                       - m0["fluvial_log_fsync_duration_seconds_sum"])
                               / max(1.0, m1["fluvial_log_fsync_duration_seconds_count"]
                                     - m0["fluvial_log_fsync_duration_seconds_count"]), 2),
        "loop_lag_ms_mean": round(1000 * (m1["fluvial_event_loop_lag_seconds_sum"]
                                          - m0["fluvial_event_loop_lag_seconds_sum"])
                                  / max(1.0, m1["fluvial_event_loop_lag_seconds_count"]
                                        - m0["fluvial_event_loop_lag_seconds_count"]), 2),
        "loop_cpu_us_per_request": round(1e6 * loop / requests, 1),
        "process_cpu_us_per_request": round(1e6 * process / requests, 1),
        "loop_cores": round(loop / wall, 2), "process_cores": round(process / wall, 2),
        "gc_share_of_loop_cpu": round(gc_cpu / loop, 3) if loop else None,
        "gc": gc_report,
        # FLUVIAL_STALLS: probes over 10 ms late, the longest, and their total wait split by
        # the loop thread's scheduler counters (approximate: a wait is counted when it ends).
        "stalls_over_10ms": len(gc_report["stalls"]),
        "stall_longest_ms": max((s[0] for s in gc_report["stalls"]), default=0.0),
        "stall_ms": {"total": round(sum(s[0] for s in gc_report["stalls"])),
                     "running": round(sum(s[1] for s in gc_report["stalls"])),
                     "runnable": round(sum(s[2] for s in gc_report["stalls"]))},
        "ack_ms": (done or {}).get("ack_ms"), "timed_out": (done or {}).get("timed_out"),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--producers", type=int, default=200)
    p.add_argument("--rate", type=float, default=10_000)
    p.add_argument("--idle", type=int, default=5000)
    p.add_argument("--seconds", type=float, default=15, help="measured window (after the warm-up)")
    p.add_argument("--warmup", type=float, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--baseline", default=None, help="git revision to compare with, rounds alternating")
    p.add_argument("--switch-interval-s", type=float, default=None,
                   help="also run the broker with this GIL switch interval (sys.setswitchinterval), rounds alternating")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "profile-connections.json")
    args = p.parse_args()
    loadgen = build_loadgen()
    wrapper = Path(tempfile.mkdtemp(prefix="fluvial-gc-")) / "gc_broker.py"
    wrapper.write_text(_GC_WRAPPER)
    variants = [("fluvial", None, None)]
    if args.baseline:
        variants.append((f"fluvial@{args.baseline}", baseline_checkout(args.baseline), None))
    if args.switch_interval_s is not None:
        variants.append((f"fluvial@switch-{args.switch_interval_s}", None, args.switch_interval_s))
    figures: dict[str, list] = collections.defaultdict(list)
    for r in range(args.rounds):
        for name, path, interval in (variants if r % 2 else variants[::-1]):
            if interval is None:
                os.environ.pop("FLUVIAL_SWITCH_INTERVAL_S", None)
            else:
                os.environ["FLUVIAL_SWITCH_INTERVAL_S"] = str(interval)
            with python_path(path):
                row = run_round(args, loadgen, wrapper)
            print(name, json.dumps({k: v for k, v in row.items() if k != "gc"}), flush=True)
            figures[name].append(row)
    args.out.write_text(json.dumps({"workload": "profile-connections", "machine": machine.describe(),
                                    "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                    "figures": figures}, indent=1))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
