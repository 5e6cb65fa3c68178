"""A tiering round and the worker loop that asks the broker for rounds.

A round: take the work (table, fixed end offsets, lease) from `lake-acquire`; reconcile
from the lake (its current snapshot's `fluvial.offsets` are where the round starts, whatever
the broker said: a job that died after its commit has already moved them); evolve the lake
table's columns; read [start, end) of every bucket and write data files (log tables) or the
last change of every key (primary-key tables); commit once with the new offsets, refused if
the lake moved meanwhile; report. A job killed at any step leaves either no commit (the next
round redoes the range; unreferenced data files are orphans, never read) or a commit the next
round starts after: no row is skipped or tiered twice.

How a round reads and writes is a `RoundIO`: `NativeRoundIO` (the table API, in one
process: the broker's `--lake-tiering` and small deployments) or `SparkRoundIO`
(`fluvial.tiering.lake.spark_job`, buckets read and files written by Spark tasks).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import pyarrow as pa

import fluvial.client as fc
from fluvial.errors import LakeLeaseError
from fluvial.tiering.lake import catalog as lake_catalog
from fluvial.tiering.lake.schema import read_columns
from fluvial.tiering.lake.writer import LakeConflictError, commit_round, reduce_changes, write_data_files

log = logging.getLogger(__name__)

# Crash tests: the process kills itself (SIGKILL) when it reaches this step of a round.
FAULT_ENV = "FLUVIAL_LAKE_FAULT"
STEPS = ("before_write", "after_write", "after_commit", "before_report")


def fault_point(step: str) -> None:
    if os.environ.get(FAULT_ENV) == step:
        log.warning("lake fault hook: killing this process at %s", step)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Work:
    """One round as the coordinator handed it out."""

    table: str
    lease_id: str
    lease_ms: int
    primary_key: list[str] | None
    raw: bool
    start: dict[int, int]
    end: dict[int, int]
    catalog: dict[str, str]

    @classmethod
    def from_json(cls, body: dict) -> "Work":
        return cls(body["table"], body["lease_id"], int(body["lease_ms"]), body.get("primary_key"),
                   bool(body.get("raw")), {int(k): int(v) for k, v in body["start_offsets"].items()},
                   {int(k): int(v) for k, v in body["end_offsets"].items()}, dict(body["lake"]["catalog"]))


@dataclass(frozen=True)
class RoundResult:
    table: str
    snapshot_id: int | None
    offsets: dict[int, int]
    rows: int
    seconds: float


class RoundIO(Protocol):
    def write_log(self, lake_table, table: str, columns: list[str], ranges: dict[int, tuple[int, int]]) -> list:
        """Read the ranges, write them as data files of `lake_table`; returns the DataFiles."""

    def read_changes(self, table: str, columns: list[str], primary_key: list[str],
                     ranges: dict[int, tuple[int, int]]) -> tuple[pa.Table, pa.Table, int]:
        """(current rows, deleted keys, changes read) of the keys changed in the ranges."""


class NativeRoundIO:
    """Reads through the table API in this process."""

    def __init__(self, url: str, security: fc.ConnectionSecurity | None = None):
        self.url = url
        self.security = security or fc.ConnectionSecurity()

    def _scan(self, table: str, columns: list[str], bucket: int, start: int, end: int):
        with fc.Client(self.url, security=self.security) as client:
            t = client.table(table)
            yield from t.scan(columns=columns, start={bucket: start}, end={bucket: end}, buckets=[bucket]).to_batches()

    def write_log(self, lake_table, table, columns, ranges):
        files = []
        for task, (bucket, (start, end)) in enumerate(sorted(ranges.items())):
            pending: list[pa.RecordBatch] = []
            size = 0
            for batch in self._scan(table, columns, bucket, start, end):
                pending.append(batch)
                size += batch.nbytes
                if size >= 128 * 1024 * 1024:
                    files += write_data_files(lake_table.metadata, lake_table.io, pa.Table.from_batches(pending), task)
                    pending, size = [], 0
            if pending:
                files += write_data_files(lake_table.metadata, lake_table.io, pa.Table.from_batches(pending), task)
        return files

    def read_changes(self, table, columns, primary_key, ranges):
        parts = [pa.Table.from_batches(list(self._scan(table, columns, b, s, e)))
                 for b, (s, e) in sorted(ranges.items())]
        parts = [p for p in parts if p.num_rows]
        if not parts:
            return pa.table({}), pa.table({}), 0
        changes = pa.concat_tables(parts, promote_options="permissive")
        rows, deleted = reduce_changes(changes, primary_key)
        return rows, deleted, changes.num_rows


class Heartbeat:
    """Keeps a round's lease alive; `check()` raises once the broker refused it."""

    def __init__(self, client: fc.Client, work: Work):
        self.client, self.work = client, work
        self.lost: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lake-heartbeat-{work.table}", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def beat(self) -> None:
        try:
            self.client._action("lake-heartbeat", {"name": self.work.table, "lease_id": self.work.lease_id})
        except LakeLeaseError as exc:
            self.lost = exc

    def _run(self) -> None:
        while not self._stop.wait(max(0.2, self.work.lease_ms / 3000)):
            try:
                self.beat()
            except fc.FluvialError as exc:  # the broker is away: the lease may still hold
                log.warning("lake heartbeat of %s failed: %s", self.work.table, exc)
            if self.lost:
                return

    def check(self) -> None:
        """Before committing: the lease must still be ours (a fresh heartbeat says so)."""
        if self.lost is None:
            self.beat()
        if self.lost is not None:
            raise self.lost


