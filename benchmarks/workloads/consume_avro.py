"""consume-avro: full reads of 20-field Avro records from a typed and a raw table, values not decoded."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks import clients
from benchmarks.brokers import RunningBroker
from benchmarks.workloads import MB_PER_S, RECORDS_PER_S, Case, Scale, Workload
from benchmarks.workloads.avro_common import VALUE_SIZES, avro_values, create_avro_topic, produce_values, size_label
from benchmarks.workloads.produce_avro import KINDS, record_count


@dataclass(frozen=True)
class PreparedTopics:
    by_case: dict[tuple[str, int], tuple[str, float]]  # (kind, size) -> (topic, mean value size)


def prepare(broker: RunningBroker, scale: Scale) -> PreparedTopics:
    """The records of produce-avro, written once per system (not timed)."""
    topics = {}
    for size in VALUE_SIZES:
        data = avro_values(size, record_count(size, scale))
        for kind in KINDS:
            topic, values = create_avro_topic(broker, f"consume-avro-{kind}-{size}", kind == "typed", scale, data)
            produce_values(broker.bootstrap, topic, values, scale.timeout_s)
            topics[(kind, size)] = topic, data.mean_size
    return PreparedTopics(topics)


def _case(kind: str, size: int, scale: Scale) -> Case:
    count = record_count(size, scale)

    def run(broker: RunningBroker, prepared: object) -> dict[str, float]:
        assert isinstance(prepared, PreparedTopics)
        topic, mean_size = prepared.by_case[(kind, size)]
        result = clients.consume_confluent(broker.bootstrap, topic, count, scale.partitions, scale.timeout_s)
        rate = result.records / result.seconds
        # Avro values differ in size: MB/s from the records' mean size, not the first record's.
        return {"records/s": rate, "MB/s": rate * mean_size / 1e6}

    return Case(f"{kind} table, {size_label(size)}", run)


def cases(scale: Scale) -> list[Case]:
    return [_case(kind, size, scale) for size in VALUE_SIZES for kind in KINDS]


def settings(scale: Scale) -> dict[str, object]:
    return {
        "records": {size_label(size): record_count(size, scale) for size in VALUE_SIZES},
        "data": "as produce-avro, written once per system before the rounds",
        "consumer": "confluent-kafka with its defaults, partitions assigned directly from the beginning, "
                    "timed from the first record received to the last; values are not decoded (decoding "
                    "in the client would be the limit, the same on every system)",
        "typed table": "Fluvial re-encodes each record's Avro bytes from the stored columns "
                       "(byte-identical to what was produced)",
        "partitions": scale.partitions,
    }


WORKLOAD = Workload(
    name="consume-avro",
    description="Consume throughput of the produce-avro records (about 200 B and 1 KB), read in full "
                "from offset 0 by confluent-kafka without decoding: on Fluvial from a typed table (Avro "
                "re-encoded from the stored columns) and from a raw table of the same bytes; Apache Kafka "
                "serves the stored bytes in both cases.",
    metrics=(RECORDS_PER_S, MB_PER_S),
    cases=cases,
    prepare=prepare,
    settings=settings,
)
