"""e2e-latency: produce at a fixed rate, consume as it arrives; latency from the produce call to the consumer."""

from __future__ import annotations

import multiprocessing
import os
import struct
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks import clients
from benchmarks.brokers import RunningBroker
from benchmarks.workloads import Case, Chart, Metric, Scale, Workload, delete_topic_settled

# records/s: the rate the goals are set at, and four times it (batches of about 100
# records at linger.ms=5), where appending and fetching take a larger share of each interval.
RATES = (5_000, 20_000)
VALUE_SIZE = 100         # bytes: an 8-byte send time, an 8-byte phase flag, padding
# The clients' default batching delay (linger.ms=5) stays: with linger.ms=0 every record would be
# its own produce request, which measures requests/s rather than what a producer at this rate sees.
LATENCY_PRODUCER = clients.PRODUCER
_HEAD = struct.Struct("<qq")
_WARMUP, _MEASURED = 0, 1

P50 = Metric("p50 latency", "ms", False, Chart.LATENCY)
P99 = Metric("p99 latency", "ms", False, Chart.LATENCY)
P999 = Metric("p99.9 latency", "ms", False, Chart.LATENCY)
ACHIEVED_RATE = Metric("achieved rate", "records/s", True)
# The machine is shared: the 1-minute load average when the run ended, kept per round, tells a
# round taken under load from a quiet one.
LOAD = Metric("load average (1 min)", "load", False)
# Fluvial only (its /metrics histogram of log fsyncs, taken before and after the measured
# window): how many fsyncs the window's records waited for and how many took longer than
# 10 ms, the disk's own tail, which under flush policy ack every reader waits behind.
# CPU the broker process used during the measured window: on a shared machine, a broker that
# needs less CPU per record is scheduled sooner when it wakes up.
BROKER_CPU = Metric("broker CPU", "% of a core", False)
FSYNCS_PER_S = Metric("fsyncs/s", "fsyncs/s", False)
SLOW_FSYNCS = Metric("fsyncs over 10 ms", "%", False)
# Everything the machine wrote to its disks during the measured window (all processes): a
# window whose writes are far above the broker's own (about 1 MB/s at 5,000 records/s) shared
# the disk with other work, and every fsync then also waits for that work's data (a device
# cache flush covers all of it). Measured: 60 MB of another process's writeback put 90-110 ms
# fsyncs into a 5 ms fdatasync loop.
DISK_WRITES = Metric("disk writes in window", "MB", False)
# The disk's own state during the window, the same for every system: a thread of the harness
# makes a 4 KB append durable (fdatasync) every 20 ms in a file of its own and keeps the slowest.
# A stall it sees in a Kafka window is one Kafka, acknowledging from the page cache, does not
# wait for; under flush policy ack, every Fluvial reader does.
DISK_PROBE_MAX = Metric("disk probe: slowest fsync", "ms", False)
DISK_PROBE_INTERVAL_S = 0.02


def _measured_seconds(scale: Scale) -> int:
    return scale.pick(full=30, quick=2)


def _consume(bootstrap: str, topic: str, partitions: int, expected: int, out_path: str,
             ready, timeout_s: float) -> None:
    """Runs in its own process, so the producer's pacing loop never delays a receive."""
    from confluent_kafka import Consumer, TopicPartition

    config = clients.confluent_consumer_config(bootstrap, clients.unique_name("latency")) | {
        "fetch.wait.max.ms": 100,
    }
    consumer = Consumer(config)
    # From the log end (-1): records sent before the consumer was there are never a backlog.
    consumer.assign([TopicPartition(topic, p, -1) for p in range(partitions)])
    # One record per poll, stamped as it is handed over: consume(n) would hold records back
    # until n arrived or its timeout passed.
    sent = np.empty(expected, dtype=np.int64)
    received = np.empty(expected, dtype=np.int64)
    offsets = np.empty(expected, dtype=np.int64)  # which record: benchmarks/e2e_trace.py follows it in the broker
    count = 0
    seen_any = False
    deadline = time.monotonic() + timeout_s
    poll, unpack, clock = consumer.poll, _HEAD.unpack_from, time.time_ns
    try:
        while count < expected and time.monotonic() < deadline:
            msg = poll(0.1)
            if msg is None:
                continue
            now = clock()
            if not seen_any:
                ready.set()
                seen_any = True
            if msg.error() is not None:
                continue
            send_ns, phase = unpack(msg.value())
            if phase == _MEASURED:
                sent[count] = send_ns
                received[count] = now
                offsets[count] = msg.offset()
                count += 1
    finally:
        consumer.close()
    # Send and receive times (ns since the epoch) and offsets, one row each: latencies, and
    # when they happened.
    np.save(out_path, np.stack([sent[:count], received[:count], offsets[:count]]))


