"""Share groups (KIP-932): ShareGroupHeartbeat and ShareGroupDescribe membership, share
sessions, and the share-partitions that ShareFetch and ShareAcknowledge work on.

Members of a share group consume the same partitions together; the broker, not an offset,
decides who gets which records (see share_partition.py). So the assignment is simple: every
member is assigned every partition of the topics it subscribes to. Acquisition locks are
loop timers; every change to a share-partition is durable before the request that made it
is answered, so acknowledged records are never delivered again after a restart.
"""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Callable

from fluvial.broker.groups.share_partition import InvalidRecordState, SharePartition
from fluvial.broker.groups.storage import GroupStorage
from fluvial.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

TopicCatalog = Callable[[], dict[str, tuple[uuid.UUID, int]]]
PartitionKey = tuple[str, uuid.UUID, int]  # group, topic id, partition


@dataclass
class ShareGroupSettings:
    session_timeout_ms: int = 45_000           # group.share.session.timeout.ms
    heartbeat_interval_ms: int = 5_000         # group.share.heartbeat.interval.ms
    record_lock_duration_ms: int = 30_000      # group.share.record.lock.duration.ms
    delivery_count_limit: int = 5              # group.share.delivery.count.limit
    auto_offset_reset: str = "latest"          # share.auto.offset.reset (per group in Kafka)
    max_size: int = 200                        # group.share.max.size


@dataclass(eq=False)
class ShareMember:
    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = 0
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: list[str] = field(default_factory=list)
    session_timer: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)

    def state(self) -> str:
        if not self.members:
            return "Empty"
        return "Stable" if all(m.member_epoch == self.group_epoch for m in self.members.values()) else "Reconciling"

    def to_json(self) -> str:
        return json.dumps({"group_epoch": self.group_epoch, "members": [
            {"member_id": m.member_id, "member_epoch": m.member_epoch, "previous": m.previous_member_epoch,
             "rack_id": m.rack_id, "client_id": m.client_id, "client_host": m.client_host,
             "subscribed": m.subscribed_topic_names} for m in self.members.values()]})

    @classmethod
    def from_json(cls, group_id: str, text: str) -> "ShareGroup":
        d = json.loads(text)
        group = cls(group_id, d["group_epoch"])
        for m in d["members"]:
            group.members[m["member_id"]] = ShareMember(m["member_id"], m["member_epoch"], m["previous"], m["rack_id"],
                                                        m["client_id"], m["client_host"], m["subscribed"])
        return group


@dataclass
class ShareHeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: dict[uuid.UUID, list[int]] | None = None


@dataclass
class ShareSession:
    next_epoch: int = 1
    partitions: set[tuple[uuid.UUID, int]] = field(default_factory=set)
    peer: str = ""  # the connection that opened it


