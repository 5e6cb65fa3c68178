"""One share-partition of a share group (KIP-932): which records of a bucket are handed out,
to whom, how often, and which are done.

The share-partition start offset (SPSO) is the first record not yet done; every record from
there to the end offset (SPEO, one past the last record ever acquired) has a state:
available, acquired (by one member, under a lock with a deadline), acknowledged or archived.
Acquiring a record counts a delivery; a record released (explicitly, or by its lock timing
out, or by its member leaving) after the delivery-attempt limit is archived instead of being
offered again. The start offset moves past every leading record that is acknowledged or
archived, and records below it are forgotten, so the state is bounded by what is in flight.
"""
from __future__ import annotations

import enum
import json

import numpy as np

ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT, ACK_RENEW = 0, 1, 2, 3, 4
_ACK_TYPES = np.array([ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT, ACK_RENEW], dtype=np.int8)


class RecordState(enum.IntEnum):
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


_AVAILABLE, _ACQUIRED = int(RecordState.AVAILABLE), int(RecordState.ACQUIRED)
_ACKNOWLEDGED, _ARCHIVED = int(RecordState.ACKNOWLEDGED), int(RecordState.ARCHIVED)


class InvalidRecordState(Exception):
    """An acknowledgement of records the member does not hold (INVALID_RECORD_STATE)."""


