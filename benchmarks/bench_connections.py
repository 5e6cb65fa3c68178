"""many-connections: many small producers and many idle connections, Fluvial beside Apache Kafka.

N confluent-kafka producers (each its own client instance, spread over a few worker
processes) produce 100 B records with acks=all at a fixed total rate, paced, for a fixed
time, while M idle connections stay open (each sent one ApiVersions request, then
nothing). Reported per system:

- ack latency p50/p99/p99.9 (produce() to the delivery report; the producers poll every
  5 ms, so figures under ~5 ms are at that granularity) and how many records failed or
  timed out (message.timeout.ms 30 s);
- how long a new connection waits for its ApiVersions answer (connect + request), every
  0.25 s during the run;
- the longest round trip of an already open connection (how long the broker was blocked);
- broker RSS before and after opening the idle connections and at its peak.

Run: `python benchmarks/bench_connections.py [--producers 200] [--rate 10000] [--idle 5000]
[--seconds 30] [--workers 4] [--systems kafka,fluvial] [--rounds 1]`. Results go to
benchmarks/results/connections.json with the machine and the load average.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from benchmarks import clients, machine  # noqa: E402
from benchmarks.brokers import FLUVIAL_DEFAULT, FLUVIAL_FLUSH_NONE, KAFKA, make_workdir, remove_workdir, start_system  # noqa: E402
from benchmarks.loop_probe import ResponsivenessProbe  # noqa: E402

SIZE = 100
PARTITIONS = 8
SYSTEMS = {"kafka": KAFKA, "fluvial": FLUVIAL_DEFAULT, "fluvial-flush-none": FLUVIAL_FLUSH_NONE}
_SIZE = struct.Struct(">i")


def _api_versions_request(correlation: int) -> bytes:
    from fluvial.protocol.messages import ApiKey, encode_request
    return encode_request(ApiKey.API_VERSIONS, 0, correlation, {}, client_id="idle")


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        parts = []
        while n:
            chunk = sock.recv(n)
            if not chunk:
                raise ConnectionError("closed by the broker")
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)
    (size,) = _SIZE.unpack(exactly(4))
    return exactly(size)


def open_idle_connections(bootstrap: str, count: int) -> list[socket.socket]:
    """`count` connections, each after one ApiVersions round trip (a client that went quiet)."""
    host, port = bootstrap.rsplit(":", 1)
    socks = []
    request = _api_versions_request(1)
    for _ in range(count):
        s = socket.create_connection((host, int(port)), timeout=60)
        s.sendall(request)
        socks.append(s)
    for s in socks:
        _read_frame(s)
    return socks


def new_connection_ms(bootstrap: str) -> float:
    """Connect and get the ApiVersions answer: what a client starting now waits for."""
    host, port = bootstrap.rsplit(":", 1)
    t0 = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(_api_versions_request(1))
        _read_frame(s)
    return (time.perf_counter() - t0) * 1000


def producer_worker(bootstrap: str, topic: str, producers: int, rate_per_producer: float, seconds: float,
                    start_at: float, out) -> None:
    """`producers` client instances in this process, each producing `rate_per_producer` records/s."""
    from confluent_kafka import KafkaError, Producer

    value = clients.payload(SIZE)
    latencies: list[float] = []
    failures = {"timed_out": 0, "other": 0}

    def delivered(err, msg, sent=None):
        if err is None:
            latencies.append(time.perf_counter() - sent)
        elif err.code() == KafkaError._MSG_TIMED_OUT:
            failures["timed_out"] += 1
        else:
            failures["other"] += 1

    instances = [Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                           "message.timeout.ms": 30_000, "log_level": 3}) for _ in range(producers)]
    # Each producer connects and learns the topic before the clock starts.
    for p in instances:
        p.list_topics(topic, timeout=60)
    while time.time() < start_at:
        time.sleep(0.01)
    t0 = time.perf_counter()
    sent = 0
    counts = [0] * producers
    interval = 1.0 / rate_per_producer
    phases = np.random.default_rng(os.getpid()).random(producers) * interval
    while True:
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
        due = np.floor((elapsed - phases) / interval).astype(np.int64) + 1
        for i, p in enumerate(instances):
            while counts[i] < due[i]:
                now = time.perf_counter()
                p.produce(topic, value, key=str(i).encode(),
                          on_delivery=lambda err, msg, now=now: delivered(err, msg, now))
                counts[i] += 1
                sent += 1
            p.poll(0)
        time.sleep(0.005)
    deadline = time.perf_counter() + 60
    for p in instances:
        p.flush(max(0.1, deadline - time.perf_counter()))
    out.put({"sent": sent, "latencies": latencies, **failures})


def run_round(spec, args) -> dict:
    workdir = make_workdir()
    broker = start_system(spec, workdir)
    proc = psutil.Process(broker.pid)
    try:
        topic = clients.unique_name("conns")
        clients.create_topic(broker.bootstrap, topic, PARTITIONS)
        rss_start = proc.memory_info().rss
        t_idle = time.perf_counter()
        idle = open_idle_connections(broker.bootstrap, args.idle)
        idle_open_s = time.perf_counter() - t_idle
        time.sleep(1)
        rss_idle = proc.memory_info().rss
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        per_worker = [args.producers // args.workers + (1 if i < args.producers % args.workers else 0)
                      for i in range(args.workers)]
        rate = args.rate / args.producers
        start_at = time.time() + 10 + args.producers * 0.05
        workers = [ctx.Process(target=producer_worker, args=(broker.bootstrap, topic, n, rate, args.seconds,
                                                           start_at, out)) for n in per_worker if n]
        for w in workers:
            w.start()
        while time.time() < start_at:
            time.sleep(0.05)
        peak = proc.memory_info().rss
        new_conn: list[float] = []
        with ResponsivenessProbe(broker.bootstrap, interval_s=0.01) as probe:
            end = time.time() + args.seconds
            while time.time() < end:
                new_conn.append(new_connection_ms(broker.bootstrap))
                peak = max(peak, proc.memory_info().rss)
                time.sleep(0.25)
            stalls = probe.report()
        results = [out.get(timeout=args.seconds + 300) for _ in workers]
        for w in workers:
            w.join(60)
        for s in idle:
            s.close()
        lat = np.array([x for r in results for x in r["latencies"]]) * 1000
        sent = sum(r["sent"] for r in results)
        row = {
            "producers": args.producers, "rate_rec_s": args.rate, "idle_connections": args.idle,
            "seconds": args.seconds, "sent": sent, "acked": int(lat.size),
            "timed_out": sum(r["timed_out"] for r in results), "failed": sum(r["other"] for r in results),
            "ack_ms_p50": round(float(np.percentile(lat, 50)), 2) if lat.size else None,
            "ack_ms_p99": round(float(np.percentile(lat, 99)), 2) if lat.size else None,
            "ack_ms_p999": round(float(np.percentile(lat, 99.9)), 2) if lat.size else None,
            "ack_ms_max": round(float(lat.max()), 2) if lat.size else None,
            "new_connection_ms_p50": round(float(np.percentile(new_conn, 50)), 2),
            "new_connection_ms_max": round(float(max(new_conn)), 2),
            "open_connection_round_trip_ms_max": round(stalls.max_ms, 2),
            "idle_connections_opened_in_s": round(idle_open_s, 2),
            "rss_mb_start": round(rss_start / 2**20, 1), "rss_mb_with_idle": round(rss_idle / 2**20, 1),
            "rss_mb_peak": round(peak / 2**20, 1),
            "loadavg": os.getloadavg(),
        }
        print(f"{spec.name}: {json.dumps(row)}", flush=True)
        return row
    finally:
        broker.stop()
        remove_workdir(workdir)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--producers", type=int, default=200)
    p.add_argument("--rate", type=float, default=10_000, help="records per second, all producers together")
    p.add_argument("--idle", type=int, default=5000)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--systems", default="kafka,fluvial")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "connections.json")
    args = p.parse_args()
    figures: dict[str, list[dict]] = {}
    for name in args.systems.split(","):
        figures[name] = [run_round(SYSTEMS[name], args) for _ in range(args.rounds)]
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps({"workload": "many-connections", "machine": machine.describe(),
                                    "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                    "figures": figures}, indent=1))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
