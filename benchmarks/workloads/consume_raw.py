"""consume-raw: full reads from the start of a topic of raw 100 B and 1 KB values, librdkafka and Java consumers."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks import clients
from benchmarks.brokers import RunningBroker
from benchmarks.workloads import MB_PER_S, RECORDS_PER_S, Case, Scale, Workload
from benchmarks.workloads.produce_raw import VALUE_SIZES


def record_count(size: int, scale: Scale) -> int:
    # Kept at 500,000 / 200,000 when produce-raw grew, so the figures stay comparable with
    # earlier runs: the 100 B topic (about 55 MB) fits the broker's wire cache (64 MiB), the
    # 1 KB topic (about 205 MB) is mostly read back from its segments.
    if size <= 100:
        return scale.pick(full=500_000, quick=20_000)
    return scale.pick(full=200_000, quick=5_000)


def reads_per_round(scale: Scale) -> int:
    # A full read of these topics lasts a fraction of a second, so one read is at the mercy of a
    # single scheduling hiccup: each round reads the topic several times and keeps the median read.
    return scale.pick(full=3, quick=1)


@dataclass(frozen=True)
class PreparedTopics:
    by_size: dict[int, str]


def prepare(broker: RunningBroker, scale: Scale) -> PreparedTopics:
    """Data as produce-raw writes it (sizes, producer settings; the counts above), written once."""
    topics = {}
    for size in VALUE_SIZES:
        topic = clients.unique_name(f"consume-raw-{size}")
        clients.create_topic(broker.bootstrap, topic, scale.partitions, scale.admin_timeout_s)
        clients.produce_confluent(broker.bootstrap, topic, record_count(size, scale), size, scale.timeout_s)
        topics[size] = topic
    return PreparedTopics(topics)


def _median_read(reads: list[dict[str, float]]) -> dict[str, float]:
    """The figures of the median read by records/s (the upper middle one of an even count)."""
    return sorted(reads, key=lambda figures: figures["records/s"])[len(reads) // 2]


def _case(client: str, size: int, scale: Scale) -> Case:
    count = record_count(size, scale)

    def run(broker: RunningBroker, prepared: object) -> dict[str, float]:
        assert isinstance(prepared, PreparedTopics)
        topic = prepared.by_size[size]
        reads = []
        for _ in range(reads_per_round(scale)):
            if client == "confluent-kafka":
                result = clients.consume_confluent(broker.bootstrap, topic, count, scale.partitions, scale.timeout_s)
            else:
                result = clients.consume_java(broker.bootstrap, topic, count, scale.timeout_s)
            reads.append(result.figures())
        return _median_read(reads)

    return Case(f"{client}, {size} B", run)


def cases(scale: Scale) -> list[Case]:
    return [_case(client, size, scale) for client in ("confluent-kafka", "java")
            for size in scale.value_sizes(client, VALUE_SIZES)]


def settings(scale: Scale) -> dict[str, object]:
    return {
        "records": {f"{size} B": record_count(size, scale) for size in VALUE_SIZES},
        "partitions": scale.partitions,
        "reads_per_round": reads_per_round(scale),
        "figure": "the median of the round's reads (by records/s)",
        "consumer": "both clients' defaults (fetch.max.bytes 50 MiB, 1 MiB per partition, "
                    "fetch wait 500 ms, fetch.min.bytes 1)",
        "confluent-kafka": "partitions assigned directly from the beginning; timed from assign to the last record",
        "java_tool": "org.apache.kafka.tools.ConsumerPerformance (fresh group, subscribe); "
                     "its fetch phase: fetch.nMsg.sec, group join excluded",
    }


WORKLOAD = Workload(
    name="consume-raw",
    description="Consume throughput: the same records as produce-raw (written once per system, "
                "not timed), read in full from offset 0 by confluent-kafka (librdkafka) and "
                "Apache Kafka's Java consumer (ConsumerPerformance).",
    metrics=(RECORDS_PER_S, MB_PER_S),
    cases=cases,
    prepare=prepare,
    settings=settings,
)
