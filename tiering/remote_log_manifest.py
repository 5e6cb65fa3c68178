"""The remote log manifest of a bucket: which remote segments make up its tiered log.

A manifest is the one source of truth for what is remote: an object no committed manifest
lists is an orphan (an upload cut short by a crash, or an expired segment whose deletion
did not happen) and is collected, never served. Manifests are committed in the broker's
metadata store (SQLite, synchronous=FULL) with a version that must match the one read, so
a commit replaces the whole manifest atomically: after a crash there is the old manifest or
the new one, never a mix.
"""
from __future__ import annotations

import bisect
import json
import uuid
from dataclasses import dataclass, field, replace

from fluvial.broker.metadata import MetadataStore
from fluvial.errors import StorageError
from fluvial.tiering.remote_segment import RemoteSegment

_DDL = """
CREATE TABLE IF NOT EXISTS remote_log_manifests (
    topic_id TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    version INTEGER NOT NULL,
    manifest TEXT NOT NULL,
    PRIMARY KEY (topic_id, bucket)
);
"""


def bucket_prefix(table: str, topic_id: str, bucket: int) -> str:
    """Where a bucket's remote objects live: ``log/<table>-<topic id>/<bucket>/``."""
    return f"log/{table}-{topic_id}/{bucket}/"


def segment_key(table: str, topic_id: str, bucket: int, base_offset: int, next_offset: int) -> str:
    # A fresh suffix per upload: a retried upload never overwrites an object a manifest lists.
    return f"{bucket_prefix(table, topic_id, bucket)}{base_offset:020d}-{next_offset:020d}-{uuid.uuid4().hex[:12]}.parquet"


@dataclass(frozen=True)
class RemoteLogManifest:
    """The remote segments of one bucket, ordered and contiguous, and the remote log start."""

    table: str
    topic_id: str
    bucket: int
    segments: tuple[RemoteSegment, ...] = ()
    # Records below this offset are gone (retention, DeleteRecords), even if a segment holds them.
    log_start_offset: int = 0
    version: int = 0
    _bases: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_bases", tuple(s.base_offset for s in self.segments))
        for before, after in zip(self.segments, self.segments[1:]):
            if before.next_offset != after.base_offset:
                raise StorageError(
                    f"remote manifest of {self.table}-{self.bucket} is not contiguous at {before.next_offset}")

    @property
    def end_offset(self) -> int:
        """The first offset not in the remote log (the remote log covers [log_start, end))."""
        return self.segments[-1].next_offset if self.segments else self.log_start_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    @property
    def keys(self) -> set[str]:
        return {s.key for s in self.segments}

    def segment_for(self, offset: int) -> RemoteSegment | None:
        """The remote segment holding ``offset``, if the remote log serves it."""
        if not self.segments or offset < self.log_start_offset or offset >= self.end_offset:
            return None
        segment = self.segments[bisect.bisect_right(self._bases, offset) - 1]
        return segment if segment.base_offset <= offset < segment.next_offset else None

    def segments_from(self, offset: int) -> tuple[RemoteSegment, ...]:
        if not self.segments:
            return ()
        i = max(0, bisect.bisect_right(self._bases, max(offset, self.log_start_offset)) - 1)
        return tuple(s for s in self.segments[i:] if s.next_offset > offset)

    def appended(self, segment: RemoteSegment) -> RemoteLogManifest:
        if self.segments and segment.base_offset != self.end_offset:
            raise StorageError(f"remote segment {segment.key} does not follow offset {self.end_offset}")
        start = self.log_start_offset if self.segments else max(self.log_start_offset, segment.base_offset)
        return replace(self, segments=self.segments + (segment,), log_start_offset=start)

    def truncated_to(self, offset: int) -> tuple[RemoteLogManifest, tuple[RemoteSegment, ...]]:
        """The manifest with the log start at ``offset``; returns it and the segments it drops
        (wholly below the new start), whose objects may go once it is committed."""
        start = max(self.log_start_offset, offset)
        dropped = tuple(s for s in self.segments if s.next_offset <= start)
        kept = self.segments[len(dropped):]
        return replace(self, segments=kept, log_start_offset=start), dropped

    def to_json(self) -> dict:
        return {"table": self.table, "topic_id": self.topic_id, "bucket": self.bucket,
                "log_start_offset": self.log_start_offset, "version": self.version,
                "segments": [s.to_json() for s in self.segments]}

    @classmethod
    def from_json(cls, data: dict) -> RemoteLogManifest:
        return cls(data["table"], data["topic_id"], data["bucket"],
                   tuple(RemoteSegment.from_json(s) for s in data["segments"]),
                   data["log_start_offset"], data["version"])


class ManifestConflict(StorageError):
    """Another commit replaced the manifest since it was read."""


class ManifestStore:
    """Remote log manifests in the broker's metadata store."""

    def __init__(self, store: MetadataStore):
        self._store = store
        store.ensure_schema(_DDL)

    def load(self, table: str, topic_id: str, bucket: int) -> RemoteLogManifest:
        rows = self._store.query("SELECT manifest FROM remote_log_manifests WHERE topic_id = ? AND bucket = ?",
                                 (topic_id, bucket))
        if not rows:
            return RemoteLogManifest(table, topic_id, bucket)
        return RemoteLogManifest.from_json(json.loads(rows[0]["manifest"]))

    def commit(self, manifest: RemoteLogManifest) -> RemoteLogManifest:
        """Replace the bucket's manifest if it is still at ``manifest.version``; returns the new one."""
        new = replace(manifest, version=manifest.version + 1)
        text = json.dumps(new.to_json(), separators=(",", ":"))
        with self._store.transaction() as conn:
            row = conn.execute("SELECT version FROM remote_log_manifests WHERE topic_id = ? AND bucket = ?",
                               (manifest.topic_id, manifest.bucket)).fetchone()
            current = row["version"] if row else 0
            if current != manifest.version:
                raise ManifestConflict(f"remote manifest of {manifest.table}-{manifest.bucket} moved "
                                       f"from version {manifest.version} to {current}")
            conn.execute("INSERT OR REPLACE INTO remote_log_manifests (topic_id, bucket, version, manifest) "
                         "VALUES (?, ?, ?, ?)", (manifest.topic_id, manifest.bucket, new.version, text))
        return new

    def delete_table(self, topic_id: str) -> None:
        with self._store.transaction() as conn:
            conn.execute("DELETE FROM remote_log_manifests WHERE topic_id = ?", (topic_id,))

    def all_for_table(self, topic_id: str) -> list[RemoteLogManifest]:
        rows = self._store.query("SELECT manifest FROM remote_log_manifests WHERE topic_id = ?", (topic_id,))
        return [RemoteLogManifest.from_json(json.loads(r["manifest"])) for r in rows]
