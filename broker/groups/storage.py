"""Durable group state in the metadata store: committed offsets and group records.

Writes are queued and applied by one writer thread, many queued writes per SQLite
transaction (group commit), so a burst of OffsetCommits costs one fsync rather than one
each while every write is still durable before its caller is answered.
"""
from __future__ import annotations

import asyncio
import base64
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fluvial.broker.metadata import MetadataStore

_DDL = """
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL,
    leader_epoch INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    commit_timestamp_ms INTEGER NOT NULL,
    expire_timestamp_ms INTEGER,
    PRIMARY KEY (group_id, topic, partition)
);
CREATE TABLE IF NOT EXISTS group_metadata (
    group_id TEXT PRIMARY KEY,
    protocol_type TEXT,
    protocol_name TEXT,
    generation_id INTEGER NOT NULL,
    leader_id TEXT,
    state_timestamp_ms INTEGER NOT NULL,
    members TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS consumer_groups (
    group_id TEXT PRIMARY KEY,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS share_groups (
    group_id TEXT PRIMARY KEY,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS share_partitions (
    group_id TEXT NOT NULL,
    topic_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (group_id, topic_id, partition)
);
"""

_UPSERT_OFFSET = (
    "INSERT INTO group_offsets (group_id, topic, partition, committed_offset, leader_epoch, metadata,"
    " commit_timestamp_ms, expire_timestamp_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (group_id, topic, partition) DO UPDATE SET committed_offset = excluded.committed_offset,"
    " leader_epoch = excluded.leader_epoch, metadata = excluded.metadata,"
    " commit_timestamp_ms = excluded.commit_timestamp_ms, expire_timestamp_ms = excluded.expire_timestamp_ms"
)
_DELETE_OFFSET = "DELETE FROM group_offsets WHERE group_id = ? AND topic = ? AND partition = ?"
_DELETE_GROUP_OFFSETS = "DELETE FROM group_offsets WHERE group_id = ?"
_UPSERT_GROUP = (
    "INSERT INTO group_metadata (group_id, protocol_type, protocol_name, generation_id, leader_id,"
    " state_timestamp_ms, members) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (group_id) DO UPDATE SET protocol_type = excluded.protocol_type,"
    " protocol_name = excluded.protocol_name, generation_id = excluded.generation_id,"
    " leader_id = excluded.leader_id, state_timestamp_ms = excluded.state_timestamp_ms,"
    " members = excluded.members"
)
_DELETE_GROUP = "DELETE FROM group_metadata WHERE group_id = ?"
_UPSERT_CONSUMER_GROUP = (
    "INSERT INTO consumer_groups (group_id, state) VALUES (?, ?)"
    " ON CONFLICT (group_id) DO UPDATE SET state = excluded.state"
)
_DELETE_CONSUMER_GROUP = "DELETE FROM consumer_groups WHERE group_id = ?"

Statement = tuple[str, tuple]