_catalogs: dict[tuple, object] = {}
_catalog_lock = threading.Lock()


def catalog_for(properties: dict[str, str]):
    key = tuple(sorted(properties.items()))
    with _catalog_lock:
        if key not in _catalogs:
            _catalogs[key] = lake_catalog.open_catalog(properties)
        return _catalogs[key]


def run_round(client: fc.Client, work: Work, io: RoundIO, catalog_options: dict[str, str] | None = None) -> RoundResult:
    """One tiering round of `work` (see the module doc); raises on failure, after which the
    lake is unchanged or holds a complete round."""
    began = time.monotonic()
    with Heartbeat(client, work) as heartbeat:
        catalog = catalog_for({**work.catalog, **(catalog_options or {})})
        info = client.describe(work.table)
        pk = work.primary_key
        lake = lake_catalog.ensure_lake_table(catalog, work.table, info.schema, pk, work.raw)
        snapshot_id, lake_offsets, _ = lake_catalog.lake_state(lake)
        ranges = {}
        for bucket, end in work.end.items():
            start = max(lake_offsets.get(bucket, 0), work.start.get(bucket, 0))
            if end > start:
                ranges[bucket] = (start, end)
        offsets = dict(lake_offsets)
        for bucket, end in work.end.items():
            offsets[bucket] = max(offsets.get(bucket, 0), end)
        rows = 0
        if ranges:
            columns = read_columns(info.schema, pk, work.raw)
            fault_point("before_write")
            if pk:
                upserts, deleted, rows = io.read_changes(work.table, columns, pk, ranges)
                fault_point("after_write")
                heartbeat.check()
                snapshot_id = commit_round(lake, snapshot_id, offsets, upserts=upserts, deleted=deleted,
                                           primary_key=pk)
            else:
                files = io.write_log(lake, work.table, columns, ranges)
                rows = sum(f.record_count for f in files)
                fault_point("after_write")
                heartbeat.check()
                snapshot_id = commit_round(lake, snapshot_id, offsets, data_files=files)
            fault_point("after_commit")
        else:
            offsets = lake_offsets  # an earlier job committed this round and died before reporting
        fault_point("before_report")
        client._action("lake-complete", {"name": work.table, "lease_id": work.lease_id, "snapshot_id": snapshot_id,
                                         "offsets": {str(b): o for b, o in offsets.items()}})
    result = RoundResult(work.table, snapshot_id, offsets, rows, time.monotonic() - began)
    log.info("lake: tiered %d rows of %s in %.2f s (snapshot %s, offsets %s)", rows, work.table, result.seconds,
             snapshot_id, offsets)
    return result


class TieringWorker:
    """Asks the broker for rounds and runs them, until stopped (or once with `run_once`)."""

    def __init__(self, url: str, job: str | None = None, catalog_options: dict[str, str] | None = None,
                 io: RoundIO | None = None, tables: list[str] | None = None, poll_s: float = 1.0,
                 security: fc.ConnectionSecurity | None = None):
        self.url = url
        # The broker's user for this job: lake-acquire/-heartbeat/-complete/-fail need
        # CLUSTER_ACTION on the cluster, reading the tables READ.
        self.security = security or fc.ConnectionSecurity()
        self.job = job or f"{socket.gethostname()}-{os.getpid()}"
        self.catalog_options = catalog_options or {}
        self.io = io or NativeRoundIO(url, self.security)
        self.tables = tables
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.results: list[RoundResult] = []
        # Called after each completed round (the CLI advances its progress bar).
        self.on_round: Callable[[RoundResult], None] | None = None

    def run_once(self) -> RoundResult | None:
        """One round of whichever table is due; None when none is."""
        with fc.Client(self.url, security=self.security) as client:
            body = client._action("lake-acquire", {"job": self.job, "tables": self.tables})
            if body is None:
                return None
            work = Work.from_json(body)
            try:
                result = run_round(client, work, self.io, self.catalog_options)
            except Exception as exc:
                log.warning("lake: round of %s failed: %s", work.table, exc)
                try:
                    client._action("lake-fail", {"name": work.table, "lease_id": work.lease_id,
                                                 "error": f"{type(exc).__name__}: {exc}"})
                except fc.FluvialError:
                    pass
                if isinstance(exc, (LakeConflictError, LakeLeaseError)):
                    return None
                raise
            self.results.append(result)
            if self.on_round is not None:
                self.on_round(result)
            return result

    def run(self, rounds: int | None = None, idle_exit_s: float | None = None) -> None:
        """Rounds until stopped, `rounds` rounds were done, or nothing was due for `idle_exit_s`."""
        done, idle_since = 0, time.monotonic()
        while not self._stop.is_set():
            try:
                result = self.run_once()
            except fc.BrokerUnavailableError as exc:
                log.warning("lake: broker unavailable: %s", exc)
                result = None
            except Exception:
                log.exception("lake: tiering round failed")
                result = None
            if result is not None:
                done, idle_since = done + 1, time.monotonic()
                if rounds is not None and done >= rounds:
                    return
                continue
            if idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                return
            self._stop.wait(self.poll_s)

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self.run, name="lake-tiering", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
