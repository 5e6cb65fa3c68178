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
from dataclasses import dataclass, field

ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT, ACK_RENEW = 0, 1, 2, 3, 4


class RecordState(enum.IntEnum):
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


@dataclass
class InFlight:
    state: RecordState
    delivery_count: int
    member_id: str | None = None
    lock_id: int = 0  # which acquisition (lock) holds the record


class InvalidRecordState(Exception):
    """An acknowledgement of records the member does not hold (INVALID_RECORD_STATE)."""


@dataclass
class SharePartition:
    start_offset: int
    end_offset: int
    records: dict[int, InFlight] = field(default_factory=dict)
    _next_lock: int = 1

    # -- acquiring ------------------------------------------------------------------------

    def acquire(self, member_id: str, log_end: int, log_start: int, max_records: int
                ) -> tuple[int, list[tuple[int, int, int]]]:
        """Hand available records to the member: first the ones offered again, then new ones
        up to the log end. Returns the lock id and (first, last, delivery count) ranges."""
        if self.start_offset < log_start:
            self._skip_to(log_start)
        lock_id = self._next_lock
        self._next_lock += 1
        taken: list[int] = []
        for offset in sorted(o for o, r in self.records.items() if r.state == RecordState.AVAILABLE):
            if len(taken) >= max_records:
                break
            taken.append(offset)
        while len(taken) < max_records and self.end_offset < log_end:
            self.records[self.end_offset] = InFlight(RecordState.AVAILABLE, 0)
            taken.append(self.end_offset)
            self.end_offset += 1
        ranges: list[tuple[int, int, int]] = []
        for offset in sorted(taken):
            r = self.records[offset]
            r.state, r.member_id, r.lock_id = RecordState.ACQUIRED, member_id, lock_id
            r.delivery_count += 1
            if ranges and ranges[-1][1] == offset - 1 and ranges[-1][2] == r.delivery_count:
                ranges[-1] = (ranges[-1][0], offset, r.delivery_count)
            else:
                ranges.append((offset, offset, r.delivery_count))
        return lock_id, ranges

    def has_available(self, log_end: int) -> bool:
        return self.end_offset < log_end or any(r.state == RecordState.AVAILABLE for r in self.records.values())

    # -- acknowledging ---------------------------------------------------------------------

    def acknowledge(self, member_id: str, batches: list[tuple[int, int, list[int]]], limit: int) -> set[int]:
        """Apply acknowledgement batches (first, last, types) atomically: every offset must be
        acquired by this member, or nothing changes (InvalidRecordState). Returns the lock ids
        of renewed records."""
        plan: list[tuple[int, int]] = []
        for first, last, types in batches:
            if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
                raise InvalidRecordState(f"bad acknowledgement batch {first}-{last}")
            for i, offset in enumerate(range(first, last + 1)):
                kind = types[0] if len(types) == 1 else types[i]
                if kind not in (ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT, ACK_RENEW):
                    raise InvalidRecordState(f"unknown acknowledge type {kind}")
                r = self.records.get(offset)
                if kind == ACK_GAP and r is None:
                    continue
                if r is None or r.state != RecordState.ACQUIRED or r.member_id != member_id:
                    raise InvalidRecordState(f"record {offset} is not acquired by member {member_id}")
                plan.append((offset, kind))
        renewed: set[int] = set()
        for offset, kind in plan:
            r = self.records[offset]
            if kind in (ACK_ACCEPT, ACK_GAP):
                self._done(r, RecordState.ACKNOWLEDGED if kind == ACK_ACCEPT else RecordState.ARCHIVED)
            elif kind == ACK_REJECT:
                self._done(r, RecordState.ARCHIVED)
            elif kind == ACK_RELEASE:
                self._release(r, limit)
            else:
                renewed.add(r.lock_id)
        self._advance()
        return renewed

    def release_lock(self, lock_id: int, limit: int) -> bool:
        """The lock of one acquisition timed out: its records still acquired become available
        (or archived past the limit). True if anything changed."""
        changed = False
        for r in self.records.values():
            if r.state == RecordState.ACQUIRED and r.lock_id == lock_id:
                self._release(r, limit)
                changed = True
        self._advance()
        return changed

    def release_member(self, member_id: str, limit: int) -> bool:
        changed = False
        for r in self.records.values():
            if r.state == RecordState.ACQUIRED and r.member_id == member_id:
                self._release(r, limit)
                changed = True
        self._advance()
        return changed

    def acquired_locks(self) -> set[int]:
        return {r.lock_id for r in self.records.values() if r.state == RecordState.ACQUIRED}

    @staticmethod
    def _release(r: InFlight, limit: int) -> None:
        r.state = RecordState.ARCHIVED if r.delivery_count >= limit else RecordState.AVAILABLE
        r.member_id, r.lock_id = None, 0

    @staticmethod
    def _done(r: InFlight, state: RecordState) -> None:
        r.state, r.member_id, r.lock_id = state, None, 0

    def _advance(self) -> None:
        while True:
            r = self.records.get(self.start_offset)
            if self.start_offset >= self.end_offset or r is None or r.state not in (
                    RecordState.ACKNOWLEDGED, RecordState.ARCHIVED):
                return
            del self.records[self.start_offset]
            self.start_offset += 1

    def _skip_to(self, offset: int) -> None:
        """Records deleted from the log (retention) are gone from the share-partition too."""
        for o in [o for o in self.records if o < offset]:
            del self.records[o]
        self.start_offset = offset
        self.end_offset = max(self.end_offset, offset)

    # -- durability ------------------------------------------------------------------------

    def to_json(self) -> str:
        """What survives a restart: locks do not, so acquired records are stored as available
        with their delivery counts (they are offered again, as Kafka does)."""
        return json.dumps({
            "start": self.start_offset, "end": self.end_offset,
            "records": [[o, int(RecordState.AVAILABLE if r.state == RecordState.ACQUIRED else r.state),
                         r.delivery_count] for o, r in sorted(self.records.items())],
        })

    @classmethod
    def from_json(cls, text: str) -> "SharePartition":
        d = json.loads(text)
        return cls(d["start"], d["end"], {o: InFlight(RecordState(s), n) for o, s, n in d["records"]})
