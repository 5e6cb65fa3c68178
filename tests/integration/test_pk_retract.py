"""The `retract` merge engine against a real broker: the seed's join example in its three
arrival orders through confluent-kafka producers (change types in the `fluvial.change`
header), with the exact changelog each emits; a `last_row` table given the same records
ends with the seed's wrong result; a property test over random joins split across
writers, through Kafka and through the table API; refusals of invalid change types."""
from __future__ import annotations

import itertools
import json
import random
import time

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.client import connect
from fluvial.errors import InvalidRecordError
from tests.support.changelog_join import (T1, T1_AVRO, T1_CONFIGS, interleave, materialized, sequential_join,
                                          split_by_level, upsert_table)

_names = itertools.count()
LABEL = {1: "+I", 2: "-U", 3: "+U", 4: "-D"}

# The seed's join output: +I(1,10,a1) and -U(1,10,a1) from the task of level 10, +U(1,20,b1)
# from the task of level 20.
I_A1, U_A1, U_B1 = ("+I", 1, 10, "a1"), ("-U", 1, 10, "a1"), ("+U", 1, 20, "b1")
SEED_ORDERINGS = {
    # (1) as in sequential processing
    "1-in-order": ([I_A1, U_A1, U_B1], [("+I", 1, 10, "a1"), ("-D", 1, 10, "a1"), ("+I", 1, 20, "b1")]),
    # (2) +U(b1) first: removing the last row (a1) brings b1 back
    "2-after-first": ([U_B1, I_A1, U_A1], [("+I", 1, 20, "b1"), ("-U", 1, 20, "b1"), ("+U", 1, 10, "a1"),
                                            ("-U", 1, 10, "a1"), ("+U", 1, 20, "b1")]),
    # (3) -U(a1) last: it removes an earlier row, nothing is emitted
    "3-before-last": ([I_A1, U_B1, U_A1], [("+I", 1, 10, "a1"), ("-U", 1, 10, "a1"), ("+U", 1, 20, "b1")]),
}


def create_topic(broker, name: str, partitions: int = 1, **configs) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config={**T1_CONFIGS, **configs})])[name].result(10)


class ChangelogWriter:
    """One parallel task of the join: a confluent-kafka producer writing change-typed rows."""

    def __init__(self, broker, topic: str):
        sr = SchemaRegistryClient({"url": broker.http_url})
        latest = {"auto.register.schemas": False, "use.latest.version": True}
        self.key_ser = AvroSerializer(sr, None, conf=latest)
        self.value_ser = AvroSerializer(sr, json.dumps(T1_AVRO), conf=latest)
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random",
                                  "linger.ms": 5, "acks": "all", "enable.idempotence": True})
        self.errors: list = []

    def send(self, change: tuple, header: bool = True) -> None:
        kind, i, level, attr = change
        key = self.key_ser({"id": i}, SerializationContext(self.topic, MessageField.KEY))
        value = self.value_ser({"id": i, "level": level, "attr": attr},
                               SerializationContext(self.topic, MessageField.VALUE))
        headers = [("fluvial.change", kind.encode())] if header else None
        self.producer.produce(self.topic, key=key, value=value, headers=headers,
                              on_delivery=lambda e, m: self.errors.append(e) if e else None)

    def flush(self) -> None:
        assert self.producer.flush(15) == 0
        assert self.errors == [], self.errors


def read_changelog(broker, topic: str, partitions: int = 1, timeout: float = 20) -> list[tuple]:
    """The whole `<topic>.changelog` through a Kafka consumer, up to its end offsets."""
    sr = SchemaRegistryClient({"url": broker.http_url})
    des = AvroDeserializer(sr)
    name = f"{topic}.changelog"
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{name}", "enable.auto.commit": False})
    ends = {p: c.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1] for p in range(partitions)}
    c.assign([TopicPartition(name, p, 0) for p in range(partitions)])
    got, pos = [], {p: 0 for p in range(partitions)}
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    # librdkafka reports the position of the last record delivered: a write that changed
    # nothing visible (an empty batch at the log's end) never moves it, so the read ends
    # at the end offsets or after a quiet second and a half.
    while any(pos[p] < ends[p] for p in pos) and time.monotonic() < deadline \
            and time.monotonic() - quiet_since < 1.5:
        for m in c.consume(500, timeout=0.3):
            if m.error() is not None:
                continue
            quiet_since = time.monotonic()
            pos[m.partition()] = m.offset() + 1
            row = des(m.value(), SerializationContext(name, MessageField.VALUE))
            got.append((m.partition(), m.offset(), dict(m.headers())["fluvial.change"].decode(), row["id"],
                        row["level"], row["attr"]))
    c.close()
    return [g[2:] for g in sorted(got)]


def replay(changes: list[tuple]) -> dict[int, tuple]:
    """A downstream consumer applying the emitted changelog; each -U/-D must match the row it takes back."""
    out: dict[int, tuple] = {}
    for kind, i, level, attr in changes:
        if kind in ("+I", "+U"):
            assert kind == "+U" or i not in out, (kind, i, out)
            out[i] = (i, level, attr)
        else:
            assert out.pop(i) == (i, level, attr)
    return out


