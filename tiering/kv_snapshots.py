"""KV snapshots in the object store: what restores a bucket whose local disk is gone, and
what a client reads a primary-key table from without asking the broker for the rows.

A remote snapshot of one bucket is a folder of objects

    kv/<table>-<topic id>/<bucket>/<snapshot id>-<token>/db/<checkpoint files>
    kv/<table>-<topic id>/<bucket>/<snapshot id>-<token>/rows.parquet

plus the bucket's manifest `kv/<table>-<topic id>/<bucket>/manifest.json`, which lists the
retained snapshots (id, covered changelog offset, files with their sizes). The manifest is
replaced (atomically) only after every object of a new snapshot is stored, so a snapshot
is either listed whole or not at all; objects of dropped snapshots are deleted after the
manifest that drops them is written, and objects no manifest lists (an upload cut short)
are collected by the next upload. The random token keeps a retried or restarted upload
from ever overwriting objects a committed manifest lists.

`rows.parquet` holds the bucket's rows at the snapshot's offset in the table's columns:
a client reads it with any Parquet reader (no RocksDB, no broker CPU), then continues
with the changelog from `log_offset`.

Every call blocks (object store I/O): the broker runs them on executors.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from fluvial.errors import ObjectNotFound, StorageError
from fluvial.progress import ProgressLog

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
ROWS = "rows.parquet"


@dataclass(frozen=True)
class RemoteKvSnapshot:
    """One snapshot of a bucket's KV tablet in the object store."""

    snapshot_id: int
    log_offset: int          # changelog offsets below this are in the snapshot
    created_ms: int
    prefix: str              # key of the snapshot's folder
    files: list[tuple[str, int]] = field(default_factory=list)  # checkpoint files (relative path, size)
    rows: int = 0            # rows in rows.parquet
    rows_bytes: int = 0      # size of rows.parquet

    @property
    def rows_key(self) -> str:
        return f"{self.prefix}/{ROWS}"

    def keys(self) -> list[str]:
        return [f"{self.prefix}/db/{name}" for name, _ in self.files] + [self.rows_key]

    def to_json(self) -> dict:
        body = asdict(self)
        body["files"] = [list(f) for f in self.files]
        body["rows_key"] = self.rows_key
        return body

    @classmethod
    def from_json(cls, body: dict) -> "RemoteKvSnapshot":
        return cls(int(body["snapshot_id"]), int(body["log_offset"]), int(body["created_ms"]), str(body["prefix"]),
                   [(str(n), int(s)) for n, s in body.get("files", [])], int(body.get("rows", 0)),
                   int(body.get("rows_bytes", 0)))


def bucket_prefix(table: str, topic_id, bucket: int) -> str:
    return f"kv/{table}-{topic_id}/{bucket}"


