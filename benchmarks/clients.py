"""Client drivers shared by the workloads: one set of producer/consumer settings for librdkafka and Java alike."""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks import kafka_dist


class CaseFailed(RuntimeError):
    """One measurement could not be taken (the client failed, timed out or lost records)."""


@dataclass(frozen=True)
class ProducerSettings:
    """Written once and mapped to both clients, so librdkafka and the Java producer batch alike."""

    acks: str = "all"
    linger_ms: int = 5            # the default of both clients (Kafka 4.0 moved Java's to 5 ms)
    batch_size: int = 1_000_000   # librdkafka's default; the Java default is 16 KiB
    compression: str = "none"
    # Idempotence is off on both sides: librdkafka defaults to off, Java to on.
    idempotence: bool = False

    def confluent(self, bootstrap: str) -> dict[str, object]:
        return {
            "bootstrap.servers": bootstrap,
            "acks": self.acks,
            "linger.ms": self.linger_ms,
            "batch.size": self.batch_size,
            "compression.type": self.compression,
            "enable.idempotence": self.idempotence,
            "delivery.report.only.error": True,  # no Python callback per record
            "queue.buffering.max.messages": 1_000_000,
            "log_level": 3,
        }

    def java(self, bootstrap: str) -> list[str]:
        return [
            f"bootstrap.servers={bootstrap}",
            f"acks={self.acks}",
            f"linger.ms={self.linger_ms}",
            f"batch.size={self.batch_size}",
            f"compression.type={self.compression}",
            f"enable.idempotence={'true' if self.idempotence else 'false'}",
        ]


PRODUCER = ProducerSettings()

# Consumers keep both clients' defaults (fetch.max.bytes 50 MiB, 1 MiB per partition, 500 ms max
# wait, fetch.min.bytes 1); only what is needed to read from the start without committing is set.
def confluent_consumer_config(bootstrap: str, group: str) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        "log_level": 3,
    }


def payload(size: int) -> bytes:
    """Random upper-case letters, as Kafka's ProducerPerformance sends them."""
    return bytes(65 + b % 26 for b in os.urandom(size))


def unique_name(prefix: str) -> str:
    return f"{prefix}-{int(time.time() * 1000) % 10**9}-{os.urandom(3).hex()}"


# --- topics ---------------------------------------------------------------------------------------

def create_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30.0,
                 security: dict[str, object] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3, **(security or {})})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                  operation_timeout=timeout_s, request_timeout=timeout_s)
    try:
        futures[topic].result(timeout=timeout_s)
    except KafkaException as exc:
        raise CaseFailed(f"CreateTopics {topic}: {exc}") from exc
    _wait_for_leaders(admin, topic, partitions, timeout_s)


def _wait_for_leaders(admin: AdminClient, topic: str, partitions: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=5).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)
    raise CaseFailed(f"topic {topic} has no leader for all {partitions} partitions after {timeout_s}s")


def delete_topic(bootstrap: str, topic: str, security: dict[str, object] | None = None) -> None:
    """Best effort: a failed delete costs only disk space in a temp dir."""
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(security or {})})
        admin.delete_topics([topic], operation_timeout=10, request_timeout=10)[topic].result(timeout=15)
    except Exception:
        pass


# --- librdkafka (confluent-kafka) -----------------------------------------------------------------

@dataclass(frozen=True)
class Throughput:
    records: int
    bytes: int
    seconds: float
    avg_latency_ms: float | None = None  # the producer's own mean send-to-ack latency, when it reports one

    def figures(self) -> dict[str, float]:
        out = {"records/s": self.records / self.seconds, "MB/s": self.bytes / self.seconds / 1e6}
        if self.avg_latency_ms is not None:
            out["producer_avg_latency_ms"] = self.avg_latency_ms
        return out


