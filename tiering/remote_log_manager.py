"""The remote log manager: one per broker, it tiers closed segments to the object store.

For every bucket of a table with `remote.storage.enable`, a tiering round (on the remote
executor, never on the event loop; bucket rounds run in parallel up to the executor's size):

1. collects orphans once after startup (objects under the bucket's prefix that the committed
   manifest does not list: an upload cut short, an expired segment whose deletion did not
   happen);
2. expires remote segments past `retention.ms` / `retention.bytes` (which cover the whole
   log): commits the manifest without them, then deletes their objects;
3. uploads each closed segment past the remote end: fsyncs it locally, rewrites it as a
   remote segment object, then commits the manifest that lists it;
4. lets the tablet's retention delete local copies past `local.retention.*` — only of
   segments wholly below the committed remote end (`LogTablet.retention_limit_offset`).

A failure (store down, disk error) ends the bucket's round; it is retried with exponential
backoff. Produce never waits for any of this: data stays local until the uploads catch up.
The manifest commit is the one step that makes an upload or an expiry real, so a crash
anywhere leaves the old or the new manifest; what the other one listed is an orphan, and
reads go by the committed manifest only.

Kafka reads of offsets below the local log start are served from the remote segments
(`read_batches`, on an executor) through a bounded cache of footers and row groups.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fluvial.broker.log.batch_meta import StoredBatch
from fluvial.broker.remote_fetches import RemoteFetches
from fluvial.errors import FluvialError, OffsetOutOfRangeError, StorageError
from fluvial.tiering.object_store import ObjectStore
from fluvial.tiering.remote_log_manifest import (
    ManifestStore, RemoteLogManifest, bucket_prefix, segment_key,
)
from fluvial.tiering.remote_segment import RemoteSegmentReader, local_segment_batches, upload_segment

log = logging.getLogger(__name__)

# Crash tests: FLUVIAL_FAULT names steps (comma-separated) at which the broker kills itself
# with SIGKILL, as a power cut would: remote.after_upload (object stored, manifest not
# committed), remote.after_commit (manifest committed, local copy not deleted),
# remote.after_expire_commit (expiry committed, objects not deleted).
FAULT_ENV = "FLUVIAL_FAULT"
_FAULTS = frozenset(filter(None, os.environ.get(FAULT_ENV, "").split(",")))

MAX_BACKOFF_S = 10.0


def fault_point(step: str) -> None:
    if step in _FAULTS:
        log.warning("fault injection: killing the broker at %s", step)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class BucketTiering:
    """The remote log state of one bucket."""

    bucket: object  # fluvial.broker.tables.Bucket
    manifest: RemoteLogManifest
    # Serialises changes of the bucket's manifest (tiering rounds, DeleteRecords).
    lock: threading.Lock = field(default_factory=threading.Lock)
    orphans_checked: bool = False
    running: bool = False
    failures: int = 0
    retry_at: float = 0.0
    last_error: str | None = None


class RemoteLogManager:
    def __init__(self, broker, store: ObjectStore):
        self.broker = broker
        self.store = store
        config = broker.config
        self.interval_s = config.remote_log_manager_interval_ms / 1000
        self.manifests = ManifestStore(broker.store)
        self.reader = RemoteSegmentReader(cache_bytes=config.remote_read_cache_bytes)
        # Uploads and expiry: bounded by the configured concurrency.
        self.executor = ThreadPoolExecutor(max(1, config.remote_upload_concurrency),
                                           thread_name_prefix="fluvial-remote")
        # Reads of remote data for Kafka clients, and DeleteRecords: never queued behind uploads.
        self.read_executor = ThreadPoolExecutor(4, thread_name_prefix="fluvial-remote-read")
        # Kafka fetches of remote offsets: bounded in time, a retried fetch joins the read.
        self.fetches = RemoteFetches(self.read_executor, max(0, config.remote_fetch_max_wait_ms) / 1000)
        self.staging = Path(config.data_dir) / "remote-staging"
        # Files of uploads a crash cut short: nothing refers to them.
        if self.staging.is_dir():
            for leftover in self.staging.iterdir():
                leftover.unlink(missing_ok=True)
        self._states: dict[tuple[str, int], BucketTiering] = {}
        self._states_lock = threading.Lock()
        tables = broker.tables
        tables.open_hooks.append(self._on_open)
        tables.altered_hooks.append(self._on_altered)
        tables.deleted_hooks.append(self._on_deleted)

    # -- per-bucket state ----------------------------------------------------------------

    def state(self, bucket) -> BucketTiering:
        # A changelog view's bucket reads the remote log of the table bucket it shows.
        bucket = getattr(bucket, "source", bucket)
        key = (str(bucket.table.topic_id), bucket.index)
        state = self._states.get(key)
        if state is not None and state.bucket is bucket:
            return state
        with self._states_lock:
            state = self._states.get(key)
            if state is None or state.bucket is not bucket:
                manifest = self.manifests.load(bucket.table.name, str(bucket.table.topic_id), bucket.index)
                state = BucketTiering(bucket, manifest)
                self._publish(state)
                self._states[key] = state
            return state

    def known_state(self, bucket) -> BucketTiering | None:
        """The bucket's remote log state if it was loaded already (no SQLite read)."""
        bucket = getattr(bucket, "source", bucket)
        return self._states.get((str(bucket.table.topic_id), bucket.index))

    def manifest(self, bucket) -> RemoteLogManifest:
        return self.state(bucket).manifest

    def _publish(self, state: BucketTiering) -> None:
        """Make the committed manifest what readers and local retention go by."""
        bucket, manifest = state.bucket, state.manifest
        bucket.remote_log_start = manifest.log_start_offset if manifest.version > 0 else None
        bucket.tablet.retention_limit_offset = manifest.end_offset if bucket.table.remote_storage_enabled else None

    def _on_open(self, table) -> None:
        for bucket in table.buckets:
            self.state(bucket)

    def _on_altered(self, table) -> None:
        for bucket in table.buckets:
            self._publish(self.state(bucket))

    def _on_deleted(self, table):
        """Forget the table's remote log; its manifests and objects go in the background."""
        topic_id = str(table.topic_id)
        with self._states_lock:
            for key in [k for k in self._states if k[0] == topic_id]:
                del self._states[key]
        prefix = f"log/{table.name}-{topic_id}/"

        def remove() -> None:
            self.manifests.delete_table(topic_id)
            try:
                self.store.delete(self.store.list(prefix))
            except Exception:  # noqa: BLE001 - left for the startup sweep of dropped tables
                log.warning("could not delete the remote objects of dropped table %s", table.name, exc_info=True)
        # Not awaited: a drop does not wait behind uploads of other tables.
        self.executor.submit(remove)

    # -- the tiering loop ----------------------------------------------------------------

    async def run(self) -> None:
        # In the background: a store that is down must not hold up the tiering rounds.
        self.executor.submit(self._sweep_dropped_tables)
        while True:
            await self.run_round()
            await asyncio.sleep(self.interval_s)

    async def run_round(self, wait: bool = False) -> None:
        """Start a tiering round for every bucket that is not in one already. Rounds are not
        awaited (unless ``wait``): a bucket with a slow upload does not hold up the others."""
        loop = asyncio.get_running_loop()
        pending = []
        now = time.monotonic()
        for bucket in list(self.broker.tables.all_buckets()):
            state = self.state(bucket)
            if state.running or now < state.retry_at:
                continue
            if not bucket.table.remote_storage_enabled and not state.manifest.segments:
                continue
            state.running = True
            pending.append(loop.run_in_executor(self.executor, self._round_guarded, state))
        if wait and pending:
            await asyncio.gather(*pending)

    def _round_guarded(self, state: BucketTiering) -> None:
        bucket = state.bucket
        try:
            self.tier_bucket(state)
            state.failures, state.last_error = 0, None
        except Exception as exc:  # noqa: BLE001 - any failure: retry later, keep serving
            state.failures += 1
            state.last_error = str(exc)
            state.retry_at = time.monotonic() + min(MAX_BACKOFF_S, 0.25 * 2 ** state.failures)
            # A request that timed out may still reach the store later (a PUT of an upload
            # given up on): the next round looks for orphans again before it goes on.
            state.orphans_checked = False
            log.warning("tiering of %s-%d failed (attempt %d), retrying: %s", bucket.table.name, bucket.index,
                        state.failures, exc)
        finally:
            state.running = False

    def tier_bucket(self, state: BucketTiering) -> None:
        """One tiering round of one bucket (blocking)."""
        bucket = state.bucket
        if self.broker.tables.tables.get(bucket.table.name) is not bucket.table:
            return  # dropped meanwhile
        with state.lock:
            if not state.orphans_checked:
                self._collect_orphans(state)
                state.orphans_checked = True
            changed = self._expire(state)
            if bucket.table.remote_storage_enabled:
                changed = self._upload_closed(state) or changed
        if changed:
            bucket.tablet.enforce_retention()

    def _collect_orphans(self, state: BucketTiering) -> None:
        table = state.bucket.table
        prefix = bucket_prefix(table.name, str(table.topic_id), state.bucket.index)
        orphans = [k for k in self.store.list(prefix) if k not in state.manifest.keys]
        if orphans:
            log.info("deleting %d orphan remote object(s) of %s-%d", len(orphans), table.name, state.bucket.index)
            self.store.delete(orphans)

    def _sweep_dropped_tables(self) -> None:
        """Objects of tables that no longer exist (a drop whose deletion was cut short)."""
        try:
            keys = self.store.list("log/")
            # Tables known after the listing: one created meanwhile is not taken for dropped.
            live = {f"{t.name}-{t.topic_id}" for t in list(self.broker.tables.tables.values())}
            stale = [k for k in keys if k.split("/")[1] not in live]
            if stale:
                log.info("deleting %d remote object(s) of dropped tables", len(stale))
                self.store.delete(stale)
        except Exception as exc:  # noqa: BLE001 - the store may be down; next start tries again
            log.warning("could not sweep the object store for dropped tables: %s", exc)

    def _upload_closed(self, state: BucketTiering) -> bool:
        bucket = state.bucket
        tablet = bucket.tablet
        table = bucket.table
        uploaded = False
        for info in tablet.segment_infos():
            if info.active:
                break
            manifest = state.manifest
            if info.next_offset <= manifest.end_offset or info.next_offset <= tablet.log_start_offset:
                continue
            if manifest.segments and info.base_offset != manifest.end_offset:
                raise StorageError(f"local segment {info.base_offset} of {table.name}-{bucket.index} does not "
                                   f"follow the remote log ending at {manifest.end_offset}")
            # Only durable data goes remote: what an upload copies is on the local disk too.
            tablet.flush_up_to(info.next_offset)
            start = max(info.base_offset, tablet.log_start_offset)
            key = segment_key(table.name, str(table.topic_id), bucket.index, info.base_offset, info.next_offset)
            try:
                segment = upload_segment(self.store, key, local_segment_batches(tablet, start, info.next_offset),
                                         self.staging, local_bytes=info.size_bytes)
            except BaseException:
                try:
                    self.store.delete([key])  # a part may be there: not listed anywhere, so removable
                except Exception:  # noqa: BLE001 - the orphan sweep gets it later
                    pass
                raise
            fault_point("remote.after_upload")
            if self.broker.tables.tables.get(table.name) is not table:
                self.store.delete([key])  # dropped during the upload
                return uploaded
            if not manifest.segments:
                manifest = RemoteLogManifest(manifest.table, manifest.topic_id, manifest.bucket, (),
                                             max(manifest.log_start_offset, tablet.log_start_offset), manifest.version)
            state.manifest = self.manifests.commit(manifest.appended(segment))
            self._publish(state)
            uploaded = True
            log.info("tiered %s-%d [%d, %d) as %s (%d bytes)", table.name, bucket.index, segment.base_offset,
                     segment.next_offset, key, segment.size_bytes)
            fault_point("remote.after_commit")
        return uploaded

    def _expire(self, state: BucketTiering) -> bool:
        manifest = state.manifest
        segments = manifest.segments
        if not segments:
            return False
        table = state.bucket.table
        retention_ms = int(table.config("retention.ms"))
        retention_bytes = int(table.config("retention.bytes"))
        drop = 0
        if retention_ms >= 0:
            now = int(time.time() * 1000)
            while drop < len(segments) and now - segments[drop].max_timestamp > retention_ms:
                drop += 1
        if retention_bytes >= 0:
            local_only = sum(i.size_bytes for i in state.bucket.tablet.segment_infos()
                             if i.base_offset >= manifest.end_offset)
            total = sum(s.local_bytes for s in segments[drop:]) + local_only
            while drop < len(segments) and total - segments[drop].local_bytes >= retention_bytes:
                total -= segments[drop].local_bytes
                drop += 1
        if drop == 0:
            return False
        self._truncate(state, segments[drop - 1].next_offset)
        return True

    def _truncate(self, state: BucketTiering, offset: int) -> None:
        """Move the remote log start to ``offset``: commit, then delete the dropped objects."""
        new, dropped = state.manifest.truncated_to(offset)
        state.manifest = self.manifests.commit(new)
        self._publish(state)
        fault_point("remote.after_expire_commit")
        tablet = state.bucket.tablet
        if tablet.log_start_offset < offset <= tablet.high_watermark:
            tablet.advance_log_start(offset)
        for segment in dropped:
            self.reader.forget(segment.key)
        if dropped:
            try:
                self.store.delete([s.key for s in dropped])
            except Exception as exc:  # noqa: BLE001 - no manifest lists them: the orphan sweep retries
                state.orphans_checked = False
                log.warning("could not delete expired remote segments of %s-%d: %s",
                            state.bucket.table.name, state.bucket.index, exc)

    # -- DeleteRecords -------------------------------------------------------------------

    def delete_records(self, bucket, offset: int) -> int:
        """Records below ``offset`` become unreadable, remote ones included (blocking); returns the log start."""
        tablet = bucket.tablet
        if not 0 <= offset <= tablet.high_watermark:
            raise OffsetOutOfRangeError(f"cannot move the log start to {offset}: the high watermark is "
                                        f"{tablet.high_watermark}")
        state = self.state(bucket)
        with state.lock:
            if state.manifest.version > 0 and offset > state.manifest.log_start_offset:
                self._truncate(state, offset)
        tablet.advance_log_start(offset)
        return bucket.log_start_offset

    # -- reads ---------------------------------------------------------------------------

    def serves(self, bucket, offset: int) -> bool:
        """Whether ``offset`` is below the local log and held by the remote log."""
        if bucket.remote_log_start is None or offset >= bucket.tablet.log_start_offset:
            return False
        return self.state(bucket).manifest.segment_for(offset) is not None

    def read_batches(self, bucket, offset: int, max_bytes: int,
                     columns: list[str] | None = None) -> list[StoredBatch]:
        """Whole remote batches from the one holding ``offset``, about ``max_bytes`` (at least one).

        Blocking (object store reads): run on an executor. Raises OffsetOutOfRangeError when
        the remote log does not hold ``offset``, StorageError when its data is unreadable.
        """
        manifest = self.state(bucket).manifest
        if manifest.segment_for(offset) is None:
            raise OffsetOutOfRangeError(f"offset {offset} is not in the remote log of "
                                        f"{bucket.table.name}-{bucket.index}")
        out: list[StoredBatch] = []
        used = 0
        try:
            for segment in manifest.segments_from(offset):
                for stored in self.reader.read_batches(self.store, segment, offset, columns):
                    size = stored.batch.nbytes  # counts only the slice of the row group
                    if out and used + size > max_bytes:
                        return out
                    out.append(stored)
                    used += size
                    if used >= max_bytes:
                        return out
        except StorageError as exc:
            log.error("cannot serve %s-%d offset %d from the remote log: %s", bucket.table.name, bucket.index,
                      offset, exc)
            raise
        return out

    def offset_for_timestamp(self, bucket, timestamp_ms: int) -> tuple[int, int] | None:
        """The first remote offset whose timestamp is >= ``timestamp_ms`` (blocking), with that timestamp."""
        manifest = self.state(bucket).manifest
        start = manifest.log_start_offset
        for segment in manifest.segments:
            if segment.max_timestamp < timestamp_ms or segment.next_offset <= start:
                continue
            for meta in self.reader.batch_metas(self.store, segment):
                if meta.max_timestamp < timestamp_ms or meta.next_offset <= start:
                    continue
                found = self._first_at_least(segment, meta.base_offset, start, timestamp_ms)
                if found is not None:
                    return found
        return None

    def max_timestamp(self, bucket) -> tuple[int, int] | None:
        """(offset, timestamp) of the remote record with the largest timestamp (earliest on ties)."""
        manifest = self.state(bucket).manifest
        live = [s for s in manifest.segments if s.next_offset > manifest.log_start_offset]
        if not live:
            return None
        segment = max(live, key=lambda s: s.max_timestamp)
        for meta in self.reader.batch_metas(self.store, segment):
            if meta.max_timestamp >= segment.max_timestamp and meta.next_offset > manifest.log_start_offset:
                return self._first_at_least(segment, meta.base_offset, manifest.log_start_offset,
                                            segment.max_timestamp)
        return None

    def _first_at_least(self, segment, base_offset: int, start: int, timestamp_ms: int) -> tuple[int, int] | None:
        stored = next(iter(self.reader.read_batches(self.store, segment, base_offset,
                                                    ["_offset", "_timestamp"])))
        offsets = stored.batch.column("_offset").to_numpy()
        timestamps = stored.batch.column("_timestamp").cast("int64").fill_null(-1).to_numpy()
        hits = np.flatnonzero((timestamps >= timestamp_ms) & (offsets >= start))
        return (int(offsets[hits[0]]), int(timestamps[hits[0]])) if len(hits) else None

    # -- visibility ----------------------------------------------------------------------

    def bucket_status(self, bucket) -> dict:
        tablet = bucket.tablet
        state = self.state(bucket)
        manifest = state.manifest
        infos = tablet.segment_infos()
        return {
            "bucket": bucket.index,
            "log_start_offset": bucket.log_start_offset,
            "high_watermark": tablet.high_watermark,
            "local": {"start_offset": tablet.log_start_offset, "end_offset": tablet.log_end_offset,
                      "bytes": sum(i.size_bytes for i in infos), "segments": len(infos)},
            "remote": {"start_offset": manifest.log_start_offset if manifest.version else None,
                       "end_offset": manifest.end_offset if manifest.segments else None,
                       "bytes": manifest.size_bytes, "segments": len(manifest.segments),
                       "manifest_version": manifest.version},
            "remote_storage_enabled": bucket.table.remote_storage_enabled,
            "upload_failures": state.failures,
            "last_error": state.last_error,
        }

    def table_status(self, table) -> dict:
        return {"table": table.name, "object_store": self.store.public_description(),
                "buckets": [self.bucket_status(b) for b in table.buckets]}

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.read_executor.shutdown(wait=True, cancel_futures=True)
        self.store.close()
