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

`--client go` runs the load from one Go process instead (`benchmarks/loadgen/`, franz-go:
each producer its own client and connections, acks=all, idempotent, linger 5 ms), built
here into benchmarks/.cache/. Hundreds of librdkafka instances (several threads each) in a
few Python processes take most of 2 cores themselves and starve the broker under test,
whichever it is; the Go generator needs a small fraction of a core for the same load, so
the figures measure the broker. The Go generator opens the idle connections first, then
connects every producer (one acknowledged record each), then produces at the full rate for
`--warmup` seconds (JIT, caches, the page cache and the idle connections' first effects
settle; not counted) and only then measures for `--seconds`: ack latency, new-connection
latency, broker CPU and RSS and the load average are of that window alone, with the ack
p50/p99 of each second of it (a tail from one burst shows there). With `--client go` the systems alternate round by round,
each round waits (up to `--max-load-wait-s`) for the 1-minute load average to fall under
`--max-load` and records it, and the median over the rounds is saved (default results:
connections-go.json, or connections-go-<producers>.json for other producer counts).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
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


LOADGEN_DIR = Path(__file__).parent / "loadgen"
LOADGEN_BIN = Path(__file__).parent / ".cache" / "loadgen"


def build_loadgen() -> Path:
    """Build the Go load generator (needs Go and the module proxy, or a warm module cache)."""
    LOADGEN_BIN.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "build", "-o", str(LOADGEN_BIN), "."], cwd=LOADGEN_DIR, check=True,
                   env={**os.environ, "CGO_ENABLED": "0"})
    return LOADGEN_BIN


def wait_for_quiet(max_load: float, max_wait_s: float) -> tuple[float, float, float]:
    """Wait until the 1-minute load average is under `max_load` (at most `max_wait_s`); return it."""
    deadline = time.monotonic() + max_wait_s
    while os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()


class _RssPeak:
    """Samples a process's RSS every 0.2 s in a thread, keeping the peak, and the machine's
    1-minute load average every second."""

    def __init__(self, proc: psutil.Process) -> None:
        self.proc, self.peak, self._stop = proc, proc.memory_info().rss, threading.Event()
        self.loads: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ticks = 0
        while not self._stop.wait(0.2):
            ticks += 1
            if ticks % 5 == 0:
                self.loads.append(os.getloadavg()[0])
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_round_go(spec, args, loadavg_before) -> dict:
    """One round with the Go load generator against a fresh broker."""
    workdir = make_workdir()
    broker = start_system(spec, workdir)
    proc = psutil.Process(broker.pid)
    try:
        topic = clients.unique_name("conns")
        clients.create_topic(broker.bootstrap, topic, PARTITIONS)
        time.sleep(1)
        rss_start = proc.memory_info().rss
        gen = subprocess.Popen([str(LOADGEN_BIN), "-bootstrap", broker.bootstrap, "-topic", topic,
                                "-producers", str(args.producers), "-rate", str(args.rate),
                                "-idle", str(args.idle), "-seconds", str(args.seconds),
                                "-size", str(SIZE), "-linger", "5ms", "-timeout", "30s",
                                "-warmup", f"{args.warmup}s"],
                               stdout=subprocess.PIPE, text=True)
        gen_proc = psutil.Process(gen.pid)
        events: dict[str, dict] = {}
        rss: dict[str, float] = {}
        sampler = None
        cpu_gen = cpu_broker = None
        t_produce = None
        for line in gen.stdout:
            event = json.loads(line)
            events[event["event"]] = event
            if event["event"] == "idle_open":
                time.sleep(1)
                rss["with_idle"] = proc.memory_info().rss
            elif event["event"] == "producing":
                rss["producers_ready"] = proc.memory_info().rss
            elif event["event"] == "measuring":
                # The warm-up is over: CPU, RSS and load are of the measured window alone.
                sampler = _RssPeak(proc)
                cpu_broker, cpu_gen, t_produce = proc.cpu_times(), gen_proc.cpu_times(), time.perf_counter()
            elif event["event"] == "done":
                break
        produce_wall = time.perf_counter() - t_produce if t_produce else None
        cpu_broker_after, cpu_gen_after = proc.cpu_times(), gen_proc.cpu_times()
        rss["peak"] = sampler.stop() if sampler else proc.memory_info().rss
        loads = sampler.loads if sampler else []
        if gen.wait(120) != 0 or "done" not in events:
            raise RuntimeError(f"load generator failed (exit {gen.returncode}) on {spec.name}")
        rss["after"] = proc.memory_info().rss
        done = events["done"]

        def cores(before, after):
            return round(((after.user - before.user) + (after.system - before.system)) / produce_wall, 2)

        ack, conn = done["ack_ms"] or {}, done["new_connection_ms"] or {}
        row = {
            "client": "go (franz-go)", "producers": args.producers, "rate_rec_s": args.rate,
            "idle_connections": args.idle, "seconds": args.seconds,
            "sent": done["sent"], "acked": done["acked"], "timed_out": done["timed_out"],
            "failed": done["failed"], "unanswered": done["unanswered"], "errors": done["errors"],
            "ack_ms_p50": ack.get("p50"), "ack_ms_p99": ack.get("p99"), "ack_ms_p999": ack.get("p999"),
            "ack_ms_max": ack.get("max"),
            # The worst and the median of the per-second p99s: one bad second vs. a steady tail.
            "ack_ms_p99_worst_second": max((b["p99"] for b in done.get("ack_ms_by_second") or []), default=None),
            "ack_ms_p99_median_second": statistics.median([b["p99"] for b in done["ack_ms_by_second"]])
            if done.get("ack_ms_by_second") else None,
            "ack_ms_by_second": done.get("ack_ms_by_second"),
            "warmup_s": done.get("warmup_s"), "warmup_sent": done.get("warmup_sent"),
            "warmup_timed_out": done.get("warmup_timed_out"), "warmup_failed": done.get("warmup_failed"),
            "new_connection_ms_p50": conn.get("p50"), "new_connection_ms_p99": conn.get("p99"),
            "new_connection_ms_max": conn.get("max"), "new_connection_failures": done["new_connection_failures"],
            "pacer_lag_ms_p99": (done["pacer_lag_ms"] or {}).get("p99"),
            "idle_connections_opened_in_s": events["idle_open"]["seconds"],
            "idle_closed_by_broker": done["idle_closed_by_broker"],
            "producers_connected_in_s": events["producers_ready"]["seconds"],
            "rss_mb_start": round(rss_start / 2**20, 1), "rss_mb_with_idle": round(rss["with_idle"] / 2**20, 1),
            "rss_mb_producers_ready": round(rss["producers_ready"] / 2**20, 1),
            "rss_mb_peak": round(rss["peak"] / 2**20, 1), "rss_mb_after": round(rss["after"] / 2**20, 1),
            "broker_cores_while_producing": cores(cpu_broker, cpu_broker_after),
            "loadgen_cores_while_producing": cores(cpu_gen, cpu_gen_after),
            "loadavg_before": loadavg_before, "loadavg": os.getloadavg(),
            "loadavg_1m_during_mean": round(statistics.mean(loads), 2) if loads else None,
            "loadavg_1m_during_max": round(max(loads), 2) if loads else None,
        }
        print(f"{spec.name}: {json.dumps(row)}", flush=True)
        return row
    finally:
        broker.stop()
        remove_workdir(workdir)