def lookup_all(client, name: str, ids) -> dict[int, tuple]:
    rows = client.table(name).lookup(pa.table({"id": pa.array(sorted(ids), pa.int64())})).to_pylist()
    return {r["id"]: (r["id"], r["level"], r["attr"]) for r in rows}


@pytest.mark.parametrize("ordering", list(SEED_ORDERINGS))
def test_seed_join_orderings_emit_the_exact_changelog(broker, ordering):
    arrivals, expected = SEED_ORDERINGS[ordering]
    name = f"t1-retract-{ordering}-{next(_names)}"
    create_topic(broker, name, **{"fluvial.merge.engine": "retract"})
    tasks = {10: ChangelogWriter(broker, name), 20: ChangelogWriter(broker, name)}  # shuffled by level
    for change in arrivals:
        tasks[change[2]].send(change)
        tasks[change[2]].flush()
    assert read_changelog(broker, name) == expected
    with connect(broker.flight_url) as client:
        assert lookup_all(client, name, [1]) == {1: (1, 20, "b1")}
        scanned = client.table(name).scan(columns=["_change", "id", "level", "attr"]).to_arrow().to_pylist()
        assert [(LABEL[r["_change"]], r["id"], r["level"], r["attr"]) for r in scanned] == expected
        stats = client.table(name).kv_stats()
        assert stats["retract"]["keys"] == 1 and stats["retract"]["rows"] == 1

    # The same records on a last-write-wins table: orderings 2 and 3 lose the row.
    plain = f"t1-last-row-{ordering}-{next(_names)}"
    create_topic(broker, plain)
    w = ChangelogWriter(broker, plain)
    for change in arrivals:
        w.send(change)
        w.flush()
    with connect(broker.flight_url) as client:
        got = lookup_all(client, plain, [1])
    assert got == upsert_table(arrivals)
    if ordering == "1-in-order":
        assert got == {1: (1, 20, "b1")}
    else:
        assert got == {}  # the seed's wrong result: the row that should exist is deleted


def test_records_without_the_header_are_adds_and_tombstones_delete_the_key(broker):
    name = f"t1-retract-plain-{next(_names)}"
    create_topic(broker, name, **{"fluvial.merge.engine": "retract"})
    w = ChangelogWriter(broker, name)
    w.send(("+I", 1, 10, "a1"), header=False)
    w.send(("+I", 1, 20, "b1"), header=False)
    w.flush()
    key = w.key_ser({"id": 1}, SerializationContext(name, MessageField.KEY))
    w.producer.produce(name, key=key, value=None)
    w.flush()
    assert read_changelog(broker, name) == [("+I", 1, 10, "a1"), ("-U", 1, 10, "a1"), ("+U", 1, 20, "b1"),
                                            ("-D", 1, 20, "b1")]
    with connect(broker.flight_url) as client:
        assert lookup_all(client, name, [1]) == {}
        assert client.table(name).kv_stats()["retract"]["rows"] == 0


def test_invalid_change_types_refuse_the_whole_batch(broker):
    name = f"t1-retract-bad-{next(_names)}"
    create_topic(broker, name, **{"fluvial.merge.engine": "retract"})
    w = ChangelogWriter(broker, name)
    # kafka-python's producer puts both records in one batch (librdkafka may send the first
    # alone, whatever its linger): one valid record, one with an invalid change type.
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError as KafkaInvalidRecord, KafkaError
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", retries=0, linger_ms=60_000,
                             batch_size=1 << 20)
    futures = []
    for kind, i in (("+I", 1), ("+X", 2)):
        key = w.key_ser({"id": i}, SerializationContext(name, MessageField.KEY))
        value = w.value_ser({"id": i, "level": 10, "attr": "x"}, SerializationContext(name, MessageField.VALUE))
        futures.append(producer.send(name, key=key, value=value, headers=[("fluvial.change", kind.encode())]))
    producer.flush(15)
    # KIP-467: the record named in the answer fails as invalid, the rest of its batch fails too.
    with pytest.raises(KafkaError, match="part of a batch which had one more more invalid records"):
        futures[0].get(timeout=15)
    with pytest.raises(KafkaInvalidRecord, match="invalid change type"):
        futures[1].get(timeout=15)
    producer.close()
    with connect(broker.flight_url) as client:
        t = client.table(name)
        assert lookup_all(client, name, [1, 2]) == {}  # nothing of the batch was applied
        with pytest.raises(InvalidRecordError, match="invalid change type .X."):
            t.upsert(pa.table({"_change": ["+I", "X"], "id": [1, 2], "level": [1, 2], "attr": ["a", "b"]}))
        assert lookup_all(client, name, [1, 2]) == {}
        t.upsert(pa.table({"_change": ["+I"], "id": [1], "level": [1], "attr": ["a"]}))
        assert lookup_all(client, name, [1]) == {1: (1, 1, "a")}  # the broker keeps serving


# -- property: random joins, split across writers, any interleaving ------------------------

