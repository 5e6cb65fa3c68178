"""KIP-848 consumer groups with Apache Kafka's Java consumer (`group.protocol=consumer`): two
console consumers share a topic, one is killed with SIGKILL and the other takes its
partitions over; every record is read; offsets survive a broker restart."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from fluvial.protocol.messages import ApiKey
from tests.integration.test_groups_confluent import wait_for
from tests.support.kafka_wire import WireClient

pytestmark = pytest.mark.java


class JavaMember:
    """A console consumer whose output lines are collected as they come."""

    def __init__(self, java_tools, bootstrap: str, topic: str, group: str, assignor: str = "uniform"):
        cmd = java_tools.java_tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap,
            "--topic", topic, "--group", group, "--timeout-ms", "60000",
            "--consumer-property", "group.protocol=consumer",
            "--consumer-property", f"group.remote.assignor={assignor}",
            "--consumer-property", "auto.offset.reset=earliest",
            "--consumer-property", "auto.commit.interval.ms=200")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self.err = b""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.decode().strip())

    def stop(self) -> None:
        self.proc.terminate()  # the console consumer closes the consumer: it leaves the group
        self.proc.wait(30)

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, v in enumerate(values):
        p.produce(topic, value=v.encode(), partition=i % 4)
    assert p.flush(30) == 0


def describe(bootstrap: str, group: str):
    with WireClient(bootstrap) as c:
        return c.request(ApiKey.CONSUMER_GROUP_DESCRIBE, 1,
                         dict(group_ids=[group], include_authorized_operations=False)).groups[0]


def committed(bootstrap: str, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(15)
    return sum(tp.offset for tp in res.topic_partitions if tp.offset >= 0)


def test_java_consumers_share_die_and_resume(fresh_broker, java_tools, topic_name):
    broker = fresh_broker("--group-consumer-session-timeout-ms", "6000",
                          "--group-consumer-heartbeat-interval-ms", "500")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 4, 1)])[topic_name].result(15)
    group = f"java848-{topic_name}"
    first = [f"a-{i}" for i in range(400)]
    produce(broker.bootstrap, topic_name, first)
    one, two = JavaMember(java_tools, broker.bootstrap, topic_name, group), None
    members = [one]
    try:
        wait_for(lambda: len(one.lines) >= 400, 60, "the first Java member to read the topic")
        two = JavaMember(java_tools, broker.bootstrap, topic_name, group)
        members.append(two)

        def shared() -> bool:
            g = describe(broker.bootstrap, group)
            return (g.group_state == "Stable" and len(g.members) == 2
                    and all(m.assignment.topic_partitions for m in g.members)
                    and all(m.member_type == 1 for m in g.members))
        wait_for(shared, 60, "two Java members sharing the partitions")
        wait_for(lambda: committed(broker.bootstrap, group) == 400, 20, "the first records to be committed")
        second = [f"b-{i}" for i in range(200)]
        produce(broker.bootstrap, topic_name, second)
        wait_for(lambda: set(second) <= set(one.lines + two.lines), 30, "both members to read the new records")
        assert {v for v in second if v in one.lines} and {v for v in second if v in two.lines}, \
            "each member reads its own partitions"
        two.kill9()
        third = [f"c-{i}" for i in range(200)]
        produce(broker.bootstrap, topic_name, third)
        # After the session timeout the survivor owns every partition and reads the rest.
        wait_for(lambda: set(third) <= set(one.lines), 60, "the survivor to take over the killed member's partitions")
        g = describe(broker.bootstrap, group)
        assert len(g.members) == 1 and sorted(g.members[0].assignment.topic_partitions[0].partitions) == [0, 1, 2, 3]
        seen = one.lines + two.lines
        assert set(first) | set(second) | set(third) <= set(seen)
        assert len(set(one.lines)) == len(one.lines), "the survivor read nothing twice"
        wait_for(lambda: committed(broker.bootstrap, group) == 800, 20, "every record to be committed")
        one.stop()
        members.clear()

        broker.restart()
        assert committed(broker.bootstrap, group) == 800
        fourth = [f"d-{i}" for i in range(40)]
        produce(broker.bootstrap, topic_name, fourth)
        again = JavaMember(java_tools, broker.bootstrap, topic_name, group)
        members.append(again)
        wait_for(lambda: len(again.lines) >= 40, 60, "a member after the restart to read the new records")
        time.sleep(1)
        assert sorted(again.lines) == sorted(fourth), "committed records were read again after the restart"
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.proc.kill()
