"""Apache Kafka's own Java clients and tools against Fluvial."""
from __future__ import annotations

import subprocess

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

pytestmark = pytest.mark.java


def run(cmd: list[str], timeout: float = 120, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, timeout=timeout, input=input)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_java_producer_performance(broker, java_tools, topic_name, codec):
    n = 20000
    cmd = java_tools.java_tool("org.apache.kafka.tools.ProducerPerformance", "--topic", topic_name,
                               "--num-records", str(n), "--record-size", "100", "--throughput", "-1",
                               "--producer-props", f"bootstrap.servers={broker.bootstrap}", "acks=all",
                               f"compression.type={codec}", "linger.ms=5")
    res = run(cmd)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    assert f"{n} records sent" in res.stdout.decode()
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check"})
    lo, hi = c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)
    c.close()
    assert (lo, hi) == (0, n)


def test_java_console_consumer_reads_what_python_produced(broker, java_tools, topic_name):
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "lz4"})
    values = [f"line-{i}" for i in range(200)]
    for v in values:
        p.produce(topic_name, key=v[::-1].encode(), value=v.encode(), partition=0)
    assert p.flush(20) == 0
    cmd = java_tools.java_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                               broker.bootstrap, "--topic", topic_name, "--partition", "0", "--offset", "earliest",
                               "--max-messages", str(len(values)), "--timeout-ms", "30000",
                               "--property", "print.key=true", "--property", "key.separator=|")
    res = run(cmd)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    lines = [line for line in res.stdout.decode().splitlines() if "|" in line]
    assert lines == [f"{v[::-1]}|{v}" for v in values]


def test_java_console_producer_then_python_reads(broker, java_tools, topic_name):
    lines = "".join(f"k{i}:value {i}\n" for i in range(100)).encode()
    cmd = java_tools.java_tool("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", broker.bootstrap,
                               "--topic", topic_name, "--property", "parse.key=true", "--property", "key.separator=:",
                               "--producer-property", "acks=all")
    res = run(cmd, input=lines)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "py", "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, 0, 0)])
    got = []
    while len(got) < 100:
        msgs = c.consume(100, timeout=5)
        assert msgs, "timed out"
        got.extend(m for m in msgs if m.error() is None)
    c.close()
    assert [(m.key(), m.value()) for m in got] == [(f"k{i}".encode(), f"value {i}".encode()) for i in range(100)]
