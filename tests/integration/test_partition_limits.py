"""CreatePartitions has CreateTopics' limit, and growing a table never stalls other clients."""
from __future__ import annotations

import threading
import time

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewPartitions, NewTopic
from kafka.errors import PolicyViolationError

from fluvial.broker.tables import MAX_BUCKETS


class LatencyProbe:
    """A second client asking for metadata in a loop; records its slowest answer."""

    def __init__(self, bootstrap: str):
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=60_000)
        self.worst = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.admin.describe_cluster()
            self.worst = max(self.worst, time.perf_counter() - started)
            self.answers += 1
            time.sleep(0.02)

    def __enter__(self) -> "LatencyProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        self.admin.close()


@pytest.fixture
def admin(broker):
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=60_000)
    yield client
    client.close()


def test_create_partitions_2_pow_30_is_refused_at_once(broker, admin, topic_name):
    admin.create_topics([NewTopic(topic_name, 1, 1)])
    with LatencyProbe(broker.bootstrap) as probe:
        started = time.perf_counter()
        with pytest.raises(PolicyViolationError, match="Excessively large number of partitions"):
            admin.create_partitions({topic_name: NewPartitions(2**30)})
        with pytest.raises(PolicyViolationError):
            admin.create_partitions({topic_name: NewPartitions(MAX_BUCKETS + 1)}, validate_only=True)
        assert time.perf_counter() - started < 5
        time.sleep(0.3)
    assert probe.answers > 3 and probe.worst < 2.0
    # Nothing changed, and the limit itself is still allowed to be approached.
    admin.create_partitions({topic_name: NewPartitions(3)})
    described = admin.describe_topics([topic_name])[0]
    assert len(described["partitions"]) == 3


def test_growing_by_thousands_of_buckets_keeps_other_clients_served(broker, admin, topic_name):
    admin.create_topics([NewTopic(topic_name, 1, 1)])
    with LatencyProbe(broker.bootstrap) as probe:
        admin.create_partitions({topic_name: NewPartitions(3000)})
        time.sleep(0.2)
    assert len(admin.describe_topics([topic_name])[0]["partitions"]) == 3000
    # Creating 3000 bucket directories and metadata runs on the I/O threads: the probe's
    # requests are answered meanwhile (a stalled loop would show seconds here).
    print(f"worst probe latency while growing to 3000 buckets: {probe.worst:.3f} s")
    assert probe.answers > 3 and probe.worst < 2.0, probe.worst
    admin.delete_topics([topic_name])