def _run(broker: RunningBroker, scale: Scale, rate: int, keep: str | None = None,
         seconds: int | None = None) -> dict[str, float]:
    """One run at `rate` records/s for `seconds` (default: the scale's); `keep` saves the send
    and receive times and offsets there (.npy, one row each)."""
    from confluent_kafka import Producer

    seconds = _measured_seconds(scale) if seconds is None else seconds
    measured_count = rate * seconds
    timeout_s = seconds + scale.timeout_s
    # The previous run (another system, alternating) may have left tens of MB in the page
    # cache (Kafka and flush policy `none` do not fsync): written back 30 s later by the
    # kernel, during this run, they would stall this run's fsyncs. Each run starts with
    # them on disk, so that no system is measured with another's writeback.
    os.sync()
    topic = clients.unique_name("e2e-latency")
    clients.create_topic(broker.bootstrap, topic, scale.partitions, scale.admin_timeout_s)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    with tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        out_path = str(Path(tmp) / "latencies.npy")
        consumer = ctx.Process(target=_consume, args=(broker.bootstrap, topic, scale.partitions,
                                                        measured_count, out_path, ready, timeout_s))
        consumer.start()
        errors: list[str] = []
        producer = Producer(LATENCY_PRODUCER.confluent(broker.bootstrap) | {
            "on_delivery": lambda err, _msg: errors.append(str(err)) if err else None})
        padding = bytes(VALUE_SIZE - _HEAD.size)
        try:
            # Warm-up records until the consumer has seen one, then half a second more:
            # connections, metadata and fetching are in their steady state before anything counts.
            try:
                _paced(producer, topic, padding, _WARMUP, rate, until=lambda sent: ready.is_set(),
                       deadline=time.monotonic() + scale.timeout_s)
            except clients.CaseFailed:
                raise clients.CaseFailed(f"e2e-latency: the consumer received nothing in "
                                         f"{scale.timeout_s:.0f} s") from None
            # Again once the consumer reads: what the previous run's broker removed or wrote
            # meanwhile (Kafka deletes a topic's files after the deletion returned) is on disk
            # before the last half-second of warm-up.
            os.sync()
            _paced(producer, topic, padding, _WARMUP, rate, until=lambda sent: sent >= rate // 2,
                   deadline=time.monotonic() + scale.timeout_s)
            fsyncs_before = _fsync_histogram(broker)
            cpu_before = _cpu_seconds(broker.pid)
            disk_before = _disk_write_bytes()
            with _DiskProbe(Path(tmp) / "disk-probe") as disk_probe:
                start = time.perf_counter()
                _paced(producer, topic, padding, _MEASURED, rate, until=lambda sent: sent >= measured_count,
                       deadline=time.monotonic() + timeout_s)
                send_seconds = time.perf_counter() - start
            cpu_after = _cpu_seconds(broker.pid)
            disk_after = _disk_write_bytes()
            fsyncs_after = _fsync_histogram(broker)
            producer.flush(30)
            consumer.join(timeout_s)
        finally:
            if consumer.is_alive():
                consumer.terminate()
                consumer.join()
            # As every other workload: the next system's round starts on a settled disk.
            delete_topic_settled(broker, topic)
        if errors:
            raise clients.CaseFailed(f"e2e-latency: {len(errors)} delivery errors, first: {errors[0]}")
        if not Path(out_path).exists():
            raise clients.CaseFailed(f"e2e-latency: the consumer process failed (exit {consumer.exitcode})")
        times = np.load(out_path)
    if keep is not None:
        np.save(keep, times)
    latencies = times[1] - times[0]
    if len(latencies) < measured_count:
        raise clients.CaseFailed(f"e2e-latency: {len(latencies)}/{measured_count} records consumed")
    p50, p99, p999 = np.percentile(latencies, [50, 99, 99.9]) / 1e6
    figures = {P50.name: p50, P99.name: p99, P999.name: p999, ACHIEVED_RATE.name: measured_count / send_seconds,
               LOAD.name: os.getloadavg()[0]}
    if cpu_before is not None and cpu_after is not None:
        figures[BROKER_CPU.name] = 100 * (cpu_after - cpu_before) / send_seconds
    if disk_before is not None and disk_after is not None:
        figures[DISK_WRITES.name] = (disk_after - disk_before) / 1e6
    if disk_probe.slowest_s is not None:
        figures[DISK_PROBE_MAX.name] = disk_probe.slowest_s * 1e3
    if fsyncs_before is not None and fsyncs_after is not None:
        count = fsyncs_after["+Inf"] - fsyncs_before["+Inf"]
        fast = fsyncs_after["0.01"] - fsyncs_before["0.01"]
        figures[FSYNCS_PER_S.name] = count / send_seconds
        if count:  # none under flush policy none
            figures[SLOW_FSYNCS.name] = 100 * (count - fast) / count
    return figures


