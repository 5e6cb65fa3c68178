"""projection-scan: 2 of 20 columns through Fluvial's native client vs a full Kafka consume and Avro decode."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass

import fastavro
from confluent_kafka import Consumer, TopicPartition

from benchmarks import clients
from benchmarks.avro_records import SCHEMA20
from benchmarks.brokers import RunningBroker
from benchmarks.workloads import RECORDS_PER_S, Case, Scale, Workload
from benchmarks.workloads.avro_common import avro_values, create_avro_topic, produce_values

SIZE = 1000
COLUMNS = ("id", "score")
ALL_COLUMNS = tuple(f["name"] for f in SCHEMA20["fields"])
# The fastest Avro decoding a Python user has for two fields (measured: fastavro record by
# record with this reader schema is 2.1x fastavro's full decode; a container block through
# fastavro.reader is no faster than record by record, and polars' columnar reader cannot
# read the map field): fastavro's schema resolution skips the other 18 fields.
PROJECTED_READER = {"type": "record", "name": "Order", "namespace": "shop",
                    "fields": [f for f in SCHEMA20["fields"] if f["name"] in COLUMNS]}


def record_count(scale: Scale) -> int:
    return scale.pick(full=200_000, quick=5_000)


@dataclass(frozen=True)
class PreparedTable:
    topic: str


def prepare(broker: RunningBroker, scale: Scale) -> PreparedTable:
    """The ~1 KB produce-avro records, once per system: a typed table on Fluvial, a topic of the same bytes on Kafka."""
    data = avro_values(SIZE, record_count(scale))
    topic, values = create_avro_topic(broker, "projection-scan", True, scale, data)
    produce_values(broker.bootstrap, topic, values, scale.timeout_s)
    return PreparedTable(topic)


def scan_native(broker: RunningBroker, topic: str, expected: int, columns: tuple[str, ...] = COLUMNS) -> float:
    """Seconds for the native client to read these columns of every row (buckets in parallel)."""
    import fluvial.client as fc

    client = fc.connect(broker.flight_url)
    try:
        start = time.perf_counter()
        result = client.table(topic).scan(columns=list(columns)).to_arrow()
        elapsed = time.perf_counter() - start
    finally:
        client.close()
    if result.num_rows != expected or result.column_names != list(columns):
        raise clients.CaseFailed(f"scan {topic}: {result.num_rows}/{expected} rows, columns {result.column_names}")
    return elapsed


def consume_and_decode(broker: RunningBroker, topic: str, expected: int, partitions: int, timeout_s: float,
                       projected: bool = False) -> float:
    """Seconds for a confluent-kafka consumer to read every record from the start and decode
    its value (what a Kafka application must do to get at any field): fastavro with the writer
    schema, as AvroDeserializer does once it has the schema cached; `projected`: resolved to
    the two-field PROJECTED_READER schema instead, which skips the other fields."""
    parsed = fastavro.parse_schema(SCHEMA20)
    reader_schema = fastavro.parse_schema(PROJECTED_READER) if projected else parsed
    read = fastavro.schemaless_reader
    consumer = Consumer(clients.confluent_consumer_config(broker.bootstrap, clients.unique_name("bench-scan")))
    try:
        consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
        got = 0
        checksum = 0.0
        deadline = time.monotonic() + timeout_s
        start = time.perf_counter()
        while got < expected:
            if time.monotonic() > deadline:
                raise clients.CaseFailed(f"consume {topic}: {got}/{expected} records after {timeout_s}s")
            for msg in consumer.consume(num_messages=min(10_000, expected - got), timeout=0.5):
                if msg.error() is not None:
                    raise clients.CaseFailed(f"consume {topic}: {msg.error()}")
                buf = io.BytesIO(msg.value())
                buf.seek(5)  # magic byte and schema id
                record = read(buf, parsed, reader_schema)
                checksum += record["id"] + record["score"]  # the application uses what it decoded
                got += 1
        return time.perf_counter() - start
    finally:
        consumer.close()


def _case(scale: Scale, name: str, columns: tuple[str, ...], projected: bool) -> Case:
    count = record_count(scale)

    def run(broker: RunningBroker, prepared: object) -> dict[str, float]:
        assert isinstance(prepared, PreparedTable)
        if broker.spec.product == "fluvial":
            seconds = scan_native(broker, prepared.topic, count, columns)
        else:
            seconds = consume_and_decode(broker, prepared.topic, count, scale.partitions, scale.timeout_s,
                                         projected)
        return {"records/s": count / seconds}

    return Case(name, run)


def cases(scale: Scale) -> list[Case]:
    return [
        _case(scale, "2 of 20 columns, ~1 KB records", COLUMNS, False),
        # The fair pair for two columns: Kafka's side with the fastest decoder for them.
        _case(scale, "2 of 20 columns, Kafka side fastavro projected", COLUMNS, True),
        # Every column: what Fluvial costs when nothing is skipped.
        _case(scale, "all 20 columns, ~1 KB records", ALL_COLUMNS, False),
    ]


def settings(scale: Scale) -> dict[str, object]:
    return {
        "records": record_count(scale),
        "data": "the ~1 KB produce-avro records (SCHEMA20), produced once per system before the rounds: "
                "a typed table on Fluvial, a topic of the same bytes on Apache Kafka",
        "fluvial": f"fluvial.client scan(columns={list(COLUMNS)}).to_arrow(), buckets in parallel; "
                   "timed from the call to the Arrow table",
        "kafka": "confluent-kafka consumer from offset 0 (partitions assigned), every value decoded with "
                 "fastavro (the writer schema, as AvroDeserializer), the two fields used; timed from assign "
                 "to the last record. 'Kafka side fastavro projected': the same with fastavro resolving to a "
                 "reader schema of the two fields (the fastest Avro decoding measured for a Python user: 2.1x "
                 "the full decode; fastavro.reader over a container block is no faster, polars' reader "
                 "cannot read maps). 'all 20 columns': Fluvial scans every user column, Kafka as in the "
                 "first case",
        "partitions": scale.partitions,
    }


WORKLOAD = Workload(
    name="projection-scan",
    description="Reading 2 of 20 columns of every row: Fluvial's native client projecting on a typed "
                "table, against a confluent-kafka consumer reading and Avro-decoding every record of "
                "the same data on Apache Kafka (what a Kafka application must do to get two fields), "
                "once with a full fastavro decode and once with fastavro resolving to a two-field reader "
                "schema (the fastest decoder measured); and all 20 columns on Fluvial against the full decode.",
    metrics=(RECORDS_PER_S,),
    cases=cases,
    prepare=prepare,
    settings=settings,
)
