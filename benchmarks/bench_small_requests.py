"""small-requests: broker CPU per single-record produce request (the cost of many small producers).

Many small producers mean many produce requests of one record each (librdkafka with
linger.ms 5 sends a record alone when it produces under ~200 records/s). This measures
what one such request costs the broker: C raw connections (threads of this process), each
keeping D requests in flight, send N acks=all produce requests of one 100 B record to an
8-partition topic; the broker's CPU time (user + system, all its threads) divided by the
requests is the figure, with the request rate reached, and the CPU of its main thread (the
event loop's) per request. A broker process on an idle core
can serve at most 1 s / (CPU per request) requests per second on its event loop.

Run: `python benchmarks/bench_small_requests.py [--rounds 3] [--requests 1500] [--flush ack,none]
[--baseline REV] [--kafka-io thread,asyncio]`. Results: benchmarks/results/small-requests.json (median of the rounds, with
the load average). `--baseline REV` also runs the broker of an older commit (its tree exported
with `git archive` under benchmarks/.cache/, compiled extensions copied from this checkout), its rounds
alternating with this checkout's so that both see the same machine load; its figures are
saved under "<system>@<rev>". `--kafka-io thread,asyncio` also runs the broker with the other
socket I/O of its Kafka listener (rounds alternating; saved under "<system>@io-<mode>").
"""
from __future__ import annotations

import argparse
import json
import os
import contextlib
import glob
import shutil
import socket
import statistics
import subprocess
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

from benchmarks import clients, machine  # noqa: E402
from benchmarks.brokers import FLUVIAL_DEFAULT, FLUVIAL_FLUSH_NONE, make_workdir, remove_workdir, start_system  # noqa: E402

PARTITIONS = 8
CONNECTIONS = 16
IN_FLIGHT = 4


def _one_record_batch() -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=int(time.time() * 1000), key=b"k", value=b"x" * 100, headers=[])
    return bytes(b.build())


def _produce_requests(topic: str, partition: int, count: int) -> list[bytes]:
    from fluvial.protocol.messages import ApiKey, encode_request, request_class
    R = request_class(ApiKey.PRODUCE)
    batch = _one_record_batch()
    body = dict(transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[R.TopicProduceData(
        name=topic, partition_data=[R.TopicProduceData.PartitionProduceData(index=partition, records=batch)])])
    return [encode_request(ApiKey.PRODUCE, 9, i + 1, body) for i in range(count)]


def _connection(bootstrap: str, requests: list[bytes], errors: list[int]) -> None:
    from fluvial.protocol.messages import ApiKey, decode_response
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=120) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = s.makefile("rb")
        sent = got = 0
        while got < len(requests):
            while sent < len(requests) and sent - got < IN_FLIGHT:
                s.sendall(requests[sent])
                sent += 1
            (size,) = struct.unpack(">i", f.read(4))
            _, response = decode_response(ApiKey.PRODUCE, 9, f.read(size))
            errors.extend(p.error_code for t in response.responses for p in t.partition_responses if p.error_code)
            got += 1


def _main_thread_cpu(proc: psutil.Process) -> float:
    """CPU seconds (user + system) of the broker's main thread, which runs its event loop."""
    for t in proc.threads():
        if t.id == proc.pid:
            return t.user_time + t.system_time
    return 0.0


def run_round(spec, requests_per_connection: int) -> dict:
    workdir = make_workdir()
    broker = start_system(spec, workdir)
    try:
        topic = clients.unique_name("small")
        clients.create_topic(broker.bootstrap, topic, PARTITIONS)
        work = [_produce_requests(topic, i % PARTITIONS, requests_per_connection) for i in range(CONNECTIONS)]
        errors: list[int] = []
        proc = psutil.Process(broker.pid)
        before = proc.cpu_times()
        loop_before = _main_thread_cpu(proc)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=_connection, args=(broker.bootstrap, w, errors)) for w in work]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        after = proc.cpu_times()
        loop_cpu = _main_thread_cpu(proc) - loop_before
        total = CONNECTIONS * requests_per_connection
        if errors:
            raise RuntimeError(f"{len(errors)} produce requests failed (codes {sorted(set(errors))})")
        cpu = (after.user - before.user) + (after.system - before.system)
        return {"requests": total, "requests_per_s": round(total / elapsed), "broker_cpu_us_per_request":
                round(cpu / total * 1e6, 1), "user_us": round((after.user - before.user) / total * 1e6, 1),
                "system_us": round((after.system - before.system) / total * 1e6, 1),
                "loop_cpu_us_per_request": round(loop_cpu / total * 1e6, 1), "loadavg": os.getloadavg()}
    finally:
        broker.stop()
        remove_workdir(workdir)


