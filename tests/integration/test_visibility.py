"""Under flush policy `ack` readers see records once fsynced, and promptly whatever the
producer's acks: a long-polling fetch wakes when the durable offset moves."""
from __future__ import annotations

import threading
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from fluvial.protocol.messages import ApiKey, request_class
from tests.integration.test_bad_input import RawClient


def long_poll(bootstrap: str, topic: str, offset: int, max_wait_ms: int) -> tuple[float, object]:
    """One Fetch that waits up to max_wait_ms for a byte: (seconds it took, partition data)."""
    c = RawClient(bootstrap)
    F = request_class(ApiKey.FETCH)
    body = dict(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                session_id=0, session_epoch=-1, topics=[F.FetchTopic(topic=topic, partitions=[
                    F.FetchTopic.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                                log_start_offset=-1, partition_max_bytes=1 << 20)])],
                forgotten_topics_data=[], rack_id="")
    started = time.monotonic()
    try:
        response = c.request(ApiKey.FETCH, 11, body)
    finally:
        c.close()
    return time.monotonic() - started, response.responses[0].partitions[0]


def test_a_waiting_fetch_wakes_when_the_record_is_durable(fresh_broker, topic_name):
    broker = fresh_broker("--flush-policy", "ack")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    for offset, acks in enumerate(["0", "1"]):
        result: list = []
        poller = threading.Thread(target=lambda: result.append(
            long_poll(broker.bootstrap, topic_name, offset, 20_000)))
        poller.start()
        time.sleep(0.5)  # the fetch is parked on the bucket
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": acks, "linger.ms": 0})
        p.produce(topic_name, value=b"hello-%d" % offset, partition=0)
        p.flush(10)
        poller.join(25)
        took, partition = result[0]
        # Woken by the group commit's fsync (nobody waits for it with acks=0/1), not by the
        # 20 s timeout.
        assert took < 10, f"acks={acks}: the fetch waited {took:.1f}s"
        assert partition.error_code == 0 and partition.high_watermark == offset + 1
        assert b"hello-%d" % offset in bytes(partition.records)
