"""Wrong group requests get Kafka's error codes; nothing is corrupted and the broker serves on."""
from __future__ import annotations

import struct

from kafka.admin import KafkaAdminClient, NewTopic

from fluvial.protocol.errors import ErrorCode as E
from fluvial.protocol.messages import ApiKey, request_class
from tests.integration.test_idempotence import RawClient

JoinProtocol = request_class(ApiKey.JOIN_GROUP).JoinGroupRequestProtocol
SyncAssignment = request_class(ApiKey.SYNC_GROUP).SyncGroupRequestAssignment
LeaveMember = request_class(ApiKey.LEAVE_GROUP).MemberIdentity
CommitTopic = request_class(ApiKey.OFFSET_COMMIT).OffsetCommitRequestTopic
FetchTopic = request_class(ApiKey.OFFSET_FETCH).OffsetFetchRequestTopic
DeleteTopic = request_class(ApiKey.OFFSET_DELETE).OffsetDeleteRequestTopic


def subscription(topic: str) -> bytes:
    return struct.pack(">hih", 0, 1, len(topic)) + topic.encode() + struct.pack(">i", -1)


def join(c: RawClient, group: str, member_id: str = "", *, protocol_type="consumer", session=10_000, topic="t"):
    return c.call(ApiKey.JOIN_GROUP, 5, dict(
        group_id=group, session_timeout_ms=session, rebalance_timeout_ms=10_000, member_id=member_id,
        group_instance_id=None, protocol_type=protocol_type,
        protocols=[JoinProtocol(name="range", metadata=subscription(topic))]))


def commit(c: RawClient, group: str, generation: int, member: str, offsets: list[tuple[str, int, int, str]]):
    topics: dict[str, list] = {}
    for t, p, o, meta in offsets:
        topics.setdefault(t, []).append(CommitTopic.OffsetCommitRequestPartition(
            partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=meta))
    r = c.call(ApiKey.OFFSET_COMMIT, 8, dict(group_id=group, generation_id_or_member_epoch=generation,
                                             member_id=member, group_instance_id=None,
                                             topics=[CommitTopic(name=t, partitions=ps) for t, ps in topics.items()]))
    return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


def fetch(c: RawClient, group: str, topic: str, partitions: list[int]):
    r = c.call(ApiKey.OFFSET_FETCH, 7, dict(group_id=group, require_stable=False,
                                            topics=[FetchTopic(name=topic, partition_indexes=partitions)]))
    assert r.error_code == 0
    return {p.partition_index: p.committed_offset for t in r.topics for p in t.partitions}


