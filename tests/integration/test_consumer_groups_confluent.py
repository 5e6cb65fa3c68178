"""KIP-848 consumer groups with confluent-kafka (`group.protocol=consumer`): members in their
own processes join, leave and are killed with SIGKILL while a producer runs; the coordinator
never lets two members own a partition at once, nothing is skipped, only a killed member's
last records are seen twice, and committed offsets survive a broker restart."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fluvial.protocol.messages import ApiKey
from tests.integration.test_groups_confluent import PacedProducer, wait_for
from tests.support.kafka_wire import WireClient

REPO = Path(__file__).resolve().parents[2]
BROKER_ARGS = ("--group-consumer-session-timeout-ms", "6000", "--group-consumer-heartbeat-interval-ms", "500")


def member_main() -> None:
    """A member: poll, write the record down, commit it; SIGTERM closes it (it leaves the group)."""
    from confluent_kafka import Consumer

    bootstrap, topic, group, out_path, assignor = sys.argv[1:6]
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                         "group.remote.assignor": assignor, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    with open(out_path, "a") as out:
        while not stopping:
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            out.write(f"{msg.partition()} {msg.offset()} {msg.value().decode()}\n")
            out.flush()
            try:
                consumer.commit(message=msg, asynchronous=False)
            except KafkaException:
                pass  # a reassignment under way: the record may be seen again by the next owner
    consumer.close()


class Member:
    def __init__(self, bootstrap: str, topic: str, group: str, out: Path, assignor: str):
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-c",
             "from tests.integration.test_consumer_groups_confluent import member_main; member_main()",
             bootstrap, topic, group, str(out), assignor], cwd=REPO, stderr=subprocess.DEVNULL)

    def values(self) -> list[str]:
        return [line.split(" ")[2] for line in self.out.read_text().splitlines()] if self.out.exists() else []

    def leave(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


class OwnershipWatch(threading.Thread):
    """Describes the group every 100 ms and notes any partition two members own at once."""

    def __init__(self, bootstrap: str, group: str):
        super().__init__(daemon=True)
        self.bootstrap, self.group = bootstrap, group
        self.violations: list = []
        self.snapshots = 0
        self.stop = threading.Event()

    def describe(self):
        with WireClient(self.bootstrap) as c:
            return c.request(ApiKey.CONSUMER_GROUP_DESCRIBE, 1,
                             dict(group_ids=[self.group], include_authorized_operations=False)).groups[0]

    def run(self) -> None:
        with WireClient(self.bootstrap) as c:
            while not self.stop.wait(0.1):
                try:
                    g = c.request(ApiKey.CONSUMER_GROUP_DESCRIBE, 1,
                                  dict(group_ids=[self.group], include_authorized_operations=False)).groups[0]
                except (ConnectionError, OSError):
                    return
                owners: dict[tuple[str, int], str] = {}
                for m in g.members:
                    for tp in m.assignment.topic_partitions:
                        for p in tp.partitions:
                            if (tp.topic_name, p) in owners:
                                self.violations.append((tp.topic_name, p, owners[(tp.topic_name, p)], m.member_id))
                            owners[(tp.topic_name, p)] = m.member_id
                self.snapshots += 1


def committed(admin: AdminClient, group: str) -> dict[int, int]:
    res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(15)
    return {tp.partition: tp.offset for tp in res.topic_partitions}


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-offsets-probe"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def stable_members(watch: OwnershipWatch, count: int):
    g = watch.describe()
    return (g.group_state == "Stable" and len(g.members) == count
            and all(m.assignment.topic_partitions for m in g.members))


def test_members_join_leave_die_and_resume_after_restart(fresh_broker, tmp_path, topic_name):
    broker = fresh_broker(*BROKER_ARGS)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 6, 1)])[topic_name].result(15)
    group = f"kip848-{topic_name}"
    producer = PacedProducer(broker.bootstrap, topic_name, 0, 1500, per_second=100)
    producer.start()
    watch = OwnershipWatch(broker.bootstrap, group)
    a = Member(broker.bootstrap, topic_name, group, tmp_path / "a.txt", "uniform")
    members = [a]
    try:
        wait_for(lambda: a.values(), 30, "the first member to consume")
        watch.start()
        b = Member(broker.bootstrap, topic_name, group, tmp_path / "b.txt", "uniform")
        c = Member(broker.bootstrap, topic_name, group, tmp_path / "c.txt", "uniform")
        members += [b, c]
        wait_for(lambda: stable_members(watch, 3), 40, "three members sharing the partitions")
        wait_for(lambda: b.values() and c.values(), 30, "the new members to consume")
        # The broker's metrics count the members of consumer groups like those of classic ones.
        metrics = urllib.request.urlopen(broker.http_url + "/metrics", timeout=10).read().decode()
        assert f'fluvial_consumer_group_members{{group="{group}",state="Stable"}} 3.0' in metrics
        b.kill9()  # its partitions come back after the session timeout
        wait_for(lambda: stable_members(watch, 2), 40, "the killed member to be removed")
        c.leave()  # a clean leave hands its partitions over at once
        wait_for(lambda: stable_members(watch, 1), 20, "the leaving member to be gone")
        producer.join(60)
        assert not producer.errors
        wait_for(lambda: producer.acked <= set(a.values() + b.values() + c.values()), 60,
                 "every acknowledged record to be consumed")
        watch.stop.set()
        watch.join(5)
        assert watch.snapshots > 20 and watch.violations == [], watch.violations[:5]
        # Exactly once per generation: only records the killed member had not committed are seen twice.
        seen: dict[str, int] = {}
        for v in a.values() + b.values() + c.values():
            seen[v] = seen.get(v, 0) + 1
        twice = {v for v, n in seen.items() if n > 1}
        assert twice <= set(b.values()), sorted(twice - set(b.values()))[:10]
        assert len(twice) <= 6, twice  # at most the last uncommitted record of each partition
        a.leave()
        members.clear()

        # Offsets are at the end of every partition, and stay there across a restart.
        ends = end_offsets(broker.bootstrap, topic_name, 6)
        assert committed(admin, group) == ends
        broker.restart()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        assert committed(admin, group) == ends
        later = [f"late-{i}" for i in range(60)]
        p = Producer({"bootstrap.servers": broker.bootstrap})
        for i, v in enumerate(later):
            p.produce(topic_name, value=v.encode(), partition=i % 6)
        assert p.flush(30) == 0
        d = Member(broker.bootstrap, topic_name, group, tmp_path / "d.txt", "range")
        members.append(d)
        wait_for(lambda: len(d.values()) >= 60, 40, "the member after the restart to read the new records")
        time.sleep(1)
        assert sorted(d.values()) == sorted(later), "records committed before the restart were read again"
        g = watch.describe()
        assert g.assignor_name == "range" and [len(m.assignment.topic_partitions[0].partitions) for m in g.members] == [6]
    finally:
        watch.stop.set()
        for m in members:
            if m.proc.poll() is None:
                m.proc.kill()
