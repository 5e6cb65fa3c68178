"""KIP-848 consumer groups: ConsumerGroupHeartbeat, ConsumerGroupDescribe, and the rules the
offset commit path applies to their members.

Lives on the broker's event loop beside the classic coordinator and shares its committed
offsets and its storage. A group id is either a classic group or a consumer group, as in
Kafka 4.x with `group.consumer.migration.policy=disabled`: a heartbeat to a classic group
with members is refused, and so is a classic JoinGroup to a consumer group with members.
Every change of a group's state is durable before the heartbeat that caused it is answered.
"""
from __future__ import annotations

import asyncio
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Callable

from fluvial.broker.groups.assignors import ASSIGNORS
from fluvial.broker.groups.consumer_group import (
    ConsumerGroup, ConsumerGroupState, ConsumerMember, MemberState, Partitions, is_empty, subtract,
)
from fluvial.broker.groups.coordinator import GroupCoordinator
from fluvial.broker.groups.storage import GroupStorage
from fluvial.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

# name -> (topic id, partition count)
TopicCatalog = Callable[[], dict[str, tuple[uuid.UUID, int]]]


@dataclass
class ConsumerGroupSettings:
    """Kafka's broker settings of consumer groups (names without the `group.consumer.` prefix)."""

    session_timeout_ms: int = 45_000       # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000     # group.consumer.heartbeat.interval.ms
    assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors; first is the default
    max_size: int = 2**31 - 1              # group.consumer.max.size


@dataclass
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: list[str] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Partitions | None = None
    client_id: str = ""
    client_host: str = ""
    version: int = 1


@dataclass
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: Partitions | None = None


@dataclass
class MemberView:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    assignment: Partitions
    target: Partitions


@dataclass
class ConsumerGroupView:
    group_id: str
    error: ErrorCode
    message: str | None = None
    state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: list[MemberView] = field(default_factory=list)


