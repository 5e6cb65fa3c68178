"""The group coordinator: Kafka's classic group protocol and committed offsets.

It lives on the broker's event loop. Delayed JoinGroup and SyncGroup answers are
asyncio futures; session timeouts, rebalance timeouts and the initial rebalance delay
are loop timers. Nothing here blocks: durable writes go through `GroupStorage`.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from fluvial.broker.groups.group import Group, GroupState, Member
from fluvial.broker.groups.storage import CommittedOffset, GroupRecord, GroupStorage, StoredMember
from fluvial.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

# Not every Kafka error code is in the shared enum yet; this is the wire number.
NON_EMPTY_GROUP = ErrorCode.NON_EMPTY_GROUP

TopicPartition = tuple[str, int]


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class GroupConfig:
    """Broker settings of the group coordinator (Kafka's names and defaults)."""

    min_session_timeout_ms: int = 6_000            # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000        # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3_000        # group.initial.rebalance.delay.ms
    max_group_size: int = 2**31 - 1                # group.max.size
    new_member_join_timeout_ms: int = 300_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000   # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms
    offset_metadata_max_bytes: int = 4096          # offset.metadata.max.bytes


@dataclass(frozen=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass
class JoinGroupResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: list[JoinedMember] = field(default_factory=list)
    skip_assignment: bool = False


@dataclass
class SyncGroupResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True)
class MemberLeave:
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


@dataclass
class LeaveGroupResult:
    error: ErrorCode
    members: list[MemberLeave] = field(default_factory=list)


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass
class GroupDescription:
    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str
    protocol_name: str
    members: list[MemberDescription] = field(default_factory=list)
    found: bool = True


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


@dataclass(frozen=True)
class OffsetCommitEntry:
    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""


class GroupCoordinator:
    """All classic groups of this broker and their committed offsets."""

    def __init__(
        self,
        storage: GroupStorage,
        config: GroupConfig | None = None,
        *,
        partition_exists: Callable[[str, int], bool] | None = None,
        now_ms: Callable[[], int] = _wall_clock_ms,
    ):
        self.config = config or GroupConfig()
        self._storage = storage
        self._partition_exists = partition_exists
        self._now_ms = now_ms
        self._groups: dict[str, Group] = {}
        self._offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._expiry_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The KIP-848 consumer groups (ConsumerGroupCoordinator), set when they are served: a
        # group id belongs to one side only, and commits to its groups follow its rules.
        self.modern_groups = None

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Load groups and offsets from the metadata store and start offset expiry."""
        self._loop = asyncio.get_running_loop()
        self._offsets = self._storage.load_offsets()
        for record in self._storage.load_groups():
            self._groups[record.group_id] = self._group_from_record(record)
        for group_id, offsets in self._offsets.items():
            if group_id not in self._groups:
                group = Group(group_id)
                group.state_timestamp_ms = max(o.commit_timestamp_ms for o in offsets.values())
                self._groups[group_id] = group
        self._expiry_task = self._loop.create_task(self._expire_periodically())

    async def close(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
            await asyncio.gather(self._expiry_task, return_exceptions=True)
        for group in self._groups.values():
            self._cancel_group_timers(group)
            for member in list(group.members.values()):
                self._cancel_timer(member.heartbeat_timer)
                self._answer_join(member, JoinGroupResult(ErrorCode.NOT_COORDINATOR, member.member_id))
                self._answer_sync(member, SyncGroupResult(ErrorCode.NOT_COORDINATOR))
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._storage.close()

    def _group_from_record(self, record: GroupRecord) -> Group:
        group = Group(
            record.group_id,
            protocol_type=record.protocol_type,
            protocol_name=record.protocol_name,
            generation_id=record.generation_id,
            state_timestamp_ms=record.state_timestamp_ms,
        )
        if not record.members or record.protocol_name is None:
            return group
        for stored in record.members:
            member = Member(
                member_id=stored.member_id,
                group_instance_id=stored.group_instance_id,
                client_id=stored.client_id,
                client_host=stored.client_host,
                session_timeout_ms=stored.session_timeout_ms,
                rebalance_timeout_ms=stored.rebalance_timeout_ms,
                protocol_type=record.protocol_type or "",
                protocols=[(record.protocol_name, stored.metadata)],
                assignment=stored.assignment,
                is_new=False,
            )
            group.add(member)
            self._schedule_heartbeat(group, member, member.session_timeout_ms)
        group.protocol_type = record.protocol_type
        group.leader_id = record.leader_id if record.leader_id in group.members else group.leader_id
        group.subscribed_topics = group.compute_subscribed_topics()
        group.state = GroupState.STABLE
        return group

    # -- JoinGroup -----------------------------------------------------------------------

    async def join_group(
        self,
        *,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
    ) -> JoinGroupResult:
        """Join (or rejoin) a group; the answer comes when the join phase completes."""
        if not group_id:
            return JoinGroupResult(ErrorCode.INVALID_GROUP_ID, member_id)
        if not (self.config.min_session_timeout_ms <= session_timeout_ms <= self.config.max_session_timeout_ms):
            return JoinGroupResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        # Requests before v1 carry no rebalance timeout: Kafka uses the session timeout.
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        if self.modern_groups is not None and self.modern_groups.owns(group_id):
            # Kafka 4.x with group.consumer.migration.policy=disabled: a consumer group with
            # members takes no classic members; an empty one becomes a classic group.
            if self.modern_groups.is_active(group_id):
                return JoinGroupResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
            self.modern_groups.release_empty(group_id)
        group = self._groups.get(group_id)
        if not member_id:
            if group is None:
                group = self._groups[group_id] = Group(group_id, state_timestamp_ms=self._now_ms())
            result = await self._join_new_member(
                group, group_instance_id, client_id, client_host, session_timeout_ms,
                rebalance_timeout_ms, protocol_type, protocols, require_known_member_id)
            if result.error not in (ErrorCode.NONE, ErrorCode.MEMBER_ID_REQUIRED):
                self._drop_if_unused(group)
            return result
        if group is None:
            return JoinGroupResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        return await self._join_known_member(
            group, member_id, group_instance_id, client_id, client_host, session_timeout_ms,
            rebalance_timeout_ms, protocol_type, protocols)

    async def _join_new_member(
        self, group: Group, group_instance_id: str | None, client_id: str, client_host: str,
        session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
        protocols: list[tuple[str, bytes]], require_known_member_id: bool,
    ) -> JoinGroupResult:
        if group.state == GroupState.DEAD:
            return JoinGroupResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not group.supports_protocols(protocol_type, protocols):
            return JoinGroupResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        known_static = group_instance_id is not None and group_instance_id in group.static_members
        if not known_static and len(group.members) + len(group.pending_members) >= self.config.max_group_size:
            return JoinGroupResult(ErrorCode.GROUP_MAX_SIZE_REACHED)
        new_member_id = f"{group_instance_id if group_instance_id is not None else client_id}-{uuid.uuid4()}"
        if group_instance_id is not None:
            old_member_id = group.static_members.get(group_instance_id)
            if old_member_id is not None:
                return await self._replace_static_member(
                    group, group_instance_id, old_member_id, new_member_id, client_id, client_host,
                    session_timeout_ms, rebalance_timeout_ms, protocols)
        elif require_known_member_id:
            # KIP-394: the id is only usable once the client joins again with it, so
            # clients that die between the two requests do not hold up the group.
            group.pending_members.add(new_member_id)
            group.pending_members_timers[new_member_id] = self._call_later(
                session_timeout_ms, self._expire_pending_member, group, new_member_id)
            return JoinGroupResult(ErrorCode.MEMBER_ID_REQUIRED, new_member_id)
        member = Member(
            member_id=new_member_id, group_instance_id=group_instance_id, client_id=client_id,
            client_host=client_host, session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms, protocol_type=protocol_type, protocols=protocols)
        return await self._add_member_and_rebalance(group, member)

    async def _join_known_member(
        self, group: Group, member_id: str, group_instance_id: str | None, client_id: str,
        client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> JoinGroupResult:
        if group.state == GroupState.DEAD:
            return JoinGroupResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        if not group.supports_protocols(protocol_type, protocols):
            return JoinGroupResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._cancel_timer(group.pending_members_timers.pop(member_id, None))
            member = Member(
                member_id=member_id, group_instance_id=group_instance_id, client_id=client_id,
                client_host=client_host, session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms, protocol_type=protocol_type, protocols=protocols)
            return await self._add_member_and_rebalance(group, member)
        if group.is_static_member_fenced(group_instance_id, member_id):
            return JoinGroupResult(ErrorCode.FENCED_INSTANCE_ID, member_id)
        member = group.members.get(member_id)
        if member is None:
            return JoinGroupResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        if group.state == GroupState.PREPARING_REBALANCE:
            return await self._update_member_and_rebalance(group, member, session_timeout_ms, rebalance_timeout_ms, protocols)
        if group.state == GroupState.COMPLETING_REBALANCE:
            if member.matches(protocols):
                # The member lost our JoinGroup answer: repeat it for the current generation.
                return self._current_generation_result(group, member, include_members=group.is_leader(member_id))
            return await self._update_member_and_rebalance(group, member, session_timeout_ms, rebalance_timeout_ms, protocols)
        if group.state == GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(protocols):
                # A rejoining leader may want to assign again (e.g. new partitions).
                return await self._update_member_and_rebalance(group, member, session_timeout_ms, rebalance_timeout_ms, protocols)
            return self._current_generation_result(group, member, include_members=False)
        return JoinGroupResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)

    async def _add_member_and_rebalance(self, group: Group, member: Member) -> JoinGroupResult:
        future = self._loop_now().create_future()
        member.join_future = future
        group.add(member)
        if group.initial_delay_remaining_ms is not None:
            group.new_member_added = True
        self._schedule_heartbeat(group, member, self.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(group)
        self._try_complete_join(group)
        return await future

    async def _update_member_and_rebalance(
        self, group: Group, member: Member, session_timeout_ms: int, rebalance_timeout_ms: int,
        protocols: list[tuple[str, bytes]],
    ) -> JoinGroupResult:
        member.protocols = protocols
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        self._answer_join(member, JoinGroupResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        future = self._loop_now().create_future()
        member.join_future = future
        self._maybe_prepare_rebalance(group)
        self._try_complete_join(group)
        return await future

    async def _replace_static_member(
        self, group: Group, group_instance_id: str, old_member_id: str, new_member_id: str,
        client_id: str, client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int,
        protocols: list[tuple[str, bytes]],
    ) -> JoinGroupResult:
        """A known static member restarted: it takes over its old place under a new id."""
        current_leader = group.leader_id or ""
        old = group.members[old_member_id]
        # The old incarnation, if it is still waiting on us, is fenced.
        self._answer_join(old, JoinGroupResult(ErrorCode.FENCED_INSTANCE_ID, old_member_id))
        self._answer_sync(old, SyncGroupResult(ErrorCode.FENCED_INSTANCE_ID))
        member = group.replace_static_member(group_instance_id, old_member_id, new_member_id)
        member.client_id, member.client_host = client_id, client_host
        member.session_timeout_ms, member.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        member.protocols = protocols
        self._schedule_heartbeat(group, member, session_timeout_ms)
        if group.state == GroupState.STABLE and group.select_protocol() == group.protocol_name:
            await self._persist_group(group)
            # The old leader id is returned on purpose: a restarted leader must not think it
            # leads, since a stable group would not broadcast a new assignment anyway.
            return JoinGroupResult(
                ErrorCode.NONE, new_member_id, group.generation_id, group.protocol_type,
                group.protocol_name, current_leader if current_leader != new_member_id else old_member_id)
        future = self._loop_now().create_future()
        member.join_future = future
        self._maybe_prepare_rebalance(group)
        self._try_complete_join(group)
        return await future

    def _current_generation_result(self, group: Group, member: Member, *, include_members: bool) -> JoinGroupResult:
        return JoinGroupResult(
            ErrorCode.NONE, member.member_id, group.generation_id, group.protocol_type,
            group.protocol_name, group.leader_id or "",
            self._member_metadata(group) if include_members else [])

    @staticmethod
    def _member_metadata(group: Group) -> list[JoinedMember]:
        assert group.protocol_name is not None
        return [JoinedMember(m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
                for m in group.members.values()]

    # -- rebalance machinery -------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: Group) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group)

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state == GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                member.assignment = b""
                self._answer_sync(member, SyncGroupResult(ErrorCode.REBALANCE_IN_PROGRESS))
        self._cancel_timer(group.sync_timer)
        group.sync_timer = None
        group.pending_sync.clear()
        self._cancel_timer(group.join_timer)
        rebalance_timeout = group.rebalance_timeout_ms()
        if group.state == GroupState.EMPTY:
            # Kafka's initial delay: let a starting fleet of consumers join one generation.
            delay = min(self.config.initial_rebalance_delay_ms, rebalance_timeout)
            group.initial_delay_remaining_ms = max(rebalance_timeout - delay, 0)
            group.new_member_added = False
            group.join_timer = self._call_later(delay, self._initial_delay_elapsed, group)
        else:
            group.initial_delay_remaining_ms = None
            group.join_timer = self._call_later(rebalance_timeout, self._complete_join, group)
        group.transition(GroupState.PREPARING_REBALANCE, self._now_ms())

    def _initial_delay_elapsed(self, group: Group) -> None:
        remaining = group.initial_delay_remaining_ms or 0
        if group.new_member_added and remaining > 0:
            group.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms, remaining)
            group.initial_delay_remaining_ms = max(remaining - delay, 0)
            group.join_timer = self._call_later(delay, self._initial_delay_elapsed, group)
            return
        group.initial_delay_remaining_ms = None
        self._complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if (group.state == GroupState.PREPARING_REBALANCE and group.initial_delay_remaining_ms is None
                and group.all_members_joined()):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        self._cancel_timer(group.join_timer)
        group.join_timer = None
        group.initial_delay_remaining_ms = None
        for member in group.not_yet_rejoined():
            # Static members keep their place while away; dynamic ones that missed the
            # join phase are out.
            if member.group_instance_id is None:
                self._remove_member(group, member)
        if group.members and not group.elect_joined_leader():
            # Only absent static members: wait for them (or their session timeout).
            group.join_timer = self._call_later(group.rebalance_timeout_ms(), self._complete_join, group)
            return
        group.init_next_generation(self._now_ms())
        if group.state == GroupState.EMPTY:
            log.info("group %s is empty at generation %d", group.group_id, group.generation_id)
            self._spawn(self._persist_group(group))
            return
        log.info("group %s stabilizing at generation %d with %d members (protocol %s)",
                 group.group_id, group.generation_id, len(group.members), group.protocol_name)
        leader_view = self._member_metadata(group)
        for member in group.members.values():
            result = JoinGroupResult(
                ErrorCode.NONE, member.member_id, group.generation_id, group.protocol_type,
                group.protocol_name, group.leader_id or "",
                leader_view if group.is_leader(member.member_id) else [])
            self._answer_join(member, result)
            member.is_new = False
            self._schedule_heartbeat(group, member, member.session_timeout_ms)
            group.pending_sync.add(member.member_id)
        group.sync_timer = self._call_later(
            group.rebalance_timeout_ms(), self._sync_deadline_elapsed, group, group.generation_id)

    def _sync_deadline_elapsed(self, group: Group, generation_id: int) -> None:
        """Members that joined a generation but never synced are removed."""
        group.sync_timer = None
        if group.generation_id != generation_id or not group.pending_sync:
            return
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        for member_id in list(group.pending_sync):
            member = group.members.get(member_id)
            if member is not None:
                log.info("member %s of group %s did not sync in time", member_id, group.group_id)
                self._remove_member(group, member)
        group.pending_sync.clear()
        self._maybe_prepare_rebalance(group)
        self._try_complete_join(group)

    def _remove_member(self, group: Group, member: Member, error: ErrorCode = ErrorCode.UNKNOWN_MEMBER_ID) -> None:
        self._cancel_timer(member.heartbeat_timer)
        member.heartbeat_timer = None
        self._answer_join(member, JoinGroupResult(error, member.member_id))
        self._answer_sync(member, SyncGroupResult(error))
        group.remove(member.member_id)

    def _remove_member_and_update_group(self, group: Group, member: Member) -> None:
        self._remove_member(group, member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group)
        if group.state == GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _schedule_heartbeat(self, group: Group, member: Member, timeout_ms: int) -> None:
        self._cancel_timer(member.heartbeat_timer)
        member.heartbeat_timer = self._call_later(timeout_ms, self._heartbeat_expired, group, member)

    def _heartbeat_expired(self, group: Group, member: Member) -> None:
        member.heartbeat_timer = None
        if group.members.get(member.member_id) is not member:
            return
        if not member.is_new and (member.awaiting_join or member.awaiting_sync):
            # Waiting on the coordinator counts as alive; the rebalance timeout rules here.
            self._schedule_heartbeat(group, member, member.session_timeout_ms)
            return
        log.info("member %s of group %s expired (session timeout)", member.member_id, group.group_id)
        self._remove_member_and_update_group(group, member)

    def _expire_pending_member(self, group: Group, member_id: str) -> None:
        group.pending_members_timers.pop(member_id, None)
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._try_complete_join(group)

    # -- SyncGroup -----------------------------------------------------------------------

    async def sync_group(
        self,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        assignments: dict[str, bytes] | None = None,
    ) -> SyncGroupResult:
        group = self._groups.get(group_id)
        if not group_id:
            return SyncGroupResult(ErrorCode.INVALID_GROUP_ID)
        if group is None:
            return SyncGroupResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state == GroupState.DEAD:
            return SyncGroupResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if group.is_static_member_fenced(group_instance_id, member_id):
            return SyncGroupResult(ErrorCode.FENCED_INSTANCE_ID)
        member = group.members.get(member_id)
        if member is None:
            return SyncGroupResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if generation_id != group.generation_id:
            return SyncGroupResult(ErrorCode.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol_name is not None and protocol_name != group.protocol_name):
            return SyncGroupResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if group.state == GroupState.EMPTY:
            return SyncGroupResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state == GroupState.PREPARING_REBALANCE:
            return SyncGroupResult(ErrorCode.REBALANCE_IN_PROGRESS)
        group.pending_sync.discard(member_id)
        self._schedule_heartbeat(group, member, member.session_timeout_ms)
        if group.state == GroupState.STABLE:
            return SyncGroupResult(ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment)
        # CompletingRebalance: wait for the leader's assignment.
        self._answer_sync(member, SyncGroupResult(ErrorCode.REBALANCE_IN_PROGRESS))
        future = self._loop_now().create_future()
        member.sync_future = future
        if group.is_leader(member_id):
            self._spawn(self._complete_sync(group, group.generation_id, dict(assignments or {})))
        return await future

    async def _complete_sync(self, group: Group, generation_id: int, assignments: dict[str, bytes]) -> None:
        record = self._group_record(group, assignments)
        try:
            await self._storage.write([GroupStorage.group_upsert(record)])
        except Exception:
            log.exception("storing group %s failed", group.group_id)
            if group.generation_id == generation_id and group.state == GroupState.COMPLETING_REBALANCE:
                for member in group.members.values():
                    self._answer_sync(member, SyncGroupResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
                self._maybe_prepare_rebalance(group)
            return
        if group.generation_id != generation_id or group.state != GroupState.COMPLETING_REBALANCE:
            return  # a new rebalance began meanwhile; its own sync will settle the group
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, b"")
        group.transition(GroupState.STABLE, self._now_ms())
        for member in group.members.values():
            self._answer_sync(member, SyncGroupResult(
                ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment))

    # -- Heartbeat and LeaveGroup ---------------------------------------------------------

    def heartbeat(self, *, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None = None) -> ErrorCode:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group.is_static_member_fenced(group_instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state == GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._schedule_heartbeat(group, member, member.session_timeout_ms)
        if group.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]) -> LeaveGroupResult:
        """Members leave (v3+ in a batch); `members` holds (member id, group instance id)."""
        if not group_id:
            return LeaveGroupResult(ErrorCode.INVALID_GROUP_ID)
        group = self._groups.get(group_id)
        if group is None:
            return LeaveGroupResult(ErrorCode.NONE, [
                MemberLeave(m, i, ErrorCode.UNKNOWN_MEMBER_ID) for m, i in members])
        if group.state == GroupState.DEAD:
            return LeaveGroupResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        results = []
        for member_id, instance_id in members:
            results.append(MemberLeave(member_id, instance_id, self._leave_one(group, member_id, instance_id)))
        return LeaveGroupResult(ErrorCode.NONE, results)

    def _leave_one(self, group: Group, member_id: str, instance_id: str | None) -> ErrorCode:
        if instance_id is not None:
            known = group.static_members.get(instance_id)
            if known is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if member_id and member_id != known:
                return ErrorCode.FENCED_INSTANCE_ID
            member_id = known
        elif member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._cancel_timer(group.pending_members_timers.pop(member_id, None))
            self._try_complete_join(group)
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        log.info("member %s leaves group %s", member_id, group.group_id)
        self._remove_member_and_update_group(group, member)
        return ErrorCode.NONE

    # -- DescribeGroups, ListGroups, DeleteGroups ----------------------------------------

    def describe_groups(self, group_ids: list[str]) -> list[GroupDescription]:
        out = []
        for group_id in group_ids:
            group = self._groups.get(group_id)
            if not group_id:
                out.append(GroupDescription(group_id, ErrorCode.INVALID_GROUP_ID, "Dead", "", "", found=False))
                continue
            if group is None or group.state == GroupState.DEAD:
                out.append(GroupDescription(group_id, ErrorCode.NONE, GroupState.DEAD.value, "", "", found=False))
                continue
            stable = group.state == GroupState.STABLE
            members = [
                MemberDescription(
                    m.member_id, m.group_instance_id, m.client_id, m.client_host,
                    m.metadata_for(group.protocol_name) if stable and group.protocol_name else b"",
                    m.assignment if stable else b"")
                for m in group.members.values()
            ]
            out.append(GroupDescription(
                group_id, ErrorCode.NONE, group.state.value, group.protocol_type or "",
                (group.protocol_name or "") if stable else "", members))
        return out

    def list_groups(self, states: list[str] | None = None, types: list[str] | None = None) -> list[GroupListing]:
        wanted_states = {s.lower() for s in states} if states else None
        wanted_types = {t.lower() for t in types} if types else None
        listings = []
        for group in self._groups.values():
            if group.state == GroupState.DEAD:
                continue
            if wanted_states is not None and group.state.value.lower() not in wanted_states:
                continue
            if wanted_types is not None and "classic" not in wanted_types:
                continue
            listings.append(GroupListing(group.group_id, group.protocol_type or "", group.state.value))
        return listings

    async def delete_groups(self, group_ids: list[str]) -> dict[str, ErrorCode]:
        """Delete empty groups with their offsets; groups with members get NON_EMPTY_GROUP."""
        errors: dict[str, ErrorCode] = {}
        statements = []
        for group_id in group_ids:
            group = self._groups.get(group_id)
            if not group_id:
                errors[group_id] = ErrorCode.INVALID_GROUP_ID
            elif group is None or group.state == GroupState.DEAD:
                errors[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
            elif group.state != GroupState.EMPTY:
                errors[group_id] = NON_EMPTY_GROUP
            else:
                self._drop_group(group)
                statements += [GroupStorage.group_offsets_delete(group_id), GroupStorage.group_delete(group_id)]
                errors[group_id] = ErrorCode.NONE
        await self._storage.write(statements)
        return errors

    # -- committed offsets ---------------------------------------------------------------

    async def commit_offsets(
        self,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[OffsetCommitEntry],
        retention_time_ms: int = -1,
        api_version: int | None = None,
    ) -> dict[TopicPartition, ErrorCode]:
        """Validate the committer as Kafka does, then store each valid partition's offset.

        `api_version` is the OffsetCommit version (members of KIP-848 consumer groups must use
        v9+); None skips that check."""
        group_error = self._validate_committer(group_id, generation_id, member_id, group_instance_id,
                                               api_version)
        if group_error != ErrorCode.NONE:
            return {(e.topic, e.partition): group_error for e in offsets}
        group = self._groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is not None and generation_id >= 0:
            self._schedule_heartbeat(group, member, member.session_timeout_ms)
        now = self._now_ms()
        expire = now + retention_time_ms if retention_time_ms > 0 else None
        results: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, CommittedOffset] = {}
        for entry in offsets:
            tp = (entry.topic, entry.partition)
            error = self._validate_offset(entry)
            results[tp] = error
            if error == ErrorCode.NONE:
                accepted[tp] = CommittedOffset(entry.offset, entry.leader_epoch, entry.metadata or "", now, expire)
        if accepted:
            statements = [GroupStorage.offset_upsert(group_id, t, p, c) for (t, p), c in accepted.items()]
            try:
                await self._storage.write(statements)
            except Exception:
                log.exception("storing offsets of group %s failed", group_id)
                return {tp: (ErrorCode.COORDINATOR_NOT_AVAILABLE if tp in accepted else e) for tp, e in results.items()}
            self._offsets.setdefault(group_id, {}).update(accepted)
        return results

    def validate_txn_committer(self, group_id: str, generation_id: int, member_id: str,
                               group_instance_id: str | None) -> ErrorCode:
        """TxnOffsetCommit's check of the committer (the offsets are held by the transaction)."""
        return self._validate_committer(group_id, generation_id, member_id, group_instance_id)

    async def apply_transactional_offsets(self, group_id: str,
                                          entries: list[tuple[str, int, int, int, str]]) -> None:
        """Store the offsets of a committed transaction (checked when they were sent)."""
        now = self._now_ms()
        accepted = {(t, p): CommittedOffset(o, e, m or "", now, None) for t, p, o, e, m in entries}
        if not accepted:
            return
        if group_id not in self._groups and not (self.modern_groups is not None and self.modern_groups.owns(group_id)):
            self._groups[group_id] = Group(group_id, state_timestamp_ms=now)
        await self._storage.write([GroupStorage.offset_upsert(group_id, t, p, c) for (t, p), c in accepted.items()])
        self._offsets.setdefault(group_id, {}).update(accepted)

    def _validate_committer(self, group_id: str, generation_id: int, member_id: str,
                            group_instance_id: str | None, api_version: int | None = None) -> ErrorCode:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        if self.modern_groups is not None and self.modern_groups.owns(group_id):
            return self.modern_groups.validate_commit(group_id, member_id, generation_id, api_version)
        group = self._groups.get(group_id)
        if group is None:
            if generation_id < 0:
                # A standalone committer (assign() consumers, Spark, admin tools): the group
                # exists only to hold offsets.
                self._groups[group_id] = Group(group_id, state_timestamp_ms=self._now_ms())
                return ErrorCode.NONE
            return ErrorCode.ILLEGAL_GENERATION
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group.is_static_member_fenced(group_instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if generation_id < 0 and group.state == GroupState.EMPTY:
            return ErrorCode.NONE
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state == GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def _validate_offset(self, entry: OffsetCommitEntry) -> ErrorCode:
        if self._partition_exists is not None and not self._partition_exists(entry.topic, entry.partition):
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if entry.metadata is not None and len(entry.metadata.encode("utf-8")) > self.config.offset_metadata_max_bytes:
            return ErrorCode.OFFSET_METADATA_TOO_LARGE
        if entry.offset < 0:
            return ErrorCode.OFFSET_OUT_OF_RANGE
        # An offset past the log end is accepted, as Kafka does: tools reset groups to planned
        # positions ahead of the data, and a consumer then waits there (or resets on fetch).
        return ErrorCode.NONE

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None
                      ) -> tuple[ErrorCode, dict[TopicPartition, CommittedOffset | None]]:
        """Committed offsets of the partitions asked for, or all of the group's if None."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, {}
        committed = self._offsets.get(group_id, {})
        if partitions is None:
            return ErrorCode.NONE, dict(committed)
        return ErrorCode.NONE, {tp: committed.get(tp) for tp in partitions}

    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]
                             ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, {}
        group = self._groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        if group.state != GroupState.EMPTY and not group.is_consumer_group():
            return NON_EMPTY_GROUP, {}
        results: dict[TopicPartition, ErrorCode] = {}
        eligible = []
        for topic, partition in partitions:
            if self._partition_exists is not None and not self._partition_exists(topic, partition):
                results[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif group.state != GroupState.EMPTY and group.is_subscribed_to(topic):
                results[(topic, partition)] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                eligible.append((topic, partition))
                results[(topic, partition)] = ErrorCode.NONE
        await self._remove_offsets(group, eligible)
        return ErrorCode.NONE, results

    async def _remove_offsets(self, group: Group, partitions: list[TopicPartition]) -> None:
        committed = self._offsets.get(group.group_id, {})
        present = [tp for tp in partitions if tp in committed]
        statements = [GroupStorage.offset_delete(group.group_id, t, p) for t, p in present]
        for tp in present:
            del committed[tp]
        if not committed:
            self._offsets.pop(group.group_id, None)
        if group.state == GroupState.EMPTY and not committed and group.group_id in self._groups:
            # An empty group without offsets has nothing left to remember.
            self._drop_group(group)
            statements.append(GroupStorage.group_delete(group.group_id))
        await self._storage.write(statements)

    async def expire_offsets(self) -> int:
        """Drop offsets past retention (Kafka's rules); returns how many were dropped."""
        now = self._now_ms()
        retention = self.config.offsets_retention_ms
        dropped = 0
        for group in list(self._groups.values()):
            committed = self._offsets.get(group.group_id, {})
            expired = []
            for tp, c in committed.items():
                if group.protocol_type is not None and group.state == GroupState.EMPTY:
                    # A consumer group's clock starts when its last member left.
                    base = group.state_timestamp_ms
                elif group.protocol_type is None:
                    base = c.commit_timestamp_ms
                elif group.subscribed_topics is not None and tp[0] not in group.subscribed_topics:
                    base = c.commit_timestamp_ms
                else:
                    continue
                deadline = c.expire_timestamp_ms if c.expire_timestamp_ms is not None else base + retention
                if deadline <= now:
                    expired.append(tp)
            if expired or (group.state == GroupState.EMPTY and not committed):
                dropped += len(expired)
                await self._remove_offsets(group, expired)
        if self.modern_groups is not None:
            dropped += await self._expire_consumer_group_offsets(now, retention)
        return dropped

    async def _expire_consumer_group_offsets(self, now: int, retention: int) -> int:
        """KIP-848 groups, by Kafka's rules: an empty group's offsets expire `retention` after
        it emptied; a group with members loses those of topics no member subscribes to."""
        dropped = 0
        for group_id in list(self._offsets):
            if group_id in self._groups or not self.modern_groups.owns(group_id):
                continue
            committed = self._offsets[group_id]
            expired = []
            for tp, c in committed.items():
                base = self.modern_groups.offsets_expiry_base(group_id, tp[0], c.commit_timestamp_ms)
                if base is None:
                    continue
                deadline = c.expire_timestamp_ms if c.expire_timestamp_ms is not None else base + retention
                if deadline <= now:
                    expired.append(tp)
            if not expired:
                continue
            for tp in expired:
                del committed[tp]
            if not committed:
                self._offsets.pop(group_id, None)
            await self._storage.write([GroupStorage.offset_delete(group_id, t, p) for t, p in expired])
            dropped += len(expired)
        return dropped

    def now_ms(self) -> int:
        """The coordinator's clock (wall-clock milliseconds; replaceable in tests)."""
        return self._now_ms()

    async def _expire_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            try:
                dropped = await self.expire_offsets()
                if dropped:
                    log.info("expired %d committed offsets", dropped)
            except Exception:
                log.exception("offset expiry failed")

    # -- helpers -------------------------------------------------------------------------

    def group(self, group_id: str) -> Group | None:
        return self._groups.get(group_id)

    def group_ids(self) -> list[str]:
        """Every group with members or committed offsets (metrics and the console; any thread)."""
        return sorted(set(list(self._groups)) | set(list(self._offsets)))

    def committed_by_group(self) -> dict[str, dict[TopicPartition, CommittedOffset]]:
        """A copy of every group's committed offsets (metrics and the console; any thread)."""
        return {group_id: dict(offsets) for group_id, offsets in list(self._offsets.items())}

    def release_empty(self, group_id: str) -> bool:
        """Give up a classic group that has no members (its committed offsets stay), so that
        the id can become a KIP-848 consumer group; False if the classic group has members."""
        group = self._groups.get(group_id)
        if group is None:
            return True
        if group.members or group.pending_members:
            return False
        self._cancel_group_timers(group)
        del self._groups[group_id]
        if group.generation_id or group.protocol_type:
            self._spawn(self._storage.write([GroupStorage.group_delete(group_id)]))
        return True

    async def forget_offsets(self, group_id: str) -> None:
        """Drop every committed offset of a group (a deleted consumer group)."""
        self._offsets.pop(group_id, None)
        await self._storage.write([GroupStorage.group_offsets_delete(group_id)])

    def _drop_group(self, group: Group) -> None:
        self._cancel_group_timers(group)
        group.transition(GroupState.DEAD, self._now_ms())
        self._groups.pop(group.group_id, None)
        self._offsets.pop(group.group_id, None)

    def _drop_if_unused(self, group: Group) -> None:
        if (group.state == GroupState.EMPTY and not group.members and not group.pending_members
                and group.generation_id == 0 and group.group_id not in self._offsets):
            self._drop_group(group)

    def _cancel_group_timers(self, group: Group) -> None:
        self._cancel_timer(group.join_timer)
        self._cancel_timer(group.sync_timer)
        group.join_timer = group.sync_timer = None
        for timer in group.pending_members_timers.values():
            timer.cancel()
        group.pending_members_timers.clear()

    def _group_record(self, group: Group, assignments: dict[str, bytes] | None = None) -> GroupRecord:
        members: tuple[StoredMember, ...] = ()
        if group.protocol_name is not None and group.state != GroupState.EMPTY:
            members = tuple(
                StoredMember(
                    m.member_id, m.group_instance_id, m.client_id, m.client_host, m.session_timeout_ms,
                    m.rebalance_timeout_ms, m.metadata_for(group.protocol_name),
                    assignments.get(m.member_id, b"") if assignments is not None else m.assignment)
                for m in group.members.values()
            )
        return GroupRecord(group.group_id, group.protocol_type, group.protocol_name, group.generation_id,
                           group.leader_id, group.state_timestamp_ms, members)

    async def _persist_group(self, group: Group) -> None:
        if self._groups.get(group.group_id) is not group:
            return
        try:
            await self._storage.write([GroupStorage.group_upsert(self._group_record(group))])
        except Exception:
            log.exception("storing group %s failed", group.group_id)

    @staticmethod
    def _answer_join(member: Member, result: JoinGroupResult) -> None:
        future, member.join_future = member.join_future, None
        if future is not None and not future.done():
            future.set_result(result)

    @staticmethod
    def _answer_sync(member: Member, result: SyncGroupResult) -> None:
        future, member.sync_future = member.sync_future, None
        if future is not None and not future.done():
            future.set_result(result)

    def _loop_now(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _call_later(self, delay_ms: int, callback: Callable, *args) -> asyncio.TimerHandle:
        return self._loop_now().call_later(max(delay_ms, 0) / 1000, callback, *args)

    @staticmethod
    def _cancel_timer(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()

    def _spawn(self, coro) -> None:
        task = self._loop_now().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
