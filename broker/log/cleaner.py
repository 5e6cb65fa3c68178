"""Log compaction of one log tablet: keep the latest record of each key, Kafka's way.

A cleaning pass looks at the tablet's closed segments below the high watermark whose
newest record is older than `min_compaction_lag_ms` (the *cleanable* segments). The
latest offset of every key in the dirty part (from the cleaner checkpoint on) is found
with one Arrow group-by; then each cleanable segment keeps a record when no later record
of its key exists. A tombstone (null value) that is the latest of its key is kept for
`delete_retention_ms` after the pass that first kept it (its batch's delete horizon) and
removed by the first pass after that. Offsets never change: kept records keep theirs, so
a cleaned segment has gaps between record offsets. Batch headers cover the gaps (each
kept batch spans from the previous kept batch's end), so segments stay contiguous and a
consumer fetching any offset of a gap continues after it, as Kafka clients do with
Kafka's compacted batches.

Crash safety: the cleaned copy of a segment is written as `<segment>.arrows.cleaned`,
fsynced, renamed to `.swap` (the directory fsynced: the commit point) and only then
renamed over the segment (`LogTablet.replace_segments`). A crash before the rename to
`.swap` leaves the original; after it, opening the tablet finishes the swap. Either way
every record the segment held that compaction would keep is still there.

Blocking and CPU-heavy: the broker runs it on its cleaner thread, never on the event loop.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fluvial.broker.log.batch_meta import ATTR_CONTROL, ATTR_TRANSACTIONAL, BatchMeta
from fluvial.broker.log.checkpoint import fsync_directory
from fluvial.broker.log.index import OffsetIndex, TimeIndex
from fluvial.broker.log.segment import DATA_SUFFIX, LogSegment, _sync, pwrite_parts
from fluvial.broker.log.segment_format import encode_batch, split_parts
from fluvial.broker.log.statistics import compute_stats, stats_columns
from fluvial.broker.log.tablet import CLEANED_SUFFIX, SWAP_SUFFIX, LogTablet
from fluvial.progress import ProgressLog

log = logging.getLogger(__name__)

MAX_LONG = (1 << 63) - 1
# `_change` of a typed log table's tombstone (kv.tablet.ChangeType.DELETE): its user columns are null.
CHANGE_DELETE = 4


@dataclass(frozen=True)
class CompactionConfig:
    """The topic configs of log compaction (Kafka's names and defaults)."""

    delete_retention_ms: int = 86_400_000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = MAX_LONG
    # Bytes of dirty keys one pass may hold (Kafka's log.cleaner.dedupe.buffer.size): a pass
    # covers the dirty segments whose keys fit (at least one); the next pass goes on from there.
    dedupe_buffer_bytes: int = 128 * 1024 * 1024


@dataclass(frozen=True)
class CleaningResult:
    segments_cleaned: int
    segments_rewritten: int
    records_before: int
    records_after: int
    tombstones_removed: int
    bytes_before: int
    bytes_after: int
    first_dirty_offset: int
    seconds: float

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def cleanable_segments(tablet: LogTablet, config: CompactionConfig, now_ms: int) -> tuple[LogSegment, ...]:
    """The oldest closed segments whose records are all older than min.compaction.lag.ms."""
    out = []
    for segment in tablet.closed_segments():
        if segment.state.next_offset <= tablet.log_start_offset:
            continue
        if config.min_compaction_lag_ms > 0 and now_ms - segment.state.max_timestamp < config.min_compaction_lag_ms:
            break
        out.append(segment)
    return tuple(out)


def _first_dirty(tablet: LogTablet) -> int:
    return max(tablet.log_start_offset, tablet.cleaner_checkpoint.read(0))


def dirty_ratio(tablet: LogTablet, segments: tuple[LogSegment, ...]) -> float:
    first_dirty = _first_dirty(tablet)
    dirty = sum(s.state.size for s in segments if s.state.next_offset > first_dirty)
    total = sum(s.state.size for s in segments)
    return dirty / total if total else 0.0


def needs_cleaning(tablet: LogTablet, config: CompactionConfig, now_ms: int) -> bool:
    """Kafka's triggers: dirty ratio at least min.cleanable.dirty.ratio, a dirty record older
    than max.compaction.lag.ms, or tombstones whose delete horizon has passed."""
    segments = cleanable_segments(tablet, config, now_ms)
    if not segments:
        return False
    first_dirty = _first_dirty(tablet)
    dirty = [s for s in segments if s.state.next_offset > first_dirty]
    if dirty and dirty_ratio(tablet, segments) >= config.min_cleanable_dirty_ratio:
        return True
    if dirty and config.max_compaction_lag_ms < MAX_LONG and \
            now_ms - dirty[0].state.first_max_timestamp >= config.max_compaction_lag_ms:
        return True
    horizon = _earliest_horizon(segments, first_dirty)
    return horizon is not None and horizon <= now_ms


def _earliest_horizon(segments: tuple[LogSegment, ...], first_dirty: int) -> int | None:
    """The earliest delete horizon of the clean part (batch headers only)."""
    best = None
    for segment in segments:
        if segment.base_offset >= first_dirty:
            break
        for header in segment.headers_from(len(segment.schema_message), segment.state):
            for meta in header.metas:
                h = meta.delete_horizon_ms
                if h >= 0 and (best is None or h < best):
                    best = h
    return best


def _read_all(segment: LogSegment, columns: list[str] | None = None) -> list[tuple[BatchMeta, pa.RecordBatch]]:
    state = segment.state
    out = []
    for header in segment.headers_from(len(segment.schema_message), state):
        batch = segment.read_batch(header, state, columns)
        # A coalesced message is cleaned as the Kafka batches it holds (written back one by one).
        out.extend(split_parts(header, batch.select(columns) if columns else batch))
    return out


def _is_aborted(aborted, meta: BatchMeta) -> bool:
    return aborted is not None and bool(meta.attributes & ATTR_TRANSACTIONAL) and aborted(
        meta.producer_id, meta.base_offset)


def _latest_offsets(segments: list[LogSegment], first_dirty: int,
                    budget: int, aborted=None) -> tuple[pa.Array, np.ndarray, int]:
    """The keys of the dirty part and the latest offset of each (one vectorized group-by),
    and how many of `segments` that covers: dirty segments are added while their keys fit
    in `budget` bytes (at least one)."""
    keys, offsets = [], []
    used = 0
    covered = 0
    for segment in segments:
        if segment.state.next_offset > first_dirty and used >= budget and keys:
            break
        covered += 1
        for meta, batch in _read_all(segment, ["_key", "_offset"]):
            if meta.next_offset <= first_dirty or meta.attributes & ATTR_CONTROL or not batch.num_rows \
                    or _is_aborted(aborted, meta):
                continue
            keys.append(batch.column(0))
            offsets.append(batch.column(1))
            used += batch.column(0).nbytes + 8 * batch.num_rows
    if not keys:
        return pa.array([], pa.binary()), np.zeros(0, np.int64), covered
    table = pa.table({"k": pa.chunked_array(keys, pa.binary()), "o": pa.chunked_array(offsets, pa.int64())})
    table = table.filter(pc.is_valid(table.column("k")))
    latest = table.group_by("k").aggregate([("o", "max")])
    return latest.column("k").combine_chunks(), latest.column("o_max").to_numpy(), covered


def _tombstones(batch: pa.RecordBatch) -> np.ndarray:
    """Which rows are tombstones: a null value (raw tables) or a delete row (typed tables)."""
    names = batch.schema.names
    if "value" in names and "_schema_id" not in names:
        return batch.column("value").is_null().to_numpy(zero_copy_only=False)
    return (batch.column("_change").to_numpy(zero_copy_only=False) == CHANGE_DELETE)


@dataclass
class _Cleaned:
    """One segment after cleaning: its kept batches (spans not yet stretched over gaps)."""

    segment: LogSegment
    kept: list[tuple[BatchMeta, pa.RecordBatch]]
    last: tuple[BatchMeta, pa.RecordBatch]  # the segment's last batch (the shape of an empty one)
    changed: bool
    removed: int
    expired: int

    @property
    def size(self) -> int:
        return sum(b.nbytes for _, b in self.kept) + 512 * len(self.kept)


def _clean_segment(segment: LogSegment, map_keys: pa.Array, map_offsets: np.ndarray, config: CompactionConfig,
                   now_ms: int, aborted=None) -> _Cleaned:
    """The segment's batches after cleaning, the records and tombstones removed (and the
    batches of aborted transactions, which are left out of `data` and so dropped)."""
    batches = _read_all(segment)
    data = [(m, b) for m, b in batches if b.num_rows and not m.attributes & ATTR_CONTROL
            and not _is_aborted(aborted, m)]
    dropped = sum(b.num_rows for m, b in batches if b.num_rows and not m.attributes & ATTR_CONTROL) \
        - sum(b.num_rows for _, b in data)
    if not data:
        kept = [(m, b) for m, b in batches if (b.num_rows and not _is_aborted(aborted, m)) or m.attributes & ATTR_CONTROL]
        return _Cleaned(segment, kept, batches[-1], bool(dropped), dropped, 0)
    keys = pa.chunked_array([b.column("_key") for _, b in data], pa.binary()).combine_chunks()
    offsets = np.concatenate([b.column("_offset").to_numpy(zero_copy_only=False) for _, b in data])
    where = pc.index_in(keys, value_set=map_keys).fill_null(-1).to_numpy(zero_copy_only=False)
    found = where >= 0
    latest = np.where(found, map_offsets[np.where(found, where, 0)] if len(map_offsets) else -1, -1)
    keep = ~found | (latest == offsets)
    keep |= keys.is_null().to_numpy(zero_copy_only=False)  # keyless records (written before compaction)
    tomb = np.concatenate([_tombstones(b) for _, b in data])
    horizons = np.repeat(np.array([m.delete_horizon_ms for m, _ in data], np.int64),
                         [b.num_rows for _, b in data])
    expired = tomb & keep & (horizons >= 0) & (horizons <= now_ms)
    keep &= ~expired
    new_horizon = now_ms + config.delete_retention_ms
    if keep.all() and not (tomb & (horizons < 0)).any() and not dropped:
        return _Cleaned(segment, [(m, b) for m, b in batches if b.num_rows or m.attributes & ATTR_CONTROL],
                        batches[-1], False, 0, 0)
    out: list[tuple[BatchMeta, pa.RecordBatch]] = []
    position = 0
    data_ids = {id(b) for _, b in data}
    for meta, batch in batches:
        if id(batch) not in data_ids:
            if meta.attributes & ATTR_CONTROL:
                out.append((meta, batch))  # control batches are kept as they are
            continue  # an empty batch of an earlier cleaning: its span goes to its neighbours
        n = batch.num_rows
        mask = keep[position:position + n]
        kept_tombs = bool((tomb[position:position + n] & mask).any())
        position += n
        kept = int(mask.sum())
        if kept == 0:
            continue
        rows = batch if kept == n else batch.filter(pa.array(mask))
        horizon = (meta.delete_horizon_ms if meta.delete_horizon_ms >= 0 else new_horizon) if kept_tombs else -1
        produced = meta.record_count if meta.producer_record_count < 0 else meta.producer_record_count
        out.append((BatchMeta(
            meta.base_offset, meta.last_offset_delta, kept, meta.base_timestamp, meta.max_timestamp,
            meta.producer_id, meta.producer_epoch, meta.base_sequence, meta.attributes,
            meta.partition_leader_epoch, meta.schema_id, produced if kept != produced else -1, horizon), rows))
    return _Cleaned(segment, out, batches[-1], True, int((~keep).sum()) + dropped, int(expired.sum()))


def _cover_gaps(kept: list[tuple[BatchMeta, pa.RecordBatch]], base: int, end: int,
                last: tuple[BatchMeta, pa.RecordBatch]) -> list[tuple[BatchMeta, pa.RecordBatch]]:
    """Stretch the kept batches' spans over the removed ones: each starts where the previous
    ends, the first at ``base`` (the output segment's) and the last ends at ``end``, so the
    offsets stay contiguous batch after batch. An output left without records keeps one
    empty batch spanning it (shaped like ``last``)."""
    if not kept:
        meta, batch = last
        return [(BatchMeta(base, end - 1 - base, 0, meta.base_timestamp,
                           meta.max_timestamp, attributes=meta.attributes & ~ATTR_CONTROL,
                           partition_leader_epoch=meta.partition_leader_epoch, schema_id=meta.schema_id),
                 batch.slice(0, 0))]
    out = []
    start = base
    for i, (meta, batch) in enumerate(kept):
        last = end - 1 if i == len(kept) - 1 else meta.last_offset
        if start != meta.base_offset or last != meta.last_offset:
            meta = BatchMeta(start, last - start, meta.record_count, meta.base_timestamp, meta.max_timestamp,
                             meta.producer_id, meta.producer_epoch, meta.base_sequence, meta.attributes,
                             meta.partition_leader_epoch, meta.schema_id, meta.producer_record_count,
                             meta.delete_horizon_ms)
        out.append((meta, batch))
        start = last + 1
    return out


def _write_cleaned(tablet: LogTablet, segment: LogSegment, end: int, batches: list[tuple[BatchMeta, pa.RecordBatch]],
                   with_stats: bool) -> tuple[LogSegment, Path, tuple[Path, Path]]:
    """Write the cleaned copy of the segments from ``segment`` up to ``end`` (named as
    ``segment``), fsync it and rename it to `.swap` (the commit point)."""
    directory = tablet.directory
    data_path = segment.data_path
    cleaned_path = data_path.with_name(data_path.name + CLEANED_SUFFIX)
    swap_path = data_path.with_name(data_path.name + SWAP_SUFFIX)
    columns = None
    fd = os.open(cleaned_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        schema_message = None
        position = 0
        for meta, batch in batches:
            stats = b""
            if with_stats and batch.num_rows:
                plain = batch.drop_columns(["_offset"])
                columns = stats_columns(plain.schema) if columns is None else columns
                stats = compute_stats(plain, columns)
            encoded = encode_batch(batch, meta, stats, compression=tablet.compression_for(batch.schema))
            parts = [encoded.header, *encoded.body_parts]
            if schema_message is None:
                schema_message = encoded.schema_message
                parts.insert(0, schema_message)
            elif encoded.schema_message != schema_message:
                raise ValueError(f"batches of {data_path} have different schemas")
            position += pwrite_parts(fd, parts, position)
        _sync(fd, cleaned_path, os.fsync)  # through the fault-injection hook, for crash tests
    except BaseException:
        os.close(fd)
        cleaned_path.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(cleaned_path, swap_path)
    fsync_directory(directory)
    # The copy as a segment object: its checksums and offsets checked, indexes built beside it.
    copy = LogSegment(directory, segment.base_offset, tablet.config.index_interval_bytes)
    copy.data_path = swap_path
    index_paths = (copy.offset_index.path.with_name(copy.offset_index.path.name + SWAP_SUFFIX),
                   copy.time_index.path.with_name(copy.time_index.path.name + SWAP_SUFFIX))
    copy.offset_index = OffsetIndex(index_paths[0])
    copy.time_index = TimeIndex(index_paths[1])
    if not copy._load_schema():
        raise ValueError(f"cleaned copy of {data_path} is unreadable")
    copy.recover()
    if copy.state.next_offset != end:
        raise ValueError(f"cleaned copy of {data_path} ends at {copy.state.next_offset}, not {end}")
    copy.pin_mapping()
    return copy, swap_path, index_paths


def clean(tablet: LogTablet, config: CompactionConfig, *, now_ms: int | None = None,
          force: bool = False, transactions=None) -> CleaningResult | None:
    """One cleaning pass (when needed, or always with ``force``); None when nothing was cleanable.

    ``transactions`` (the bucket's Kafka transactions, `broker/txn_index.py`): segments at or
    past the last stable offset are not cleaned (Kafka's first uncleanable offset: a record of
    an open transaction must not replace a committed one), and records of aborted
    transactions are removed, never counted as a key's latest."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    with tablet.cleaner_lock:
        tablet.check_online()
        if not force and not needs_cleaning(tablet, config, now):
            return None
        started = time.perf_counter()
        segments = cleanable_segments(tablet, config, now)
        aborted = None
        if transactions is not None:
            lso = transactions.last_stable_offset(tablet.high_watermark)
            segments = tuple(s for s in segments if s.state.next_offset <= lso)
            aborted = transactions.is_aborted
        if not segments:
            return None
        first_dirty = _first_dirty(tablet)
        map_keys, map_offsets, covered = _latest_offsets(list(segments), first_dirty, config.dedupe_buffer_bytes,
                                                         aborted)
        segments = segments[:covered]
        with_stats = tablet.config.batch_statistics
        totals = {"rewritten": 0, "records_before": 0, "records_after": 0, "tombstones": 0, "bytes_before": 0,
                  "bytes_after": 0}

        def write(group: list[_Cleaned]) -> None:
            olds = tuple(c.segment for c in group)
            before = sum(s.state.size for s in olds)
            count = sum(h.meta.record_count for s in olds for h in s.headers_from(len(s.schema_message), s.state))
            totals["bytes_before"] += before
            totals["records_before"] += count
            if len(group) == 1 and not group[0].changed:
                totals["records_after"] += count
                totals["bytes_after"] += before
                return
            first, end = olds[0], olds[-1].state.next_offset
            batches = _cover_gaps([kb for c in group for kb in c.kept], first.base_offset, end, group[-1].last)
            copy, swap_path, index_paths = _write_cleaned(tablet, first, end, batches, with_stats)
            if tablet.replace_segments(olds, copy, swap_path, index_paths):
                totals["rewritten"] += 1
                totals["records_after"] += count - sum(c.removed for c in group)
                totals["tombstones"] += sum(c.expired for c in group)
                totals["bytes_after"] += copy.state.size
            else:
                totals["records_after"] += count
                totals["bytes_after"] += before

        # A pass over a large log takes a while: say how far it is (at most every 2 s).
        progress = ProgressLog(log, f"cleaning {tablet.directory.name}", len(segments), "segments")
        # Consecutive cleaned segments of one schema are merged while the result stays under
        # segment.bytes (as Kafka's cleaner groups them), so compaction leaves no trail of tiny
        # segments; one group at a time is held in memory.
        group: list[_Cleaned] = []
        size = 0
        for done, segment in enumerate(segments):
            progress.update(done)
            c = _clean_segment(segment, map_keys, map_offsets, config, now, aborted)
            if group and (c.segment.schema_message != group[0].segment.schema_message
                          or size + c.size > tablet.config.segment_bytes):
                write(group)
                group, size = [], 0
            group.append(c)
            size += c.size
        if group:
            write(group)
        rewritten, records_before, records_after, tombstones, bytes_before, bytes_after = (
            totals["rewritten"], totals["records_before"], totals["records_after"], totals["tombstones"],
            totals["bytes_before"], totals["bytes_after"])
        end = segments[-1].state.next_offset
        tablet.cleaner_checkpoint.write(end)
        result = CleaningResult(len(segments), rewritten, records_before, records_after, tombstones,
                                bytes_before, bytes_after, end, time.perf_counter() - started)
        log.info("cleaned %s: %d of %d segments rewritten, %d -> %d records, %d tombstones removed, "
                 "%d -> %d bytes in %.3f s", tablet.directory.name, rewritten, len(segments), records_before,
                 records_after, tombstones, bytes_before, bytes_after, result.seconds)
        return result


__all__ = ["CompactionConfig", "CleaningResult", "clean", "needs_cleaning", "cleanable_segments", "DATA_SUFFIX"]
