"""produce-raw: acks=all produce throughput of raw 100 B and 1 KB values, librdkafka and Java producers."""

from __future__ import annotations

from benchmarks import clients
from benchmarks.brokers import RunningBroker
from benchmarks.workloads import MB_PER_S, RECORDS_PER_S, Case, Scale, Workload, delete_topic_settled

VALUE_SIZES = (100, 1000)


def record_count(size: int, scale: Scale) -> int:
    # Long enough that a run lasts seconds on both systems: with 500,000 / 200,000 records a
    # librdkafka run took about half a second, and a client's start-up and a scheduling hiccup
    # of the shared machine moved single rounds by a factor of two.
    if size <= 100:
        return scale.pick(full=2_000_000, quick=20_000)
    return scale.pick(full=500_000, quick=5_000)


def _case(client: str, size: int, scale: Scale) -> Case:
    count = record_count(size, scale)
    produce = clients.produce_confluent if client == "confluent-kafka" else clients.produce_java

    def run(broker: RunningBroker, _prepared: object) -> dict[str, float]:
        # A fresh topic per run: every run writes to an empty log, on both systems.
        topic = clients.unique_name(f"produce-raw-{size}")
        clients.create_topic(broker.bootstrap, topic, scale.partitions, scale.admin_timeout_s)
        try:
            return produce(broker.bootstrap, topic, count, size, scale.timeout_s).figures()
        finally:
            delete_topic_settled(broker, topic)

    return Case(f"{client}, {size} B", run)


def cases(scale: Scale) -> list[Case]:
    return [_case(client, size, scale) for client in ("confluent-kafka", "java")
            for size in scale.value_sizes(client, VALUE_SIZES)]


def settings(scale: Scale) -> dict[str, object]:
    return {
        "records": {f"{size} B": record_count(size, scale) for size in VALUE_SIZES},
        "partitions": scale.partitions,
        "producer": clients.PRODUCER.__dict__,
        "java_tool": "org.apache.kafka.tools.ProducerPerformance --throughput -1",
    }


WORKLOAD = Workload(
    name="produce-raw",
    description="Produce throughput, acks=all, no compression, raw values of 100 B and 1 KB into a "
                "fresh topic, with confluent-kafka (librdkafka) and Apache Kafka's Java producer "
                "(ProducerPerformance); timed from the first send to the last acknowledgement.",
    metrics=(RECORDS_PER_S, MB_PER_S),
    cases=cases,
    settings=settings,
)
