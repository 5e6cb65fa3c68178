"""Share-group requests that are wrong get Kafka's error codes and change nothing: unknown
members and wrong epochs in heartbeats, share sessions with wrong epochs, acknowledgements of
records not acquired (or acquired by another member); release, reject and the delivery limit."""
from __future__ import annotations

import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from fluvial.protocol.errors import ErrorCode as E
from fluvial.protocol.messages import ApiKey, request_class
from tests.integration.test_groups_bad_input import join
from tests.integration.test_idempotence import RawClient
from tests.support.kafka_wire import WireClient

SF = request_class(ApiKey.SHARE_FETCH)
SA = request_class(ApiKey.SHARE_ACKNOWLEDGE)
ACCEPT, RELEASE, REJECT = 1, 2, 3


def beat(c, group, member, epoch, topics=None):
    return c.request(ApiKey.SHARE_GROUP_HEARTBEAT, 1, dict(group_id=group, member_id=member, member_epoch=epoch,
                                                           rack_id=None, subscribed_topic_names=topics))


def fetch(c, group, member, epoch, tid, acks=(), max_records=100, wait_ms=0, renew=False):
    part = SF.FetchTopic.FetchPartition(partition_index=0, partition_max_bytes=0, acknowledgement_batches=[
        SF.FetchTopic.FetchPartition.AcknowledgementBatch(first_offset=f, last_offset=last, acknowledge_types=t)
        for f, last, t in acks])
    r = c.request(ApiKey.SHARE_FETCH, 2, dict(
        group_id=group, member_id=member, share_session_epoch=epoch, max_wait_ms=wait_ms, min_bytes=1,
        max_bytes=1 << 20, max_records=max_records, batch_size=max_records, share_acquire_mode=0,
        is_renew_ack=renew, topics=[SF.FetchTopic(topic_id=tid, partitions=[part])], forgotten_topics_data=[]))
    parts = [p for t in r.responses for p in t.partitions]
    return r, (parts[0] if parts else None)


def ack(c, group, member, epoch, tid, batches):
    r = c.request(ApiKey.SHARE_ACKNOWLEDGE, 2, dict(
        group_id=group, member_id=member, share_session_epoch=epoch, is_renew_ack=False,
        topics=[SA.AcknowledgeTopic(topic_id=tid, partitions=[SA.AcknowledgeTopic.AcknowledgePartition(
            partition_index=0, acknowledgement_batches=[
                SA.AcknowledgeTopic.AcknowledgePartition.AcknowledgementBatch(
                    first_offset=f, last_offset=last, acknowledge_types=t) for f, last, t in batches])])]))
    parts = [p for t in r.responses for p in t.partitions]
    return r.error_code, (parts[0].error_code if parts else None)


def acquired(part) -> list[tuple[int, int, int]]:
    return [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records] if part else []