ROOT = Path(__file__).resolve().parents[1]


def baseline_checkout(rev: str) -> Path:
    """A directory whose `fluvial` package is the checkout of `rev` (put on PYTHONPATH)."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    parent = ROOT / "benchmarks" / ".cache" / f"baseline-{sha}"
    tree = parent / "fluvial"
    if not tree.exists():
        # An exported tree (not a git worktree): nothing is registered in the repository.
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for ext in glob.glob(str(ROOT / "**" / "*.so"), recursive=True):
        rel = Path(ext).relative_to(ROOT)
        if rel.parts[0] not in ("benchmarks", "build", ".cache") and (tree / rel).parent.exists():
            shutil.copy2(ext, tree / rel)
    return parent


@contextlib.contextmanager
def python_path(path: Path | None):
    """Brokers started inside run the `fluvial` found first on `path` (None: this checkout)."""
    old = os.environ.get("PYTHONPATH")
    if path is not None:
        os.environ["PYTHONPATH"] = str(path)
    try:
        yield
    finally:
        if path is not None:
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old


@contextlib.contextmanager
def broker_args(extra: str):
    """Brokers started inside get these options too (benchmarks/brokers.py reads them)."""
    old = os.environ.get("FLUVIAL_BENCH_BROKER_ARGS")
    if extra:
        os.environ["FLUVIAL_BENCH_BROKER_ARGS"] = f"{old or ''} {extra}".strip()
    try:
        yield
    finally:
        if extra:
            if old is None:
                os.environ.pop("FLUVIAL_BENCH_BROKER_ARGS", None)
            else:
                os.environ["FLUVIAL_BENCH_BROKER_ARGS"] = old


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=1500, help="per connection")
    p.add_argument("--flush", default="ack,none")
    p.add_argument("--baseline", default=None, help="git revision to compare with, rounds alternating")
    p.add_argument("--kafka-io", default=None,
                   help="e.g. thread,asyncio: the first is the default run, the others variants (--kafka-io)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "small-requests.json")
    args = p.parse_args()
    specs = {"ack": FLUVIAL_DEFAULT, "none": FLUVIAL_FLUSH_NONE}
    io_modes = args.kafka_io.split(",") if args.kafka_io else [None]
    variants: list[tuple[str, Path | None, str | None]] = [("", None, io_modes[0])]
    variants += [(f"@io-{mode}", None, mode) for mode in io_modes[1:]]
    if args.baseline:
        variants.append((f"@{args.baseline}", baseline_checkout(args.baseline), None))
    figures = {}
    for flush in args.flush.split(","):
        rounds: dict[str, list[dict]] = {suffix: [] for suffix, _, _ in variants}
        for r in range(args.rounds):
            for suffix, path, io_mode in (variants if r % 2 == 0 else variants[::-1]):
                with python_path(path), broker_args(f"--kafka-io {io_mode}" if io_mode else ""):
                    row = run_round(specs[flush], args.requests)
                print(f"flush {flush}{suffix} round {r}: {json.dumps(row)}", flush=True)
                rounds[suffix].append(row)
        for suffix, rows in rounds.items():
            figures[specs[flush].name + suffix] = {
                "median_broker_cpu_us_per_request": statistics.median(x["broker_cpu_us_per_request"] for x in rows),
                "median_requests_per_s": statistics.median(x["requests_per_s"] for x in rows),
                "median_loop_cpu_us_per_request": statistics.median(x["loop_cpu_us_per_request"] for x in rows),
                "rounds": rows}
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps({"workload": "small-requests", "machine": machine.describe(),
                                    "settings": {"connections": CONNECTIONS, "in_flight": IN_FLIGHT,
                                                 "requests_per_connection": args.requests,
                                                 "partitions": PARTITIONS, "record_bytes": 100,
                                                 "baseline": args.baseline, "kafka_io": args.kafka_io},
                                    "figures": figures}, indent=1))
    print(json.dumps({k: {m: v for m, v in f.items() if m != "rounds"} for k, f in figures.items()}))


if __name__ == "__main__":
    main()
