"""A refused CreateTopics leaves nothing behind: no table, no registered schema, no files;
a restart does not bring it back, and a producer may then auto-create the name."""
from __future__ import annotations

import json
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

AVRO = json.dumps({"type": "record", "name": "r", "fields": [{"name": "a", "type": "long"}]})


def subjects(broker) -> list[str]:
    with urllib.request.urlopen(f"{broker.http_url}/subjects?deleted=true", timeout=10) as r:
        return json.load(r)


def topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def test_refused_creation_leaves_nothing_and_the_name_stays_usable(fresh_broker):
    broker = fresh_broker()
    name = "half"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    configs = {"fluvial.value.format": "json", "fluvial.value.schema": AVRO, "retention.ms": "60000"}
    future = admin.create_topics([NewTopic(name, 3, 1, config=configs)])[name]
    with pytest.raises(KafkaException) as refused:
        future.result(15)
    assert refused.value.args[0].name() == "INVALID_CONFIG"
    assert name not in topics(broker.bootstrap)
    # The schema registered on the way was taken back: it must not type a later table.
    assert f"{name}-value" not in subjects(broker)
    assert not list((broker.data_dir / "log").glob(f"{name}-*"))

    # A refusal after the value schema was registered (the primary-key check comes after
    # the registry's): the registration is taken back.
    pk_configs = {"fluvial.value.format": "avro", "fluvial.value.schema": AVRO, "fluvial.primary.key": "nope"}
    future = admin.create_topics([NewTopic(name, 1, 1, config=pk_configs)])[name]
    with pytest.raises(KafkaException):
        future.result(15)
    assert f"{name}-value" not in subjects(broker)
    assert name not in topics(broker.bootstrap)

    broker.restart()
    assert name not in topics(broker.bootstrap)

    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 15000})
    delivered = []
    for i in range(5):
        producer.produce(name, f"raw-{i}".encode(), on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(20) == 0
    assert delivered == [None] * 5
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition(name, 0, 0)])
    values = []
    for _ in range(40):
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            values.append(msg.value())
        if len(values) == 5:
            break
    consumer.close()
    assert values == [f"raw-{i}".encode() for i in range(5)]
    # Exactly one table of that name, also after a restart.
    broker.restart()
    assert name in topics(broker.bootstrap)
