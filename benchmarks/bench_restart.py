"""Restart time of a broker holding a large log: after kill -9, and after a clean stop.

A broker process (flush policy `ack`, the default: every acknowledged batch is fsynced)
is filled through confluent-kafka (acks=all, 16 KiB batches as the Java client's default, 1 KiB values)
with `--sizes` of log over `--partitions` partitions. Then, `--rounds` times per size:
some more records are produced (so the active segments hold data written since the last
recovery checkpoint, as after any crash), the broker is killed with SIGKILL and started
again. Measured from the new process's start: when the Kafka port accepts a TCP
connection ("port open") and when a consumer's first fetch from offset 0 of partition 0
is answered ("first fetch"); and, from the broker's log, how long opening (recovering)
the log tablets took ("log open"), the part that grows with the log. A clean restart
(SIGTERM, then start) is measured the same way, and so is an empty broker's start (the
floor: interpreter, imports, listeners). Medians of the rounds; the load average is recorded with each figure. Saves
benchmarks/results/restart.json.

    python -m benchmarks.bench_restart [--sizes 100M,1G,5G] [--rounds 3] [--partitions 4]

`--tablet-sizes 1G` measures instead, in-process, the reopening of one log tablet after a
crash with and without its recovery point (benchmarks/results/restart-tablet.json).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks import machine
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "restart.json"
TOPIC = "restart"
VALUE = os.urandom(1024)
BATCH_BYTES = 16384


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "log").rglob("*.arrows"))


def produce(bootstrap: str, partitions: int, nbytes: int) -> int:
    """Produce about `nbytes` of values with acks=all; returns how many records."""
    # 16 KiB batches, the Java client's default batch.size: many batches per segment, the
    # hard case for recovery (librdkafka's own default, 1 MB, makes batches 64x fewer).
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 2,
                  "batch.size": BATCH_BYTES, "queue.buffering.max.kbytes": 262144})
    n = max(1, nbytes // len(VALUE))
    errors = []

    def done(err, _msg):
        if err is not None:
            errors.append(err)

    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, value=VALUE, partition=i % partitions, on_delivery=done)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(600) == 0, "records left unsent"
    assert not errors, errors[:3]
    return n


def wait_port(port: int, started: float, timeout: float = 300) -> float:
    while time.perf_counter() - started < timeout:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return time.perf_counter() - started
        except OSError:
            time.sleep(0.01)
    raise TimeoutError("the broker's port did not open")


def first_fetch(bootstrap: str, started: float, timeout: float = 300) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "restart-bench", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 10})
    c.assign([TopicPartition(TOPIC, 0, 0)])
    try:
        while time.perf_counter() - started < timeout:
            m = c.poll(0.05)
            if m is not None and m.error() is None:
                return time.perf_counter() - started
        raise TimeoutError("no record fetched")
    finally:
        c.close()


OPENED = re.compile(r"opened \d+ tables \((\d+) buckets\) in ([0-9.]+) s")


def log_open_seconds(broker: BrokerProcess) -> float | None:
    """The broker's own figure for opening (and recovering) its log tablets, from its log."""
    found = OPENED.findall(broker.log_tail(400))
    return float(found[-1][1]) if found else None


def timed_start(broker: BrokerProcess, fetch: bool = True) -> dict[str, float]:
    """Start the broker; seconds from spawning the process to port open and to first fetch,
    and the part of it the broker spent opening its log tablets."""
    cmd = [sys.executable, "-m", "fluvial.broker", "broker", "--data-dir", str(broker.data_dir),
           "--kafka-port", str(broker.port), "--http-port", "0", "--flight-port", "0", "--log-format", "text",
           *broker.extra_args]
    log = open(broker.log_path, "ab")
    started = time.perf_counter()
    broker.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    port_open = wait_port(broker.port, started)
    out = {"port_open_s": port_open}
    if fetch:
        out["first_fetch_s"] = first_fetch(broker.bootstrap, started)
    out["log_open_s"] = log_open_seconds(broker)
    out["load_avg_1m"] = os.getloadavg()[0]
    return out


