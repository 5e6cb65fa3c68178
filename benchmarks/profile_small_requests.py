"""profile-small-requests: the event loop's CPU per one-record produce request, step by step.

Runs the load of `bench_small_requests.py` (C raw connections, D requests in flight each,
acks=all one-record batches of 100 B to an 8-partition topic) against Fluvial (flush policy
`ack`) and samples the broker with py-spy while it runs. The loop thread's CPU per request
is measured over the sampled window (psutil, the main thread's user + system time, divided
by the requests answered meanwhile), and each function's share of the loop's samples turns
into microseconds per request: inclusive (the function and what it calls) and self (its own
code, C calls it makes included, py-spy's `--native` being off). py-spy samples the loop
while it waits in epoll too (`EpollSelector.select`: idle time, not CPU): those samples
are left out, and the others share the measured CPU.

By default the batches are like the Go generator's (franz-go): an idempotent producer per
connection (sequences counting up) and snappy; `--plain` sends bench_small_requests' batches
(no producer id, uncompressed).

Run: `python benchmarks/profile_small_requests.py [--seconds 8] [--plain] [--rev REV] [--out FILE]`
(`--rev`: the broker of an older commit, exported as bench_small_requests' `--baseline` does).
Results: benchmarks/results/profile-small-requests.json (with the load average); the raw
py-spy output goes to benchmarks/.cache/profile-small-requests.txt.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

from benchmarks import clients, machine  # noqa: E402
from benchmarks.bench_small_requests import (CONNECTIONS, IN_FLIGHT, PARTITIONS, _main_thread_cpu,  # noqa: E402
                                             baseline_checkout, python_path)
from benchmarks.brokers import FLUVIAL_DEFAULT, make_workdir, remove_workdir, start_system  # noqa: E402


def _requests(topic: str, partition: int, count: int, producer_id: int, snappy: bool) -> list[bytes]:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from fluvial.protocol.messages import ApiKey, encode_request, request_class
    R = request_class(ApiKey.PRODUCE)
    out = []
    now = int(time.time() * 1000)
    for i in range(count):
        b = DefaultRecordBatchBuilder(magic=2, compression_type=2 if snappy else 0, is_transactional=False,
                                      producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                      base_sequence=i if producer_id >= 0 else -1, batch_size=1 << 20)
        b.append(0, timestamp=now, key=b"k", value=bytes(100), headers=[])
        body = dict(transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[R.TopicProduceData(
            name=topic, partition_data=[R.TopicProduceData.PartitionProduceData(index=partition,
                                                                                records=bytes(b.build()))])])
        out.append(encode_request(ApiKey.PRODUCE, 9, i + 1, body))
    return out


def _connection(bootstrap: str, requests: list[bytes], answered: list[int], slot: int, stop: threading.Event,
                errors: list[int]) -> None:
    from fluvial.protocol.messages import ApiKey, decode_response
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=120) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = s.makefile("rb")
        sent = got = 0
        while got < len(requests) and not stop.is_set():
            while sent < len(requests) and sent - got < IN_FLIGHT:
                s.sendall(requests[sent])
                sent += 1
            (size,) = struct.unpack(">i", f.read(4))
            _, response = decode_response(ApiKey.PRODUCE, 9, f.read(size))
            errors.extend(p.error_code for t in response.responses for p in t.partition_responses if p.error_code)
            got += 1
            answered[slot] = got


_SELECT = "EpollSelector.select (selectors.py)"
# Steps of a request, by function as py-spy names it: ("self" | "inclusive", function).
PARTS = {
    "socket_write": ("self", "_SelectorSocketTransport.write (asyncio/selector_events.py)"),
    "socket_read": ("self", "_SelectorSocketTransport._read_ready__get_buffer (asyncio/selector_events.py)"),
    "executor_wakeups": ("self", "BaseSelectorEventLoop._read_from_self (asyncio/selector_events.py)"),
    "executor_submit": ("inclusive", "BaseEventLoop.run_in_executor (asyncio/base_events.py)"),
    "produce_handler": ("inclusive", "produce (broker/handlers/produce.py)"),
    "respond_and_append": ("inclusive", "_respond (broker/handlers/produce.py)"),
    "request_decode": ("inclusive", "decode_produce_request (protocol/produce_request.py)"),
    # the one-partition request read by one compiled call (header included)
    "request_read_compiled": ("inclusive", "decode_common (protocol/produce_request.py)"),
    "header_decode": ("inclusive", "decode_request_header (protocol/messages.py)"),
    "records_checked": ("inclusive", "to_wire_records (broker/kafka_batches.py)"),
    "answer_encode": ("inclusive", "encode_produce_response (protocol/produce_response.py)"),
    "loop_callbacks_self": ("self", "Handle._run (asyncio/events.py)"),
    # --kafka-io thread (broker/netio.py): the batch callback and the calls into the I/O thread
    "io_events": ("inclusive", "_on_events (broker/netio.py)"),
    "io_events_self": ("self", "_on_events (broker/netio.py)"),
    "io_send": ("self", "send (broker/netio.py)"),
}


def parts_of(result: dict) -> dict[str, float]:
    """The PARTS' microseconds per request from a result's self/inclusive lists (0 when absent)."""
    return {name: result[f"{kind}_us_per_request"].get(fn, 0.0) for name, (kind, fn) in PARTS.items()}


def shares(raw: str) -> tuple[int, dict[str, int], dict[str, int]]:
    """(loop samples, inclusive samples by function, self samples by function)."""
    inclusive: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        if not line.startswith("thread") or "MainThread" not in line.split(";", 1)[0]:
            continue
        stack, count = line.rsplit(" ", 1)
        n = int(count)
        total += n
        frames = [re.sub(r" \((.*?):\d+\)", r" (\1)", f) for f in stack.split(";")[1:]]
        for name in set(frames):
            inclusive[name] += n
        if frames:
            own[frames[-1]] += n
    return total, inclusive, own


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8, help="sampled window")
    p.add_argument("--plain", action="store_true", help="no producer id, uncompressed")
    p.add_argument("--requests", type=int, default=4000, help="per connection (the run stops after the window)")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--rev", default=None, help="profile the broker of this git revision instead of the checkout")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "profile-small-requests.json")
    args = p.parse_args()
    raw_path = Path(__file__).parent / ".cache" / "profile-small-requests.txt"
    raw_path.parent.mkdir(exist_ok=True)
    load_before = os.getloadavg()
    workdir = make_workdir()
    with python_path(baseline_checkout(args.rev) if args.rev else None):
        broker = start_system(FLUVIAL_DEFAULT, workdir)
    try:
        topic = clients.unique_name("profile-small")
        clients.create_topic(broker.bootstrap, topic, PARTITIONS)
        work = [_requests(topic, i % PARTITIONS, args.requests, -1 if args.plain else 1000 + i, not args.plain)
                for i in range(CONNECTIONS)]
        answered = [0] * CONNECTIONS
        errors: list[int] = []
        stop = threading.Event()
        threads = [threading.Thread(target=_connection, args=(broker.bootstrap, w, answered, i, stop, errors))
                   for i, w in enumerate(work)]
        for t in threads:
            t.start()
        time.sleep(1.5)  # connections up, first segment files, the loop warm
        proc = psutil.Process(broker.pid)
        loop_before, n_before, t0 = _main_thread_cpu(proc), sum(answered), time.perf_counter()
        subprocess.run(["py-spy", "record", "--pid", str(broker.pid), "--format", "raw", "--threads", "-r", "250",
                        "-d", str(int(args.seconds)), "-o", str(raw_path), "--nonblocking"],
                       check=True, capture_output=True)
        loop_cpu, n, elapsed = _main_thread_cpu(proc) - loop_before, sum(answered) - n_before, time.perf_counter() - t0
        stop.set()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"{len(errors)} produce requests failed (codes {sorted(set(errors))})")
    finally:
        broker.stop()
        remove_workdir(workdir)
    total, inclusive, own = shares(raw_path.read_text())
    us_per_request = loop_cpu / max(n, 1) * 1e6
    # py-spy samples the loop thread in epoll_wait too (idle, not CPU): the other samples
    # share the loop's measured CPU, so a function's share of them x the CPU per request is
    # its CPU per request (wall time on a thread that is not starved here).
    idle = own.get(_SELECT, 0)
    us_per_sample = us_per_request / max(total - idle, 1)

    def per_request(counter: collections.Counter) -> dict[str, float]:
        return {name: round(c * us_per_sample, 1) for name, c in counter.most_common() if name != _SELECT}

    result = {
        "workload": "profile-small-requests", "machine": machine.describe(),
        "settings": {"connections": CONNECTIONS, "in_flight": IN_FLIGHT, "partitions": PARTITIONS,
                     "batches": "plain" if args.plain else "idempotent, snappy", "sample_s": args.seconds,
                     "rev": args.rev},
        "requests_per_s": round(n / elapsed), "loop_cpu_us_per_request": round(us_per_request, 1),
        "loop_samples": total, "idle_samples": idle, "inclusive_us_per_request": per_request(inclusive),
        "self_us_per_request": per_request(own), "loadavg_before": load_before, "loadavg": os.getloadavg(),
    }
    result["parts_us_per_request"] = parts_of(result)
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{result['requests_per_s']} requests/s, loop {result['loop_cpu_us_per_request']} us/request, "
          f"load {load_before[0]:.1f}")
    for title, key in (("self", "self_us_per_request"), ("inclusive", "inclusive_us_per_request")):
        print(f"-- {title} us per request")
        for name, us in list(result[key].items())[:args.top]:  # the file keeps them all
            print(f"{us:7.1f}  {name}")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
