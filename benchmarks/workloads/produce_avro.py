"""produce-avro: acks=all produce of 20-field Avro records (about 200 B and 1 KB) into a typed and a raw table."""

from __future__ import annotations

from benchmarks import clients
from benchmarks.brokers import RunningBroker
from benchmarks.workloads import MB_PER_S, RECORDS_PER_S, Case, Scale, Workload, delete_topic_settled
from benchmarks.workloads.avro_common import (
    DISK_BYTES_PER_RECORD, PAD_BY_SIZE, VALUE_SIZES, avro_values, create_avro_topic, disk_bytes, produce_values,
    size_label,
)

KINDS = ("typed", "raw")


def record_count(size: int, scale: Scale) -> int:
    # Long enough to measure the brokers rather than the start of a run: at 200,000 / 100,000
    # a Kafka round lasted about 0.15 s, mostly the client's own produce loop.
    if size <= 200:
        return scale.pick(full=1_000_000, quick=5_000)
    return scale.pick(full=300_000, quick=2_000)


def _case(kind: str, size: int, scale: Scale) -> Case:
    count = record_count(size, scale)

    def run(broker: RunningBroker, _prepared: object) -> dict[str, float]:
        data = avro_values(size, count)
        topic, values = create_avro_topic(broker, f"produce-avro-{kind}-{size}", kind == "typed", scale, data)
        try:
            figures = produce_values(broker.bootstrap, topic, values, scale.timeout_s).figures()
            on_disk = disk_bytes(broker, topic)
            if on_disk is not None:
                figures[DISK_BYTES_PER_RECORD.name] = on_disk / count
            return figures
        finally:
            delete_topic_settled(broker, topic)

    return Case(f"{kind} table, {size_label(size)}", run)


def cases(scale: Scale) -> list[Case]:
    return [_case(kind, size, scale) for size in VALUE_SIZES for kind in KINDS]


def settings(scale: Scale) -> dict[str, object]:
    return {
        "records": {size_label(size): record_count(size, scale) for size in VALUE_SIZES},
        "schema": "benchmarks/avro_records.py SCHEMA20 (20 fields: every type of the table mapping); "
                  f"make_record pad {PAD_BY_SIZE} widens the string and bytes fields",
        "serializer": "confluent-kafka AvroSerializer against a Fluvial schema registry, once per run; "
                      "every system gets the same bytes",
        "typed table": "Fluvial: the schema registered under <topic>-value before producing, values stored as "
                       "typed columns; Apache Kafka: a plain topic (it stores bytes)",
        "raw table": "a plain topic of the same bytes on every system",
        "disk B/record": "Kafka: the partition directory's .log files; Fluvial: its .arrows segments "
                         "(indexes excluded), after the last acknowledgement",
        "partitions": scale.partitions,
        "producer": clients.PRODUCER.__dict__,
    }


WORKLOAD = Workload(
    name="produce-avro",
    description="Produce throughput and bytes on disk per record of 20-field Avro records (about 200 B "
                "and 1 KB, Confluent wire format) with confluent-kafka, acks=all, into a fresh topic: on "
                "Fluvial once into a typed table (schema registered, values stored as typed columns) and "
                "once into a raw table of the same bytes; Apache Kafka stores the bytes in both cases.",
    metrics=(RECORDS_PER_S, MB_PER_S, DISK_BYTES_PER_RECORD),
    cases=cases,
    settings=settings,
)
