"""The classic group protocol as the coordinator runs it, driven by real asyncio timers."""
from __future__ import annotations

import asyncio
import struct

import pytest

from fluvial.broker.groups import GroupConfig, GroupCoordinator, GroupState, GroupStorage
from fluvial.broker.groups.coordinator import NON_EMPTY_GROUP, OffsetCommitEntry
from fluvial.broker.groups.group import parse_subscription_topics
from fluvial.broker.metadata import MetadataStore
from fluvial.protocol.errors import ErrorCode as E


def subscription(*topics: str, version: int = 1) -> bytes:
    """A ConsumerProtocolSubscription as the Java client writes it."""
    out = struct.pack(">hi", version, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    out += struct.pack(">i", -1)  # user data
    if version >= 1:
        out += struct.pack(">i", 0)  # owned partitions
    return out


CONFIG = GroupConfig(min_session_timeout_ms=10, initial_rebalance_delay_ms=50)


class Clock:
    def __init__(self, now: int = 1_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


def make_coordinator(tmp_path, *, config=CONFIG, clock=None, topics=None) -> GroupCoordinator:
    store = MetadataStore(tmp_path / "metadata.db")
    topics = topics if topics is not None else {"t": 6, "u": 2}
    return GroupCoordinator(
        GroupStorage(store), config,
        partition_exists=lambda t, p: t in topics and 0 <= p < topics[t],
        now_ms=clock or Clock())


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


async def join(c: GroupCoordinator, member_id: str = "", *, group="g", instance=None, protocols=None,
               session=2000, rebalance=1000, client="c", require_known=False):
    return await c.join_group(
        group_id=group, member_id=member_id, group_instance_id=instance, client_id=client,
        client_host="/127.0.0.1", session_timeout_ms=session, rebalance_timeout_ms=rebalance,
        protocol_type="consumer", protocols=protocols or [("range", subscription("t"))],
        require_known_member_id=require_known)


async def join_fresh(c, **kw):
    """JoinGroup v4+: first without member id (MEMBER_ID_REQUIRED), then with it."""
    first = await join(c, require_known=True, **kw)
    assert first.error == E.MEMBER_ID_REQUIRED and first.member_id
    return await join(c, first.member_id, require_known=True, **kw)


async def form_group(c, n: int, **kw):
    """n members join at once and sync; returns their join results."""
    results = await asyncio.gather(*(join_fresh(c, client=f"c{i}", **kw) for i in range(n)))
    leader = next(r for r in results if r.leader_id == r.member_id)
    assignments = {r.member_id: f"assign-{r.member_id}".encode() for r in results}
    syncs = await asyncio.gather(*(
        c.sync_group(group_id=kw.get("group", "g"), generation_id=r.generation_id, member_id=r.member_id,
                     assignments=assignments if r is leader else None)
        for r in results))
    for r, s in zip(results, syncs):
        assert s.error == E.NONE and s.assignment == assignments[r.member_id]
    return results


def test_member_id_required_then_single_member_group(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        first = await join(c, require_known=True)
        assert first.error == E.MEMBER_ID_REQUIRED
        assert first.member_id.startswith("c-")
        res = await join(c, first.member_id, require_known=True)
        assert res.error == E.NONE
        assert res.generation_id == 1
        assert res.leader_id == res.member_id == first.member_id
        assert res.protocol_name == "range" and res.protocol_type == "consumer"
        assert [m.member_id for m in res.members] == [res.member_id]
        assert c.group("g").state == GroupState.COMPLETING_REBALANCE
        sync = await c.sync_group(group_id="g", generation_id=1, member_id=res.member_id,
                                  assignments={res.member_id: b"a"})
        assert sync.error == E.NONE and sync.assignment == b"a"
        assert c.group("g").state == GroupState.STABLE
        assert c.heartbeat(group_id="g", generation_id=1, member_id=res.member_id) == E.NONE
        await c.close()
    run(scenario())


def test_three_members_form_one_generation_leader_sees_all(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        results = await form_group(c, 3)
        assert {r.generation_id for r in results} == {1}
        assert len({r.leader_id for r in results}) == 1
        leader = [r for r in results if r.leader_id == r.member_id]
        assert len(leader) == 1 and len(leader[0].members) == 3
        assert all(r.members == [] for r in results if r is not leader[0])
        assert c.group("g").state == GroupState.STABLE
        await c.close()
    run(scenario())


def test_protocol_chosen_among_those_all_members_support(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        meta = subscription("t")
        a, b = await asyncio.gather(
            join_fresh(c, protocols=[("cooperative-sticky", meta), ("range", meta)]),
            join_fresh(c, protocols=[("range", meta), ("roundrobin", meta)], client="d"))
        assert a.protocol_name == b.protocol_name == "range"
        # A member sharing no protocol with the group is refused and changes nothing.
        bad = await join(c, protocols=[("sticky", meta)], client="e")
        assert bad.error == E.INCONSISTENT_GROUP_PROTOCOL
        assert len(c.group("g").members) == 2
        await c.close()
    run(scenario())


def test_most_preferred_protocol_wins_the_vote(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        meta = subscription("t")
        both = [("cooperative-sticky", meta), ("range", meta)]
        results = await asyncio.gather(*(join_fresh(c, protocols=both, client=f"x{i}") for i in range(3)))
        assert {r.protocol_name for r in results} == {"cooperative-sticky"}
        await c.close()
    run(scenario())


def test_new_member_triggers_rebalance_and_everyone_rejoins(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        (a,) = await form_group(c, 1)
        newcomer = asyncio.ensure_future(join_fresh(c, client="late"))
        await asyncio.sleep(0.05)
        assert c.group("g").state == GroupState.PREPARING_REBALANCE
        assert c.heartbeat(group_id="g", generation_id=1, member_id=a.member_id) == E.REBALANCE_IN_PROGRESS
        # Offsets may still be committed while the rebalance is being prepared.
        errs = await c.commit_offsets(group_id="g", generation_id=1, member_id=a.member_id,
                                      group_instance_id=None, offsets=[OffsetCommitEntry("t", 0, 5)])
        assert errs == {("t", 0): E.NONE}
        a2 = await join(c, a.member_id)
        b = await newcomer
        assert a2.generation_id == b.generation_id == 2
        assert a2.error == b.error == E.NONE
        # The old generation is refused.
        assert c.heartbeat(group_id="g", generation_id=1, member_id=a.member_id) == E.ILLEGAL_GENERATION
        sync_old = await c.sync_group(group_id="g", generation_id=1, member_id=a.member_id)
        assert sync_old.error == E.ILLEGAL_GENERATION
        await c.close()
    run(scenario())


def test_heartbeat_errors(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        (a,) = await form_group(c, 1)
        assert c.heartbeat(group_id="nope", generation_id=1, member_id=a.member_id) == E.UNKNOWN_MEMBER_ID
        assert c.heartbeat(group_id="g", generation_id=1, member_id="ghost") == E.UNKNOWN_MEMBER_ID
        assert c.heartbeat(group_id="g", generation_id=7, member_id=a.member_id) == E.ILLEGAL_GENERATION
        assert c.heartbeat(group_id="", generation_id=1, member_id=a.member_id) == E.INVALID_GROUP_ID
        sync = await c.sync_group(group_id="g", generation_id=1, member_id="ghost")
        assert sync.error == E.UNKNOWN_MEMBER_ID
        rejoin = await join(c, "ghost")
        assert rejoin.error == E.UNKNOWN_MEMBER_ID
        assert (await join(c, session=5)).error == E.INVALID_SESSION_TIMEOUT
        await c.close()
    run(scenario())


def test_session_timeout_expires_a_silent_member(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        a, b = await form_group(c, 2, session=300)
        # Only a heartbeats; b goes silent as if killed.
        for _ in range(6):
            await asyncio.sleep(0.1)
            err = c.heartbeat(group_id="g", generation_id=1, member_id=a.member_id)
            if err == E.REBALANCE_IN_PROGRESS:
                break
        assert err == E.REBALANCE_IN_PROGRESS
        assert not c.group("g").has(b.member_id)
        a2 = await join(c, a.member_id, session=300)
        assert a2.generation_id == 2 and [m.member_id for m in a2.members] == [a.member_id]
        await c.close()
    run(scenario())


def test_member_that_does_not_rejoin_is_dropped_at_rebalance_timeout(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        a, b = await form_group(c, 2, rebalance=300, session=5000)
        started = asyncio.get_running_loop().time()
        a2 = await join(c, a.member_id, rebalance=300, session=5000)  # leader rejoins: rebalance
        waited = asyncio.get_running_loop().time() - started
        assert a2.error == E.NONE and a2.generation_id == 2
        assert 0.25 < waited < 2
        assert [m.member_id for m in a2.members] == [a.member_id]
        assert c.heartbeat(group_id="g", generation_id=1, member_id=b.member_id) == E.UNKNOWN_MEMBER_ID
        await c.close()
    run(scenario())


def test_member_that_never_syncs_is_removed(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        a, b = await asyncio.gather(join_fresh(c, rebalance=200), join_fresh(c, rebalance=200, client="d"))
        leader, follower = (a, b) if a.leader_id == a.member_id else (b, a)
        sync = await c.sync_group(group_id="g", generation_id=1, member_id=leader.member_id,
                                  assignments={leader.member_id: b"x", follower.member_id: b"y"})
        assert sync.error == E.NONE
        # The follower never syncs: removed once the 200 ms rebalance timeout has passed (polled,
        # so a loaded machine that fires the timer late does not fail the test).
        assert c.group("g").has(follower.member_id)
        deadline = asyncio.get_running_loop().time() + 10
        while c.group("g").has(follower.member_id) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        assert not c.group("g").has(follower.member_id)
        assert c.heartbeat(group_id="g", generation_id=1, member_id=leader.member_id) == E.REBALANCE_IN_PROGRESS
        await c.close()
    run(scenario())


def test_follower_waits_for_leader_assignment(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        a, b = await asyncio.gather(join_fresh(c), join_fresh(c, client="d"))
        leader, follower = (a, b) if a.leader_id == a.member_id else (b, a)
        waiting = asyncio.ensure_future(c.sync_group(group_id="g", generation_id=1, member_id=follower.member_id))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        # Commits in CompletingRebalance are answered REBALANCE_IN_PROGRESS.
        errs = await c.commit_offsets(group_id="g", generation_id=1, member_id=follower.member_id,
                                      group_instance_id=None, offsets=[OffsetCommitEntry("t", 1, 1)])
        assert errs[("t", 1)] == E.REBALANCE_IN_PROGRESS
        await c.sync_group(group_id="g", generation_id=1, member_id=leader.member_id,
                           assignments={leader.member_id: b"L", follower.member_id: b"F"})
        assert (await waiting).assignment == b"F"
        await c.close()
    run(scenario())


def test_leave_group_batch_and_unknown_members(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        a, b, d = await form_group(c, 3)
        res = c.leave_group("g", [(a.member_id, None), ("ghost", None), (b.member_id, None)])
        assert res.error == E.NONE
        assert [m.error for m in res.members] == [E.NONE, E.UNKNOWN_MEMBER_ID, E.NONE]
        assert c.heartbeat(group_id="g", generation_id=1, member_id=d.member_id) == E.REBALANCE_IN_PROGRESS
        d2 = await join(c, d.member_id)
        assert d2.generation_id == 2 and len(d2.members) == 1
        last = c.leave_group("g", [(d.member_id, None)])
        assert last.members[0].error == E.NONE
        await asyncio.sleep(0)
        assert c.group("g").state == GroupState.EMPTY
        unknown = c.leave_group("other", [("x", None)])
        assert unknown.members[0].error == E.UNKNOWN_MEMBER_ID
        await c.close()
    run(scenario())


def test_leaving_member_releases_a_pending_join(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        a, b = await form_group(c, 2, rebalance=10_000)
        rejoin = asyncio.ensure_future(join(c, a.member_id, rebalance=10_000))
        await asyncio.sleep(0.05)
        assert not rejoin.done()
        c.leave_group("g", [(b.member_id, None)])
        res = await asyncio.wait_for(rejoin, 1)
        assert res.generation_id == 2 and len(res.members) == 1
        await c.close()
    run(scenario())


def test_static_member_rejoins_without_rebalance_and_fences_old_id(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        a, b = await asyncio.gather(join(c, instance="i-a", client="a"), join(c, instance="i-b", client="b"))
        assert a.error == b.error == E.NONE  # static members need no MEMBER_ID_REQUIRED round
        leader, follower = (a, b) if a.leader_id == a.member_id else (b, a)
        await c.sync_group(group_id="g", generation_id=1, member_id=leader.member_id,
                           assignments={leader.member_id: b"L", follower.member_id: b"F"})
        follower_instance = "i-a" if follower is a else "i-b"
        # The follower restarts: same instance id, no member id.
        again = await join(c, instance=follower_instance, client="restarted")
        assert again.error == E.NONE
        assert again.member_id != follower.member_id
        assert again.generation_id == 1 and again.leader_id == leader.member_id and again.members == []
        assert c.group("g").state == GroupState.STABLE
        sync = await c.sync_group(group_id="g", generation_id=1, member_id=again.member_id,
                                  group_instance_id=follower_instance)
        assert sync.assignment == b"F"
        # The old incarnation is fenced everywhere.
        assert c.heartbeat(group_id="g", generation_id=1, member_id=follower.member_id,
                           group_instance_id=follower_instance) == E.FENCED_INSTANCE_ID
        errs = await c.commit_offsets(group_id="g", generation_id=1, member_id=follower.member_id,
                                      group_instance_id=follower_instance, offsets=[OffsetCommitEntry("t", 0, 1)])
        assert errs[("t", 0)] == E.FENCED_INSTANCE_ID
        assert c.heartbeat(group_id="g", generation_id=1, member_id=leader.member_id) == E.NONE
        # LeaveGroup by instance id with a stale member id is fenced; with the right one it leaves.
        res = c.leave_group("g", [(follower.member_id, follower_instance)])
        assert res.members[0].error == E.FENCED_INSTANCE_ID
        res = c.leave_group("g", [("", follower_instance)])
        assert res.members[0].error == E.NONE
        assert c.heartbeat(group_id="g", generation_id=1, member_id=leader.member_id) == E.REBALANCE_IN_PROGRESS
        await c.close()
    run(scenario())


def test_static_leader_restart_keeps_old_leader_id_in_answer(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        a = await join(c, instance="solo")
        await c.sync_group(group_id="g", generation_id=1, member_id=a.member_id, assignments={a.member_id: b"A"})
        again = await join(c, instance="solo")
        assert again.error == E.NONE and again.generation_id == 1
        assert again.leader_id == a.member_id != again.member_id
        sync = await c.sync_group(group_id="g", generation_id=1, member_id=again.member_id, group_instance_id="solo")
        assert sync.assignment == b"A"
        await c.close()
    run(scenario())


def test_describe_list_and_delete_groups(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        await form_group(c, 2, protocols=[("range", subscription("t", "u"))])
        await c.commit_offsets(group_id="solo", generation_id=-1, member_id="", group_instance_id=None,
                               offsets=[OffsetCommitEntry("t", 0, 3)])
        (desc, missing) = c.describe_groups(["g", "missing"])
        assert desc.state == "Stable" and desc.protocol_type == "consumer" and desc.protocol_name == "range"
        assert len(desc.members) == 2
        assert all(parse_subscription_topics(m.metadata) == ["t", "u"] for m in desc.members)
        assert all(m.assignment.startswith(b"assign-") for m in desc.members)
        assert all(m.client_host == "/127.0.0.1" for m in desc.members)
        assert not missing.found and missing.state == "Dead"
        listed = {g.group_id: g for g in c.list_groups()}
        assert listed["g"].state == "Stable" and listed["g"].protocol_type == "consumer"
        assert listed["solo"].state == "Empty" and listed["solo"].protocol_type == ""
        assert [g.group_id for g in c.list_groups(states=["empty"])] == ["solo"]
        assert [g.group_id for g in c.list_groups(states=["Stable"])] == ["g"]
        errs = await c.delete_groups(["g", "solo", "missing"])
        assert errs == {"g": NON_EMPTY_GROUP, "solo": E.NONE, "missing": E.GROUP_ID_NOT_FOUND}
        assert NON_EMPTY_GROUP == 68
        assert c.fetch_offsets("solo", [("t", 0)])[1][("t", 0)] is None
        await c.close()
    run(scenario())


def test_offset_commit_fetch_and_validation(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        (a,) = await form_group(c, 1)
        entries = [
            OffsetCommitEntry("t", 0, 42, leader_epoch=3, metadata="hello"),
            OffsetCommitEntry("t", 1, 11),                # past the log end: accepted, as Kafka does
            OffsetCommitEntry("t", 2, -5),                # negative
            OffsetCommitEntry("nope", 0, 1),              # unknown topic
            OffsetCommitEntry("t", 6, 1),                 # unknown partition
            OffsetCommitEntry("t", 3, 1, metadata="x" * 5000),
        ]
        errs = await c.commit_offsets(group_id="g", generation_id=1, member_id=a.member_id,
                                      group_instance_id=None, offsets=entries)
        assert errs == {
            ("t", 0): E.NONE, ("t", 1): E.NONE, ("t", 2): E.OFFSET_OUT_OF_RANGE,
            ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION, ("t", 6): E.UNKNOWN_TOPIC_OR_PARTITION,
            ("t", 3): E.OFFSET_METADATA_TOO_LARGE,
        }
        err, fetched = c.fetch_offsets("g", [("t", 0), ("t", 1), ("nope", 0)])
        assert err == E.NONE
        assert fetched[("t", 0)].offset == 42 and fetched[("t", 0)].leader_epoch == 3
        assert fetched[("t", 0)].metadata == "hello"
        assert fetched[("t", 1)].offset == 11 and fetched[("nope", 0)] is None
        assert set(c.fetch_offsets("g", None)[1]) == {("t", 0), ("t", 1)}
        # Committer checks: wrong generation, unknown member, standalone commit to a live group.
        wrong_gen = await c.commit_offsets(group_id="g", generation_id=9, member_id=a.member_id,
                                           group_instance_id=None, offsets=[OffsetCommitEntry("t", 0, 1)])
        assert wrong_gen == {("t", 0): E.ILLEGAL_GENERATION}
        ghost = await c.commit_offsets(group_id="g", generation_id=1, member_id="ghost",
                                       group_instance_id=None, offsets=[OffsetCommitEntry("t", 0, 1)])
        assert ghost == {("t", 0): E.UNKNOWN_MEMBER_ID}
        standalone = await c.commit_offsets(group_id="g", generation_id=-1, member_id="",
                                            group_instance_id=None, offsets=[OffsetCommitEntry("t", 0, 1)])
        assert standalone == {("t", 0): E.UNKNOWN_MEMBER_ID}
        assert c.fetch_offsets("g", [("t", 0)])[1][("t", 0)].offset == 42
        # A group that does not exist: generation >= 0 is a stale member, -1 a standalone committer.
        stale = await c.commit_offsets(group_id="new", generation_id=3, member_id="m",
                                       group_instance_id=None, offsets=[OffsetCommitEntry("t", 0, 1)])
        assert stale == {("t", 0): E.ILLEGAL_GENERATION}
        simple = await c.commit_offsets(group_id="new", generation_id=-1, member_id="",
                                        group_instance_id=None, offsets=[OffsetCommitEntry("t", 0, 7)])
        assert simple == {("t", 0): E.NONE}
        assert c.fetch_offsets("new", [("t", 0)])[1][("t", 0)].offset == 7
        await c.close()
    run(scenario())


def test_offset_delete_respects_subscriptions(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        (a,) = await form_group(c, 1, protocols=[("range", subscription("t"))])
        await c.commit_offsets(group_id="g", generation_id=1, member_id=a.member_id, group_instance_id=None,
                               offsets=[OffsetCommitEntry("t", 0, 1), OffsetCommitEntry("u", 0, 2)])
        err, parts = await c.delete_offsets("g", [("t", 0), ("u", 0), ("zz", 0)])
        assert err == E.NONE
        assert parts == {("t", 0): E.GROUP_SUBSCRIBED_TO_TOPIC, ("u", 0): E.NONE,
                         ("zz", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
        assert set(c.fetch_offsets("g", None)[1]) == {("t", 0)}
        assert (await c.delete_offsets("missing", [("t", 0)]))[0] == E.GROUP_ID_NOT_FOUND
        # Once the group is empty everything may go, and the group with it.
        c.leave_group("g", [(a.member_id, None)])
        await asyncio.sleep(0.01)
        err, parts = await c.delete_offsets("g", [("t", 0)])
        assert err == E.NONE and parts == {("t", 0): E.NONE}
        assert c.group("g") is None
        await c.close()
    run(scenario())


def test_offsets_and_stable_group_survive_restart(tmp_path):
    async def first_life():
        c = make_coordinator(tmp_path)
        await c.start()
        a, b = await form_group(c, 2, session=5000)
        await c.commit_offsets(group_id="g", generation_id=1, member_id=a.member_id, group_instance_id=None,
                               offsets=[OffsetCommitEntry("t", 0, 17, 2, "meta")])
        await c.commit_offsets(group_id="standalone", generation_id=-1, member_id="", group_instance_id=None,
                               offsets=[OffsetCommitEntry("u", 1, 4)])
        await c.close()
        return a, b

    async def second_life(a, b):
        c = make_coordinator(tmp_path)
        await c.start()
        got = c.fetch_offsets("g", [("t", 0)])[1][("t", 0)]
        assert (got.offset, got.leader_epoch, got.metadata) == (17, 2, "meta")
        assert c.fetch_offsets("standalone", None)[1][("u", 1)].offset == 4
        # Members of the stable generation carry on as if nothing happened.
        assert c.group("g").state == GroupState.STABLE
        assert c.heartbeat(group_id="g", generation_id=1, member_id=a.member_id) == E.NONE
        sync = await c.sync_group(group_id="g", generation_id=1, member_id=b.member_id)
        assert sync.assignment == f"assign-{b.member_id}".encode()
        # A new member's generation continues from the stored one.
        newcomer = asyncio.ensure_future(join_fresh(c, client="late"))
        await asyncio.sleep(0.05)
        await asyncio.gather(join(c, a.member_id), join(c, b.member_id))
        assert (await newcomer).generation_id == 2
        await c.close()

    a, b = run(first_life())
    run(second_life(a, b))


def test_offsets_expire_after_retention(tmp_path):
    clock = Clock()
    config = GroupConfig(min_session_timeout_ms=10, initial_rebalance_delay_ms=0, offsets_retention_ms=1000)

    async def scenario():
        c = make_coordinator(tmp_path, config=config, clock=clock)
        await c.start()
        (a,) = await form_group(c, 1)
        await c.commit_offsets(group_id="g", generation_id=1, member_id=a.member_id, group_instance_id=None,
                               offsets=[OffsetCommitEntry("t", 0, 5)])
        await c.commit_offsets(group_id="simple", generation_id=-1, member_id="", group_instance_id=None,
                               offsets=[OffsetCommitEntry("t", 1, 6)])
        clock.now += 5000
        # The consumer group is still active: its subscribed offsets stay; the standalone one expires.
        assert await c.expire_offsets() == 1
        assert c.fetch_offsets("g", [("t", 0)])[1][("t", 0)].offset == 5
        assert c.group("simple") is None
        c.leave_group("g", [(a.member_id, None)])
        await asyncio.sleep(0.01)
        assert c.group("g").state == GroupState.EMPTY
        clock.now += 500
        assert await c.expire_offsets() == 0  # retention counts from when the group emptied
        clock.now += 600
        assert await c.expire_offsets() == 1
        assert c.group("g") is None and c.fetch_offsets("g", None)[1] == {}
        await c.close()

    run(scenario())
    # Expiry is durable too.
    async def reopened():
        c = make_coordinator(tmp_path, config=config, clock=clock)
        await c.start()
        assert c.fetch_offsets("g", None)[1] == {} and c.list_groups() == []
        await c.close()
    run(reopened())


def test_pending_member_that_never_returns_does_not_block_the_group(tmp_path):
    async def scenario():
        c = make_coordinator(tmp_path)
        await c.start()
        (a,) = await form_group(c, 1, session=200)
        ghost = await join(c, require_known=True, session=200, client="ghost")
        assert ghost.error == E.MEMBER_ID_REQUIRED
        # The leader rejoins; the pending id expires after its session timeout.
        res = await asyncio.wait_for(join(c, a.member_id, session=200), 2)
        assert res.error == E.NONE and len(res.members) == 1
        await c.close()
    run(scenario())


def test_subscription_topics_parse():
    assert parse_subscription_topics(subscription("a", "bb", version=0)) == ["a", "bb"]
    assert parse_subscription_topics(subscription(version=3)) == []
    with pytest.raises(Exception):
        parse_subscription_topics(b"\x00\x01\x00\x00\x00\x05\x00\x09ab")
