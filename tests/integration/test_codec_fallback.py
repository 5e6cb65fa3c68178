"""Without the compiled record codec the broker still works, and says so once, loudly."""
from __future__ import annotations

import os
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

WITHOUT_CODEC = Path(__file__).resolve().parents[1] / "support" / "without_codec"
WARNING = "the compiled record codec (fluvial.protocol._records) is not loaded"


def test_broker_without_compiled_codec_warns_once_and_serves(fresh_broker, monkeypatch, topic_name):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(WITHOUT_CODEC), os.environ.get("PYTHONPATH")])))
    broker = fresh_broker()
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce(topic_name, f"v{i}".encode())
    assert producer.flush(20) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    values = []
    for _ in range(40):
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            values.append(msg.value())
        if len(values) == 10:
            break
    consumer.close()
    assert values == [f"v{i}".encode() for i in range(10)]
    log = broker.log_path.read_text()
    assert log.count(WARNING) == 1, log[-2000:]
    assert "WARNING" in log.split(WARNING)[0].splitlines()[-1]


def test_broker_with_compiled_codec_does_not_warn(broker):
    from fluvial.protocol import records

    if not records.HAS_NATIVE:
        import pytest
        pytest.skip("the compiled codec is not built here")
    assert WARNING not in broker.log_path.read_text()
