"""The broker's lake tiering coordinator: which table a tiering job works on next, under a lease.

Per lake-enabled table a state, kept in the metadata store (`lake_tiering`):
pending (never tiered) -> tiering (a job holds a lease) -> tiered (a round completed) or
failed (a job reported failure); a tiered or failed table is due again `fluvial.lake.freshness`
after its last round, a tiering one when its lease expired. A job asks for work
(`acquire`), extends its lease (`heartbeat`) and reports (`complete`/`fail`); a report or
heartbeat under a lease that expired or was handed on is refused (`LakeLeaseError`).

The coordinator never decides what is tiered: the lake snapshot's `fluvial.offsets` does.
A round starts from them and ends at the high watermarks when the work is handed out, so a
job that died after committing is followed by one that starts where the commit ended.
Calls run on Flight threads (catalog I/O is blocking), never on the event loop.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fluvial.broker.config import config_flag, parse_duration_ms
from fluvial.errors import InvalidRequestError, LakeLeaseError
from fluvial.tiering.lake import catalog as lake_catalog

log = logging.getLogger(__name__)

PENDING, TIERING, TIERED, FAILED = "pending", "tiering", "tiered", "failed"

_DDL = """
CREATE TABLE IF NOT EXISTS lake_tiering (
    name TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    lease_id TEXT,
    lease_expires_ms INTEGER,
    job TEXT,
    snapshot_id INTEGER,
    offsets TEXT NOT NULL DEFAULT '{}',
    tiered_ms INTEGER,
    error TEXT,
    rounds INTEGER NOT NULL DEFAULT 0,
    updated_ms INTEGER NOT NULL,
    started_ms INTEGER,
    round_ms INTEGER
);
"""


def now_ms() -> int:
    return int(time.time() * 1000)


def lake_enabled(table) -> bool:
    # A primary-key table's changelog view shares its configs but is not a lake table itself.
    if getattr(table, "source", None) is not None:
        return False
    return config_flag(table.configs.get("fluvial.lake.enable", "false"))


def freshness_ms(table) -> int:
    return parse_duration_ms(table.configs.get("fluvial.lake.freshness", "30s"))


# Scheduling margin on top of twice the smoothed round duration: covers the job's poll
# interval (it acquires up to one poll after a table is due) and the produce-to-visible delay.
SCHEDULE_MARGIN_MS = 1000
# Weight of the newest round in the smoothed round duration (which rises at once to a slower
# round and decays by this weight towards faster ones).
ROUND_SMOOTHING = 0.3


def smoothed_round_ms(previous: int | None, last: int) -> int:
    """The round duration the schedule plans with: a slower round counts at once (one slow
    round means the next may be slow too), faster ones pull it down gradually."""
    if previous is None:
        return last
    return max(last, int(round((1 - ROUND_SMOOTHING) * previous + ROUND_SMOOTHING * last)))


def next_round_start_ms(started_ms: int, freshness: int, round_ms: int | None) -> int:
    """When the round after one that started at `started_ms` is due.

    A row appended just after a round fixed its end offsets is committed by the next round,
    so its lag is (next start - this start) + the next round's duration + the job's poll
    delay. Starting `freshness - 2 x smoothed duration - margin` after this start keeps that
    under the freshness even when the next round takes up to twice as long as usual. Rounds
    never follow closer than a tenth of the freshness (a freshness shorter than the rounds
    means back-to-back rounds, which is what it asks for).
    """
    gap = freshness - 2 * (round_ms or 0) - SCHEDULE_MARGIN_MS
    return started_ms + max(gap, freshness // 10)


def table_shape(table) -> tuple[Any, list[str] | None, bool]:
    """(user Arrow schema, primary key or None, raw) of a broker table."""
    from fluvial.broker.flight.catalog import is_typed, user_schema

    pk = table.configs.get("fluvial.primary.key")
    return user_schema(table), [c.strip() for c in pk.split(",")] if pk else None, not is_typed(table)


@dataclass
class Row:
    name: str
    state: str
    lease_id: str | None
    lease_expires_ms: int | None
    job: str | None
    snapshot_id: int | None
    offsets: dict[int, int]
    tiered_ms: int | None
    error: str | None
    rounds: int
    updated_ms: int
    started_ms: int | None = None
    round_ms: int | None = None


class LakeCoordinator:
    """Hands lake tables to tiering jobs under leases; one per broker."""

    def __init__(self, broker, catalog_properties: dict[str, str], lease_ms: int):
        self.broker = broker
        self.store = broker.store
        self.properties = catalog_properties
        self.lease_ms = lease_ms
        self._catalog = None
        self._catalog_lock = threading.Lock()
        self._ensure_lock = threading.Lock()
        # One acquire at a time: two jobs must never get the same table.
        self._acquire_lock = threading.Lock()
        self.store.ensure_schema(_DDL)
        columns = {r["name"] for r in self.store.query("PRAGMA table_info(lake_tiering)")}
        for column in ("started_ms", "round_ms"):
            if column not in columns:  # a metadata store from before these columns
                with self.store.transaction() as conn:
                    conn.execute(f"ALTER TABLE lake_tiering ADD COLUMN {column} INTEGER")

    # -- the lake ----------------------------------------------------------------------

    def catalog(self):
        with self._catalog_lock:
            if self._catalog is None:
                self._catalog = lake_catalog.open_catalog(self.properties)
            return self._catalog

    def ensure_table(self, table):
        """Create or evolve the lake table of a broker table (blocking catalog I/O)."""
        schema, pk, raw = table_shape(table)
        with self._ensure_lock:
            return lake_catalog.ensure_lake_table(self.catalog(), table.name, schema, pk, raw, str(table.topic_id))

    # -- state rows --------------------------------------------------------------------

    def _row(self, name: str) -> Row | None:
        rows = self.store.query("SELECT * FROM lake_tiering WHERE name = ?", (name,))
        if not rows:
            return None
        r = rows[0]
        return Row(r["name"], r["state"], r["lease_id"], r["lease_expires_ms"], r["job"], r["snapshot_id"],
                   {int(k): v for k, v in json.loads(r["offsets"]).items()}, r["tiered_ms"], r["error"],
                   r["rounds"], r["updated_ms"], r["started_ms"], r["round_ms"])

    def _ensure_row(self, name: str) -> Row:
        with self.store.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO lake_tiering (name, state, updated_ms) VALUES (?, ?, ?)",
                         (name, PENDING, now_ms()))
        return self._row(name)

    def forget(self, name: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM lake_tiering WHERE name = ?", (name,))

    def lake_table(self, name: str):
        table = self.broker.tables.get(name)
        if not lake_enabled(table):
            raise InvalidRequestError(f"table {name!r} is not a lake table (set fluvial.lake.enable=true)")
        return table

    def state_of(self, row: Row | None, now: int) -> str:
        if row is None:
            return PENDING
        if row.state == TIERING and (row.lease_expires_ms or 0) < now:
            return "lease-expired"
        return row.state

    # -- the Flight actions --------------------------------------------------------------

    def info(self, name: str) -> dict | None:
        """`lake-info`: None for a table that is not lake-enabled."""
        table = self.broker.tables.get(name)
        if not lake_enabled(table):
            return None
        lake = self.ensure_table(table)
        return lake_catalog.lake_info(self.properties, name, lake, self.state_of(self._row(name), now_ms()),
                                      freshness_ms(table))

    def _due(self, table, row: Row, now: int) -> int | None:
        """When the table is due for a round (ms), None while a live lease holds it."""
        if row.state == PENDING:
            return 0
        if row.state == TIERING:
            return row.lease_expires_ms if (row.lease_expires_ms or 0) < now else None
        if row.state == FAILED:
            return row.updated_ms + freshness_ms(table)
        # Freshness is the target lag: see next_round_start_ms.
        started = row.started_ms if row.started_ms is not None else (row.tiered_ms or 0)
        return next_round_start_ms(started, freshness_ms(table), row.round_ms)

    def acquire(self, job: str, only: list[str] | None = None) -> dict | None:
        """`lake-acquire`: the most overdue lake table with new rows, leased to `job`; None if none is due."""
        with self._acquire_lock:
            now = now_ms()
            candidates = []
            for table in list(self.broker.tables.tables.values()):
                if not lake_enabled(table) or (only and table.name not in only):
                    continue
                row = self._row(table.name) or self._ensure_row(table.name)
                due = self._due(table, row, now)
                if due is not None and due <= now:
                    candidates.append((due, table.name, table))
            for _, name, table in sorted(candidates):
                lake = self.ensure_table(table)
                snapshot_id, lake_offsets, _ = lake_catalog.lake_state(lake)
                start, end = {}, {}
                for b in table.buckets:
                    # Offsets retention removed before they were tiered cannot be tiered. The
                    # bucket's log start, not its local one: offsets held only by remote
                    # segments are still read (the round's scan stitches them in).
                    start[b.index] = max(lake_offsets.get(b.index, 0), b.log_start_offset)
                    end[b.index] = max(start[b.index], b.tablet.high_watermark)
                if all(end[b] == start[b] for b in end):
                    # Nothing new: the lake is as fresh as the table.
                    with self.store.transaction() as conn:
                        conn.execute("UPDATE lake_tiering SET state = ?, tiered_ms = ?, snapshot_id = ?, offsets = ?, "
                                     "lease_id = NULL, updated_ms = ?, started_ms = ? WHERE name = ?",
                                     (TIERED, now, snapshot_id, lake_catalog.offsets_json(lake_offsets), now, now,
                                      name))
                    continue
                lease = uuid.uuid4().hex
                with self.store.transaction() as conn:
                    conn.execute("UPDATE lake_tiering SET state = ?, lease_id = ?, lease_expires_ms = ?, job = ?, "
                                 "error = NULL, updated_ms = ?, started_ms = ? WHERE name = ?",
                                 (TIERING, lease, now + self.lease_ms, job, now, now, name))
                schema, pk, raw = table_shape(table)
                log.info("lake: %s leased to %s, offsets %s -> %s", name, job, start, end)
                return {"table": name, "lease_id": lease, "lease_ms": self.lease_ms,
                        "kind": "primary_key" if pk else "log", "primary_key": pk, "raw": raw,
                        "snapshot_id": snapshot_id,
                        "start_offsets": {str(b): o for b, o in start.items()},
                        "end_offsets": {str(b): o for b, o in end.items()},
                        "lake": lake_catalog.lake_info(self.properties, name, lake, TIERING, freshness_ms(table))}
            return None

    def _check_lease(self, name: str, lease_id: str, now: int) -> Row:
        row = self._row(name)
        if row is None or row.state != TIERING or row.lease_id != lease_id:
            raise LakeLeaseError(f"lease {lease_id} on lake table {name!r} is not held any more "
                                 f"(the table is {row.state if row else 'unknown'}); the round's work is reconciled "
                                 "from the lake by the next job")
        if (row.lease_expires_ms or 0) < now:
            raise LakeLeaseError(f"lease {lease_id} on lake table {name!r} expired "
                                 f"{now - row.lease_expires_ms} ms ago; the next job reconciles from the lake")
        return row

    def heartbeat(self, name: str, lease_id: str) -> dict:
        """`lake-heartbeat`: extends a live lease."""
        with self._acquire_lock:
            now = now_ms()
            self._check_lease(name, lease_id, now)
            with self.store.transaction() as conn:
                conn.execute("UPDATE lake_tiering SET lease_expires_ms = ?, updated_ms = ? WHERE name = ?",
                             (now + self.lease_ms, now, name))
            return {"lease_ms": self.lease_ms}

    def complete(self, name: str, lease_id: str, snapshot_id: int | None, offsets: dict[str, int]) -> dict:
        """`lake-complete`: the round committed lake snapshot `snapshot_id` covering `offsets`."""
        with self._acquire_lock:
            now = now_ms()
            row = self._check_lease(name, lease_id, now)
            table = self.lake_table(name)
            lake = self.ensure_table(table)
            current_id, current, _ = lake_catalog.lake_state(lake)
            reported = {int(k): int(v) for k, v in offsets.items()}
            if snapshot_id is not None and lake.metadata.snapshot_by_id(int(snapshot_id)) is None:
                raise InvalidRequestError(f"lake table {name!r} has no snapshot {snapshot_id}")
            if current != reported:
                raise InvalidRequestError(f"the report says lake table {name!r} covers {reported}, its current "
                                          f"snapshot {current_id} covers {current}")
            with self.store.transaction() as conn:
                conn.execute("UPDATE lake_tiering SET state = ?, lease_id = NULL, lease_expires_ms = NULL, "
                             "snapshot_id = ?, offsets = ?, tiered_ms = ?, error = NULL, rounds = rounds + 1, "
                             "updated_ms = ?, round_ms = ? WHERE name = ?",
                             (TIERED, current_id, lake_catalog.offsets_json(current), now, now,
                              smoothed_round_ms(row.round_ms, now - (row.started_ms or now)), name))
            return {"state": TIERED, "snapshot_id": current_id}

    def fail(self, name: str, lease_id: str, error: str) -> dict:
        """`lake-fail`: the round failed; the table is due again after its freshness interval."""
        with self._acquire_lock:
            now = now_ms()
            self._check_lease(name, lease_id, now)
            with self.store.transaction() as conn:
                conn.execute("UPDATE lake_tiering SET state = ?, lease_id = NULL, lease_expires_ms = NULL, "
                             "error = ?, updated_ms = ? WHERE name = ?", (FAILED, str(error)[:2000], now, name))
            log.warning("lake: tiering %s failed: %s", name, error)
            return {"state": FAILED}

    def status(self, name: str | None = None) -> list[dict]:
        """`lake-status`: per lake table its state, lake snapshot, tiered offsets and lag."""
        now = now_ms()
        out = []
        tables = [self.broker.tables.get(name)] if name else sorted(
            self.broker.tables.tables.values(), key=lambda t: t.name)
        for table in tables:
            if not lake_enabled(table):
                if name:
                    raise InvalidRequestError(f"table {name!r} is not a lake table")
                continue
            row = self._row(table.name)
            lake = lake_catalog.load_lake_table(self.catalog(), table.name)
            snapshot_id, offsets, committed_ms = lake_catalog.lake_state(lake)
            buckets = []
            for b in table.buckets:
                tiered = offsets.get(b.index, 0)
                buckets.append({"bucket": b.index, "tiered": tiered, "high_watermark": b.tablet.high_watermark,
                                "lag_records": max(0, b.tablet.high_watermark - max(tiered, b.log_start_offset))})
            lag_records = sum(b["lag_records"] for b in buckets)
            out.append({"table": table.name, "state": self.state_of(row, now), "snapshot_id": snapshot_id,
                        "committed_ms": committed_ms, "buckets": buckets, "lag_records": lag_records,
                        "lag_seconds": round((now - (committed_ms or table.created_ms)) / 1000, 3) if lag_records else 0.0,
                        "freshness_ms": freshness_ms(table), "rounds": row.rounds if row else 0,
                        "job": row.job if row else None, "error": row.error if row else None})
        return out
