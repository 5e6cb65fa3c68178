"""Share groups (KIP-932) with Apache Kafka 4.2's KafkaShareConsumer and franz-go's share
consumer (kgo.ShareGroup): several consumers share one partition; acknowledged records are not delivered again; records a live consumer holds
without acknowledging come back to the others once their acquisition lock times out (with a
higher delivery count); acknowledgements survive a broker restart."""
from __future__ import annotations

import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from fluvial.protocol.messages import ApiKey
from tests.integration.test_groups_confluent import wait_for
from tests.support import kafka_clients_42
from tests.support.kafka_wire import WireClient

HERE = Path(__file__).resolve().parent
LOCK_MS = 3000


@pytest.fixture(scope="module")
def share_worker(tmp_path_factory):
    if shutil.which("javac") is None:
        pytest.skip("no JDK")
    try:
        cp = kafka_clients_42.classpath()
    except Exception as exc:  # noqa: BLE001 - no Maven Central: say why
        pytest.skip(f"kafka-clients {kafka_clients_42.VERSION} is not available: {exc}")
    out = tmp_path_factory.mktemp("share-worker")
    subprocess.run(["javac", "-d", str(out), "-cp", cp, str(HERE / "java" / "ShareWorker.java")],
                   check=True, timeout=120)
    return f"{out}:{cp}"


@pytest.fixture(scope="module")
def franz_go_worker(tmp_path_factory):
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain")
    binary = tmp_path_factory.mktemp("share-go") / "share"
    build = subprocess.run(["go", "build", "-o", str(binary), "."], cwd=HERE / "go" / "share",
                           capture_output=True, timeout=240)
    if build.returncode != 0:
        pytest.skip(f"franz-go could not be built (no module proxy?): {build.stderr.decode()[-500:]}")
    return str(binary)


class Worker:
    """One share consumer process (Java or Go: same arguments, same output lines)."""

    def __init__(self, command: list[str], bootstrap: str, topic: str, group: str, mode: str, seconds: int):
        self.proc = subprocess.Popen([*command, bootstrap, topic, group, mode, str(seconds)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.records: list[tuple[int, str, int]] = []
        self.started = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            line = raw.decode().split()
            if line and line[0] == "STARTED":
                self.started.set()
            elif line and line[0] == "R":
                self.records.append((int(line[1]), line[2], int(line[3])))

    def values(self) -> list[str]:
        return [v for _, v, _ in self.records]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for v in values:
        p.produce(topic, value=v.encode())
    assert p.flush(30) == 0


@pytest.mark.java
def test_java_share_consumers(fresh_broker, share_worker, topic_name):
    share_a_partition(fresh_broker, ["java", "-cp", share_worker, "ShareWorker"], topic_name)


def test_franz_go_share_consumers(fresh_broker, franz_go_worker, topic_name):
    share_a_partition(fresh_broker, [franz_go_worker], topic_name)


def share_a_partition(fresh_broker, share_worker: list[str], topic_name: str) -> None:
    broker = fresh_broker("--share-auto-offset-reset", "earliest",
                          "--group-share-record-lock-duration-ms", str(LOCK_MS),
                          "--group-share-heartbeat-interval-ms", "500")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    group = f"share-{topic_name}"
    first = [f"a-{i}" for i in range(100)]
    produce(broker.bootstrap, topic_name, first)
    workers = []
    try:
        # One consumer takes records and sits on them without acknowledging.
        holder = Worker(share_worker, broker.bootstrap, topic_name, group, "hold", 60)
        workers.append(holder)
        wait_for(lambda: holder.records, 30, "the holding consumer to get records")
        held = set(holder.values())
        # Two consumers acknowledge everything they get, from the same partition.
        ackers = [Worker(share_worker, broker.bootstrap, topic_name, group, "ack", 60) for _ in range(2)]
        workers += ackers
        for w in ackers:
            assert w.started.wait(30)
        second = [f"b-{i}" for i in range(200)]
        for i in range(0, 200, 20):
            produce(broker.bootstrap, topic_name, second[i:i + 20])
            time.sleep(0.1)
        every = set(first) | set(second)
        wait_for(lambda: every <= set(ackers[0].values() + ackers[1].values()), 60,
                 "the acknowledging consumers to get every record (the held ones after their lock times out)")
        got = ackers[0].values() + ackers[1].values()
        assert len(got) == len(set(got)), "an acknowledged record was delivered again"
        assert ackers[0].values() and ackers[1].values(), "both consumers read from the one partition"
        redelivered = {v: n for w in ackers for _, v, n in w.records if v in held}
        assert set(redelivered) == held and all(n >= 2 for n in redelivered.values()), redelivered
        with WireClient(broker.bootstrap) as c:
            d = c.request(ApiKey.SHARE_GROUP_DESCRIBE, 1, dict(group_ids=[group], include_authorized_operations=False))
            assert d.groups[0].error_code == 0 and len(d.groups[0].members) == 3
        metrics = urllib.request.urlopen(broker.http_url + "/metrics", timeout=10).read().decode()
        assert f'fluvial_consumer_group_members{{group="{group}",state="Stable"}} 3.0' in metrics
        # A worker acknowledges right after printing: give the last acknowledgements a moment to
        # land before the workers are killed (unacknowledged records would rightly come back).
        time.sleep(2)
        for w in workers:
            w.stop()
        workers.clear()

        # Acknowledged records stay acknowledged across a restart: a new consumer sees only new ones.
        broker.restart()
        late = Worker(share_worker, broker.bootstrap, topic_name, group, "ack", 40)
        workers.append(late)
        assert late.started.wait(30)
        time.sleep(2)
        third = [f"c-{i}" for i in range(20)]
        produce(broker.bootstrap, topic_name, third)
        wait_for(lambda: set(third) <= set(late.values()), 30, "the consumer after the restart to get new records")
        time.sleep(1)
        assert sorted(late.values()) == sorted(third)
    finally:
        for w in workers:
            w.stop()
