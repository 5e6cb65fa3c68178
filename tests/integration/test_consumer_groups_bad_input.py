"""KIP-848 requests that are wrong get Kafka's error codes and change nothing: wrong member
epochs, unknown members, bad joins, commits from stale members, and the classic protocol
meeting a consumer group (and the other way round)."""
from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewTopic

from fluvial.protocol.errors import ErrorCode as E
from fluvial.protocol.messages import ApiKey, request_class
from tests.integration.test_groups_bad_input import commit, join
from tests.integration.test_idempotence import RawClient
from tests.support.kafka_wire import WireClient

HB = ApiKey.CONSUMER_GROUP_HEARTBEAT
Owned = request_class(HB).TopicPartitions
CommitTopic = request_class(ApiKey.OFFSET_COMMIT).OffsetCommitRequestTopic
FetchGroup = request_class(ApiKey.OFFSET_FETCH).OffsetFetchRequestGroup


def heartbeat(c: WireClient, group: str, member: str, epoch: int, **fields):
    body = dict(group_id=group, member_id=member, member_epoch=epoch, instance_id=None, rack_id=None,
                rebalance_timeout_ms=-1, subscribed_topic_names=None, subscribed_topic_regex=None,
                server_assignor=None, topic_partitions=None)
    body.update(fields)
    return c.request(HB, 1, body)


def join_848(c: WireClient, group: str, member: str, topic: str, **fields):
    return heartbeat(c, group, member, 0, rebalance_timeout_ms=30_000, subscribed_topic_names=[topic],
                     topic_partitions=[], **fields)


def describe(c: WireClient, group: str):
    return c.request(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, dict(group_ids=[group],
                                                             include_authorized_operations=False)).groups[0]


