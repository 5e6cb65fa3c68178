"""KV snapshots of a bucket: RocksDB checkpoints with the log offset they cover, kept N deep.

Each snapshot is a directory `<id>/` holding the checkpoint (`db/`) and `snapshot.json`
(the offset: the first changelog offset not in it). The manifest is written last and
the directory renamed into place, so a snapshot either exists whole or not at all. Tables
with remote storage on also upload each snapshot (`fluvial.tiering.kv_snapshots`).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

_MANIFEST = "snapshot.json"


@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: int
    log_offset: int  # changelog offsets below this are in the snapshot
    created_ms: int
    path: Path
    remote: dict | None = None  # the object-store copy (RemoteKvSnapshot.to_json()), once uploaded

    def to_json(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


class SnapshotStore:
    """The snapshots of one bucket's KV tablet in a local directory."""

    def __init__(self, root: Path, retain: int = 3):
        self.root = Path(root)
        self.retain = max(1, retain)

    def list(self) -> list[SnapshotInfo]:
        """Complete snapshots, oldest first."""
        out = []
        if not self.root.is_dir():
            return out
        for d in self.root.iterdir():
            manifest = d / _MANIFEST
            if not d.name.isdigit() or not manifest.is_file():
                continue
            try:
                meta = json.loads(manifest.read_text())
            except ValueError:
                continue
            out.append(SnapshotInfo(int(d.name), int(meta["log_offset"]), int(meta["created_ms"]), d))
        return sorted(out, key=lambda s: s.snapshot_id)

    def latest(self, max_offset: int | None = None) -> SnapshotInfo | None:
        """The newest snapshot (covering at most `max_offset`, when given)."""
        for info in reversed(self.list()):
            if max_offset is None or info.log_offset <= max_offset:
                return info
        return None

    def discard_after(self, offset: int) -> list[SnapshotInfo]:
        """Delete the snapshots covering changes past `offset` (a log end that went back: after
        a power loss those offsets are given to other changes); returns what was deleted."""
        doomed = [s for s in self.list() if s.log_offset > offset]
        for info in doomed:
            shutil.rmtree(info.path, ignore_errors=True)
        if doomed:
            _fsync_dir(self.root)
        return doomed

    def take(self, tablet) -> SnapshotInfo:
        """Checkpoint `tablet` (a KvTablet, writes held off by the caller) into a new snapshot."""
        self.root.mkdir(parents=True, exist_ok=True)
        existing = self.list()
        snapshot_id = existing[-1].snapshot_id + 1 if existing else 1
        tmp = self.root / f".tmp-{snapshot_id}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        offset = tablet.checkpoint(tmp / "db")
        created = int(time.time() * 1000)
        manifest = tmp / _MANIFEST
        with open(manifest, "w") as f:
            json.dump({"log_offset": offset, "created_ms": created}, f)
            f.flush()
            os.fsync(f.fileno())
        final = self.root / str(snapshot_id)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        self._expire()
        return SnapshotInfo(snapshot_id, offset, created, final)

    def _expire(self) -> None:
        snapshots = self.list()
        for old in snapshots[:-self.retain]:
            shutil.rmtree(old.path, ignore_errors=True)
        for d in self.root.iterdir():
            if d.name.startswith(".tmp-"):
                shutil.rmtree(d, ignore_errors=True)

    def restore(self, info: SnapshotInfo, dest: Path) -> None:
        """Copy a snapshot's RocksDB into `dest` (which must not exist)."""
        shutil.copytree(info.path / "db", dest)

    def delete_all(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