class SharePartition:
    def __init__(self, start_offset: int, end_offset: int, states: np.ndarray | None = None,
                 counts: np.ndarray | None = None):
        self.start_offset = start_offset
        self.end_offset = end_offset
        n = end_offset - start_offset
        self.state = states if states is not None else np.full(n, _AVAILABLE, dtype=np.int8)
        self.count = counts if counts is not None else np.zeros(n, dtype=np.int16)
        self.lock = np.zeros(n, dtype=np.int32)
        self.member = np.full(n, -1, dtype=np.int32)
        self._member_ids: dict[str, int] = {}
        self._next_lock = 1

    def _member_index(self, member_id: str) -> int:
        return self._member_ids.setdefault(member_id, len(self._member_ids))

    # -- acquiring ------------------------------------------------------------------------

    def acquire(self, member_id: str, log_end: int, log_start: int, max_records: int
                ) -> tuple[int, list[tuple[int, int, int]]]:
        """Hand available records to the member: first the ones offered again, then new ones
        up to the log end. Returns the lock id and (first, last, delivery count) ranges."""
        if self.start_offset < log_start:
            self._skip_to(log_start)
        lock_id = self._next_lock
        self._next_lock += 1
        again = np.flatnonzero(self.state == _AVAILABLE)[:max(max_records, 0)]
        new = max(0, min(max_records - len(again), log_end - self.end_offset))
        if new:
            n = len(self.state)
            self._grow(new)
            again = np.concatenate([again, np.arange(n, n + new)])
        if not len(again):
            return lock_id, []
        self.state[again] = _ACQUIRED
        self.member[again] = self._member_index(member_id)
        self.lock[again] = lock_id
        self.count[again] += 1
        counts = self.count[again]
        breaks = np.flatnonzero((np.diff(again) != 1) | (np.diff(counts) != 0)) + 1
        starts = np.concatenate([[0], breaks])
        ends = np.concatenate([breaks, [len(again)]]) - 1
        base = self.start_offset
        return lock_id, [(int(base + again[a]), int(base + again[b]), int(counts[a])) for a, b in zip(starts, ends)]

    def has_available(self, log_end: int) -> bool:
        return self.end_offset < log_end or bool((self.state == _AVAILABLE).any())

    # -- acknowledging ---------------------------------------------------------------------

    def acknowledge(self, member_id: str, batches: list[tuple[int, int, list[int]]], limit: int) -> set[int]:
        """Apply acknowledgement batches (first, last, types) atomically: every offset must be
        acquired by this member, or nothing changes (InvalidRecordState). Returns the lock ids
        of renewed records."""
        member = self._member_ids.get(member_id, -2)
        plan: list[tuple[np.ndarray, np.ndarray]] = []
        for first, last, types in batches:
            if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
                raise InvalidRecordState(f"bad acknowledgement batch {first}-{last}")
            kinds = np.asarray(types, dtype=np.int8)
            if not np.isin(kinds, _ACK_TYPES).all():
                raise InvalidRecordState("unknown acknowledge type")
            kinds = np.broadcast_to(kinds, (last - first + 1,))
            index = np.arange(first, last + 1, dtype=np.int64) - self.start_offset
            inside = (index >= 0) & (index < len(self.state))
            if not inside[kinds != ACK_GAP].all():
                raise InvalidRecordState(f"records {first}-{last} are not acquired by member {member_id}")
            index, kinds = index[inside], kinds[inside]
            if not ((self.state[index] == _ACQUIRED) & (self.member[index] == member)).all():
                raise InvalidRecordState(f"records {first}-{last} are not acquired by member {member_id}")
            plan.append((index, kinds))
        renewed: set[int] = set()
        for index, kinds in plan:
            accept = index[(kinds == ACK_ACCEPT)]
            archive = index[(kinds == ACK_REJECT) | (kinds == ACK_GAP)]
            release = index[kinds == ACK_RELEASE]
            renewed.update(int(x) for x in np.unique(self.lock[index[kinds == ACK_RENEW]]))
            self._finish(accept, _ACKNOWLEDGED)
            self._finish(archive, _ARCHIVED)
            self._release(release, limit)
        self._advance()
        return renewed

    def release_lock(self, lock_id: int, limit: int) -> bool:
        """The lock of one acquisition timed out: its records still acquired become available
        (or archived past the limit). True if anything changed."""
        index = np.flatnonzero((self.state == _ACQUIRED) & (self.lock == lock_id))
        self._release(index, limit)
        self._advance()
        return bool(len(index))

    def release_member(self, member_id: str, limit: int) -> bool:
        member = self._member_ids.get(member_id)
        if member is None:
            return False
        index = np.flatnonzero((self.state == _ACQUIRED) & (self.member == member))
        self._release(index, limit)
        self._advance()
        return bool(len(index))

    def acquired_locks(self) -> set[int]:
        return {int(x) for x in np.unique(self.lock[self.state == _ACQUIRED])}

    def _release(self, index: np.ndarray, limit: int) -> None:
        self.state[index] = np.where(self.count[index] >= limit, _ARCHIVED, _AVAILABLE)
        self.member[index] = -1
        self.lock[index] = 0

    def _finish(self, index: np.ndarray, state: int) -> None:
        self.state[index] = state
        self.member[index] = -1
        self.lock[index] = 0

    def _grow(self, n: int) -> None:
        self.state = np.concatenate([self.state, np.full(n, _AVAILABLE, dtype=np.int8)])
        self.count = np.concatenate([self.count, np.zeros(n, dtype=np.int16)])
        self.lock = np.concatenate([self.lock, np.zeros(n, dtype=np.int32)])
        self.member = np.concatenate([self.member, np.full(n, -1, dtype=np.int32)])
        self.end_offset += n

    def _drop_front(self, k: int) -> None:
        self.state, self.count = self.state[k:], self.count[k:]
        self.lock, self.member = self.lock[k:], self.member[k:]
        self.start_offset += k

    def _advance(self) -> None:
        done = (self.state == _ACKNOWLEDGED) | (self.state == _ARCHIVED)
        k = len(done) if done.all() else int(np.argmin(done))
        if k:
            self._drop_front(k)

    def _skip_to(self, offset: int) -> None:
        """Records deleted from the log (retention) are gone from the share-partition too."""
        if offset >= self.end_offset:
            self._drop_front(len(self.state))
            self.start_offset = self.end_offset = offset
        else:
            self._drop_front(offset - self.start_offset)

    # -- durability ------------------------------------------------------------------------

    def to_json(self) -> str:
        """What survives a restart: locks do not, so acquired records are stored as available
        with their delivery counts (they are offered again, as Kafka does)."""
        states = np.where(self.state == _ACQUIRED, _AVAILABLE, self.state)
        return json.dumps({"start": self.start_offset, "end": self.end_offset,
                           "states": states.tolist(), "counts": self.count.tolist()})

    @classmethod
    def from_json(cls, text: str) -> "SharePartition":
        d = json.loads(text)
        if "records" in d:  # the first layout: one [offset, state, count] per record
            rows = sorted(d["records"])
            return cls(d["start"], d["end"], np.asarray([r[1] for r in rows], dtype=np.int8),
                       np.asarray([r[2] for r in rows], dtype=np.int16))
        return cls(d["start"], d["end"], np.asarray(d["states"], dtype=np.int8),
                   np.asarray(d["counts"], dtype=np.int16))
