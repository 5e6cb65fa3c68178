"""The state of one KIP-848 consumer group and the reconciliation of a member's assignment.

The coordinator owns the assignment: a group epoch counts changes of membership,
subscriptions and partition counts; the target assignment is recomputed once per group
epoch (its assignment epoch); each member then moves from its current assignment to its
target one in two steps, as Kafka's CurrentAssignmentBuilder does: first it is asked to
revoke what it must give up (its epoch stays), and only once it reports them gone does it
get the new epoch and the partitions no other member still holds. So no partition is
ever owned by two members at once.
"""
from __future__ import annotations

import asyncio
import enum
import json
import uuid
from dataclasses import dataclass, field

Partitions = dict[uuid.UUID, set[int]]


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


class ConsumerGroupState(enum.Enum):
    """Kafka's wire names of a consumer group's states."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


def copy_partitions(parts: Partitions) -> Partitions:
    return {t: set(p) for t, p in parts.items() if p}


def subtract(a: Partitions, b: Partitions) -> Partitions:
    return {t: p - b.get(t, set()) for t, p in a.items() if p - b.get(t, set())}


def intersect(a: Partitions, b: Partitions) -> Partitions:
    return {t: p & b[t] for t, p in a.items() if t in b and p & b[t]}


def is_empty(parts: Partitions) -> bool:
    return not any(parts.values())


@dataclass(eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300_000
    subscribed_topic_names: list[str] = field(default_factory=list)
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    # Loop timers (not persisted).
    session_timer: asyncio.TimerHandle | None = None
    rebalance_timer: asyncio.TimerHandle | None = None

    def to_json(self) -> dict:
        return {
            "member_id": self.member_id, "instance_id": self.instance_id, "rack_id": self.rack_id,
            "client_id": self.client_id, "client_host": self.client_host,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "subscribed_topic_names": self.subscribed_topic_names,
            "subscribed_topic_regex": self.subscribed_topic_regex, "server_assignor": self.server_assignor,
            "member_epoch": self.member_epoch, "previous_member_epoch": self.previous_member_epoch,
            "state": self.state.value, "assigned": _parts_to_json(self.assigned),
            "pending_revocation": _parts_to_json(self.pending_revocation),
        }

    @classmethod
    def from_json(cls, d: dict) -> "ConsumerMember":
        return cls(
            member_id=d["member_id"], instance_id=d["instance_id"], rack_id=d["rack_id"],
            client_id=d["client_id"], client_host=d["client_host"],
            rebalance_timeout_ms=d["rebalance_timeout_ms"], subscribed_topic_names=d["subscribed_topic_names"],
            subscribed_topic_regex=d["subscribed_topic_regex"], server_assignor=d["server_assignor"],
            member_epoch=d["member_epoch"], previous_member_epoch=d["previous_member_epoch"],
            state=MemberState(d["state"]), assigned=_parts_from_json(d["assigned"]),
            pending_revocation=_parts_from_json(d["pending_revocation"]))


def _parts_to_json(parts: Partitions) -> dict[str, list[int]]:
    return {str(t): sorted(p) for t, p in sorted(parts.items(), key=lambda kv: str(kv[0])) if p}


def _parts_from_json(d: dict[str, list[int]]) -> Partitions:
    return {uuid.UUID(t): set(p) for t, p in d.items()}


@dataclass(eq=False)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Partitions] = field(default_factory=dict)
    # The partition counts of the subscribed topics the target was computed from.
    subscription_metadata: dict[uuid.UUID, int] = field(default_factory=dict)
    # When the last member left (offsets of an empty group expire counting from then).
    empty_since_ms: int = 0
    last_written: str | None = None

    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch != self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(m.member_epoch != self.assignment_epoch or m.state != MemberState.STABLE
               for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        for member in self.members.values():
            if member.instance_id == instance_id:
                return member
        return None

    def owner_elsewhere(self, member_id: str) -> set[tuple[uuid.UUID, int]]:
        """Partitions held (assigned or still being revoked) by members other than this one."""
        held: set[tuple[uuid.UUID, int]] = set()
        for other in self.members.values():
            if other.member_id == member_id:
                continue
            for parts in (other.assigned, other.pending_revocation):
                held.update((t, p) for t, ps in parts.items() for p in ps)
        return held

    def reconcile(self, member: ConsumerMember, owned: Partitions | None) -> None:
        """Move the member one step towards its target assignment (see the module doc)."""
        target = self.target.get(member.member_id, {})
        if member.state == MemberState.UNREVOKED_PARTITIONS:
            if owned is None or not is_empty(intersect(owned, member.pending_revocation)):
                return  # still waiting for the member to give the partitions up
        elif member.member_epoch == self.assignment_epoch and member.state == MemberState.STABLE:
            return
        revoke = subtract(member.assigned, target)
        if revoke:
            member.assigned = intersect(member.assigned, target)
            member.pending_revocation = revoke
            member.state = MemberState.UNREVOKED_PARTITIONS
            return
        held = self.owner_elsewhere(member.member_id)
        assigned = copy_partitions(member.assigned)
        unreleased = False
        for topic_id, parts in subtract(target, member.assigned).items():
            for p in parts:
                if (topic_id, p) in held:
                    unreleased = True
                else:
                    assigned.setdefault(topic_id, set()).add(p)
        member.assigned = assigned
        member.pending_revocation = {}
        member.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
        if member.member_epoch != self.assignment_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.assignment_epoch

    def to_json(self) -> str:
        return json.dumps({
            "group_epoch": self.group_epoch, "assignment_epoch": self.assignment_epoch,
            "assignor_name": self.assignor_name,
            "members": [m.to_json() for m in self.members.values()],
            "target": {m: _parts_to_json(p) for m, p in self.target.items()},
            "subscription_metadata": {str(t): n for t, n in self.subscription_metadata.items()},
            "empty_since_ms": self.empty_since_ms,
        }, sort_keys=True)

    @classmethod
    def from_json(cls, group_id: str, text: str) -> "ConsumerGroup":
        d = json.loads(text)
        group = cls(group_id, group_epoch=d["group_epoch"], assignment_epoch=d["assignment_epoch"],
                    assignor_name=d["assignor_name"],
                    target={m: _parts_from_json(p) for m, p in d["target"].items()},
                    subscription_metadata={uuid.UUID(t): n for t, n in d["subscription_metadata"].items()},
                    empty_since_ms=d.get("empty_since_ms", 0))
        for md in d["members"]:
            member = ConsumerMember.from_json(md)
            group.members[member.member_id] = member
        group.last_written = text
        return group