# s2 starts with every level joined (so that most s1 changes produce join rows); then s1
# rows move between levels (mostly) and s2 rows change or go (sometimes).
join_steps = st.lists(
    st.one_of(st.tuples(st.just("s1"), st.integers(1, 4), st.one_of(st.none(), st.integers(0, 4))),
              st.tuples(st.just("s1"), st.integers(1, 4), st.integers(0, 4)),
              st.tuples(st.just("s1"), st.integers(1, 4), st.integers(0, 4)),
              st.tuples(st.just("s2"), st.integers(0, 4), st.one_of(st.none(), st.integers(0, 3)))),
    min_size=4, max_size=30)


def _scenario(steps, writers, seed):
    changes = sequential_join([("s2", level, level) for level in range(5)] + list(steps))
    arrivals = [c for _, c in interleave(split_by_level(changes, writers), random.Random(seed))]
    return changes, arrivals


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=join_steps, writers=st.integers(2, 8), seed=st.integers(0, 2 ** 32 - 1))
def test_reordered_join_changelog_through_kafka_equals_the_sequential_result(broker, steps, writers, seed):
    changes, arrivals = _scenario(steps, writers, seed)
    expected = upsert_table(changes)
    name = f"t1-prop-kafka-{next(_names)}"
    create_topic(broker, name, partitions=2, **{"fluvial.merge.engine": "retract"})
    tasks = [ChangelogWriter(broker, name) for _ in range(writers)]
    order = interleave(split_by_level(changes, writers), random.Random(seed))
    assert [c for _, c in order] == arrivals
    # Consecutive records of one task go in one flush: a task's records stay in order.
    for w, group in itertools.groupby(order, key=lambda x: x[0]):
        for _, c in group:
            tasks[w].send(c)
        tasks[w].flush()
    with connect(broker.flight_url) as client:
        assert lookup_all(client, name, range(1, 5)) == expected
        full = client.table(name).full_read().rows.to_pylist()
        assert {r["id"]: (r["id"], r["level"], r["attr"]) for r in full} == expected
    emitted = read_changelog(broker, name, partitions=2)
    assert replay(emitted) == expected
    assert sorted(emitted) == sorted(materialized(arrivals)[1])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=join_steps, writers=st.integers(2, 8), seed=st.integers(0, 2 ** 32 - 1))
def test_reordered_join_changelog_through_the_table_api_equals_the_sequential_result(broker, steps, writers, seed):
    changes, arrivals = _scenario(steps, writers, seed)
    expected = upsert_table(changes)
    order = interleave(split_by_level(changes, writers), random.Random(seed))
    assert [c for _, c in order] == arrivals
    with connect(broker.flight_url) as client:
        t = client.create_table(f"t1-prop-api-{next(_names)}", T1, buckets=3, primary_key=["id"],
                                merge_engine="retract")
        plain = client.create_table(f"t1-prop-api-lr-{next(_names)}", T1, buckets=3, primary_key=["id"])
        for _, group in itertools.groupby(order, key=lambda x: x[0]):
            rows = [{"_change": c[0], "id": c[1], "level": c[2], "attr": c[3]} for _, c in group]
            t.upsert(rows)
            plain.upsert(rows)
        assert lookup_all(client, t.name, range(1, 5)) == expected
        log = t.scan(columns=["_bucket", "_offset", "_change", "id", "level", "attr"]).to_arrow().to_pylist()
        emitted = [(LABEL[r["_change"]], r["id"], r["level"], r["attr"])
                   for r in sorted(log, key=lambda r: (r["_bucket"], r["_offset"]))]
        assert replay(emitted) == expected
        # A last-write-wins table gets what applying the arrivals in order gives.
        assert lookup_all(client, plain.name, range(1, 5)) == upsert_table(arrivals)


def test_aggregation_table_through_kafka_sums_and_refuses_what_cannot_retract(broker):
    name = f"t1-agg-{next(_names)}"
    create_topic(broker, name, **{"fluvial.merge.engine": "aggregation", "fluvial.agg.level": "sum",
                                  "fluvial.agg.attr": "listagg"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    from confluent_kafka.admin import ConfigResource
    described = admin.describe_configs([ConfigResource("topic", name)])
    configs = list(described.values())[0].result(10)
    assert configs["fluvial.agg.level"].value == "sum"
    w = ChangelogWriter(broker, name)
    for change in [("+I", 1, 10, "a"), ("+I", 1, 5, "b"), ("+I", 2, 1, "c")]:
        w.send(change, header=False)
    w.flush()
    # listagg cannot take a value back: a -U record fails its batch, nothing applied.
    w.producer = Producer({"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random", "retries": 0})
    w.send(("-U", 1, 10, "a"))
    w.producer.flush(15)
    assert [e.name() for e in w.errors] == ["INVALID_RECORD"]
    with connect(broker.flight_url) as client:
        assert lookup_all(client, name, [1, 2]) == {1: (1, 15, "a,b"), 2: (2, 1, "c")}
    # How many changes a key emits depends on how the producer batched its records (one
    # per key per batch); replayed, the changelog always ends with the table's rows.
    assert replay(read_changelog(broker, name)) == {1: (1, 15, "a,b"), 2: (2, 1, "c")}