def empty_start(workdir: Path, rounds: int) -> dict:
    """The floor: a broker with no tables (interpreter start, imports, listeners)."""
    broker = BrokerProcess(workdir / "empty").start()
    runs = []
    try:
        for _ in range(rounds):
            broker.stop()
            runs.append(timed_start(broker, fetch=False))
    finally:
        broker.stop()
    return {"port_open_s": statistics.median(r["port_open_s"] for r in runs), "runs": runs}


def measure_size(size: int, args, workdir: Path) -> dict:
    data = workdir / f"data-{size}"
    shutil.rmtree(data, ignore_errors=True)
    broker = BrokerProcess(data, *args.broker_args).start()
    try:
        return _measure(broker, data, size, args)
    finally:
        if broker.alive():
            broker.kill9()
        shutil.rmtree(data, ignore_errors=True)


def _measure(broker: BrokerProcess, data: Path, size: int, args) -> dict:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, args.partitions, 1)])[TOPIC].result(30)
    t0 = time.perf_counter()
    records = produce(broker.bootstrap, args.partitions, size)
    fill_s = time.perf_counter() - t0
    print(f"  filled {log_bytes(data) / 2**20:.0f} MiB ({records} records) in {fill_s:.0f} s", flush=True)
    kill9, clean = [], []
    for r in range(args.rounds):
        # Data written since the last recovery, as after any crash.
        produce(broker.bootstrap, args.partitions, args.extra_bytes)
        broker.kill9()
        m = timed_start(broker)
        kill9.append(m)
        print(f"  kill -9 round {r}: port open {m['port_open_s']:.2f} s, first fetch {m['first_fetch_s']:.2f} s, "
              f"log tablets opened in {m['log_open_s']} s (load {m['load_avg_1m']:.1f})", flush=True)
    for r in range(args.rounds):
        broker.stop()
        m = timed_start(broker)
        clean.append(m)
        print(f"  clean round {r}: port open {m['port_open_s']:.2f} s, first fetch {m['first_fetch_s']:.2f} s, "
              f"log tablets opened in {m['log_open_s']} s (load {m['load_avg_1m']:.1f})", flush=True)
    size_on_disk = log_bytes(data)
    broker.stop()

    def summary(runs: list[dict]) -> dict:
        return {"port_open_s": statistics.median(x["port_open_s"] for x in runs),
                "first_fetch_s": statistics.median(x["first_fetch_s"] for x in runs),
                "log_open_s": statistics.median(x["log_open_s"] or 0.0 for x in runs),
                "runs": runs}

    return {"target_bytes": size, "log_bytes": size_on_disk, "records": records, "fill_s": fill_s,
            "kill9": summary(kill9), "clean": summary(clean)}


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def tablet_reopen(size: int, workdir: Path, rounds: int) -> dict:
    """In-process, one bucket: a log tablet of `size` written in 16 KiB batches with a flush
    (flush policy ack) every 64 batches, never closed (a crash), then opened again: with its
    recovery point (only what may be torn is checked) and without it (every batch checked,
    what a segment past the recovery point costs)."""
    import numpy as np
    import pyarrow as pa

    from fluvial.broker.log import BatchMeta, FlushPolicy, LogConfig, LogTablet
    from fluvial.broker.log.tablet import RECOVERY_POINT_CHECKPOINT

    directory = workdir / f"tablet-{size}"
    shutil.rmtree(directory, ignore_errors=True)
    config = LogConfig(flush_policy=FlushPolicy.ACK, segment_bytes=max(size * 2, 1 << 20))
    tablet = LogTablet.open(directory, config)
    n = BATCH_BYTES // len(VALUE)
    now = int(time.time() * 1000)
    rows = pa.record_batch({
        "_timestamp": pa.array(np.full(n, now), pa.timestamp("ms", tz="UTC")),
        "_change": pa.array(np.zeros(n, np.int8)),
        "_key": pa.nulls(n, pa.binary()),
        "_headers": pa.nulls(n, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        "value": pa.array([VALUE] * n, pa.binary()),
    })
    meta = BatchMeta(-1, n - 1, n, now, now)
    batches = 0
    while tablet.size_bytes < size:
        tablet.append(rows, meta)
        batches += 1
        if batches % 64 == 0:
            tablet.flush()
    tablet.flush()
    checkpoint = (directory / RECOVERY_POINT_CHECKPOINT).read_bytes()
    out = {"log_bytes": tablet.size_bytes, "batches": batches, "with_recovery_point_s": [], "full_check_s": []}
    del tablet  # never closed: as after kill -9
    for _ in range(rounds):
        for key, keep in (("with_recovery_point_s", True), ("full_check_s", False)):
            path = directory / RECOVERY_POINT_CHECKPOINT
            if keep:
                path.write_bytes(checkpoint)
            else:
                path.unlink(missing_ok=True)
            t0 = time.perf_counter()
            reopened = LogTablet.open(directory, config)
            out[key].append(time.perf_counter() - t0)
            del reopened
    shutil.rmtree(directory, ignore_errors=True)
    out["load_avg_1m"] = os.getloadavg()[0]
    for key in ("with_recovery_point_s", "full_check_s"):
        out[key + "_median"] = statistics.median(out[key])
    return out


def main() -> None:
    # A SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the broker under test is stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100M,1G", help="comma-separated log sizes, e.g. 100M,1G,5G")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--extra-bytes", type=parse_size, default=parse_size("8M"),
                    help="produced before each kill -9")
    ap.add_argument("--broker-args", default="", help="extra broker arguments, e.g. '--flush-policy none'")
    ap.add_argument("--workdir", default=None, help="where the data directories go (default: a temp dir)")
    ap.add_argument("--tablet-sizes", default=None,
                    help="instead: reopen one log tablet in-process after a crash, e.g. 1G")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    args.broker_args = args.broker_args.split()
    if args.tablet_sizes:
        tablet_results = {"benchmark": "restart-tablet", "machine": machine.describe(), "sizes": {}}
        with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
            for label in args.tablet_sizes.split(","):
                r = tablet_results["sizes"][label] = tablet_reopen(parse_size(label), Path(tmp), args.rounds)
                print(f"{label} ({r['log_bytes'] / 2**20:.0f} MiB, {r['batches']} batches): reopen after a crash "
                      f"{r['with_recovery_point_s_median']:.3f} s with the recovery point, "
                      f"{r['full_check_s_median']:.3f} s checking every batch (load {r['load_avg_1m']:.1f})")
        if not args.no_save:
            path = RESULTS.with_name("restart-tablet.json")
            path.write_text(json.dumps(tablet_results, indent=2) + "\n")
            print(f"saved {path}")
        return
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results = {"benchmark": "restart", "machine": machine.describe(), "partitions": args.partitions,
               "broker_args": args.broker_args, "value_bytes": len(VALUE), "sizes": {}}
    if RESULTS.exists() and not args.no_save:
        previous = json.loads(RESULTS.read_text())
        if previous.get("broker_args") == args.broker_args and previous.get("partitions") == args.partitions:
            results["sizes"].update(previous.get("sizes", {}))  # a run of some sizes keeps the others
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        results["empty"] = empty_start(Path(tmp), args.rounds)
        print(f"empty broker: port open {results['empty']['port_open_s']:.2f} s", flush=True)
        for size, label in zip(sizes, args.sizes.split(",")):
            print(f"{label}:", flush=True)
            results["sizes"][label] = measure_size(size, args, Path(tmp))
    for label, r in results["sizes"].items():
        k, c = r["kill9"], r["clean"]
        print(f"{label:>6} ({r['log_bytes'] / 2**20:.0f} MiB): kill -9 port open {k['port_open_s']:.2f} s, "
              f"first fetch {k['first_fetch_s']:.2f} s, log open {k.get('log_open_s', 0):.3f} s; "
              f"clean port open {c['port_open_s']:.2f} s, first fetch {c['first_fetch_s']:.2f} s, "
              f"log open {c.get('log_open_s', 0):.3f} s")
    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