class ShareGroupCoordinator:
    def __init__(self, storage: GroupStorage, topics: TopicCatalog, is_other_group: Callable[[str], bool],
                 settings: ShareGroupSettings | None = None):
        self.settings = settings or ShareGroupSettings()
        self._storage = storage
        self._topics = topics
        self._is_other_group = is_other_group
        self._groups: dict[str, ShareGroup] = {}
        self._partitions: dict[PartitionKey, SharePartition] = {}
        self._locks: dict[tuple[PartitionKey, int], asyncio.TimerHandle] = {}
        self._sessions: dict[tuple[str, str], ShareSession] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # Set when records become available again (a lock timed out, a release): long polls wake.
        self.released = asyncio.Event()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for group_id, text in self._storage.load_share_groups().items():
            group = self._groups[group_id] = ShareGroup.from_json(group_id, text)
            for member in group.members.values():
                self._arm_session(group, member)
        for (group_id, topic_id, partition), text in self._storage.load_share_partitions().items():
            self._partitions[(group_id, uuid.UUID(topic_id), partition)] = SharePartition.from_json(text)

    async def close(self) -> None:
        for group in self._groups.values():
            for member in group.members.values():
                if member.session_timer is not None:
                    member.session_timer.cancel()
        for timer in self._locks.values():
            timer.cancel()

    def owns(self, group_id: str) -> bool:
        return group_id in self._groups

    def listings(self) -> list[tuple[str, str]]:
        return [(g.group_id, g.state()) for g in self._groups.values()]

    def group(self, group_id: str) -> ShareGroup | None:
        return self._groups.get(group_id)

    # -- membership ---------------------------------------------------------------------

    def _assignment(self, member: ShareMember) -> dict[uuid.UUID, list[int]]:
        catalog = self._topics()
        return {catalog[n][0]: list(range(catalog[n][1])) for n in member.subscribed_topic_names if n in catalog}

    async def heartbeat(self, *, group_id: str, member_id: str, member_epoch: int, rack_id: str | None,
                        subscribed: list[str] | None, client_id: str, client_host: str) -> ShareHeartbeatResult:
        invalid = ErrorCode.INVALID_REQUEST
        if not group_id:
            return ShareHeartbeatResult(invalid, "GroupId can't be empty.")
        if not member_id:
            return ShareHeartbeatResult(invalid, "MemberId can't be empty.")
        if member_epoch == 0 and not subscribed:
            return ShareHeartbeatResult(invalid, "SubscribedTopicNames must be set in first request.")
        if member_epoch < -1:
            return ShareHeartbeatResult(invalid, f"MemberEpoch is invalid: {member_epoch}.")
        group = self._groups.get(group_id)
        if group is None:
            if self._is_other_group(group_id):
                return ShareHeartbeatResult(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a share group.")
            if member_epoch != 0:
                return ShareHeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID,
                                            f"Member {member_id} is not a member of group {group_id}.")
            group = self._groups[group_id] = ShareGroup(group_id)
        member = group.members.get(member_id)
        if member_epoch == -1:
            if member is None:
                return ShareHeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID,
                                            f"Member {member_id} is not a member of group {group_id}.")
            await self._remove(group, member)
            return ShareHeartbeatResult(ErrorCode.NONE, None, member_id, -1, self.settings.heartbeat_interval_ms)
        assignment_before = None
        if member_epoch == 0:
            if member is None:
                if len(group.members) >= self.settings.max_size:
                    return ShareHeartbeatResult(ErrorCode.GROUP_MAX_SIZE_REACHED,
                                                f"The share group has reached its maximum capacity of "
                                                f"{self.settings.max_size} members.")
                member = group.members[member_id] = ShareMember(member_id)
            group.group_epoch += 1
        else:
            if member is None:
                return ShareHeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID,
                                            f"Member {member_id} is not a member of group {group_id}.")
            if member_epoch > member.member_epoch or (
                    member_epoch < member.member_epoch and member_epoch != member.previous_member_epoch):
                return ShareHeartbeatResult(ErrorCode.FENCED_MEMBER_EPOCH,
                                            f"The share group member has epoch {member_epoch}, the coordinator "
                                            f"knows {member.member_epoch}.")
            assignment_before = self._assignment(member)
        if subscribed is not None and sorted(set(subscribed)) != member.subscribed_topic_names:
            member.subscribed_topic_names = sorted(set(subscribed))
            if member_epoch != 0:
                group.group_epoch += 1
        member.rack_id = rack_id if rack_id is not None else member.rack_id
        member.client_id, member.client_host = client_id, client_host
        if member.member_epoch != group.group_epoch:
            member.previous_member_epoch, member.member_epoch = member.member_epoch, group.group_epoch
        self._arm_session(group, member)
        assignment = self._assignment(member)
        await self._storage.write([GroupStorage.share_group_upsert(group_id, group.to_json())])
        send = member_epoch == 0 or assignment != assignment_before
        return ShareHeartbeatResult(ErrorCode.NONE, None, member_id, member.member_epoch,
                                    self.settings.heartbeat_interval_ms, assignment if send else None)

    async def _remove(self, group: ShareGroup, member: ShareMember) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        group.members.pop(member.member_id, None)
        group.group_epoch += 1
        self._sessions.pop((group.group_id, member.member_id), None)
        statements = [GroupStorage.share_group_upsert(group.group_id, group.to_json())]
        statements += self._release_member(group.group_id, member.member_id)
        await self._storage.write(statements)

    def _release_member(self, group_id: str, member_id: str) -> list:
        statements = []
        for key, sp in self._partitions.items():
            if key[0] == group_id and sp.release_member(member_id, self.settings.delivery_count_limit):
                statements.append(self._partition_statement(key))
                self.released.set()
        return statements

    def _arm_session(self, group: ShareGroup, member: ShareMember) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        member.session_timer = self._loop_now().call_later(
            self.settings.session_timeout_ms / 1000, self._expire, group, member)

    def _expire(self, group: ShareGroup, member: ShareMember) -> None:
        if group.members.get(member.member_id) is member:
            log.info("share group %s: member %s removed (session timeout)", group.group_id, member.member_id)
            self._spawn(self._remove(group, member))

    def describe(self, group_id: str):
        return self._groups.get(group_id)

    async def delete_empty(self, group_id: str) -> ErrorCode:
        """DeleteGroups of a share group: only without members; its share-partition state goes too."""
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.members:
            return ErrorCode.NON_EMPTY_GROUP
        del self._groups[group_id]
        keys = [k for k in self._partitions if k[0] == group_id]
        for key in keys:
            del self._partitions[key]
            for lock in [lk for lk in self._locks if lk[0] == key]:
                self._locks.pop(lock).cancel()
        self._sessions = {k: v for k, v in self._sessions.items() if k[0] != group_id}
        await self._storage.write(GroupStorage.share_group_delete(group_id))
        return ErrorCode.NONE

    def assignment_of(self, member: ShareMember) -> dict[uuid.UUID, list[int]]:
        return self._assignment(member)

    # -- share sessions -------------------------------------------------------------------

    def open_session(self, group_id: str, member_id: str, epoch: int, peer: str = ""
                     ) -> tuple[ErrorCode, str | None, ShareSession | None]:
        """Check the request's share-session epoch: 0 opens a session, -1 closes it after this
        request, any other must be the next one of the member's open session."""
        key = (group_id, member_id)
        if epoch == 0:
            old = self._sessions.get(key)
            if old is not None:
                # A new session for the member: what it held under the old one is offered again.
                self._spawn(self._storage.write(self._release_member(group_id, member_id)))
            session = self._sessions[key] = ShareSession(peer=peer)
            return ErrorCode.NONE, None, session
        session = self._sessions.get(key)
        if session is None:
            return ErrorCode.SHARE_SESSION_NOT_FOUND, "The share session was not found.", None
        if epoch == -1:
            self._sessions.pop(key, None)
            return ErrorCode.NONE, None, session
        if epoch != session.next_epoch:
            return ErrorCode.INVALID_SHARE_SESSION_EPOCH, (
                f"The share session epoch is {epoch}, expected {session.next_epoch}."), None
        session.next_epoch = epoch + 1 if epoch < 2**31 - 1 else 1
        return ErrorCode.NONE, None, session

    def connection_closed(self, peer: str) -> None:
        """A client connection ended: the share sessions it opened end with it, and the
        records their members held are offered again at once (as Kafka does)."""
        for key in [k for k, s in self._sessions.items() if s.peer == peer]:
            del self._sessions[key]
            self._spawn(self._storage.write(self._release_member(*key)))

    async def release_session(self, group_id: str, member_id: str) -> None:
        """A closed share session: the records its member still holds are offered again."""
        await self._storage.write(self._release_member(group_id, member_id))

    # -- share-partitions -----------------------------------------------------------------

    def share_partition(self, group_id: str, topic_id: uuid.UUID, partition: int,
                        log_start: int, log_end: int) -> SharePartition:
        key = (group_id, topic_id, partition)
        sp = self._partitions.get(key)
        if sp is None:
            first = log_start if self.settings.auto_offset_reset == "earliest" else log_end
            sp = self._partitions[key] = SharePartition(first, first)
        return sp

    def acquire(self, group_id: str, member_id: str, topic_id: uuid.UUID, partition: int, log_start: int,
                log_end: int, max_records: int) -> list[tuple[int, int, int]]:
        key = (group_id, topic_id, partition)
        sp = self.share_partition(group_id, topic_id, partition, log_start, log_end)
        if max_records <= 0 or not sp.has_available(log_end):
            return []
        lock_id, ranges = sp.acquire(member_id, log_end, log_start, max_records)
        if ranges:
            self._arm_lock(key, lock_id)
        return ranges

    def acknowledge(self, group_id: str, member_id: str, topic_id: uuid.UUID, partition: int,
                    batches: list[tuple[int, int, list[int]]]) -> ErrorCode:
        key = (group_id, topic_id, partition)
        sp = self._partitions.get(key)
        if sp is None:
            return ErrorCode.INVALID_RECORD_STATE
        try:
            renewed = sp.acknowledge(member_id, batches, self.settings.delivery_count_limit)
        except InvalidRecordState:
            return ErrorCode.INVALID_RECORD_STATE
        for lock_id in renewed:
            self._arm_lock(key, lock_id)
        live = sp.acquired_locks()
        for (k, lock_id) in [k for k in self._locks if k[0] == key and k[1] not in live]:
            self._locks.pop((k, lock_id)).cancel()
        if any(b[2] and 2 in b[2] for b in batches):
            self.released.set()
        return ErrorCode.NONE

    def _arm_lock(self, key: PartitionKey, lock_id: int) -> None:
        old = self._locks.pop((key, lock_id), None)
        if old is not None:
            old.cancel()
        self._locks[(key, lock_id)] = self._loop_now().call_later(
            self.settings.record_lock_duration_ms / 1000, self._lock_expired, key, lock_id)

    def _lock_expired(self, key: PartitionKey, lock_id: int) -> None:
        self._locks.pop((key, lock_id), None)
        sp = self._partitions.get(key)
        if sp is not None and sp.release_lock(lock_id, self.settings.delivery_count_limit):
            self.released.set()
            self._spawn(self._storage.write([self._partition_statement(key)]))

    def _partition_statement(self, key: PartitionKey):
        return GroupStorage.share_partition_upsert(key[0], str(key[1]), key[2], self._partitions[key].to_json())

    async def persist(self, keys: set[PartitionKey]) -> None:
        await self._storage.write([self._partition_statement(k) for k in keys if k in self._partitions])

    def start_and_end(self, group_id: str) -> dict[tuple[uuid.UUID, int], tuple[int, int]]:
        return {(t, p): (sp.start_offset, sp.end_offset) for (g, t, p), sp in self._partitions.items() if g == group_id}

    # -- helpers ---------------------------------------------------------------------------

    def _loop_now(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _spawn(self, coro) -> None:
        task = self._loop_now().create_task(coro)
        task.add_done_callback(lambda t: t.cancelled() or (t.exception() and log.error(
            "share group state write failed: %s", t.exception())))
