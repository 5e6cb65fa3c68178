"""The broker's log cleaner: compacts the buckets of tables with cleanup.policy=compact.

One cleaner thread (as Kafka's log.cleaner.threads=1): every `log_cleaner_backoff_ms` each
compacted bucket is checked (dirty ratio, max compaction lag, tombstone horizons) and
cleaned when due by `broker/log/cleaner.py`, off the event loop. `compact_table` cleans a
table now (the table API action `compact`, `fluvial table compact NAME`): it first rolls
the active segments and waits for them to be durable, so everything produced so far is
cleanable.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from fluvial.broker.broker import on_start, on_stop
from fluvial.broker.log.cleaner import MAX_LONG, CleaningResult, CompactionConfig, clean

log = logging.getLogger(__name__)


def compaction_config(table, broker_config) -> CompactionConfig:
    return CompactionConfig(
        dedupe_buffer_bytes=max(1, broker_config.log_cleaner_dedupe_buffer_size),
        delete_retention_ms=int(table.config("delete.retention.ms")),
        min_cleanable_dirty_ratio=float(table.config("min.cleanable.dirty.ratio")),
        min_compaction_lag_ms=int(table.config("min.compaction.lag.ms")),
        max_compaction_lag_ms=int(table.config("max.compaction.lag.ms") or MAX_LONG),
    )


class LogCleanerManager:
    def __init__(self, broker):
        self.broker = broker
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="fluvial-cleaner")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="log-cleaner")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown, True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.broker.config.log_cleaner_backoff_ms / 1000)
            for table in [t for t in list(self.broker.tables.tables.values()) if getattr(t, "compacted", False)]:
                for bucket in list(table.buckets):
                    try:
                        await self._clean(bucket, force=False)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("cleaning %s-%d failed", table.name, bucket.index)

    async def _clean(self, bucket, *, force: bool) -> CleaningResult | None:
        loop = asyncio.get_running_loop()
        index = self.broker.extensions.get("txn_index")
        result = await loop.run_in_executor(self.executor, lambda: clean(
            bucket.tablet, compaction_config(bucket.table, self.broker.config), force=force,
            transactions=index.get(bucket) if index is not None else None))
        if result is not None and result.segments_rewritten:
            self.broker.wire_cache.drop_bucket_below(bucket.table.name, bucket.index, result.first_dirty_offset)
        return result

    async def compact_table(self, name: str) -> list[dict]:
        """Clean every bucket of a compacted table now, up to its current end."""
        from fluvial.errors import InvalidRequestError

        table = self.broker.tables.get(name)
        if not table.compacted:
            raise InvalidRequestError(f"table {name} is not compacted (cleanup.policy={table.config('cleanup.policy')})")
        out = []
        for bucket in list(table.buckets):
            bucket.tablet.roll()
            # Only durable records are cleaned (readers never see what a crash could take back).
            end = bucket.tablet.log_end_offset
            await bucket.group_commit.wait_durable(end)
            # Passes until everything is clean (several when the dirty keys exceed the dedupe buffer).
            passes: list[CleaningResult] = []
            while not passes or passes[-1].first_dirty_offset < end:
                result = await self._clean(bucket, force=True)
                if result is None:
                    break
                passes.append(result)
                if len(passes) > 1 and result.first_dirty_offset <= passes[-2].first_dirty_offset:
                    break  # held below an open Kafka transaction: the rest is cleaned once it ends
            out.append({"bucket": bucket.index, **_summary(passes)})
        return out


def _summary(passes: list[CleaningResult]) -> dict:
    """One bucket's figures over its cleaning passes."""
    if not passes:
        return {}
    return {**passes[-1].to_json(), "passes": len(passes), "records_before": passes[0].records_before,
            "bytes_before": passes[0].bytes_before,
            "segments_rewritten": sum(p.segments_rewritten for p in passes),
            "tombstones_removed": sum(p.tombstones_removed for p in passes),
            "seconds": sum(p.seconds for p in passes)}


@on_start
async def start_log_cleaner(broker) -> None:
    manager = LogCleanerManager(broker)
    broker.extensions["log_cleaner"] = manager
    manager.start()


@on_stop
async def stop_log_cleaner(broker) -> None:
    manager = broker.extensions.pop("log_cleaner", None)
    if manager is not None:
        await manager.stop()