class _DiskProbe:
    """A 4 KB append made durable every `DISK_PROBE_INTERVAL_S` in a thread, while the block runs;
    `slowest_s` is the longest fdatasync (None if none ran)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="disk-probe", daemon=True)
        self.slowest_s: float | None = None

    def __enter__(self) -> "_DiskProbe":
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        page = bytes(4096)
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while not self._stop.wait(DISK_PROBE_INTERVAL_S):
                os.write(fd, page)
                began = time.perf_counter()
                os.fdatasync(fd)
                took = time.perf_counter() - began
                if self.slowest_s is None or took > self.slowest_s:
                    self.slowest_s = took
        finally:
            os.close(fd)


def _cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of a process (Linux); None where /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _disk_write_bytes() -> int | None:
    """Bytes written to all disks so far (every process); None where psutil cannot tell."""
    try:
        import psutil
        counters = psutil.disk_io_counters(perdisk=False)
    except (ImportError, OSError, RuntimeError):
        return None
    return None if counters is None else counters.write_bytes


def _fsync_histogram(broker: RunningBroker) -> dict[str, float] | None:
    """Fluvial's cumulative fsync counts by upper bound ("0.01", "+Inf", ...); None for Kafka."""
    if broker.spec.product != "fluvial" or "--http-port" not in broker.listeners:
        return None
    with urllib.request.urlopen(f"{broker.http_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("fluvial_log_fsync_duration_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            counts[bound] = float(line.rsplit(" ", 1)[1])
    return counts if "0.01" in counts and "+Inf" in counts else None


def _paced(producer, topic: str, padding: bytes, phase: int, rate: int, until, deadline: float) -> None:
    """Sends at `rate` on a 0.5 ms tick; each record carries the wall time of its own produce call."""
    produce, poll, pack = producer.produce, producer.poll, _HEAD.pack
    start = time.perf_counter()
    sent = 0
    while not until(sent):
        due = int((time.perf_counter() - start) * rate) + 1
        while sent < due and not until(sent):
            produce(topic, pack(time.time_ns(), phase) + padding)
            sent += 1
        poll(0)
        if time.monotonic() > deadline:
            raise clients.CaseFailed(f"e2e-latency: pacing stopped after {sent} records (deadline)")
        time.sleep(0.0005)


def case_name(rate: int) -> str:
    return f"confluent-kafka, 100 B, {rate:,} records/s"


def cases(scale: Scale) -> list[Case]:
    return [Case(case_name(rate), lambda broker, _prepared, rate=rate: _run(broker, scale, rate)) for rate in RATES]


def settings(scale: Scale) -> dict[str, object]:
    return {
        "rates": list(RATES),
        "value_size": VALUE_SIZE,
        "measured_seconds": _measured_seconds(scale),
        "partitions": scale.partitions,
        "producer": LATENCY_PRODUCER.__dict__,
        "consumer": "confluent-kafka in its own process, partitions assigned, fetch.wait.max.ms=100",
        "before_each_run": "sync, at the start and again once the consumer reads (no system measured with "
                           "the page cache or file deletions an earlier run left)",
        "disk_probe": f"a 4 KB append and fdatasync every {DISK_PROBE_INTERVAL_S * 1e3:.0f} ms in a file of "
                      "the harness during the measured window, every system; its slowest fsync is kept",
    }


WORKLOAD = Workload(
    name="e2e-latency",
    description=f"End-to-end latency at a fixed {' and '.join(f'{r:,}' for r in RATES)} records/s of "
                f"{VALUE_SIZE} B values, acks=all, "
                "linger.ms=5: from the producer's produce() call to the consumer (another process) "
                "receiving the record; p50/p99/p99.9 over the measured records (warm-up excluded).",
    metrics=(P50, P99, P999, ACHIEVED_RATE, LOAD, BROKER_CPU, FSYNCS_PER_S, SLOW_FSYNCS, DISK_WRITES,
             DISK_PROBE_MAX),
    cases=cases,
    settings=settings,
)
