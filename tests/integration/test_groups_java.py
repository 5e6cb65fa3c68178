"""Apache Kafka's Java consumer in a group: reads to the end, commits, resumes."""
from __future__ import annotations

import subprocess
import threading

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.java


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for v in values:
        p.produce(topic, key=v.encode(), value=v.encode())
    assert p.flush(30) == 0


def console_consumer(java_tools, bootstrap: str, topic: str, group: str, count: int) -> subprocess.Popen:
    cmd = java_tools.java_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap,
                               "--topic", topic, "--group", group, "--max-messages", str(count),
                               "--timeout-ms", "40000", "--consumer-property", "auto.offset.reset=earliest",
                               "--consumer-property", "session.timeout.ms=10000")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def committed(bootstrap: str, group: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(15)
    return {tp.partition: tp.offset for tp in res.topic_partitions}


def test_java_console_consumers_share_a_group_and_commit(broker, java_tools, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 4, 1)])[topic_name].result(15)
    group = f"java-{topic_name}"
    values = [f"j-{i}" for i in range(2000)]
    produce(broker.bootstrap, topic_name, values)
    # Two Java consumers in one group split the topic between them and read it to the end.
    procs = [console_consumer(java_tools, broker.bootstrap, topic_name, group, 2000) for _ in range(2)]
    outputs: list[bytes] = [b"", b""]

    def drain(i: int) -> None:
        outputs[i] = procs[i].communicate(timeout=120)[0]

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(130)
    lines = [line for out in outputs for line in out.decode().splitlines() if line.startswith("j-")]
    assert sorted(lines) == sorted(values)
    assert all(out.strip() for out in outputs), "both members got a share of the partitions"
    assert sum(committed(broker.bootstrap, group).values()) == 2000

    # The group resumes where it committed: a later member sees only new records.
    later = [f"k-{i}" for i in range(50)]
    produce(broker.bootstrap, topic_name, later)
    out, err = console_consumer(java_tools, broker.bootstrap, topic_name, group, 50).communicate(timeout=120)
    assert sorted(line for line in out.decode().splitlines() if line[:2] in ("j-", "k-")) == sorted(later), \
        err.decode()[-2000:]
    assert sum(committed(broker.bootstrap, group).values()) == 2050
