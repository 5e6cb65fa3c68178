"""Consumer groups of confluent-kafka processes: join, leave, die, rebalance, resume.

Each member is its own process that writes every record it processes to a file and
then commits (commit-after-process), so a member can be stopped cleanly (SIGTERM ->
close() -> LeaveGroup) or killed with SIGKILL like a crashed application.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[2]


def member_main() -> None:
    """A group member: poll, record, commit; SIGTERM closes it cleanly."""
    from confluent_kafka import Consumer

    bootstrap, topic, group, out_path, strategy, instance = (sys.argv[1:7] + [""])[:6]
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    config = {
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": strategy, "max.poll.interval.ms": 60000,
    }
    if instance:
        config.update({"group.instance.id": instance, "session.timeout.ms": 15000})
    consumer = Consumer(config)
    events = open(out_path + ".assignments", "a")

    def on_assign(_consumer, partitions):
        events.write(" ".join(str(tp.partition) for tp in partitions) + "\n")
        events.flush()

    consumer.subscribe([topic], on_assign=on_assign)
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
                pass  # e.g. a rebalance or the broker restarting: the record may be seen again
    consumer.close()


class Member:
    def __init__(self, bootstrap: str, topic: str, group: str, out: Path, strategy: str, instance: str = ""):
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from tests.integration.test_groups_confluent import member_main; member_main()",
             bootstrap, topic, group, str(out), strategy, instance],
            cwd=REPO, stderr=subprocess.DEVNULL)

    def assignments(self) -> list[list[int]]:
        path = Path(str(self.out) + ".assignments")
        if not path.exists():
            return []
        return [sorted(int(p) for p in line.split()) for line in path.read_text().splitlines()]

    def leave(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def lines(self) -> list[tuple[int, int, str]]:
        if not self.out.exists():
            return []
        out = []
        for line in self.out.read_text().splitlines():
            p, o, v = line.split(" ")
            out.append((int(p), int(o), v))
        return out


class PacedProducer(threading.Thread):
    """Produces values v-<i> at a steady rate; remembers which ones were acknowledged."""

    def __init__(self, bootstrap: str, topic: str, start: int, count: int, per_second: float):
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                                  "message.timeout.ms": 120_000})
        self.topic, self.start_at, self.count, self.rate = topic, start, count, per_second
        self.acked: set[str] = set()
        self.errors: list = []

    def _done(self, err, msg) -> None:
        if err is None:
            self.acked.add(msg.value().decode())
        else:
            self.errors.append(err)

    def run(self) -> None:
        t0 = time.monotonic()
        for i in range(self.start_at, self.start_at + self.count):
            self.producer.produce(self.topic, value=f"v-{i}".encode(), key=str(i).encode(), on_delivery=self._done)
            self.producer.poll(0)
            delay = t0 + (i - self.start_at + 1) / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        self.producer.flush(120)


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(client: AdminClient, topic: str, partitions: int) -> None:
    client.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)


def describe(client: AdminClient, group: str):
    return client.describe_consumer_groups([group])[group].result(15)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def processed(members: list[Member]) -> list[str]:
    return [v for m in members for _, _, v in m.lines()]


def stable_with(client: AdminClient, group: str, n: int):
    d = describe(client, group)
    return d if d.state == ConsumerGroupState.STABLE and len(d.members) == n else None


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_three_members_join_leave_and_die_while_a_producer_runs(fresh_broker, tmp_path, topic_name, strategy):
    broker = fresh_broker()
    client = admin(broker.bootstrap)
    create_topic(client, topic_name, 6)
    group = f"g-{topic_name}"
    producer = PacedProducer(broker.bootstrap, topic_name, 0, 2400, per_second=120)
    producer.start()
    members = {name: Member(broker.bootstrap, topic_name, group, tmp_path / f"{name}.txt", strategy)
               for name in ("a", "b", "c")}
    try:
        d = wait_for(lambda: stable_with(client, group, 3), 40, "three members in a stable group")
        assigned = [tp.partition for m in d.members for tp in m.assignment.topic_partitions]
        assert sorted(assigned) == list(range(6))
        assert all(len(m.assignment.topic_partitions) == 2 for m in d.members)
        wait_for(lambda: len(processed(list(members.values()))) >= 300, 30, "some records processed")

        members["b"].leave()           # clean leave: LeaveGroup, immediate rebalance
        wait_for(lambda: stable_with(client, group, 2), 30, "the group without b")
        members["c"].kill9()           # crash: found by the session timeout
        t_kill = time.monotonic()
        d = wait_for(lambda: stable_with(client, group, 1), 40, "the group without the killed member")
        assert time.monotonic() - t_kill >= 3, "a killed member is noticed by its session timeout"
        assert len(d.members[0].assignment.topic_partitions) == 6
        members["d"] = Member(broker.bootstrap, topic_name, group, tmp_path / "d.txt", strategy)
        d = wait_for(lambda: stable_with(client, group, 2), 40, "the newcomer in the group")
        assigned = sorted(tp.partition for m in d.members for tp in m.assignment.topic_partitions)
        assert assigned == list(range(6))

        producer.join(120)
        assert not producer.errors and len(producer.acked) == 2400
        everything = list(members.values())
        wait_for(lambda: producer.acked <= set(processed(everything)), 90, "every record to be processed")

        # The survivors committed what they processed: committed offsets reach the log end.
        def committed_at_end():
            res = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(15)
            offsets = {tp.partition: tp.offset for tp in res.topic_partitions}
            return len(offsets) == 6 and sum(offsets.values()) == 2400
        wait_for(committed_at_end, 30, "committed offsets at the log end")
    finally:
        for m in members.values():
            if m.proc.poll() is None:
                m.leave()
    assert describe(client, group).state == ConsumerGroupState.EMPTY


def test_group_resumes_from_committed_offsets_after_broker_restart(fresh_broker, tmp_path, topic_name):
    broker = fresh_broker()
    client = admin(broker.bootstrap)
    create_topic(client, topic_name, 6)
    group = f"g-{topic_name}"
    first = PacedProducer(broker.bootstrap, topic_name, 0, 1200, per_second=2000)
    first.run()
    assert len(first.acked) == 1200
    a = Member(broker.bootstrap, topic_name, group, tmp_path / "a.txt", "range")
    b = Member(broker.bootstrap, topic_name, group, tmp_path / "b.txt", "range")
    wait_for(lambda: len(processed([a, b])) >= 500, 60, "half of the records processed")
    # Both members stop cleanly, then the broker dies hard and comes back.
    a.leave()
    b.leave()
    before = processed([a, b])
    broker.kill9()
    broker.start()
    client = admin(broker.bootstrap)
    second = PacedProducer(broker.bootstrap, topic_name, 1200, 1200, per_second=2000)
    second.run()
    c = Member(broker.bootstrap, topic_name, group, tmp_path / "c.txt", "range")
    d = Member(broker.bootstrap, topic_name, group, tmp_path / "d.txt", "range")
    try:
        everything = first.acked | second.acked
        wait_for(lambda: everything <= set(processed([a, b, c, d])), 90, "every record to be processed")
        after = processed([c, d])
        # The new members started exactly where the old ones committed.
        assert not set(before) & set(after), "records processed before the restart were delivered again"
        assert len(before) + len(after) == 2400
    finally:
        for m in (c, d):
            if m.proc.poll() is None:
                m.leave()


def test_members_ride_through_a_broker_kill(fresh_broker, tmp_path, topic_name):
    broker = fresh_broker()
    client = admin(broker.bootstrap)
    create_topic(client, topic_name, 6)
    group = f"g-{topic_name}"
    PacedProducer(broker.bootstrap, topic_name, 0, 600, per_second=5000).run()
    members = [Member(broker.bootstrap, topic_name, group, tmp_path / f"{i}.txt", "range") for i in range(2)]
    try:
        wait_for(lambda: len(processed(members)) >= 600, 60, "the first records processed")
        broker.kill9()
        broker.start()
        later = PacedProducer(broker.bootstrap, topic_name, 600, 600, per_second=5000)
        later.run()
        assert len(later.acked) == 600
        wanted = {f"v-{i}" for i in range(1200)}
        wait_for(lambda: wanted <= set(processed(members)), 90, "records produced after the restart")
        seen = processed(members)
        # Positions were kept across the outage: at most a few records are seen twice.
        assert len(seen) - len(set(seen)) <= 12
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.leave()


def test_static_member_restart_does_not_rebalance(fresh_broker, tmp_path, topic_name):
    broker = fresh_broker()
    client = admin(broker.bootstrap)
    create_topic(client, topic_name, 4)
    group = f"g-{topic_name}"
    PacedProducer(broker.bootstrap, topic_name, 0, 400, per_second=5000).run()
    a = Member(broker.bootstrap, topic_name, group, tmp_path / "a.txt", "range", instance="inst-a")
    b = Member(broker.bootstrap, topic_name, group, tmp_path / "b.txt", "range", instance="inst-b")
    try:
        before = wait_for(lambda: stable_with(client, group, 2), 40, "two static members")
        wait_for(lambda: len(processed([a, b])) >= 400, 60, "the records processed")
        ids_before = {m.group_instance_id: (m.member_id, sorted(tp.partition for tp in m.assignment.topic_partitions))
                      for m in before.members}
        b_assignments = b.assignments()
        # a crashes and comes straight back under the same instance id.
        a.kill9()
        a = Member(broker.bootstrap, topic_name, group, tmp_path / "a2.txt", "range", instance="inst-a")
        wait_for(lambda: a.assignments(), 30, "the restarted member to get its partitions")
        after = wait_for(lambda: stable_with(client, group, 2), 30, "the group stable again")
        ids_after = {m.group_instance_id: (m.member_id, sorted(tp.partition for tp in m.assignment.topic_partitions))
                     for m in after.members}
        assert ids_after["inst-a"][0] != ids_before["inst-a"][0]        # a new member id ...
        assert ids_after["inst-a"][1] == ids_before["inst-a"][1]        # ... in the old place
        assert ids_after["inst-b"] == ids_before["inst-b"]
        assert a.assignments() == [ids_before["inst-a"][1]]
        time.sleep(2)
        assert b.assignments() == b_assignments, "the other member must not have been rebalanced"
        # The restarted member resumed from its committed offsets: nothing new to read.
        PacedProducer(broker.bootstrap, topic_name, 400, 40, per_second=5000).run()
        wait_for(lambda: {f"v-{i}" for i in range(400, 440)} <= set(processed([a, b])), 30, "new records")
        # The restarted member went on from its committed offsets (a commit in flight at the
        # kill may make it see one record per partition again).
        assert len([v for v in processed([a]) if int(v[2:]) < 400]) <= 2
    finally:
        for m in (a, b):
            if m.proc.poll() is None:
                m.leave()