class ConsumerGroupCoordinator:
    """Every KIP-848 consumer group of this broker."""

    def __init__(self, classic: GroupCoordinator, storage: GroupStorage, topics: TopicCatalog,
                 settings: ConsumerGroupSettings | None = None):
        self.classic = classic
        self.settings = settings or ConsumerGroupSettings()
        unknown = [a for a in self.settings.assignors if a not in ASSIGNORS]
        if unknown or not self.settings.assignors:
            raise ValueError(f"group.consumer.assignors: unknown assignor(s) {unknown}; known: {sorted(ASSIGNORS)}")
        self._storage = storage
        self._topics = topics
        self._groups: dict[str, ConsumerGroup] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- life cycle --------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for group_id, text in self._storage.load_consumer_groups().items():
            group = ConsumerGroup.from_json(group_id, text)
            self._groups[group_id] = group
            self.classic.release_empty(group_id)
            for member in group.members.values():
                # Members get a full session after a restart to find the broker again.
                self._arm_session(group, member)
                if member.state == MemberState.UNREVOKED_PARTITIONS:
                    self._arm_rebalance(group, member)
        self.classic.modern_groups = self

    async def close(self) -> None:
        self.classic.modern_groups = None
        for group in self._groups.values():
            for member in group.members.values():
                self._cancel(member)

    # -- queries used by the classic side and the handlers --------------------------------

    def owns(self, group_id: str) -> bool:
        return group_id in self._groups

    def group(self, group_id: str) -> ConsumerGroup | None:
        return self._groups.get(group_id)

    def is_active(self, group_id: str) -> bool:
        """A consumer group with members (a classic JoinGroup to it is refused)."""
        group = self._groups.get(group_id)
        return group is not None and bool(group.members)

    def validate_commit(self, group_id: str, member_id: str, member_epoch: int,
                        api_version: int | None = None) -> ErrorCode:
        """Kafka's ConsumerGroup.validateOffsetCommit: the member epoch stands in for the
        generation; a member commits with OffsetCommit v9+ (None: a transactional commit)."""
        group = self._groups[group_id]
        if member_epoch < 0 and not group.members:
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if api_version is not None and api_version < 9:
            return ErrorCode.UNSUPPORTED_VERSION
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    def validate_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """Kafka's ConsumerGroup.validateOffsetFetch (OffsetFetch v9+ carries member id and epoch)."""
        group = self._groups.get(group_id)
        if group is None or (member_id is None and member_epoch < 0):
            return ErrorCode.NONE
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    def offsets_expiry_base(self, group_id: str, topic: str, commit_timestamp_ms: int) -> int | None:
        """When the retention of a committed offset starts counting, or None while it is kept:
        from when the group emptied, or from the commit for a topic no member subscribes to."""
        group = self._groups[group_id]
        if not group.members:
            return group.empty_since_ms
        catalog = self._topics()
        entry = catalog.get(topic)
        for member in group.members.values():
            if topic in member.subscribed_topic_names or (
                    entry is not None and entry[0] in self._subscribed_topics(member, catalog)):
                return None
        return commit_timestamp_ms

    def listings(self) -> list[tuple[str, str]]:
        """(group id, state) of every consumer group."""
        return [(g.group_id, g.state().value) for g in self._groups.values()]

    def release_empty(self, group_id: str) -> None:
        """Forget an empty consumer group (its offsets stay): the id becomes a classic group."""
        group = self._groups.get(group_id)
        if group is not None and not group.members:
            del self._groups[group_id]
            task = self._loop_now().create_task(
                self._storage.write([GroupStorage.consumer_group_delete(group_id)]))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def delete_empty(self, group_id: str) -> ErrorCode:
        """DeleteGroups of a consumer group: only when it has no members; offsets go with it."""
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.members:
            return ErrorCode.NON_EMPTY_GROUP
        del self._groups[group_id]
        await self._storage.write([GroupStorage.consumer_group_delete(group_id)])
        await self.classic.forget_offsets(group_id)
        return ErrorCode.NONE

    def describe(self, group_id: str) -> ConsumerGroupView:
        if not group_id:
            return ConsumerGroupView(group_id, ErrorCode.INVALID_GROUP_ID, "Group id can't be empty.")
        group = self._groups.get(group_id)
        if group is None:
            classic = self.classic.group(group_id)
            if classic is not None and classic.members:
                return ConsumerGroupView(group_id, ErrorCode.GROUP_ID_NOT_FOUND,
                                         f"Group {group_id} is not a consumer group.")
            return ConsumerGroupView(group_id, ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
        return ConsumerGroupView(
            group_id, ErrorCode.NONE, None, group.state().value, group.group_epoch, group.assignment_epoch,
            group.assignor_name,
            [MemberView(m.member_id, m.instance_id, m.rack_id, m.member_epoch, m.client_id, m.client_host,
                        list(m.subscribed_topic_names), m.subscribed_topic_regex, m.assigned,
                        group.target.get(m.member_id, {}))
             for m in group.members.values()])

    # -- ConsumerGroupHeartbeat ------------------------------------------------------------

    def _validate(self, req: HeartbeatRequest) -> tuple[ErrorCode, str] | None:
        invalid = ErrorCode.INVALID_REQUEST
        if not req.group_id:
            return invalid, "GroupId can't be empty."
        if req.instance_id is not None and not req.instance_id:
            return invalid, "InstanceId can't be empty."
        if req.rack_id is not None and not req.rack_id:
            return invalid, "RackId can't be empty."
        if req.member_epoch == 0:
            if req.version >= 1 and not req.member_id:
                return invalid, "MemberId can't be empty."
            if req.rebalance_timeout_ms == -1:
                return invalid, "RebalanceTimeoutMs must be provided in first request."
            if req.owned is None or not is_empty(req.owned):
                return invalid, "TopicPartitions must be empty when (re-)joining."
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                return invalid, "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
        elif req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH) or req.member_epoch > 0:
            if not req.member_id:
                return invalid, "MemberId can't be empty."
            if req.member_epoch == STATIC_LEAVE_EPOCH and req.instance_id is None:
                return invalid, "InstanceId can't be null when MemberEpoch is -2."
        else:
            return invalid, f"MemberEpoch is invalid: {req.member_epoch}."
        if req.server_assignor is not None and req.server_assignor not in self.settings.assignors:
            return ErrorCode.UNSUPPORTED_ASSIGNOR, f"ServerAssignor {req.server_assignor} is not supported."
        if req.subscribed_topic_regex is not None:
            try:
                re.compile(req.subscribed_topic_regex)
            except re.error as exc:
                return ErrorCode.INVALID_REGULAR_EXPRESSION, f"SubscribedTopicRegex is invalid: {exc}."
        return None

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResult:
        invalid = self._validate(req)
        if invalid is not None:
            return HeartbeatResult(invalid[0], invalid[1])
        group = self._groups.get(req.group_id)
        if group is None:
            classic = self.classic.group(req.group_id)
            if classic is not None and classic.members:
                return HeartbeatResult(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {req.group_id} is not a consumer group.")
            if req.member_epoch != 0:
                return HeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID,
                                       f"Member {req.member_id} is not a member of group {req.group_id}.")
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return await self._leave(group, req)
        if group is None:
            self.classic.release_empty(req.group_id)
            group = self._groups[req.group_id] = ConsumerGroup(req.group_id)
        result = self._join_or_heartbeat(group, req)
        if result.error == ErrorCode.NONE:
            try:
                await self._persist(group)
            except Exception:  # noqa: BLE001 - the member retries; nothing is acknowledged
                log.exception("storing consumer group %s failed", group.group_id)
                return HeartbeatResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, "The group state could not be stored.")
        elif not group.members and group.group_epoch == 0:
            self._groups.pop(group.group_id, None)
        return result

    def _join_or_heartbeat(self, group: ConsumerGroup, req: HeartbeatRequest) -> HeartbeatResult:
        fenced = ErrorCode.FENCED_MEMBER_EPOCH
        epoch_before = group.group_epoch
        member = group.members.get(req.member_id) if req.member_id else None
        if req.member_epoch == 0:
            if req.instance_id is not None:
                static = group.static_member(req.instance_id)
                if static is not None and static.member_id != req.member_id:
                    if static.member_epoch != STATIC_LEAVE_EPOCH:
                        return HeartbeatResult(ErrorCode.UNRELEASED_INSTANCE_ID,
                                               f"Static member {static.member_id} with instance id "
                                               f"{req.instance_id} is not released yet.")
                    # The instance comes back under a new member id and takes its partitions.
                    new_id = req.member_id or str(uuid.uuid4())
                    self._cancel(static)
                    del group.members[static.member_id]
                    target = group.target.pop(static.member_id, {})
                    static.member_id = new_id
                    static.member_epoch = static.previous_member_epoch = 0
                    group.members[new_id] = static
                    group.target[new_id] = target
                    member = static
            if member is None:
                if len(group.members) >= self.settings.max_size:
                    return HeartbeatResult(ErrorCode.GROUP_MAX_SIZE_REACHED,
                                           f"The consumer group has reached its maximum capacity of "
                                           f"{self.settings.max_size} members.")
                member = ConsumerMember(member_id=req.member_id or str(uuid.uuid4()))
                group.members[member.member_id] = member
                group.group_epoch += 1
            elif member.member_epoch != 0:
                # A member that lost its epoch rejoins: it gave up everything it owned.
                member.assigned, member.pending_revocation = {}, {}
                member.member_epoch = member.previous_member_epoch = 0
                member.state = MemberState.STABLE
                group.group_epoch += 1
        else:
            if member is None:
                return HeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID,
                                       f"Member {req.member_id} is not a member of group {group.group_id}.")
            if req.instance_id is not None and member.instance_id not in (None, req.instance_id):
                return HeartbeatResult(ErrorCode.FENCED_INSTANCE_ID,
                                       f"Instance id {req.instance_id} is fenced.")
            if req.member_epoch > member.member_epoch:
                return HeartbeatResult(fenced, f"The consumer group member has a greater member epoch "
                                               f"({req.member_epoch}) than the one known by the group "
                                               f"coordinator ({member.member_epoch}).")
            if req.member_epoch < member.member_epoch and (
                    req.member_epoch != member.previous_member_epoch
                    or (req.owned is not None and subtract(req.owned, member.assigned))):
                return HeartbeatResult(fenced, f"The consumer group member has a smaller member epoch "
                                               f"({req.member_epoch}) than the one known by the group "
                                               f"coordinator ({member.member_epoch}).")
        was_assigned = {t: set(p) for t, p in member.assigned.items()}
        changed = self._update_member(member, req)
        changed = self._maybe_refresh_metadata(group) or changed
        # One bump covers a membership or subscription change and the metadata it brings.
        if changed and group.group_epoch == epoch_before:
            group.group_epoch += 1
        if group.group_epoch > group.assignment_epoch:
            self._compute_target(group)
        group.reconcile(member, req.owned)
        if member.state == MemberState.UNREVOKED_PARTITIONS:
            self._arm_rebalance(group, member)
        elif member.rebalance_timer is not None:
            member.rebalance_timer.cancel()
            member.rebalance_timer = None
        self._arm_session(group, member)
        full = req.member_epoch == 0 or (req.rebalance_timeout_ms != -1 and req.subscribed_topic_names is not None
                                         and req.owned is not None)
        return HeartbeatResult(
            ErrorCode.NONE, None, member.member_id, member.member_epoch, self.settings.heartbeat_interval_ms,
            member.assigned if full or was_assigned != member.assigned else None)

    def _update_member(self, member: ConsumerMember, req: HeartbeatRequest) -> bool:
        """Take the member's fields from the request; True if its subscription changed."""
        changed = False
        if req.instance_id is not None:
            member.instance_id = req.instance_id
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        if req.subscribed_topic_names is not None and sorted(req.subscribed_topic_names) != sorted(member.subscribed_topic_names):
            member.subscribed_topic_names = sorted(set(req.subscribed_topic_names))
            changed = True
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None  # "" clears the regex
            if regex != member.subscribed_topic_regex:
                member.subscribed_topic_regex = regex
                changed = True
        if req.server_assignor is not None and req.server_assignor != member.server_assignor:
            member.server_assignor = req.server_assignor
            changed = True
        return changed

    # -- assignment ------------------------------------------------------------------------

    def _subscribed_topics(self, member: ConsumerMember, catalog: dict[str, tuple[uuid.UUID, int]]) -> set[uuid.UUID]:
        topics = {catalog[name][0] for name in member.subscribed_topic_names if name in catalog}
        if member.subscribed_topic_regex:
            pattern = re.compile(member.subscribed_topic_regex)
            # Internal topics are never matched by a pattern, as in Kafka.
            topics.update(tid for name, (tid, _) in catalog.items()
                          if not name.startswith("__") and pattern.fullmatch(name))
        return topics

    def _maybe_refresh_metadata(self, group: ConsumerGroup) -> bool:
        """True when a subscribed topic appeared, went, or got more partitions (a new epoch)."""
        catalog = self._topics()
        counts = {tid: n for tid, n in catalog.values()}
        wanted: set[uuid.UUID] = set()
        for member in group.members.values():
            wanted |= self._subscribed_topics(member, catalog)
        metadata = {tid: counts[tid] for tid in wanted}
        if metadata == group.subscription_metadata:
            return False
        group.subscription_metadata = metadata
        return True

    def _compute_target(self, group: ConsumerGroup) -> None:
        catalog = self._topics()
        votes: dict[str, int] = {}
        for member in group.members.values():
            if member.server_assignor:
                votes[member.server_assignor] = votes.get(member.server_assignor, 0) + 1
        # The assignor most members ask for, else the first configured one.
        name = (max(sorted(votes), key=lambda n: votes[n]) if votes else self.settings.assignors[0])
        group.assignor_name = name
        subscriptions = {m.member_id: self._subscribed_topics(m, catalog) for m in group.members.values()}
        group.target = ASSIGNORS[name](subscriptions, dict(group.subscription_metadata), group.target)
        group.assignment_epoch = group.group_epoch

    # -- leaving and fencing -------------------------------------------------------------

    async def _leave(self, group: ConsumerGroup | None, req: HeartbeatRequest) -> HeartbeatResult:
        member = None
        if group is not None:
            member = group.members.get(req.member_id)
            if member is None and req.instance_id is not None:
                member = group.static_member(req.instance_id)
        if group is None or member is None:
            return HeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID,
                                   f"Member {req.member_id} is not a member of group {req.group_id}.")
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            # A static member restarting: it keeps its partitions for one session timeout.
            member.member_epoch = STATIC_LEAVE_EPOCH
            self._arm_session(group, member)
        else:
            self._remove(group, member)
        await self._persist(group)
        return HeartbeatResult(ErrorCode.NONE, None, req.member_id, req.member_epoch,
                               self.settings.heartbeat_interval_ms)

    def _remove(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        self._cancel(member)
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        group.group_epoch += 1
        if group.members:
            self._maybe_refresh_metadata(group)
            self._compute_target(group)
        else:
            group.assignment_epoch = group.group_epoch
            group.subscription_metadata = {}
            group.empty_since_ms = self.classic.now_ms()

    def _fence(self, group: ConsumerGroup, member: ConsumerMember, why: str) -> None:
        if self._groups.get(group.group_id) is not group or group.members.get(member.member_id) is not member:
            return
        log.info("consumer group %s: member %s removed (%s)", group.group_id, member.member_id, why)
        self._remove(group, member)
        task = self._loop_now().create_task(self._persist(group))
        task.add_done_callback(lambda t: t.cancelled() or t.exception() and log.error(
            "storing consumer group %s failed: %s", group.group_id, t.exception()))

    def _arm_session(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        member.session_timer = self._loop_now().call_later(
            self.settings.session_timeout_ms / 1000, self._fence, group, member, "session timeout")

    def _arm_rebalance(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        if member.rebalance_timer is None:
            member.rebalance_timer = self._loop_now().call_later(
                max(member.rebalance_timeout_ms, 0) / 1000, self._rebalance_expired, group, member)

    def _rebalance_expired(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        member.rebalance_timer = None
        if member.state == MemberState.UNREVOKED_PARTITIONS:
            self._fence(group, member, "partitions not revoked within the rebalance timeout")

    @staticmethod
    def _cancel(member: ConsumerMember) -> None:
        for timer in (member.session_timer, member.rebalance_timer):
            if timer is not None:
                timer.cancel()
        member.session_timer = member.rebalance_timer = None

    async def _persist(self, group: ConsumerGroup) -> None:
        if self._groups.get(group.group_id) is not group:
            return
        text = group.to_json()
        if text == group.last_written:
            return
        await self._storage.write([GroupStorage.consumer_group_upsert(group.group_id, text)])
        group.last_written = text

    def _loop_now(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def state_of(self, group_id: str) -> ConsumerGroupState | None:
        group = self._groups.get(group_id)
        return group.state() if group is not None else None
