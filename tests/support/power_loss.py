"""Take away from a stopped broker's log files what a power loss could have taken.

The broker runs with ``FLUVIAL_SYNC_JOURNAL`` set (``fluvial.broker.log.sync_journal``):
every segment creation, segment fsync (with the size it covered), cut by recovery and
directory fsync (with the journal line it began at) is recorded. After the broker is killed
with SIGKILL (the page cache keeps every write), `lose_unsynced_writes` rewrites each
segment as the disk could hold it after a power loss:

- bytes past what the segment's fsyncs covered are lost; optionally a random part of them
  survives, with its last few pages each kept or zeroed (a torn tail). Two flushes of one
  segment may fsync at once and be recorded in either order, so what is durable is the
  largest size any fsync since the segment's creation (or its last cut) covered, not the
  size on the last line;
- a segment whose creation was recorded after the last fsync of its directory began may
  vanish altogether;
- index files (derived data, never fsynced) are cut at a random length;
- the recovery-point checkpoint (written without fsync) may be gone.

Files the journal does not mention (written before it was enabled, or not log segments)
are left alone. Metadata in SQLite (synchronous=FULL, fsync per commit) is not touched.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

PAGE = 4096
TORN_PAGES = 4  # how many pages before the cut may be lost independently


@dataclass
class FileRecord:
    created_at: int = -1  # journal line of the creation, -1 when not created under the journal
    synced_size: int = 0  # the largest size an fsync covered since creation or the last cut (0: none)


@dataclass
class PowerLossReport:
    segments_cut: int = 0
    bytes_lost: int = 0
    segments_vanished: int = 0
    torn_pages_kept: int = 0
    details: list[str] = field(default_factory=list)


def read_journal(journal: Path) -> tuple[dict[str, FileRecord], dict[str, int]]:
    """Per file: creation and what its fsyncs made durable; per directory: the journal line
    at which its latest successful fsync began (creations on earlier lines are durable)."""
    files: dict[str, FileRecord] = {}
    dir_synced: dict[str, int] = {}
    if not journal.exists():
        return files, dir_synced
    for n, line in enumerate(journal.read_text(encoding="utf-8").splitlines()):
        parts = line.split("\t")
        if len(parts) != 3:
            continue  # a line cut by the kill
        kind, path, size = parts[0], parts[1], int(parts[2])
        if kind == "create":
            files[path] = FileRecord(created_at=n)
        elif kind == "sync":
            # Concurrent fsyncs finish in any order: one recorded later covering less does
            # not undo what an earlier line's fsync made durable.
            record = files.setdefault(path, FileRecord())
            record.synced_size = max(record.synced_size, size)
        elif kind == "truncate":
            record = files.setdefault(path, FileRecord())
            record.synced_size = size
        elif kind == "dirsync":
            dir_synced[path] = max(dir_synced.get(path, -1), size)
    return files, dir_synced


def lose_unsynced_writes(journal: Path, data_dir: Path, rng: random.Random, *, torn: bool = True) -> PowerLossReport:
    """Rewrite the log files under ``data_dir`` as a power loss could leave them."""
    files, dir_synced = read_journal(journal)
    report = PowerLossReport()
    for path_text, record in files.items():
        path = Path(path_text)
        if not path.exists():
            continue
        directory = str(path.parent)
        entry_durable = record.created_at < 0 or dir_synced.get(directory, -1) > record.created_at
        if not entry_durable and (not torn or rng.random() < 0.5):
            size = path.stat().st_size
            _remove_segment(path)
            report.segments_vanished += 1
            report.bytes_lost += size
            report.details.append(f"{path.parent.name}/{path.name}: vanished ({size} bytes)")
            continue
        durable = record.synced_size
        size = path.stat().st_size
        if size <= durable:
            continue
        keep = durable
        kept_pages = 0
        with open(path, "r+b") as f:
            if torn:
                keep = rng.randint(durable, size)
                # Write-back mostly goes in file order: the unsynced data up to `keep` reached
                # the disk, except that in its last few pages some did and some did not (a
                # lost page reads as zeros).
                first_page = max(durable // PAGE, (keep + PAGE - 1) // PAGE - TORN_PAGES)
                for page in range(first_page, (keep + PAGE - 1) // PAGE):
                    lo, hi = max(page * PAGE, durable), min((page + 1) * PAGE, keep)
                    if rng.random() < 0.5:
                        kept_pages += 1
                        continue
                    f.seek(lo)
                    f.write(bytes(hi - lo))
            f.truncate(keep)
        report.segments_cut += 1
        report.bytes_lost += size - keep
        report.torn_pages_kept += kept_pages
        report.details.append(f"{path.parent.name}/{path.name}: {size} -> {keep} bytes (synced {durable})")
        _damage_indexes(path, rng)
        checkpoint = path.parent / "recovery-point.checkpoint"
        if checkpoint.exists() and rng.random() < 0.5:
            checkpoint.unlink()
    return report


def _remove_segment(path: Path) -> None:
    for suffix in ("", ".index", ".timeindex"):
        other = path.with_suffix(suffix) if suffix else path
        other.unlink(missing_ok=True)


def _damage_indexes(segment: Path, rng: random.Random) -> None:
    for suffix in (".index", ".timeindex"):
        index = segment.with_suffix(suffix)
        if index.exists() and rng.random() < 0.5:
            size = index.stat().st_size
            os.truncate(index, rng.randint(0, size))
