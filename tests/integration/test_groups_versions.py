"""Old and new versions of the group APIs, request by request, as older and newer clients send them."""
from __future__ import annotations

from kafka.admin import KafkaAdminClient, NewTopic

from fluvial.protocol.errors import ErrorCode as E
from fluvial.protocol.messages import ApiKey, request_class
from tests.integration.test_groups_bad_input import JoinProtocol, commit, subscription
from tests.integration.test_idempotence import RawClient

FetchTopic = request_class(ApiKey.OFFSET_FETCH).OffsetFetchRequestTopic
FetchGroup = request_class(ApiKey.OFFSET_FETCH).OffsetFetchRequestGroup


def test_old_and_new_versions_of_the_group_apis(broker, topic_name):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(topic_name, 3, 1)])
    admin.close()
    c = RawClient(broker.bootstrap)
    group = f"v-{topic_name}"

    # JoinGroup v0-v3 has no MEMBER_ID_REQUIRED round: the member is in at once.
    j = c.call(ApiKey.JOIN_GROUP, 0, dict(group_id=group, session_timeout_ms=10_000, member_id="",
                                          protocol_type="consumer",
                                          protocols=[JoinProtocol(name="range", metadata=subscription(topic_name))]))
    assert j.error_code == 0 and j.member_id and j.leader == j.member_id and j.protocol_name == "range"
    assert [m.member_id for m in j.members] == [j.member_id]
    s = c.call(ApiKey.SYNC_GROUP, 0, dict(group_id=group, generation_id=j.generation_id, member_id=j.member_id,
                                          assignments=[]))
    assert s.error_code == 0 and s.assignment == b""  # a member the leader did not assign gets nothing
    assert commit(c, group, j.generation_id, j.member_id, [(topic_name, 2, 0, "m")]) == {(topic_name, 2): 0}

    # OffsetFetch v1 (explicit partitions), v2+ null topics (everything), v8 several groups at once.
    r = c.call(ApiKey.OFFSET_FETCH, 1, dict(group_id=group, topics=[FetchTopic(name=topic_name, partition_indexes=[1, 2])]))
    assert {p.partition_index: (p.committed_offset, p.metadata) for p in r.topics[0].partitions} == {1: (-1, ""), 2: (0, "m")}
    r = c.call(ApiKey.OFFSET_FETCH, 5, dict(group_id=group, topics=None))
    assert r.error_code == 0 and [(t.name, [p.partition_index for p in t.partitions]) for t in r.topics] == [(topic_name, [2])]
    r = c.call(ApiKey.OFFSET_FETCH, 8, dict(groups=[
        FetchGroup(group_id=group, topics=None), FetchGroup(group_id="nobody-here", topics=None)], require_stable=False))
    by_group = {g.group_id: g for g in r.groups}
    assert by_group[group].topics[0].partitions[0].committed_offset == 0
    assert by_group["nobody-here"].error_code == 0 and by_group["nobody-here"].topics == []

    # DescribeGroups v0 answers an unknown group with state Dead and no error; ListGroups v4 filters by state.
    r = c.call(ApiKey.DESCRIBE_GROUPS, 0, dict(groups=["unknown-group", group]))
    assert (r.groups[0].error_code, r.groups[0].group_state) == (0, "Dead")
    assert (r.groups[1].group_state, r.groups[1].protocol_data) == ("Stable", "range")
    r = c.call(ApiKey.LIST_GROUPS, 4, dict(states_filter=["Stable"]))
    assert group in {g.group_id for g in r.groups} and all(g.group_state == "Stable" for g in r.groups)
    r = c.call(ApiKey.LIST_GROUPS, 0, dict())
    assert any(g.group_id == group and g.protocol_type == "consumer" for g in r.groups)

    # LeaveGroup v0 names one member; its error is the response's error.
    r = c.call(ApiKey.LEAVE_GROUP, 0, dict(group_id=group, member_id="someone-else"))
    assert r.error_code == E.UNKNOWN_MEMBER_ID
    r = c.call(ApiKey.LEAVE_GROUP, 0, dict(group_id=group, member_id=j.member_id))
    assert r.error_code == 0
    r = c.call(ApiKey.LIST_GROUPS, 4, dict(states_filter=["Empty"]))
    assert group in {g.group_id for g in r.groups}
    # An empty group takes standalone commits (generation -1), as assign() consumers and tools send.
    assert commit(c, group, -1, "", [(topic_name, 0, 0, "")]) == {(topic_name, 0): 0}
    c.close()


GroupsOwned = {
    ApiKey.FIND_COORDINATOR: (0, 6), ApiKey.JOIN_GROUP: (0, 9), ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.HEARTBEAT: (0, 4), ApiKey.LEAVE_GROUP: (0, 5), ApiKey.DESCRIBE_GROUPS: (0, 6),
    ApiKey.LIST_GROUPS: (0, 5), ApiKey.DELETE_GROUPS: (0, 2), ApiKey.OFFSET_COMMIT: (2, 9),
    ApiKey.OFFSET_FETCH: (1, 9), ApiKey.OFFSET_DELETE: (0, 0), ApiKey.INIT_PRODUCER_ID: (0, 5),
}


def test_every_advertised_version_is_answered(broker, topic_name):
    """Each version a client may pick gets a well-formed answer on a connection that stays open."""
    c = RawClient(broker.bootstrap)
    versions = c.call(ApiKey.API_VERSIONS, 3, dict(client_software_name="t", client_software_version="1"))
    advertised = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    for api, expected in GroupsOwned.items():
        assert advertised[api] == expected, ApiKey(api).name
    group = f"all-{topic_name}"
    commit_topic = request_class(ApiKey.OFFSET_COMMIT).OffsetCommitRequestTopic
    bodies = {
        ApiKey.FIND_COORDINATOR: lambda v: dict(key=group, key_type=0, coordinator_keys=[group]),
        ApiKey.JOIN_GROUP: lambda v: dict(group_id=group, session_timeout_ms=10, rebalance_timeout_ms=10,
                                          member_id="", protocol_type="consumer", protocols=[]),
        ApiKey.SYNC_GROUP: lambda v: dict(group_id=group, generation_id=1, member_id="m", assignments=[]),
        ApiKey.HEARTBEAT: lambda v: dict(group_id=group, generation_id=1, member_id="m"),
        ApiKey.LEAVE_GROUP: lambda v: dict(group_id=group, member_id="m", members=[]),
        ApiKey.DESCRIBE_GROUPS: lambda v: dict(groups=[group]),
        ApiKey.LIST_GROUPS: lambda v: dict(states_filter=[], types_filter=[]),
        ApiKey.DELETE_GROUPS: lambda v: dict(groups_names=[group]),
        ApiKey.OFFSET_COMMIT: lambda v: dict(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                             topics=[commit_topic(name=topic_name, partitions=[
                                                 commit_topic.OffsetCommitRequestPartition(
                                                     partition_index=0, committed_offset=0, committed_metadata=None)])]),
        ApiKey.OFFSET_FETCH: lambda v: dict(group_id=group, topics=None if v >= 2 else [],
                                            groups=[FetchGroup(group_id=group, topics=None)]),
        ApiKey.OFFSET_DELETE: lambda v: dict(group_id=group, topics=[]),
        ApiKey.INIT_PRODUCER_ID: lambda v: dict(transactional_id=None, transaction_timeout_ms=60_000),
    }
    for api, (lo, hi) in GroupsOwned.items():
        for version in range(lo, hi + 1):
            response = c.call(api, version, bodies[api](version))
            assert response is not None, (ApiKey(api).name, version)
    c.close()
