"""A primary-key table's Kafka views over tiered offsets: once the early segments of the
table's log are remote-only, a Kafka consumer of `<table>.changelog` and of the upsert topic
reads from offset 0 exactly what it read before tiering, each change once, with its change
type; ListOffsets earliest on either is the remote log start."""
from __future__ import annotations

import json
import random
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.integration.test_remote_log import FAST, action, store_args, wait_tiered  # noqa: F401 (fixture)

SCHEMA = {"type": "record", "name": "Account", "fields": [
    {"name": "id", "type": "long"}, {"name": "owner", "type": "string"}, {"name": "balance", "type": "long"}]}


def create_pk_table(broker, name: str) -> None:
    # Remote storage off at first: the reads before tiering are captured while all is local.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    cfg = {"fluvial.value.format": "avro", "fluvial.value.schema": json.dumps(SCHEMA),
           "fluvial.primary.key": "id", "segment.bytes": "16384"}
    admin.create_topics([NewTopic(name, 1, 1, config=cfg)])[name].result(10)


def enable_tiering(broker, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("remote.storage.enable", "true", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("local.retention.ms", "0", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(10)


def write_workload(broker, name: str, n: int, seed: int = 7) -> list[tuple[str, int, int | None]]:
    """Upserts and deletes over a few hundred keys; returns the changes the table must log
    for them, in order: (change type, id, balance)."""
    sr = SchemaRegistryClient({"url": broker.http_url})
    latest = {"auto.register.schemas": False, "use.latest.version": True}
    key_ser = AvroSerializer(sr, None, conf=latest)
    value_ser = AvroSerializer(sr, json.dumps(SCHEMA), conf=latest)
    kctx, vctx = SerializationContext(name, MessageField.KEY), SerializationContext(name, MessageField.VALUE)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2, "acks": "all", "batch.size": 4096,
                  "enable.idempotence": True})
    rng = random.Random(seed)
    present: dict[int, int] = {}
    changes: list[tuple[str, int, int | None]] = []
    for i in range(n):
        k = rng.randrange(300)
        key = key_ser({"id": k}, kctx)
        if rng.random() < 0.15:
            p.produce(name, key=key, value=None, partition=0)
            if k in present:
                changes.append(("-D", k, present.pop(k)))
        else:
            row = {"id": k, "owner": f"owner-{k}-" + "x" * (i % 40), "balance": i}
            p.produce(name, key=key, value=value_ser(row, vctx), partition=0)
            if k in present:
                changes += [("-U", k, present[k]), ("+U", k, i)]
            else:
                changes.append(("+I", k, i))
            present[k] = i
        p.poll(0)
    assert p.flush(30) == 0
    return changes


def read_from_zero(broker, topic: str, last_offset: int) -> list[tuple]:
    """Every record of partition 0 from offset 0 up to ``last_offset`` (inclusive)."""
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False,
                  "max.partition.fetch.bytes": 16384})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple] = []
    deadline = time.monotonic() + 60
    while (not got or got[-1][0] < last_offset) and time.monotonic() < deadline:
        for m in c.consume(500, timeout=0.5):
            assert m.error() is None, m.error()
            got.append((m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]))
    c.close()
    return got


def decoded(broker, topic: str, records: list[tuple]) -> list[tuple[str, int, int | None]]:
    de = AvroDeserializer(SchemaRegistryClient({"url": broker.http_url}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    key_de = AvroDeserializer(SchemaRegistryClient({"url": broker.http_url}))
    kctx = SerializationContext(topic, MessageField.KEY)
    out = []
    for _, key, value, headers, _ in records:
        change = dict(headers)["fluvial.change"].decode()
        out.append((change, key_de(key, kctx)["id"], None if value is None else de(value, ctx)["balance"]))
    return out


def test_changelog_and_upsert_topic_read_tiered_offsets(fresh_broker, store_args, topic_name):
    broker = fresh_broker(*store_args, *FAST)
    create_pk_table(broker, topic_name)
    changes = write_workload(broker, topic_name, 2500)
    view = f"{topic_name}.changelog"
    end = action(broker, "status", {"name": topic_name})["buckets"][0]["high_watermark"]
    assert end == len(changes)

    # Before tiering: everything local.
    changelog_before = read_from_zero(broker, view, end - 1)
    upserts_before = read_from_zero(broker, topic_name, end - 1)
    assert [r[0] for r in changelog_before] == list(range(end))  # each change once, in order
    got = decoded(broker, topic_name, changelog_before)
    # -D carries the deleted row in the changelog, a tombstone (no value) in the upsert stream.
    assert got == changes
    assert decoded(broker, topic_name, upserts_before) == [
        (c, k, None if c == "-D" else b) for c, k, b in changes if c != "-U"]

    enable_tiering(broker, topic_name)
    status = wait_tiered(broker, topic_name, local_start_above=end // 3)
    assert status["remote"]["start_offset"] == 0 and status["local"]["start_offset"] > 0
    assert status["remote"]["end_offset"] >= status["local"]["start_offset"]
    # The view shows its table's storage: the same remote log, not one of its own.
    view_status = action(broker, "status", {"name": view})["buckets"][0]
    # (Tiering goes on meanwhile: the view's figures are at least the earlier ones.)
    assert view_status["remote"]["start_offset"] == 0 and view_status["log_start_offset"] == 0
    assert view_status["remote"]["segments"] >= status["remote"]["segments"]
    assert view_status["local"]["start_offset"] >= status["local"]["start_offset"]

    # After: the early offsets come from the object store, and the reads are unchanged.
    assert read_from_zero(broker, view, end - 1) == changelog_before
    assert read_from_zero(broker, topic_name, end - 1) == upserts_before

    # ListOffsets earliest is the remote log start on both topics; latest the high watermark.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lo"})
    for topic in (view, topic_name):
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, end)
    # A timestamp lookup lands in remote data for the view as for the table.
    ts = changelog_before[5][4]
    for topic in (view, topic_name):
        [found] = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)
        assert found.offset <= 5 and found.offset < status["local"]["start_offset"]
    c.close()

    # The view is read-only: DeleteRecords on it is refused, and neither the remote nor the
    # local log of the table moves.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    [future] = admin.delete_records([TopicPartition(view, 0, end // 2)]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(10)
    assert refused.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
    after = action(broker, "status", {"name": topic_name})["buckets"][0]
    assert after["log_start_offset"] == 0 and after["remote"]["start_offset"] == 0

    # After kill -9 and a restart, the view (read first this time) still finds the remote log.
    broker.kill9()
    broker.start()
    assert read_from_zero(broker, view, end - 1) == changelog_before
    assert read_from_zero(broker, topic_name, end - 1) == upserts_before