@dataclass(frozen=True)
class CommittedOffset:
    """One committed position of a group on a bucket."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = 0
    expire_timestamp_ms: int | None = None


@dataclass(frozen=True)
class StoredMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupRecord:
    """What survives a restart of a group: its generation and, if stable, its members."""

    group_id: str
    protocol_type: str | None
    protocol_name: str | None
    generation_id: int
    leader_id: str | None
    state_timestamp_ms: int
    members: tuple[StoredMember, ...]


def _encode_members(members: tuple[StoredMember, ...]) -> str:
    return json.dumps([
        {
            "member_id": m.member_id,
            "group_instance_id": m.group_instance_id,
            "client_id": m.client_id,
            "client_host": m.client_host,
            "session_timeout_ms": m.session_timeout_ms,
            "rebalance_timeout_ms": m.rebalance_timeout_ms,
            "metadata": base64.b64encode(m.metadata).decode("ascii"),
            "assignment": base64.b64encode(m.assignment).decode("ascii"),
        }
        for m in members
    ])


def _decode_members(text: str) -> tuple[StoredMember, ...]:
    return tuple(
        StoredMember(
            member_id=d["member_id"],
            group_instance_id=d["group_instance_id"],
            client_id=d["client_id"],
            client_host=d["client_host"],
            session_timeout_ms=d["session_timeout_ms"],
            rebalance_timeout_ms=d["rebalance_timeout_ms"],
            metadata=base64.b64decode(d["metadata"]),
            assignment=base64.b64decode(d["assignment"]),
        )
        for d in json.loads(text)
    )


class GroupStorage:
    """Reads group state at start-up and applies durable writes in order."""

    def __init__(self, store: MetadataStore):
        self._store = store
        store.ensure_schema(_DDL)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="group-storage")
        self._pending: list[tuple[list[Statement], asyncio.Future]] = []
        self._writer: asyncio.Task | None = None

    # -- start-up reads ----------------------------------------------------------------

    def load_offsets(self) -> dict[str, dict[tuple[str, int], CommittedOffset]]:
        offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        for row in self._store.query("SELECT * FROM group_offsets"):
            offsets.setdefault(row["group_id"], {})[(row["topic"], row["partition"])] = CommittedOffset(
                offset=row["committed_offset"],
                leader_epoch=row["leader_epoch"],
                metadata=row["metadata"],
                commit_timestamp_ms=row["commit_timestamp_ms"],
                expire_timestamp_ms=row["expire_timestamp_ms"],
            )
        return offsets

    def load_groups(self) -> list[GroupRecord]:
        return [
            GroupRecord(
                group_id=row["group_id"],
                protocol_type=row["protocol_type"],
                protocol_name=row["protocol_name"],
                generation_id=row["generation_id"],
                leader_id=row["leader_id"],
                state_timestamp_ms=row["state_timestamp_ms"],
                members=_decode_members(row["members"]),
            )
            for row in self._store.query("SELECT * FROM group_metadata")
        ]

    def load_consumer_groups(self) -> dict[str, str]:
        """KIP-848 groups: group id -> the group's state as JSON (see consumer_group.py)."""
        return {row["group_id"]: row["state"] for row in self._store.query("SELECT * FROM consumer_groups")}

    def load_share_groups(self) -> dict[str, str]:
        return {row["group_id"]: row["state"] for row in self._store.query("SELECT * FROM share_groups")}

    def load_share_partitions(self) -> dict[tuple[str, str, int], str]:
        return {(row["group_id"], row["topic_id"], row["partition"]): row["state"]
                for row in self._store.query("SELECT * FROM share_partitions")}

    # -- statements --------------------------------------------------------------------

    @staticmethod
    def offset_upsert(group_id: str, topic: str, partition: int, committed: CommittedOffset) -> Statement:
        return (_UPSERT_OFFSET, (group_id, topic, partition, committed.offset, committed.leader_epoch,
                                 committed.metadata, committed.commit_timestamp_ms, committed.expire_timestamp_ms))

    @staticmethod
    def offset_delete(group_id: str, topic: str, partition: int) -> Statement:
        return (_DELETE_OFFSET, (group_id, topic, partition))

    @staticmethod
    def group_offsets_delete(group_id: str) -> Statement:
        return (_DELETE_GROUP_OFFSETS, (group_id,))

    @staticmethod
    def group_upsert(record: GroupRecord) -> Statement:
        return (_UPSERT_GROUP, (record.group_id, record.protocol_type, record.protocol_name,
                                record.generation_id, record.leader_id, record.state_timestamp_ms,
                                _encode_members(record.members)))

    @staticmethod
    def group_delete(group_id: str) -> Statement:
        return (_DELETE_GROUP, (group_id,))

    @staticmethod
    def consumer_group_upsert(group_id: str, state: str) -> Statement:
        return (_UPSERT_CONSUMER_GROUP, (group_id, state))

    @staticmethod
    def share_group_upsert(group_id: str, state: str) -> Statement:
        return ("INSERT INTO share_groups (group_id, state) VALUES (?, ?)"
                " ON CONFLICT (group_id) DO UPDATE SET state = excluded.state", (group_id, state))

    @staticmethod
    def share_partition_upsert(group_id: str, topic_id: str, partition: int, state: str) -> Statement:
        return ("INSERT INTO share_partitions (group_id, topic_id, partition, state) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (group_id, topic_id, partition) DO UPDATE SET state = excluded.state",
                (group_id, topic_id, partition, state))

    @staticmethod
    def share_group_delete(group_id: str) -> list[Statement]:
        """Statements dropping a share group and its share-partitions (use with `+`)."""
        return [("DELETE FROM share_groups WHERE group_id = ?", (group_id,)),
                ("DELETE FROM share_partitions WHERE group_id = ?", (group_id,))]

    @staticmethod
    def consumer_group_delete(group_id: str) -> Statement:
        return (_DELETE_CONSUMER_GROUP, (group_id,))

    # -- durable writes ----------------------------------------------------------------

    async def write(self, statements: list[Statement]) -> None:
        """Apply the statements atomically; returns once they are durable."""
        if not statements:
            return
        future = asyncio.get_running_loop().create_future()
        self._pending.append((statements, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._drain())
        await future

    def write_now(self, statements: list[Statement]) -> None:
        """A synchronous write, for start-up and shutdown paths off the event loop."""
        self._apply([statements])

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await loop.run_in_executor(self._executor, self._apply, [s for s, _ in batch])
            except Exception as exc:  # every waiter of this transaction learns of the failure
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            else:
                for _, future in batch:
                    if not future.done():
                        future.set_result(None)

    def _apply(self, batches: list[list[Statement]]) -> None:
        with self._store.transaction() as conn:
            for statements in batches:
                for sql, params in statements:
                    conn.execute(sql, params)

    async def close(self) -> None:
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        self._executor.shutdown(wait=True)
