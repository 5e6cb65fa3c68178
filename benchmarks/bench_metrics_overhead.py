"""metrics-overhead: what the metrics cost the request path, and what a scrape costs.

1. Per-request cost of the Kafka listener's instrumentation (two clock reads, one
   `RequestStats.observe`), timed in-process against the same
   dispatch without it: nanoseconds per request.
2. Broker CPU per single-record produce request (benchmarks/bench_small_requests.py),
   with and without the metrics: the same script run by a checkout without them
   (`--baseline-python`, a Python whose `fluvial` is that checkout) and by this one,
   rounds alternating so that load changes hit both alike. Median of the rounds.
3. Duration of one `/metrics` scrape of a broker with many buckets (200 tables x 4
   buckets) and one consumer group committed on all of them, the size of the exposition,
   and the event loop's timer lag while the scrapes ran (`--scrape-only`: this part alone,
   into results/metrics-scrape.json).

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


def scrape_cost(tables: int = 200, buckets: int = 4, scrapes: int = 15) -> dict:
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
            # The same time without scrapes first: the loop's lag on this machine at this load.
            def lag_text() -> str:
                with urllib.request.urlopen(f"{broker.http_url}/metrics", timeout=60) as r:
                    return r.read().decode()
            quiet_start = lag_text()
            time.sleep(6.0)
            quiet_end = lag_text()
            times, size, texts = [], 0, []
            for _ in range(scrapes):
                t0 = time.perf_counter()
                with urllib.request.urlopen(f"{broker.http_url}/metrics", timeout=60) as r:
                    texts.append(r.read().decode())
                    size = len(texts[-1])
                times.append((time.perf_counter() - t0) * 1000)
        finally:
            broker.stop()
    # The event loop's timer lag while scrapes ran (the scrape thread shares the GIL with it),
    # against 6 s without scrapes just before: probes, the bucket of the worst, probes over 50 ms.
    during = _lag_between(texts[0], texts[-1])
    quiet = _lag_between(quiet_start, quiet_end)
    return {"tables": tables, "buckets_per_table": buckets, "scrapes": scrapes,
            "median_scrape_ms": round(statistics.median(times), 1), "exposition_bytes": size,
            "loop_lag_during_scrapes": during, "loop_lag_without_scrapes": quiet}


def _lag_between(before: str, after: str) -> dict:
    first, last = _loop_lag_buckets(before), _loop_lag_buckets(after)
    bounds = sorted((float(le), last[le] - first.get(le, 0)) for le in last)
    total = bounds[-1][1] if bounds else 0
    worst = next((le for le, n in bounds if n == total), None)
    return {"probes": total, "worst_bucket_s": worst,
            "over_50ms": total - next((n for le, n in bounds if le >= 0.05), total)}


def _loop_lag_buckets(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families
    for family in text_string_to_metric_families(text):
        if family.name == "fluvial_event_loop_lag_seconds":
            return {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    return {}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline-python", help="a Python whose fluvial is a checkout without the metrics")
    p.add_argument("--baseline-checkout", type=Path, help="that checkout (its benchmarks/ are run)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=800, help="per connection (16 connections)")
    p.add_argument("--flush", default="none", help="flush policy of the small-requests rounds")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "metrics-overhead.json")
    p.add_argument("--scrape-only", action="store_true",
                   help="only the scrape of many buckets, into results/metrics-scrape.json")
    args = p.parse_args()
    if args.scrape_only:
        result = {"workload": "metrics-scrape", "machine": machine.describe(), "loadavg_start": os.getloadavg(),
                  "scrape": scrape_cost(), "loadavg_end": os.getloadavg()}
        out = args.out.parent / "metrics-scrape.json"
        out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result["scrape"]))
        return
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
