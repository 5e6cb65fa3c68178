"""metrics-overhead: what the metrics cost the request path, and what a scrape costs.

1. Per-request cost of the Kafka listener's instrumentation (two clock reads, one
   `RequestStats.observe`), timed in-process against the same
   dispatch without it: nanoseconds per request.
2. Broker CPU per single-record produce request (benchmarks/bench_small_requests.py),
   with and without the metrics: the same script run by a checkout without them
   (`--baseline-python`, a Python whose `fluvial` is that checkout) and by this one,
   rounds alternating so that load changes hit both alike. Median of the rounds.
3. Duration of one `/metrics` scrape of a broker with many buckets (200 tables x 4
   buckets) and one consumer group per table, and the size of the exposition.

Run: `python benchmarks/bench_metrics_overhead.py [--baseline-python PATH --baseline-checkout DIR]
[--rounds 3] [--requests 800]`. Results: benchmarks/results/metrics-overhead.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def instrumentation_ns(n: int = 200_000) -> dict:
    """ns per request of the listener's timing, against the same awaits without it."""
    from fluvial.broker.request_stats import RequestStats

    stats = RequestStats()

    async def handle() -> bytes:
        return b"x"

    frame = memoryview(b"\x00\x00rest of a request")

    async def plain() -> None:
        for _ in range(n):
            await handle()

    async def timed() -> None:
        # What the listener adds around each request: two clock reads, the API key from
        # the frame's first two bytes, one observation (no extra coroutine frame).
        for _ in range(n):
            started = time.perf_counter()
            reply = await handle()
            if not isinstance(reply, asyncio.Future):
                stats.observe(frame[0] << 8 | frame[1], time.perf_counter() - started)

    def run(fn) -> float:
        t0 = time.perf_counter()
        asyncio.run(fn())
        return (time.perf_counter() - t0) / n * 1e9

    base = [run(plain) for _ in range(5)]
    inst = [run(timed) for _ in range(5)]
    return {"requests": n, "median_ns_without": round(statistics.median(base), 1),
            "median_ns_with": round(statistics.median(inst), 1),
            "median_added_ns": round(statistics.median(inst) - statistics.median(base), 1)}


def small_requests(python: str, checkout: Path, requests: int, flush: str) -> float:
    out = Path(tempfile.mkdtemp()) / "small.json"
    subprocess.run([python, str(checkout / "benchmarks" / "bench_small_requests.py"), "--rounds", "1",
                    "--requests", str(requests), "--flush", flush, "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL, cwd=checkout)
    figures = json.loads(out.read_text())["figures"]
    return next(iter(figures.values()))["median_broker_cpu_us_per_request"]


def scrape_cost(tables: int = 200, buckets: int = 4) -> dict:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.support.broker_process import BrokerProcess
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            names = [f"scrape-{i}" for i in range(tables)]
            for f in admin.create_topics([NewTopic(n, buckets, 1) for n in names]).values():
                f.result(60)
            c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "scrape", "enable.auto.commit": False})
            for n in names:  # one committed offset per bucket: the group's lag per partition
                c.commit(offsets=[TopicPartition(n, b, 0) for b in range(buckets)], asynchronous=False)
            c.close()
            times, size = [], 0
            for _ in range(7):
                t0 = time.perf_counter()
                with urllib.request.urlopen(f"{broker.http_url}/metrics", timeout=60) as r:
                    size = len(r.read())
                times.append((time.perf_counter() - t0) * 1000)
        finally:
            broker.stop()
    return {"tables": tables, "buckets_per_table": buckets, "median_scrape_ms": round(statistics.median(times), 1),
            "exposition_bytes": size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline-python", help="a Python whose fluvial is a checkout without the metrics")
    p.add_argument("--baseline-checkout", type=Path, help="that checkout (its benchmarks/ are run)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=800, help="per connection (16 connections)")
    p.add_argument("--flush", default="none", help="flush policy of the small-requests rounds")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "metrics-overhead.json")
    args = p.parse_args()
    result: dict = {"workload": "metrics-overhead", "machine": machine.describe(), "loadavg_start": os.getloadavg()}
    result["instrumentation"] = instrumentation_ns()
    print(json.dumps(result["instrumentation"]), flush=True)
    if args.baseline_python:
        rows = {"without_metrics": [], "with_metrics": []}
        for r in range(args.rounds):
            order = [("without_metrics", args.baseline_python, args.baseline_checkout),
                     ("with_metrics", sys.executable, ROOT)]
            for name, python, checkout in (order if r % 2 == 0 else order[::-1]):
                cpu = small_requests(python, checkout, args.requests, args.flush)
                rows[name].append({"broker_cpu_us_per_request": cpu, "loadavg": os.getloadavg()})
                print(f"round {r} {name}: {cpu} us/request (load {os.getloadavg()[0]:.2f})", flush=True)
        result["small_requests"] = {
            "flush_policy": args.flush, "connections": 16, "requests_per_connection": args.requests,
            **{f"median_{k}_us": statistics.median(x["broker_cpu_us_per_request"] for x in v) for k, v in rows.items()},
            "rounds": rows}
    result["scrape"] = scrape_cost()
    print(json.dumps(result["scrape"]), flush=True)
    result["loadavg_end"] = os.getloadavg()
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine",)}, indent=1)[:2000])


if __name__ == "__main__":
    main()
