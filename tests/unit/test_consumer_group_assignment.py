"""KIP-848 server-side assignment: the uniform and range assignors and the revoke-then-assign
reconciliation that never gives one partition to two members at once."""
from __future__ import annotations

import uuid

from fluvial.broker.groups.assignors import range_assign, uniform_assign
from fluvial.broker.groups.consumer_group import ConsumerGroup, ConsumerMember, MemberState

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)


def flat(assignment):
    return sorted((m, t, p) for m, parts in assignment.items() for t, ps in parts.items() for p in ps)


def test_range_gives_contiguous_ranges_per_topic():
    subs = {"a": {T1, T2}, "b": {T1, T2}}
    out = range_assign(subs, {T1: 5, T2: 2}, {})
    assert out["a"] == {T1: {0, 1, 2}, T2: {0}}
    assert out["b"] == {T1: {3, 4}, T2: {1}}


def test_uniform_balances_and_keeps_partitions_where_they_are():
    subs = {"a": {T1}, "b": {T1}}
    first = uniform_assign(subs, {T1: 6}, {})
    assert sorted(len(p[T1]) for p in first.values()) == [3, 3]
    # A third member takes two partitions; the others keep most of theirs.
    subs["c"] = {T1}
    second = uniform_assign(subs, {T1: 6}, first)
    assert sorted(len(p.get(T1, ())) for p in second.values()) == [2, 2, 2]
    for m in ("a", "b"):
        assert second[m][T1] <= first[m][T1]
    owners = [p for parts in second.values() for p in parts.get(T1, ())]
    assert sorted(owners) == list(range(6))


def test_uniform_respects_subscriptions():
    subs = {"a": {T1}, "b": {T2}, "c": {T1, T2}}
    out = uniform_assign(subs, {T1: 3, T2: 3}, {})
    assert T2 not in out["a"] and T1 not in out["b"]
    assert sorted((t, p) for parts in out.values() for t, ps in parts.items() for p in ps) == \
        sorted([(T1, p) for p in range(3)] + [(T2, p) for p in range(3)])
    assert max(len(flat({m: out[m]})) for m in out) - min(len(flat({m: out[m]})) for m in out) <= 1


def test_reconciliation_revokes_before_it_assigns():
    group = ConsumerGroup("g")
    a = ConsumerMember("a", member_epoch=1, assigned={T1: {0, 1, 2, 3}})
    b = ConsumerMember("b")
    group.members = {"a": a, "b": b}
    group.group_epoch = group.assignment_epoch = 2
    group.target = {"a": {T1: {0, 1}}, "b": {T1: {2, 3}}}
    # b cannot have 2 and 3 while a still owns them: it gets epoch 2 with nothing yet.
    group.reconcile(b, {})
    assert b.member_epoch == 2 and b.assigned == {} and b.state == MemberState.UNRELEASED_PARTITIONS
    # a is asked to revoke 2 and 3 first, keeping its epoch.
    group.reconcile(a, {T1: {0, 1, 2, 3}})
    assert a.member_epoch == 1 and a.assigned == {T1: {0, 1}} and a.pending_revocation == {T1: {2, 3}}
    assert a.state == MemberState.UNREVOKED_PARTITIONS
    # Still owning them, a stays where it is.
    group.reconcile(a, {T1: {0, 1, 2, 3}})
    assert a.state == MemberState.UNREVOKED_PARTITIONS
    group.reconcile(b, {})
    assert b.assigned == {}
    # a reports them gone: it moves to epoch 2, and b then gets them.
    group.reconcile(a, {T1: {0, 1}})
    assert a.member_epoch == 2 and a.previous_member_epoch == 1 and a.state == MemberState.STABLE
    group.reconcile(b, {})
    assert b.assigned == {T1: {2, 3}} and b.state == MemberState.STABLE


def test_group_state_round_trips_through_json():
    group = ConsumerGroup("g", group_epoch=3, assignment_epoch=3, assignor_name="range",
                          target={"a": {T1: {0}}}, subscription_metadata={T1: 1})
    group.members["a"] = ConsumerMember("a", instance_id="i", member_epoch=3, previous_member_epoch=2,
                                        subscribed_topic_names=["t"], assigned={T1: {0}})
    again = ConsumerGroup.from_json("g", group.to_json())
    assert again.to_json() == group.to_json()
    assert again.members["a"].assigned == {T1: {0}} and again.target == {"a": {T1: {0}}}


def test_consumer_group_offsets_expire_by_kafkas_rules(tmp_path):
    """Offsets of a KIP-848 group: kept while a member subscribes to their topic; dropped
    `retention` after the commit for a topic nobody subscribes to, and `retention` after the
    group emptied for the rest."""
    import asyncio

    from fluvial.broker.groups import GroupConfig, GroupCoordinator, GroupStorage
    from fluvial.broker.groups.consumer_coordinator import ConsumerGroupCoordinator, HeartbeatRequest
    from fluvial.broker.groups.coordinator import OffsetCommitEntry
    from fluvial.broker.metadata import MetadataStore

    now = [1_000_000]
    topics = {"t": (T1, 2), "u": (T2, 1)}

    async def scenario():
        storage = GroupStorage(MetadataStore(tmp_path / "meta.db"))
        classic = GroupCoordinator(storage, GroupConfig(offsets_retention_ms=1000), now_ms=lambda: now[0])
        await classic.start()
        modern = ConsumerGroupCoordinator(classic, storage, lambda: topics)
        await modern.start()
        r = await modern.heartbeat(HeartbeatRequest("g", "m1", 0, rebalance_timeout_ms=1000,
                                                    subscribed_topic_names=["t"], owned={}))
        assert r.error == 0
        for topic in ("t", "u"):
            assert await classic.commit_offsets(group_id="g", generation_id=r.member_epoch, member_id="m1",
                                                group_instance_id=None, offsets=[OffsetCommitEntry(topic, 0, 5)],
                                                api_version=9) == {(topic, 0): 0}
        now[0] += 5000
        assert await classic.expire_offsets() == 1  # "u": nobody subscribes to it
        assert set(classic.fetch_offsets("g", None)[1]) == {("t", 0)}
        assert (await modern.heartbeat(HeartbeatRequest("g", "m1", -1))).error == 0
        now[0] += 500
        assert await classic.expire_offsets() == 0  # counted from when the group emptied
        now[0] += 600
        assert await classic.expire_offsets() == 1
        assert classic.fetch_offsets("g", None)[1] == {}
        await modern.close()
        await classic.close()

    asyncio.run(scenario())
