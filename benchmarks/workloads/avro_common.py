"""What the Avro workloads share: the serialized 20-field records, typed/raw topics, disk sizes.

The values are serialized once per run with confluent-kafka's AvroSerializer against a Fluvial
schema registry (a short-lived Fluvial broker of its own, so that every system gets the very
same bytes, Apache Kafka included). A Fluvial typed table gets the schema registered under
`<topic>-value` before anything is produced; where that registry gives the schema another id
than the one in the bytes, only the 4-byte id in each value's header is rewritten.
"""
from __future__ import annotations

import functools
import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from benchmarks import clients
from benchmarks.avro_records import SCHEMA20, make_record
from benchmarks.brokers import RunningBroker
from benchmarks.workloads import Metric, Scale

# make_record's `pad` giving values of about 200 B and about 1 KB (Confluent header included).
PAD_BY_SIZE = {200: 24, 1000: 824}
VALUE_SIZES = tuple(PAD_BY_SIZE)

DISK_BYTES_PER_RECORD = Metric("disk B/record", "B", False)


def size_label(size: int) -> str:
    return "1 KB" if size == 1000 else f"{size} B"


@dataclass(frozen=True)
class AvroValues:
    values: list[bytes]
    schema_id: int  # the id in the values' headers

    @property
    def mean_size(self) -> float:
        return sum(map(len, self.values)) / len(self.values)

    def framed_for(self, schema_id: int) -> list[bytes]:
        """The same Avro bodies under another schema id."""
        if schema_id == self.schema_id:
            return self.values
        header = b"\0" + schema_id.to_bytes(4, "big")
        return [header + v[5:] for v in self.values]


@functools.cache
def avro_values(size: int, count: int) -> AvroValues:
    """`count` records of SCHEMA20 of about `size` bytes, serialized once per process."""
    from tests.support.broker_process import BrokerProcess  # the registry's broker, only when needed

    rng = random.Random(20 + size)
    records = [make_record(rng, i, PAD_BY_SIZE[size]) for i in range(count)]
    with tempfile.TemporaryDirectory(prefix="fluvial-bench-registry-") as tmp:
        registry = BrokerProcess(Path(tmp) / "data", "--flush-policy", "none").start()
        try:
            serializer = AvroSerializer(SchemaRegistryClient({"url": registry.http_url}), json.dumps(SCHEMA20))
            ctx = SerializationContext("bench-avro", MessageField.VALUE)
            values = [serializer(r, ctx) for r in records]
        finally:
            registry.stop()
    return AvroValues(values, int.from_bytes(values[0][1:5], "big"))


def register_value_schema(broker: RunningBroker, topic: str) -> int:
    """Types the Fluvial table `topic` (before it exists) by registering SCHEMA20 under `<topic>-value`."""
    client = SchemaRegistryClient({"url": broker.http_url})
    return client.register_schema(f"{topic}-value", Schema(json.dumps(SCHEMA20), "AVRO"))


def create_avro_topic(broker: RunningBroker, prefix: str, typed: bool, scale: Scale,
                      data: AvroValues) -> tuple[str, list[bytes]]:
    """A fresh topic and the values to produce into it. Apache Kafka has no typed tables:
    there both kinds are plain topics of the same bytes."""
    topic = clients.unique_name(prefix)
    values = data.values
    if typed and broker.spec.product == "fluvial":
        values = data.framed_for(register_value_schema(broker, topic))
    clients.create_topic(broker.bootstrap, topic, scale.partitions, scale.admin_timeout_s)
    return topic, values


def produce_values(bootstrap: str, topic: str, values: list[bytes], timeout_s: float) -> clients.Throughput:
    """Produce the given values as fast as the client goes (settings as produce-raw); timed to the last ack."""
    errors: list[str] = []

    def on_error(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    config = clients.PRODUCER.confluent(bootstrap) | {"message.timeout.ms": int(timeout_s * 1000),
                                                      "on_delivery": on_error}
    producer = Producer(config)
    produce, poll = producer.produce, producer.poll
    deadline = time.monotonic() + timeout_s
    start = time.perf_counter()
    for i, value in enumerate(values):
        while True:
            try:
                produce(topic, value)
                break
            except BufferError:
                poll(0.005)
                if time.monotonic() > deadline:
                    raise clients.CaseFailed(f"produce to {topic}: local queue still full after {timeout_s}s")
        if i & 0x3FF == 0:
            poll(0)
    remaining = producer.flush(max(1.0, deadline - time.monotonic()))
    elapsed = time.perf_counter() - start
    if remaining:
        raise clients.CaseFailed(f"produce to {topic}: {remaining} records not acknowledged after {timeout_s}s")
    if errors:
        raise clients.CaseFailed(f"produce to {topic}: {len(errors)} delivery errors, first: {errors[0]}")
    return clients.Throughput(len(values), sum(map(len, values)), elapsed)


def disk_bytes(broker: RunningBroker, topic: str) -> int | None:
    """Bytes of the topic's log files: Kafka's `.log` segments, Fluvial's `.arrows` segments
    (indexes excluded on both). None when the log is not on this machine's file system."""
    suffix = ".log" if broker.spec.product == "kafka" else ".arrows"
    dirs = [d for d in broker.workdir.rglob(f"{topic}-*") if d.is_dir() and d.name[len(topic) + 1:].isdigit()]
    if not dirs:
        return None
    return sum(f.stat().st_size for d in dirs for f in d.iterdir() if f.suffix == suffix)