def test_group_requests_with_wrong_ids_generations_and_partitions(broker, topic_name):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(topic_name, 2, 1)])
    c = RawClient(broker.bootstrap)
    group = f"bad-{topic_name}"

    # Heartbeat, sync and leave from nobody.
    hb = c.call(ApiKey.HEARTBEAT, 3, dict(group_id=group, generation_id=1, member_id="nobody", group_instance_id=None))
    assert hb.error_code == E.UNKNOWN_MEMBER_ID
    sync = c.call(ApiKey.SYNC_GROUP, 3, dict(group_id=group, generation_id=1, member_id="nobody",
                                             group_instance_id=None, assignments=[]))
    assert sync.error_code == E.UNKNOWN_MEMBER_ID
    leave = c.call(ApiKey.LEAVE_GROUP, 3, dict(group_id=group, members=[LeaveMember(member_id="nobody")]))
    assert leave.members[0].error_code == E.UNKNOWN_MEMBER_ID
    # Joins that cannot be accepted.
    assert join(c, group, session=1).error_code == E.INVALID_SESSION_TIMEOUT
    assert join(c, "").error_code == E.INVALID_GROUP_ID
    assert join(c, group, "made-up-id").error_code == E.UNKNOWN_MEMBER_ID

    # A real member.
    first = join(c, group, topic=topic_name)
    assert first.error_code == E.MEMBER_ID_REQUIRED and first.member_id
    member = first.member_id
    joined = join(c, group, member, topic=topic_name)
    assert joined.error_code == 0 and joined.generation_id >= 1 and joined.leader == member
    gen = joined.generation_id
    # Another protocol type cannot join this group.
    assert join(c, group, protocol_type="connect").error_code == E.INCONSISTENT_GROUP_PROTOCOL
    wrong_gen = c.call(ApiKey.SYNC_GROUP, 3, dict(group_id=group, generation_id=gen + 5, member_id=member,
                                                  group_instance_id=None, assignments=[]))
    assert wrong_gen.error_code == E.ILLEGAL_GENERATION
    sync = c.call(ApiKey.SYNC_GROUP, 3, dict(group_id=group, generation_id=gen, member_id=member,
                                             group_instance_id=None,
                                             assignments=[SyncAssignment(member_id=member, assignment=b"mine")]))
    assert sync.error_code == 0 and sync.assignment == b"mine"
    hb = c.call(ApiKey.HEARTBEAT, 3, dict(group_id=group, generation_id=gen - 1, member_id=member,
                                          group_instance_id=None))
    assert hb.error_code == E.ILLEGAL_GENERATION

    # Commits: the valid one is stored, the others are refused one by one.
    big = "m" * 5000
    errors = commit(c, group, gen, member, [(topic_name, 0, 0, "ok"), (topic_name, 1, 10**12, ""),
                                            (topic_name, 7, 1, ""), ("no-such-topic", 0, 1, ""),
                                            (topic_name, 1, -3, ""), (topic_name, 1, 0, big)])
    assert errors == {(topic_name, 0): E.NONE, (topic_name, 1): E.OFFSET_METADATA_TOO_LARGE,
                      (topic_name, 7): E.UNKNOWN_TOPIC_OR_PARTITION, ("no-such-topic", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    errors = commit(c, group, gen, member, [(topic_name, 1, 10**12, "")])
    assert errors == {(topic_name, 1): E.NONE}  # past the log end: Kafka accepts it
    errors = commit(c, group, gen, member, [(topic_name, 1, -3, "")])
    assert errors == {(topic_name, 1): E.OFFSET_OUT_OF_RANGE}
    assert commit(c, group, gen + 1, member, [(topic_name, 1, 0, "")]) == {(topic_name, 1): E.ILLEGAL_GENERATION}
    assert commit(c, group, gen, "ghost", [(topic_name, 1, 0, "")]) == {(topic_name, 1): E.UNKNOWN_MEMBER_ID}
    # A standalone commit into a group with members is refused too.
    assert commit(c, group, -1, "", [(topic_name, 1, 0, "")]) == {(topic_name, 1): E.UNKNOWN_MEMBER_ID}
    assert fetch(c, group, topic_name, [0, 1]) == {0: 0, 1: 10**12}

    # Deleting a live group or offsets of a subscribed topic is refused.
    r = c.call(ApiKey.DELETE_GROUPS, 2, dict(groups_names=[group, "never-existed"]))
    assert {x.group_id: x.error_code for x in r.results} == {group: 68, "never-existed": E.GROUP_ID_NOT_FOUND}
    r = c.call(ApiKey.OFFSET_DELETE, 0, dict(group_id=group, topics=[
        DeleteTopic(name=topic_name, partitions=[DeleteTopic.OffsetDeleteRequestPartition(partition_index=0)])]))
    assert r.error_code == 0 and r.topics[0].partitions[0].error_code == E.GROUP_SUBSCRIBED_TO_TOPIC

    # After the member leaves, the group is empty and may go, offsets with it.
    leave = c.call(ApiKey.LEAVE_GROUP, 3, dict(group_id=group, members=[LeaveMember(member_id=member)]))
    assert leave.error_code == 0 and leave.members[0].error_code == 0
    r = c.call(ApiKey.DESCRIBE_GROUPS, 5, dict(groups=[group], include_authorized_operations=False))
    assert r.groups[0].group_state == "Empty"
    r = c.call(ApiKey.DELETE_GROUPS, 2, dict(groups_names=[group]))
    assert r.results[0].error_code == 0
    assert fetch(c, group, topic_name, [0]) == {0: -1}
    r = c.call(ApiKey.DESCRIBE_GROUPS, 6, dict(groups=[group], include_authorized_operations=False))
    assert r.groups[0].error_code == E.GROUP_ID_NOT_FOUND

    # The broker keeps serving on the same connection.
    r = c.call(ApiKey.FIND_COORDINATOR, 4, dict(key_type=0, coordinator_keys=[group]))
    assert r.coordinators[0].error_code == 0 and r.coordinators[0].port == broker.port
    c.close()
    admin.close()


def test_find_coordinator_answers_for_groups_and_transactions(broker):
    c = RawClient(broker.bootstrap)
    for version in (0, 1, 2, 3):
        body = dict(key="g") if version == 0 else dict(key="g", key_type=1)
        r = c.call(ApiKey.FIND_COORDINATOR, version, body)
        assert r.error_code == 0 and r.port == broker.port and r.node_id >= 0
    r = c.call(ApiKey.FIND_COORDINATOR, 6, dict(key_type=1, coordinator_keys=["tx-a", "tx-b"]))
    assert [x.key for x in r.coordinators] == ["tx-a", "tx-b"]
    assert all(x.error_code == 0 and x.port == broker.port for x in r.coordinators)
    r = c.call(ApiKey.FIND_COORDINATOR, 6, dict(key_type=9, coordinator_keys=["x"]))
    assert r.coordinators[0].error_code == E.INVALID_REQUEST
    c.close()
