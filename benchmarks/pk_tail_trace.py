"""Where a single-key lookup's slow calls spend their time (the p99 of `bench_pk`).

A broker process (flush policy `ack`, the probes of `benchmarks/lookup_trace_hook` loaded
into it) holds a primary-key table of `--keys` keys (bench_pk's schema, 2 buckets, flushed
to SST files by a KV snapshot). Single-key lookups run one after another over the client's
lookup session; for each the client records when it sent the keys and got the answer
(monotonic ns, one clock for both processes on one machine) and its own thread's
scheduler counters; the broker's Flight thread records when `read_chunk` returned the keys
(GIL held), when it began and ended writing the answer, and its scheduler counters; both
processes time their garbage collections. With `--threads`, every thread of both
processes is read (/proc/<pid>/task/*/schedstat: CPU ns, run-queue wait ns) before and
after each call, naming which threads ran or waited for a core while a slow call was
under way (reading them perturbs the clocks: their figures are for attribution, not
latency). Calls over `--slow-ms` are broken down against the median call:

- client -> broker: from the client's send to the broker thread's return from read_chunk
  (gRPC delivery, the handler thread's wake-up, and its wait for the GIL);
- broker: lookup and answer written; broker -> client: until the client has the rows;
- run-queue waits of the client thread and the broker's Flight thread (ready, no core);
- collections overlapping the call in either process.

    python -m benchmarks.pk_tail_trace [--keys 1000000] [--lookups 3000] [--rounds 3] [--threads]
        [--switch-interval-s S] [--slow-ms 1.0]

Saves benchmarks/results/pk-tail-trace.json (or `--out`).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import fluvial.client as fc
from benchmarks import machine
from benchmarks.bench_pk import SCHEMA, rows
from tests.support.broker_process import BrokerProcess

HOOK = Path(__file__).parent / "lookup_trace_hook"
RESULTS = Path(__file__).parent / "results" / "pk-tail-trace.json"


def _sched(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        cpu, wait, _ = f.read().split()
    return int(cpu), int(wait)


class Threads:
    """Scheduler counters of every thread of some processes, by (pid, tid, name)."""

    def __init__(self, pids: list[int]):
        self.paths = {}
        for pid in pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                except OSError:
                    continue
                self.paths[(pid, int(tid), name)] = f"/proc/{pid}/task/{tid}/schedstat"

    def read(self) -> dict:
        out = {}
        for key, path in self.paths.items():
            try:
                out[key] = _sched(path)
            except OSError:
                pass
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--buckets", type=int, default=2)
    ap.add_argument("--lookups", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", action="store_true", help="read every thread's scheduler counters per call")
    ap.add_argument("--switch-interval-s", type=float, default=None, help="sys.setswitchinterval in the broker")
    ap.add_argument("--slow-ms", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rng = np.random.default_rng(11)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace"
        env = {"FLUVIAL_LOOKUP_TRACE": str(trace),
               "PYTHONPATH": os.pathsep.join([str(HOOK), os.environ.get("PYTHONPATH", "")])}
        if args.switch_interval_s:
            env["FLUVIAL_SWITCH_INTERVAL_S"] = str(args.switch_interval_s)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            broker = BrokerProcess(Path(tmp) / "data", "--flush-policy", "ack").start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        client_gc: list = []
        gc_start = [0]

        def on_gc(phase, info):
            now = time.monotonic_ns()
            if phase == "start":
                gc_start[0] = now
            else:
                client_gc.append((gc_start[0], now, info.get("generation", -1)))

        calls = []
        try:
            with fc.connect(broker.flight_url) as client:
                t = client.create_table("accounts", SCHEMA, buckets=args.buckets, kafka_format="avro",
                                        primary_key=["id"])
                for start in range(0, args.keys, args.batch):
                    t.upsert(rows(rng, np.arange(start, min(start + args.batch, args.keys), dtype=np.int64)))
                t.snapshot()
                ids = rng.integers(0, args.keys, args.lookups * (args.rounds + 1))
                singles = [pa.table({"id": pa.array([int(k)], pa.int64())}) for k in ids]
                for keys in singles[:args.lookups]:  # warm-up: cold blocks, not counted
                    t.lookup(keys)
                gc.callbacks.append(on_gc)
                me = f"/proc/thread-self/schedstat"
                threads = Threads([broker.proc.pid, os.getpid()]) if args.threads else None
                loads = []
                for r in range(args.rounds):
                    for keys in singles[args.lookups * (r + 1):args.lookups * (r + 2)]:
                        before = threads.read() if threads else None
                        c0 = _sched(me)
                        t0 = time.monotonic_ns()
                        got = t.lookup(keys)
                        t1 = time.monotonic_ns()
                        c1 = _sched(me)
                        after = threads.read() if threads else None
                        assert got.num_rows == 1
                        call = {"t0": t0, "t1": t1, "cpu": c1[0] - c0[0], "rq": c1[1] - c0[1],
                                "key": keys.column(0)[0].as_py(), "round": r}
                        if threads:
                            call["threads"] = {f"{'broker' if k[0] == broker.proc.pid else 'client'}:{k[2]}:{k[1]}":
                                               (after[k][0] - before[k][0], after[k][1] - before[k][1])
                                               for k in after if k in before}
                        calls.append(call)
                    loads.append(os.getloadavg()[0])
                gc.callbacks.remove(on_gc)
            time.sleep(0.5)  # the session's end writes the broker's trace
        finally:
            broker.stop()
        served = {}
        broker_gc = []
        for path in Path(tmp).glob("trace-*.jsonl"):
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                broker_gc += rec["gc"]
                for lk in rec["lookups"]:
                    if "wr1" in lk and lk["key"] is not None:
                        served.setdefault(lk["key"], []).append(lk)
    # Each call's broker record: the one with its key received inside the call's window.
    rowsout = []
    for c in calls:
        match = [s for s in served.get(c["key"], []) if c["t0"] <= s["recv"] <= c["t1"]]
        if not match:
            continue
        s = match[0]
        gcs_b = [g for g in broker_gc if g[1] >= c["t0"] and g[0] <= c["t1"]]
        gcs_c = [g for g in client_gc if g[1] >= c["t0"] and g[0] <= c["t1"]]
        row = {"total_us": (c["t1"] - c["t0"]) / 1e3, "to_broker_us": (s["recv"] - c["t0"]) / 1e3,
               "broker_us": (s["wr1"] - s["recv"]) / 1e3, "write_us": (s["wr1"] - s["wr0"]) / 1e3,
               "to_client_us": (c["t1"] - s["wr1"]) / 1e3, "client_cpu_us": c["cpu"] / 1e3,
               "client_rq_us": c["rq"] / 1e3, "broker_thread_cpu_us": (s["cpu1"] - s["cpu0"]) / 1e3,
               "broker_thread_rq_us": (s["rq1"] - s["rq0"]) / 1e3,
               "broker_wait_started_before_send_us": (c["t0"] - s["rd0"]) / 1e3,
               "gc_broker_us": sum((g[1] - g[0]) / 1e3 for g in gcs_b),
               "gc_client_us": sum((g[1] - g[0]) / 1e3 for g in gcs_c), "round": c["round"]}
        if "threads" in c:
            row["threads"] = c["threads"]
        rowsout.append(row)
    total = np.array([r["total_us"] for r in rowsout])
    slow = [r for r in rowsout if r["total_us"] > args.slow_ms * 1000]
    fields = [k for k in rowsout[0] if k not in ("threads", "round")]

    def summary(rs: list[dict]) -> dict:
        return {k: round(float(np.median([r[k] for r in rs])), 1) for k in fields} if rs else {}

    def threads_of(rs: list[dict]) -> dict:
        """Mean CPU and run-queue wait per call of each thread (us), busiest first."""
        if not rs or "threads" not in rs[0]:
            return {}
        acc: dict = {}
        for r in rs:
            for name, (cpu, wait) in r["threads"].items():
                a = acc.setdefault(name.rsplit(":", 1)[0], [0, 0])
                a[0] += cpu
                a[1] += wait
        out = {k: [round(v[0] / len(rs) / 1e3, 1), round(v[1] / len(rs) / 1e3, 1)] for k, v in acc.items()}
        return dict(sorted(((k, v) for k, v in out.items() if v[0] + v[1] >= 5), key=lambda kv: -kv[1][0] - kv[1][1]))

    normal = [r for r in rowsout if r["total_us"] <= np.percentile(total, 50)]
    out = {
        "benchmark": "pk-tail-trace", "keys": args.keys, "lookups": len(rowsout), "rounds": args.rounds,
        "switch_interval_s": args.switch_interval_s or 0.005, "threads_read": args.threads,
        "p50_ms": round(float(np.percentile(total, 50)) / 1e3, 3),
        "p99_ms": round(float(np.percentile(total, 99)) / 1e3, 3),
        "p99_rounds_ms": [round(float(np.percentile([r["total_us"] for r in rowsout if r["round"] == i], 99)) / 1e3, 3)
                          for i in range(args.rounds)],
        "slow_ms": args.slow_ms, "slow_calls": len(slow),
        "median_call": summary(rowsout), "median_slow_call": summary(slow),
        # What the slow calls had in common: share of them where each part exceeded its
        # median by over 300 us, where the client or broker thread waited for a core over
        # 100 us, or a collection ran.
        "slow_where": {
            **{f"{k}_over_median+300us": round(sum(r[k] > summary(rowsout)[k] + 300 for r in slow) / max(len(slow), 1), 2)
               for k in ("to_broker_us", "broker_us", "to_client_us")},
            "client_rq_over_100us": round(sum(r["client_rq_us"] > 100 for r in slow) / max(len(slow), 1), 2),
            "broker_thread_rq_over_100us": round(sum(r["broker_thread_rq_us"] > 100 for r in slow) / max(len(slow), 1), 2),
            "any_gc": round(sum(r["gc_broker_us"] + r["gc_client_us"] > 0 for r in slow) / max(len(slow), 1), 2)},
        "gc_broker_during_calls": sum(r["gc_broker_us"] > 0 for r in rowsout),
        "gc_client_during_calls": sum(r["gc_client_us"] > 0 for r in rowsout),
        "threads_normal_calls_us_cpu_rq": threads_of(normal),
        "threads_slow_calls_us_cpu_rq": threads_of(slow),
        "slowest": sorted(({k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items() if k != "threads"}
                           for r in rowsout), key=lambda r: -r["total_us"])[:15],
        "load_average_1m": loads, "machine": machine.describe(),
    }
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