MEDIAN_KEYS = ("sent", "acked", "timed_out", "failed", "unanswered", "ack_ms_p50", "ack_ms_p99", "ack_ms_p999",
               "ack_ms_max", "ack_ms_p99_worst_second", "ack_ms_p99_median_second", "warmup_timed_out",
               "warmup_failed", "loadavg_1m_during_mean", "loadavg_1m_during_max", "new_connection_ms_p50", "new_connection_ms_p99", "new_connection_ms_max",
               "pacer_lag_ms_p99", "rss_mb_start", "rss_mb_with_idle", "rss_mb_producers_ready", "rss_mb_peak",
               "rss_mb_after", "broker_cores_while_producing", "loadgen_cores_while_producing")


def median_row(rows: list[dict]) -> dict:
    out = {}
    for key in MEDIAN_KEYS:
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    out["loadavg_before_max"] = max(r["loadavg_before"][0] for r in rows)
    out["loadavg_before_min"] = min(r["loadavg_before"][0] for r in rows)
    out["rounds"] = len(rows)
    return out


def main_go(args) -> None:
    build_loadgen()
    names = args.systems.split(",")
    figures: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            load = wait_for_quiet(args.max_load, args.max_load_wait_s)
            print(f"round {r} {name}: load average before {load}", flush=True)
            figures[name].append(run_round_go(SYSTEMS[name], args, load))
    out = args.out or Path(__file__).parent / "results" / (
        "connections-go.json" if args.producers == 200 else f"connections-go-{args.producers}.json")
    out.parent.mkdir(exist_ok=True)
    medians = {n: median_row(rows) for n, rows in figures.items()}
    out.write_text(json.dumps({"workload": "many-connections", "client": "go (franz-go)",
                               "machine": machine.describe(),
                               "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                               "median": medians, "figures": figures}, indent=1))
    print(json.dumps(medians, indent=1))
    print(f"saved {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--producers", type=int, default=200)
    p.add_argument("--rate", type=float, default=10_000, help="records per second, all producers together")
    p.add_argument("--idle", type=int, default=5000)
    p.add_argument("--seconds", type=float, default=30, help="measured window (--client go: after the warm-up)")
    p.add_argument("--warmup", type=float, default=10, help="--client go: seconds at full rate before measuring")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--systems", default="kafka,fluvial")
    p.add_argument("--client", choices=("confluent", "go"), default="confluent")
    p.add_argument("--max-load", type=float, default=4.0, help="--client go: wait for a lower load average")
    p.add_argument("--max-load-wait-s", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.client == "go":
        main_go(args)
        return
    args.out = args.out or Path(__file__).parent / "results" / "connections.json"
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
