"""The state of one classic consumer group: members, generation, protocol, leader."""
from __future__ import annotations

import asyncio
import enum
import struct
from collections import Counter
from dataclasses import dataclass, field


class GroupState(enum.Enum):
    """The classic group protocol states, named as Kafka names them on the wire."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    @classmethod
    def parse(cls, name: str) -> "GroupState | None":
        """A state from its wire name, case-insensitively (ListGroups filters)."""
        lowered = name.lower()
        for state in cls:
            if state.value.lower() == lowered:
                return state
        return None


CONSUMER_PROTOCOL_TYPE = "consumer"


@dataclass(eq=False)
class Member:
    """One member of a classic group, as the coordinator knows it."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    # A member stays "new" until its first join completes; new members that vanish
    # while waiting for the join phase are expired on their own timer.
    is_new: bool = True
    join_future: asyncio.Future | None = None
    sync_future: asyncio.Future | None = None
    heartbeat_timer: asyncio.TimerHandle | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_future is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol_name: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        raise KeyError(protocol_name)

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        """Same protocols with the same metadata, in the same order of preference."""
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        """This member's most preferred protocol among the candidates."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError("member supports none of the candidate protocols")


@dataclass(eq=False)
class Group:
    """A classic group; the coordinator mutates it on the event loop only."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    # Member ids handed out with MEMBER_ID_REQUIRED that have not joined with them yet.
    pending_members: set[str] = field(default_factory=set)
    # Members of the current generation that have not sent SyncGroup yet.
    pending_sync: set[str] = field(default_factory=set)
    state_timestamp_ms: int = 0
    # Join phase bookkeeping (Kafka's DelayedJoin / InitialDelayedJoin).
    join_timer: asyncio.TimerHandle | None = None
    initial_delay_remaining_ms: int | None = None
    new_member_added: bool = False
    pending_members_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    sync_timer: asyncio.TimerHandle | None = None
    subscribed_topics: frozenset[str] | None = frozenset()

    # -- queries ---------------------------------------------------------------------

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def is_static_member_fenced(self, group_instance_id: str | None, member_id: str) -> bool:
        """True when the instance id is registered under a different member id."""
        if group_instance_id is None:
            return False
        known = self.static_members.get(group_instance_id)
        return known is not None and known != member_id

    def can_rebalance(self) -> bool:
        return self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY)

    def all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def not_yet_rejoined(self) -> list[Member]:
        return [m for m in self.members.values() if not m.awaiting_join]

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def is_consumer_group(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Whether a member with these protocols may join (Kafka's rule)."""
        names = [name for name, _ in protocols]
        if not protocol_type or not names:
            return False
        if self.state == GroupState.EMPTY or not self.members:
            return True
        if protocol_type != self.protocol_type:
            return False
        counts = self._protocol_counts()
        return any(counts.get(name, 0) == len(self.members) for name in names)

    def _protocol_counts(self) -> Counter:
        counts: Counter = Counter()
        for member in self.members.values():
            counts.update(set(member.protocol_names()))
        return counts

    def candidate_protocols(self) -> set[str]:
        counts = self._protocol_counts()
        return {name for name, n in counts.items() if n == len(self.members)}

    def select_protocol(self) -> str:
        """The protocol most members prefer among those all members support.

        Ties go to the protocol the leader prefers, then by name, so the choice is
        deterministic.
        """
        candidates = self.candidate_protocols()
        if not candidates:
            raise ValueError("no protocol supported by all members")
        votes = Counter(m.vote(candidates) for m in self.members.values())
        leader = self.members.get(self.leader_id or "")
        preference = {name: i for i, name in enumerate(leader.protocol_names())} if leader else {}
        return min(votes, key=lambda name: (-votes[name], preference.get(name, len(preference)), name))

    def is_subscribed_to(self, topic: str) -> bool:
        """Unknown subscriptions (non-consumer protocols) count as subscribed."""
        if self.subscribed_topics is None:
            return True
        return topic in self.subscribed_topics

    # -- changes ----------------------------------------------------------------------

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            # Prefer a member that has already rejoined, as Kafka does.
            joined = [m.member_id for m in self.members.values() if m.awaiting_join]
            self.leader_id = joined[0] if joined else next(iter(self.members), None)
        return member

    def replace_static_member(self, group_instance_id: str, old_member_id: str, new_member_id: str) -> Member:
        member = self.members.pop(old_member_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        self.static_members[group_instance_id] = new_member_id
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        if old_member_id in self.pending_sync:
            self.pending_sync.discard(old_member_id)
            self.pending_sync.add(new_member_id)
        return member

    def elect_joined_leader(self) -> bool:
        """Make sure the leader is a member that rejoined; False if none did."""
        leader = self.members.get(self.leader_id or "")
        if leader is not None and leader.awaiting_join:
            return True
        for member in self.members.values():
            if member.awaiting_join:
                self.leader_id = member.member_id
                return True
        return False

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp_ms = now_ms

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = frozenset()
            self.transition(GroupState.EMPTY, now_ms)

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        if not self.members:
            return frozenset()
        if not self.is_consumer_group() or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            try:
                topics.update(parse_subscription_topics(member.metadata_for(self.protocol_name)))
            except (KeyError, ValueError, struct.error):
                return None
        return frozenset(topics)


def parse_subscription_topics(metadata: bytes) -> list[str]:
    """Topic names of a ConsumerProtocolSubscription (any version: topics come first)."""
    view = memoryview(metadata)
    (_version,) = struct.unpack_from(">h", view, 0)
    (count,) = struct.unpack_from(">i", view, 2)
    if count < 0:
        return []
    pos = 6
    topics = []
    for _ in range(count):
        (length,) = struct.unpack_from(">h", view, pos)
        pos += 2
        if length < 0 or pos + length > len(view):
            raise ValueError("bad topic name in consumer subscription")
        topics.append(bytes(view[pos:pos + length]).decode("utf-8"))
        pos += length
    return topics