def commit_v9(c: WireClient, group: str, member: str, epoch: int, topic: str, offset: int) -> int:
    r = c.request(ApiKey.OFFSET_COMMIT, 9, dict(
        group_id=group, generation_id_or_member_epoch=epoch, member_id=member, group_instance_id=None,
        topics=[CommitTopic(name=topic, partitions=[CommitTopic.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")])]))
    return r.topics[0].partitions[0].error_code


def fetch_v9(c: WireClient, group: str, member: str | None, epoch: int):
    r = c.request(ApiKey.OFFSET_FETCH, 9, dict(groups=[FetchGroup(group_id=group, member_id=member,
                                                                   member_epoch=epoch, topics=None)],
                                               require_stable=False))
    g = r.groups[0]
    return g.error_code, {p.partition_index: p.committed_offset for t in g.topics for p in t.partitions}


def test_consumer_group_heartbeats_with_wrong_epochs_members_and_fields(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(15)
    group = f"g848-{topic_name}"
    with WireClient(broker.bootstrap) as c:
        # Joins missing what a first heartbeat must carry.
        assert heartbeat(c, group, "m1", 0, subscribed_topic_names=[topic_name], topic_partitions=[]).error_code \
            == E.INVALID_REQUEST  # no rebalance timeout
        assert heartbeat(c, group, "", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=[topic_name],
                         topic_partitions=[]).error_code == E.INVALID_REQUEST  # v1: the client names itself
        assert join_848(c, group, "m1", topic_name, server_assignor="sticky").error_code == E.UNSUPPORTED_ASSIGNOR
        assert heartbeat(c, group, "m1", 0, rebalance_timeout_ms=30_000, subscribed_topic_regex="(",
                         topic_partitions=[]).error_code == E.INVALID_REGULAR_EXPRESSION
        assert heartbeat(c, group, "m1", 3).error_code == E.UNKNOWN_MEMBER_ID  # no such group yet
        assert describe(c, group).error_code == E.GROUP_ID_NOT_FOUND

        first = join_848(c, group, "m1", topic_name, server_assignor="range")
        assert first.error_code == 0 and first.member_epoch == 1 and first.member_id == "m1"
        assert sorted(first.assignment.topic_partitions[0].partitions) == [0, 1]
        before = describe(c, group)
        assert (before.group_state, before.group_epoch, before.assignor_name) == ("Stable", 1, "range")

        assert heartbeat(c, group, "m1", 5).error_code == E.FENCED_MEMBER_EPOCH      # ahead of the coordinator
        assert heartbeat(c, group, "nobody", 1).error_code == E.UNKNOWN_MEMBER_ID
        left = heartbeat(c, group, "m1", -1)
        assert (left.error_code, left.member_epoch) == (0, -1)
        # A member that left joins again (under the same id, as KIP-1082 clients do).
        again = join_848(c, group, "m1", topic_name)
        assert again.error_code == 0 and again.member_epoch == 3
        assert heartbeat(c, group, "m1", 1).error_code == E.FENCED_MEMBER_EPOCH      # behind, not the previous one
        assert heartbeat(c, group, "nobody", -1).error_code == E.UNKNOWN_MEMBER_ID   # leaving as a stranger
        assert heartbeat(c, group, "m1", -2).error_code == E.INVALID_REQUEST         # static leave without instance
        after = describe(c, group)
        assert (after.group_epoch, [(m.member_id, m.member_epoch) for m in after.members]) == (3, [("m1", 3)])

        # Offsets: a member commits with its epoch; a stale epoch or a stranger is refused.
        assert commit_v9(c, group, "m1", 3, topic_name, 7) == 0
        assert commit_v9(c, group, "m1", 2, topic_name, 9) == E.STALE_MEMBER_EPOCH
        assert commit_v9(c, group, "ghost", 3, topic_name, 9) == E.UNKNOWN_MEMBER_ID
        assert commit_v9(c, group, "", -1, topic_name, 9) == E.UNKNOWN_MEMBER_ID  # the group has members
        with_v8 = commit(RawClient(broker.bootstrap), group, 3, "m1", [(topic_name, 0, 9, "")])
        assert with_v8[(topic_name, 0)] == E.UNSUPPORTED_VERSION  # members of consumer groups commit with v9+
        assert fetch_v9(c, group, "m1", 2)[0] == E.STALE_MEMBER_EPOCH
        assert fetch_v9(c, group, "ghost", 3)[0] == E.UNKNOWN_MEMBER_ID
        assert fetch_v9(c, group, "m1", 3) == (0, {0: 7})
        assert fetch_v9(c, group, None, -1) == (0, {0: 7})  # admin tools

        # The classic protocol meets the consumer group.
        raw = RawClient(broker.bootstrap)
        if True:
            assert join(raw, group, topic=topic_name).error_code == E.INCONSISTENT_GROUP_PROTOCOL
            classic = f"classic-{topic_name}"
            joined = join(raw, classic, topic=topic_name)
            joined = join(raw, classic, joined.member_id, topic=topic_name)
            assert joined.error_code == 0
            assert join_848(c, classic, "m9", topic_name).error_code == E.GROUP_ID_NOT_FOUND
            listed = {g.group_id: (g.group_type, g.group_state, g.protocol_type)
                      for g in raw.call(ApiKey.LIST_GROUPS, 5, dict(states_filter=[], types_filter=[])).groups}
            assert listed[group] == ("consumer", "Stable", "consumer")
            assert listed[classic][0] == "classic"
            d = raw.call(ApiKey.DESCRIBE_GROUPS, 5, dict(groups=[group], include_authorized_operations=False))
            assert d.groups[0].group_state == "Dead"
            assert raw.call(ApiKey.DELETE_GROUPS, 2, dict(groups_names=[group])).results[0].error_code \
                == E.NON_EMPTY_GROUP
        assert describe(c, classic).error_code == E.GROUP_ID_NOT_FOUND

        # Leaving empties the group; the offsets stay; then it can be deleted with them.
        left = heartbeat(c, group, "m1", -1)
        assert (left.error_code, left.member_epoch) == (0, -1)
        assert describe(c, group).group_state == "Empty"
        assert commit_v9(c, group, "", -1, topic_name, 11) == 0  # admin commit to an empty group
        assert fetch_v9(c, group, None, -1) == (0, {0: 11})
        assert raw.call(ApiKey.DELETE_GROUPS, 2, dict(groups_names=[group])).results[0].error_code == 0
        raw.close()
        assert describe(c, group).error_code == E.GROUP_ID_NOT_FOUND
        assert fetch_v9(c, group, None, -1) == (0, {})


def partitions_of(response) -> list[int]:
    return sorted(p for tp in response.assignment.topic_partitions for p in tp.partitions)


def test_revoke_then_assign_static_members_and_regex_subscriptions(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 4, 1)])[topic_name].result(15)
    group = f"g848s-{topic_name}"
    with WireClient(broker.bootstrap) as c:
        one = join_848(c, group, "m1", topic_name, instance_id="i1", server_assignor="range")
        assert partitions_of(one) == [0, 1, 2, 3]
        tid = one.assignment.topic_partitions[0].topic_id
        # A second member: it gets the new epoch but nothing m1 still owns.
        two = join_848(c, group, "m2", topic_name, server_assignor="range")
        assert two.member_epoch == 2 and partitions_of(two) == []
        # m1 is told to keep 0-1 and give up 2-3, at its old epoch.
        r = heartbeat(c, group, "m1", 1, topic_partitions=[Owned(topic_id=tid, partitions=[0, 1, 2, 3])])
        assert r.member_epoch == 1 and partitions_of(r) == [0, 1]
        assert heartbeat(c, group, "m2", 2).assignment is None  # still nothing released
        r = heartbeat(c, group, "m1", 1, topic_partitions=[Owned(topic_id=tid, partitions=[0, 1])])
        assert r.member_epoch == 2
        assert partitions_of(heartbeat(c, group, "m2", 2)) == [2, 3]

        # Static member m1 restarts: it keeps its partitions while it is away...
        assert heartbeat(c, group, "m1", -2, instance_id="i1").member_epoch == -2
        assert join_848(c, group, "m3", topic_name, instance_id="i2").error_code == 0
        d = describe(c, group)
        owned = {m.member_id: sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions)
                 for m in d.members}
        assert owned["m1"] == [0, 1] and owned["m3"] == []
        # ...nobody else may use its instance id while it has not left...
        assert join_848(c, group, "m4", topic_name, instance_id="i2").error_code == E.UNRELEASED_INSTANCE_ID
        # ...and it comes back under a new member id with the same partitions.
        back = join_848(c, group, "m1b", topic_name, instance_id="i1")
        assert back.error_code == 0 and partitions_of(back) == [0, 1]
        assert "m1" not in {m.member_id for m in describe(c, group).members}

        # A regex subscription follows new topics.
        regex_group = f"g848r-{topic_name}"
        prefix = f"rx{topic_name[2:8]}"
        admin.create_topics([NewTopic(f"{prefix}.a", 2, 1)])[f"{prefix}.a"].result(15)
        r = heartbeat(c, regex_group, "r1", 0, rebalance_timeout_ms=30_000, subscribed_topic_regex=rf"{prefix}\..*",
                      topic_partitions=[])
        assert r.error_code == 0 and partitions_of(r) == [0, 1]
        admin.create_topics([NewTopic(f"{prefix}.b", 3, 1)])[f"{prefix}.b"].result(15)
        r = heartbeat(c, regex_group, "r1", r.member_epoch)
        assert r.member_epoch == 2 and len(r.assignment.topic_partitions) == 2 and len(partitions_of(r)) == 5


def test_members_carry_on_across_a_broker_kill(fresh_broker, topic_name):
    """The group's state is durable: after kill -9 and restart the members keep their epochs
    and partitions (no rebalance), and the id is still a consumer group."""
    broker = fresh_broker()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 4, 1)])[topic_name].result(15)
    group = f"g848k-{topic_name}"
    with WireClient(broker.bootstrap) as c:
        one = join_848(c, group, "m1", topic_name, server_assignor="range")
        tid = one.assignment.topic_partitions[0].topic_id
        join_848(c, group, "m2", topic_name, server_assignor="range")
        heartbeat(c, group, "m1", 1, topic_partitions=[Owned(topic_id=tid, partitions=[0, 1, 2, 3])])
        assert heartbeat(c, group, "m1", 1, topic_partitions=[Owned(topic_id=tid, partitions=[0, 1])]).member_epoch == 2
        assert partitions_of(heartbeat(c, group, "m2", 2)) == [2, 3]
        before = describe(c, group)
        assert before.group_state == "Stable"
    broker.kill9()
    broker.start()
    with WireClient(broker.bootstrap) as c:
        after = describe(c, group)
        assert (after.group_state, after.group_epoch, after.assignment_epoch) == ("Stable", 2, 2)
        r1 = heartbeat(c, group, "m1", 2, topic_partitions=[Owned(topic_id=tid, partitions=[0, 1])])
        r2 = heartbeat(c, group, "m2", 2, topic_partitions=[Owned(topic_id=tid, partitions=[2, 3])])
        assert (r1.error_code, r1.member_epoch, r1.assignment) == (0, 2, None)
        assert (r2.error_code, r2.member_epoch, r2.assignment) == (0, 2, None)
        raw = RawClient(broker.bootstrap)
        assert join(raw, group, topic=topic_name).error_code == E.INCONSISTENT_GROUP_PROTOCOL
        raw.close()