class RemoteKvSnapshots:
    """The remote snapshots of one bucket's KV tablet, kept `retain` deep."""

    def __init__(self, store, prefix: str, retain: int = 2):
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.retain = max(1, retain)

    @property
    def manifest_key(self) -> str:
        return f"{self.prefix}/{MANIFEST}"

    def list(self) -> list[RemoteKvSnapshot]:
        """The committed snapshots, oldest first ([] when none)."""
        try:
            data = self.store.get(self.manifest_key)
        except ObjectNotFound:
            return []
        try:
            body = json.loads(data)
            return [RemoteKvSnapshot.from_json(s) for s in body["snapshots"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"the KV snapshot manifest {self.manifest_key} in {self.store.url} is corrupt: "
                               f"{exc}") from None

    def latest(self, max_offset: int | None = None, min_offset: int = 0) -> RemoteKvSnapshot | None:
        """The newest snapshot covering an offset in [min_offset, max_offset]."""
        for snap in reversed(self.list()):
            if (max_offset is None or snap.log_offset <= max_offset) and snap.log_offset >= min_offset:
                return snap
        return None

    def upload(self, checkpoint: Path, log_offset: int, rows: Iterable[pa.RecordBatch], schema: pa.Schema,
               scratch: Path) -> RemoteKvSnapshot:
        """Store a local checkpoint (`checkpoint/` holds RocksDB's files) and its rows, then
        commit it in the manifest. `scratch` is a local folder for the Parquet file."""
        listed = self.list()
        snapshot_id = listed[-1].snapshot_id + 1 if listed else 1
        # Snapshots covering more than this one are from offsets a power loss took back (a
        # discard on open that could not reach the store): they go with this commit.
        existing = [s for s in listed if s.log_offset <= log_offset]
        prefix = f"{self.prefix}/{snapshot_id}-{uuid.uuid4().hex[:12]}"
        files = []
        for path in sorted(p for p in Path(checkpoint).rglob("*") if p.is_file()):
            name = path.relative_to(checkpoint).as_posix()
            self.store.put_file(f"{prefix}/db/{name}", path)
            files.append((name, path.stat().st_size))
        scratch.mkdir(parents=True, exist_ok=True)
        parquet = scratch / f".upload-{uuid.uuid4().hex}.parquet"
        count = 0
        try:
            with pq.ParquetWriter(parquet, schema, compression="zstd") as writer:
                for batch in rows:
                    writer.write_batch(batch)
                    count += batch.num_rows
            size = parquet.stat().st_size
            self.store.put_file(f"{prefix}/{ROWS}", parquet)
        finally:
            parquet.unlink(missing_ok=True)
        snap = RemoteKvSnapshot(snapshot_id, log_offset, int(time.time() * 1000), prefix, files, count, size)
        kept = (existing + [snap])[-self.retain:]
        self.store.replace(self.manifest_key, json.dumps({"snapshots": [s.to_json() for s in kept]}).encode())
        self.collect_garbage(kept)
        return snap

    def discard_after(self, offset: int) -> list[RemoteKvSnapshot]:
        """Drop the snapshots covering changes past `offset` (a log end that went back: after
        a power loss those offsets are given to other changes) from the manifest, then their
        objects; returns what was dropped."""
        listed = self.list()
        kept = [s for s in listed if s.log_offset <= offset]
        if len(kept) == len(listed):
            return []
        self.store.replace(self.manifest_key, json.dumps({"snapshots": [s.to_json() for s in kept]}).encode())
        self.collect_garbage(kept)
        return [s for s in listed if s.log_offset > offset]

    def collect_garbage(self, kept: list[RemoteKvSnapshot] | None = None) -> int:
        """Delete every object of this bucket no committed snapshot lists (dropped snapshots,
        uploads cut short). Returns how many were deleted."""
        kept = self.list() if kept is None else kept
        live = {self.manifest_key} | {k for s in kept for k in s.keys()}
        dead = [k for k in self.store.list(self.prefix + "/") if k not in live]
        if dead:
            self.store.delete(dead)
        return len(dead)

    def download(self, snap: RemoteKvSnapshot, dest: Path) -> None:
        """The snapshot's RocksDB into `dest` (which must not exist): written to a temporary
        folder, every file's size checked, then renamed into place."""
        dest = Path(dest)
        tmp = dest.parent / f".{dest.name}.download"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        progress = ProgressLog(log, f"restoring KV snapshot {snap.snapshot_id} into {dest}",
                               sum(size for _, size in snap.files), "bytes")
        try:
            for name, size in snap.files:
                key = f"{snap.prefix}/db/{name}"
                try:
                    data = self.store.get(key)
                except ObjectNotFound:
                    raise StorageError(f"KV snapshot {snap.snapshot_id} in {self.store.url} is missing {key}") from None
                if len(data) != size:
                    raise StorageError(f"KV snapshot object {key} in {self.store.url} has {len(data)} bytes, "
                                       f"its manifest says {size}: the snapshot is corrupt")
                target = tmp / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                progress.advance(size)
            os.rename(tmp, dest)
            progress.finish()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def delete_all(self) -> None:
        self.store.delete(self.store.list(self.prefix + "/"))


def read_snapshot_rows(store, snap: RemoteKvSnapshot, columns: list[str] | None = None) -> pa.Table:
    """The rows of a remote snapshot (only `columns`' bytes are fetched, when given)."""
    try:
        with store.open_input(snap.rows_key) as f:
            table = pq.read_table(f, columns=columns)
    except ObjectNotFound:
        raise StorageError(f"KV snapshot {snap.snapshot_id} in {store.url} is missing {snap.rows_key}") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise StorageError(f"KV snapshot rows {snap.rows_key} in {store.url} cannot be read: {exc}") from None
    if table.num_rows != snap.rows:
        raise StorageError(f"KV snapshot rows {snap.rows_key} in {store.url} hold {table.num_rows} rows, "
                           f"its manifest says {snap.rows}: the snapshot is corrupt")
    return table