def produce_confluent(bootstrap: str, topic: str, count: int, size: int, timeout_s: float,
                      settings: ProducerSettings = PRODUCER, security: dict[str, object] | None = None) -> Throughput:
    """Produce `count` values of `size` bytes as fast as the client goes; timed to the last ack.
    `security`: the client's TLS/SASL settings (security.protocol, sasl.*, ssl.*)."""
    errors: list[str] = []

    def on_error(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    config = settings.confluent(bootstrap) | {"message.timeout.ms": int(timeout_s * 1000),
                                              "on_delivery": on_error} | (security or {})
    producer = Producer(config)
    value = payload(size)
    produce, poll = producer.produce, producer.poll
    deadline = time.monotonic() + timeout_s
    start = time.perf_counter()
    for i in range(count):
        while True:
            try:
                produce(topic, value)
                break
            except BufferError:
                poll(0.005)
                if time.monotonic() > deadline:
                    raise CaseFailed(f"produce to {topic}: local queue still full after {timeout_s}s")
        if i & 0x3FF == 0:
            poll(0)
    remaining = producer.flush(max(1.0, deadline - time.monotonic()))
    elapsed = time.perf_counter() - start
    if remaining:
        raise CaseFailed(f"produce to {topic}: {remaining} records not acknowledged after {timeout_s}s")
    if errors:
        raise CaseFailed(f"produce to {topic}: {len(errors)} delivery errors, first: {errors[0]}")
    return Throughput(count, count * size, elapsed)


def consume_confluent(bootstrap: str, topic: str, expected: int, partitions: int, timeout_s: float,
                      security: dict[str, object] | None = None) -> Throughput:
    """Read a topic from the start until `expected` records arrived. Partitions are assigned
    directly (no group join), and the clock runs from the first batch received to the last, so
    connection and offset lookup are not counted (ConsumerPerformance also leaves its set-up out);
    the first batch's records are therefore not counted either."""
    consumer = Consumer(confluent_consumer_config(bootstrap, unique_name("bench")) | (security or {}))
    try:
        consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])  # -2 = beginning
        deadline = time.monotonic() + timeout_s
        records = 0
        counted_records = 0
        counted_bytes = 0
        start = 0.0
        consume = consumer.consume
        while records < expected:
            if time.monotonic() > deadline:
                raise CaseFailed(f"consume {topic}: {records}/{expected} records after {timeout_s}s")
            # consume() waits until it has num_messages or times out: ask for one record first (to
            # start the clock) and never for more than are still to come.
            wanted = 1 if records == 0 else min(10_000, expected - records)
            batch = consume(num_messages=wanted, timeout=0.5)
            if not batch:
                continue
            for msg in batch:
                err = msg.error()
                if err is not None:
                    raise CaseFailed(f"consume {topic}: {err}")
            if records == 0:
                start = time.perf_counter()
            else:
                counted_records += len(batch)
                counted_bytes += len(batch) * len(batch[0].value())
            records += len(batch)
        elapsed = time.perf_counter() - start
        if counted_records == 0:
            raise CaseFailed(f"consume {topic}: {records} records are too few to time")
        return Throughput(counted_records, counted_bytes, elapsed)
    finally:
        consumer.close()


# --- Apache Kafka's Java tools --------------------------------------------------------------------

_PERF_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency")


def produce_java(bootstrap: str, topic: str, count: int, size: int, timeout_s: float,
                 settings: ProducerSettings = PRODUCER) -> Throughput:
    """Apache Kafka's ProducerPerformance (its own timer starts at the first send, not at JVM start)."""
    cmd = kafka_dist.java_tool(
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic", topic, "--num-records", str(count), "--record-size", str(size), "--throughput", "-1",
        "--producer-props", *settings.java(bootstrap), f"delivery.timeout.ms={int(timeout_s * 1000)}",
        # The Java producer insists on delivery.timeout.ms >= linger.ms + request.timeout.ms.
        f"request.timeout.ms={min(30_000, int(timeout_s * 500))}",
    )
    out = _run_tool(cmd, timeout_s + 30)
    match = None
    for match in _PERF_LINE.finditer(out):
        pass
    if match is None:
        raise CaseFailed(f"ProducerPerformance printed no summary:\n{out[-1500:]}")
    sent = int(match.group(1))
    if sent != count or "Exception" in out:
        raise CaseFailed(f"ProducerPerformance: {sent}/{count} records acknowledged:\n{out[-1500:]}")
    rate = float(match.group(2))
    return Throughput(count, count * size, count / rate, float(match.group(4)))


def consume_java(bootstrap: str, topic: str, expected: int, timeout_s: float) -> Throughput:
    """Apache Kafka's ConsumerPerformance: joins a fresh group, subscribes, reads from the start.
    The figure is its fetch phase (after the group join), so group join time is not counted."""
    cmd = kafka_dist.java_tool(
        "org.apache.kafka.tools.ConsumerPerformance",
        "--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(expected),
        "--group", unique_name("bench-java"), "--timeout", str(int(min(timeout_s, 30) * 1000)),
    )
    out = _run_tool(cmd, timeout_s + 30)
    lines = [line for line in out.splitlines() if "," in line]
    header_at = next((i for i, line in enumerate(lines) if line.startswith("start.time")), None)
    if header_at is None or header_at + 1 >= len(lines):
        raise CaseFailed(f"ConsumerPerformance printed no figures:\n{out[-1500:]}")
    names = [n.strip() for n in lines[header_at].split(",")]
    values = [v.strip() for v in lines[header_at + 1].split(",")]
    row = dict(zip(names, values))
    records = int(float(row["data.consumed.in.nMsg"]))
    fetch_ms = float(row["fetch.time.ms"])
    if records < expected:
        raise CaseFailed(f"ConsumerPerformance: {records}/{expected} records:\n{out[-1500:]}")
    size = float(row["data.consumed.in.MB"]) * 1024 * 1024  # the tool's MB are MiB
    return Throughput(records, int(size), max(fetch_ms, 1.0) / 1000)


def _run_tool(cmd: list[str], timeout_s: float) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-1500:]
        main_class = cmd[cmd.index("-cp") + 2]
        raise CaseFailed(f"{main_class} timed out after {timeout_s:.0f}s: {tail!r}") from exc
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise CaseFailed(f"exit {done.returncode}:\n{out[-1500:]}")
    return out