def test_share_group_errors_and_acknowledgement_rules(fresh_broker, topic_name):
    broker = fresh_broker("--share-auto-offset-reset", "earliest", "--group-share-delivery-count-limit", "2",
                          "--group-share-record-lock-duration-ms", "60000")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        p.produce(topic_name, value=b"v%d" % i)
    assert p.flush(15) == 0
    group = f"sg-{topic_name}"
    with WireClient(broker.bootstrap) as c:
        assert beat(c, group, "", 0, [topic_name]).error_code == E.INVALID_REQUEST
        assert beat(c, group, "a", 0, None).error_code == E.INVALID_REQUEST       # no subscription on join
        assert beat(c, group, "a", 1).error_code == E.UNKNOWN_MEMBER_ID           # no such group/member
        a = beat(c, group, "a", 0, [topic_name])
        assert a.error_code == 0 and a.member_epoch == 1
        tid = a.assignment.topic_partitions[0].topic_id
        assert beat(c, group, "b", 0, [topic_name]).member_epoch == 2
        assert beat(c, group, "a", 7).error_code == E.FENCED_MEMBER_EPOCH
        assert beat(c, group, "ghost", 2).error_code == E.UNKNOWN_MEMBER_ID
        raw = RawClient(broker.bootstrap)
        assert join(raw, group, topic=topic_name).error_code == E.INCONSISTENT_GROUP_PROTOCOL
        raw.close()

        # Sessions: a fetch without an open session, or with the wrong next epoch.
        assert fetch(c, group, "a", 1, tid)[0].error_code == E.SHARE_SESSION_NOT_FOUND
        r, part = fetch(c, group, "a", 0, tid, max_records=4)
        assert r.error_code == 0 and acquired(part) == [(0, 3, 1)] and part.records
        assert fetch(c, group, "a", 5, tid)[0].error_code == E.INVALID_SHARE_SESSION_EPOCH
        r, part_b = fetch(c, group, "b", 0, tid, max_records=3)
        assert acquired(part_b) == [(4, 6, 1)]  # b shares the partition, gets other records

        # b may not acknowledge a's records, nor records nobody acquired: nothing changes.
        assert ack(c, group, "b", 1, tid, [(0, 0, [ACCEPT])]) == (0, E.INVALID_RECORD_STATE)
        assert ack(c, group, "b", 2, tid, [(4, 8, [ACCEPT])]) == (0, E.INVALID_RECORD_STATE)
        assert ack(c, group, "b", 3, tid, [(4, 6, [ACCEPT, ACCEPT])]) == (0, E.INVALID_RECORD_STATE)
        # a accepts 0, releases 1, rejects 2; 3 stays acquired.
        assert ack(c, group, "a", 1, tid, [(0, 2, [ACCEPT, RELEASE, REJECT])]) == (0, 0)
        assert ack(c, group, "a", 2, tid, [(0, 0, [ACCEPT])]) == (0, E.INVALID_RECORD_STATE)  # already done
        # b's acquisition was untouched by its refused acknowledgements: it accepts them now.
        assert ack(c, group, "b", 4, tid, [(4, 6, [ACCEPT])]) == (0, 0)
        # The released record 1 comes back (second delivery) before new ones.
        r, part = fetch(c, group, "b", 5, tid, max_records=3)
        assert acquired(part) == [(1, 1, 2), (7, 8, 1)]
        # Released again at the delivery limit (2), it is archived, not offered a third time.
        assert ack(c, group, "b", 6, tid, [(1, 1, [RELEASE]), (7, 8, [ACCEPT])]) == (0, 0)
        r, part = fetch(c, group, "b", 7, tid, max_records=10)
        assert acquired(part) == [(9, 9, 1)]
        # Closing a's session offers what it still held (record 3) again.
        assert ack(c, group, "a", -1, tid, [])[0] == 0
        r, part = fetch(c, group, "b", 8, tid, max_records=10, wait_ms=2000)
        assert acquired(part) == [(3, 3, 2)]
        assert ack(c, group, "b", 9, tid, [(3, 3, [ACCEPT]), (9, 9, [ACCEPT])]) == (0, 0)
        d = c.request(ApiKey.SHARE_GROUP_DESCRIBE, 1, dict(group_ids=[group, "nope"],
                                                           include_authorized_operations=False))
        assert [g.error_code for g in d.groups] == [0, E.GROUP_ID_NOT_FOUND]
        assert beat(c, group, "a", -1).member_epoch == -1
        raw = RawClient(broker.bootstrap)
        deleted = raw.call(ApiKey.DELETE_GROUPS, 2, dict(groups_names=[group])).results[0].error_code
        assert deleted == E.NON_EMPTY_GROUP  # b is still a member
        raw.close()
    # Everything done is durable: after a kill -9 nothing is offered again.
    broker.kill9()
    broker.start()
    with WireClient(broker.bootstrap) as c:
        assert beat(c, group, "b", 2).member_epoch == 3  # a left: the group moved on
        r, part = fetch(c, group, "b", 0, tid, max_records=10, wait_ms=500)
        assert acquired(part) == []
        # Once empty, the group can be deleted with its share-partition state: it starts over.
        assert beat(c, group, "b", -1).member_epoch == -1
        raw = RawClient(broker.bootstrap)
        assert raw.call(ApiKey.DELETE_GROUPS, 2, dict(groups_names=[group])).results[0].error_code == 0
        raw.close()
        d = c.request(ApiKey.SHARE_GROUP_DESCRIBE, 1, dict(group_ids=[group], include_authorized_operations=False))
        assert d.groups[0].error_code == E.GROUP_ID_NOT_FOUND
        assert beat(c, group, "c", 0, [topic_name]).error_code == 0
        r, part = fetch(c, group, "c", 0, tid, max_records=100)
        assert acquired(part) == [(0, 9, 1)]


def test_records_held_by_a_closed_connection_are_offered_again(fresh_broker, topic_name):
    """A share session belongs to its connection: when the connection ends (a consumer killed
    with SIGKILL), its records come back at once, not only when their 60 s locks expire."""
    broker = fresh_broker("--share-auto-offset-reset", "earliest", "--group-share-record-lock-duration-ms", "60000")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(5):
        p.produce(topic_name, value=b"v%d" % i)
    assert p.flush(15) == 0
    group = f"sgc-{topic_name}"
    with WireClient(broker.bootstrap) as c:
        tid = beat(c, group, "x", 0, [topic_name]).assignment.topic_partitions[0].topic_id
        beat(c, group, "y", 0, [topic_name])
        with WireClient(broker.bootstrap) as gone:
            assert acquired(fetch(gone, group, "x", 0, tid)[1]) == [(0, 4, 1)]
        started = time.monotonic()
        _, part = fetch(c, group, "y", 0, tid, wait_ms=3000)
        assert acquired(part) == [(0, 4, 2)] and time.monotonic() - started < 10
        # A fetch carrying only renewals (KIP-1222) renews and acquires nothing new.
        p.produce(topic_name, value=b"v5")
        assert p.flush(15) == 0
        _, part = fetch(c, group, "y", 1, tid, acks=[(0, 4, [4])], renew=True)
        assert part.acknowledge_error_code == 0 and acquired(part) == []
        _, part = fetch(c, group, "y", 2, tid, acks=[(0, 4, [ACCEPT])])
        assert part.acknowledge_error_code == 0 and acquired(part) == [(5, 5, 1)]
