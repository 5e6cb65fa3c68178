"""Creating, growing and deleting big topics never keeps other clients waiting.

A probe connection pings the broker with ApiVersions every 2 ms while an admin client
creates a 200-partition topic, grows it to 400 partitions and deletes it. The file and
SQLite work of those changes runs off the event loop, so no ping may wait long (before:
a 200-partition creation blocked every connection for 0.2-1.5 s).
"""
from __future__ import annotations

import os
import time

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from benchmarks.loop_probe import ResponsivenessProbe

# Healthy runs stay under 10 ms on a quiet machine; at a load average of 8 on 2 cores,
# scheduling alone gives 50-90 ms spikes. Blocking work took 180-1,600 ms.
MAX_STALL_MS = 150.0


@pytest.fixture
def admin_and_broker(fresh_broker):
    b = fresh_broker()
    admin = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 3})
    admin.list_topics(timeout=30)
    return admin, b


def _probed(bootstrap: str, action) -> float:
    with ResponsivenessProbe(bootstrap) as probe:
        action()
    report = probe.report()
    assert report.samples > 5
    return report


def test_big_topic_changes_do_not_block_other_clients(admin_and_broker):
    admin, b = admin_and_broker
    name = "wide"

    def create():
        admin.create_topics([NewTopic(name, 200, 1)])[name].result(60)

    def grow():
        admin.create_partitions([NewPartitions(name, 400)])[name].result(60)

    def delete():
        admin.delete_topics([name])[name].result(60)

    # What the machine alone does to the probe (other processes, scheduling), for as long.
    baseline = _probed(b.bootstrap, lambda: time.sleep(1.5))
    limit = max(MAX_STALL_MS, 2 * baseline.max_ms)
    reports = {step.__name__: _probed(b.bootstrap, step) for step in (create, grow, delete)}
    worst = {step: r.max_ms for step, r in reports.items()}
    assert all(ms < limit for ms in worst.values()), (
        f"longest round trips {worst}, limit {limit:.0f} ms (idle baseline {baseline.max_ms:.0f} ms, "
        f"load {os.getloadavg()}); slow ones: { {step: r.slow for step, r in reports.items()} }")


def test_topic_changes_keep_their_answers(admin_and_broker):
    """Moving the work off the loop keeps CreateTopics/CreatePartitions/DeleteTopics semantics."""
    admin, b = admin_and_broker
    admin.create_topics([NewTopic("kept", 3, 1)])["kept"].result(30)
    md = admin.list_topics("kept", timeout=10).topics["kept"]
    assert len(md.partitions) == 3
    # Concurrent creations of one name: exactly one wins, the others are told it exists.
    futures = [admin.create_topics([NewTopic("twice", 2, 1)])["twice"] for _ in range(3)]
    outcomes = []
    for f in futures:
        try:
            f.result(30)
            outcomes.append("created")
        except Exception as exc:  # noqa: BLE001 - the error is what is checked
            outcomes.append(exc.args[0].name())
    assert sorted(outcomes) == ["TOPIC_ALREADY_EXISTS", "TOPIC_ALREADY_EXISTS", "created"], outcomes
    with pytest.raises(Exception) as err:
        admin.create_partitions([NewPartitions("kept", 2)])["kept"].result(30)
    assert err.value.args[0].name() == "INVALID_PARTITIONS"
    admin.create_partitions([NewPartitions("kept", 5)])["kept"].result(30)
    assert len(admin.list_topics("kept", timeout=10).topics["kept"].partitions) == 5
    admin.delete_topics(["kept"])["kept"].result(30)
    with pytest.raises(Exception) as err:
        admin.delete_topics(["kept"])["kept"].result(30)
    assert err.value.args[0].name() == "UNKNOWN_TOPIC_OR_PART"
    # Created again under the same name: empty, with the new partition count.
    admin.create_topics([NewTopic("kept", 2, 1)])["kept"].result(30)
    assert len(admin.list_topics("kept", timeout=10).topics["kept"].partitions) == 2
    # Survives a restart.
    b.restart()
    admin2 = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 3})
    topics = admin2.list_topics(timeout=30).topics
    assert len(topics["kept"].partitions) == 2 and len(topics["twice"].partitions) == 2
