"""Topic administration round trips with kafka-python's KafkaAdminClient and confluent-kafka's AdminClient."""
from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions,
                                   NewTopic)
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.admin import NewTopic as KNewTopic


def produce(bootstrap: str, topic: str, partitions: int, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=i % partitions)
    assert p.flush(20) == 0


def watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        c.close()


def test_confluent_admin_configs_partitions_delete_records(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 2, 1, config={"retention.ms": "3600000"})])[topic_name].result(10)
    configs = admin.describe_configs([ConfigResource("topic", topic_name)])
    entries = list(configs.values())[0].result(10)
    assert entries["retention.ms"].value == "3600000"
    assert not entries["retention.ms"].is_default
    assert entries["segment.bytes"].is_default and entries["segment.bytes"].value == str(1024 ** 3)

    res = ConfigResource("topic", topic_name, incremental_configs=[
        ConfigEntry("retention.bytes", "1000000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([res])[res].result(10)
    entries = list(admin.describe_configs([ConfigResource("topic", topic_name)]).values())[0].result(10)
    assert entries["retention.bytes"].value == "1000000"
    assert entries["retention.ms"].is_default

    bad = ConfigResource("topic", topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)])
    try:
        admin.incremental_alter_configs([bad])[bad].result(10)
        raise AssertionError("an invalid config value was accepted")
    except Exception as exc:  # noqa: BLE001 - the client wraps the broker's INVALID_CONFIG
        assert "INVALID_CONFIG" in str(exc) or "not a number" in str(exc)

    admin.create_partitions([NewPartitions(topic_name, 4)])[topic_name].result(10)
    assert len(admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions) == 4

    produce(broker.bootstrap, topic_name, 4, 400)
    deleted = admin.delete_records([TopicPartition(topic_name, 1, 60)])
    low = list(deleted.values())[0].result(10)
    assert low.low_watermark == 60
    assert watermarks(broker.bootstrap, topic_name, 1) == (60, 100)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "after-delete", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic_name, 1, 0)])  # below the log start: reset to earliest
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 40 and time.monotonic() < deadline:
        got.extend(m for m in c.consume(40, timeout=1) if m.error() is None)
    c.close()
    assert got[0].offset() == 60


def test_kafka_python_admin_configs_and_log_dirs(broker, topic_name):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([KNewTopic(topic_name, 3, 1)])
    admin.alter_configs([KConfigResource(ConfigResourceType.TOPIC, topic_name, configs={"segment.ms": "60000"})])
    described = admin.describe_configs([KConfigResource(ConfigResourceType.TOPIC, topic_name)], config_filter="all")
    cfg = described["topic"][topic_name]
    assert cfg["segment.ms"]["value"] == "60000" and cfg["segment.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert cfg["retention.ms"]["config_source"] == "DEFAULT_CONFIG"
    produce(broker.bootstrap, topic_name, 3, 300)
    dirs = admin.describe_log_dirs()
    text = repr(dirs)
    assert topic_name in text
    admin.close()
