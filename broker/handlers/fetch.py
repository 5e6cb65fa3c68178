"""Fetch: whole batches from each bucket, long-polling until min_bytes or max_wait.

Batches come from the wire cache when a consumer tails what was just produced, and are
re-encoded from the stored Arrow columns otherwise (off the event loop when large).
No fetch sessions: session id 0 tells clients to send full requests every time.
"""
from __future__ import annotations

import asyncio
import struct
import time
import weakref

from fluvial.broker import kafka_batches
from fluvial.broker.authorization import allowed
from fluvial.broker.read_ahead import PreparedReads, ReadAhead, next_offset
from fluvial.broker.handlers import RequestContext, handles
from fluvial.errors import FluvialError, UnknownTableError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.fetch_response import FetchedPartition, encode_fetch_response
from fluvial.protocol.messages import ApiKey
from fluvial.security.acls import AclOperation, ResourceType


def _read_bucket(ctx: RequestContext, bucket, offset: int, max_bytes: int,
                 min_one: bool = True) -> tuple[list[bytes], int]:
    """Encoded batches from `offset`, at most `max_bytes`, as the table's kind serves them
    (`TableKind.read_kafka`). Offsets below the local log that the remote log holds are
    read from the object store (the caller runs this on an executor then)."""
    return bucket.table.kind.read_kafka(ctx.broker, bucket, offset, max_bytes, min_one)


def _committed_view(state, result: FetchedPartition, batches: list, fetch_offset: int) -> tuple[list, int]:
    """A read_committed answer: batches below the last stable offset only, with the aborted
    transactions that have records among them (the client drops those records)."""
    lso = state.last_stable_offset(result.high_watermark)
    result.last_stable_offset = lso
    kept = [b for b in batches if _BASE.unpack_from(b, 0)[0] < lso]
    result.records = kept
    if kept:
        upper = next_offset(kept[-1])
        result.aborted = [(a.producer_id, a.first_offset) for a in state.aborted_between(fetch_offset, upper)]
    return kept, sum(map(len, kept))


_BASE = struct.Struct(">q")


def _partition_result(index: int, code: int, bucket=None, records: list[bytes] | None = None) -> FetchedPartition:
    hw = bucket.tablet.high_watermark if bucket is not None else -1
    start = bucket.log_start_offset if bucket is not None else -1
    return FetchedPartition(index, code, hw, hw, start, records if records is not None else [])


@handles(ApiKey.FETCH, 4, 17)
async def fetch(ctx: RequestContext, request):
    if ctx.version >= 7 and request.session_id != 0:
        return encode_fetch_response(ctx.header, throttle_time_ms=0, error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
                                     session_id=0, topics=[])
    tables = ctx.broker.tables
    by_id = ctx.version >= 13
    # Resolve topics and buckets once; errors are answered without waiting.
    wanted = []  # (topic_key, partition request, bucket | error code)
    check_acls = ctx.broker.authorizer.enabled
    for t in request.topics:
        try:
            table = tables.get_by_id(t.topic_id) if by_id else tables.get(t.topic)
        except UnknownTableError:
            table = None
        # READ on the topic (Kafka checks it before telling whether a named topic exists).
        denied = check_acls and (table is not None or not by_id) and not allowed(
            ctx, AclOperation.READ, ResourceType.TOPIC, table.name if table is not None else t.topic)
        for p in t.partitions:
            if denied:
                target = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif table is None:
                target = ErrorCode.UNKNOWN_TOPIC_ID if by_id else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif not 0 <= p.partition < len(table.buckets):
                target = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                target = table.bucket(p.partition)
            wanted.append((t.topic_id if by_id else t.topic, p, target))

    deadline = time.monotonic() + max(0, request.max_wait_ms) / 1000
    loop = asyncio.get_running_loop()
    while True:
        results, total = await _collect(ctx, request, wanted, loop)
        remaining = deadline - time.monotonic()
        if total >= max(1, request.min_bytes) or remaining <= 0 or any(
                r.error_code not in (0,) for _, r in results):
            break
        events = [target.data_arrived() for _, _, target in wanted if not isinstance(target, int)]
        if not events:
            break
        waiters = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    grouped: dict = {}
    stats = ctx.broker.kafka.request_stats
    for (key, result), (_, p, target) in zip(results, wanted):
        grouped.setdefault(key, []).append(result)
        if result.error_code:
            stats.error(ApiKey.FETCH, result.error_code)
        elif result.records:
            _count_out(target, result.records, p.fetch_offset)
    return encode_fetch_response(ctx.header, throttle_time_ms=0, error_code=0, session_id=0,
                                 topics=list(grouped.items()))


def _count_out(bucket, batches: list, fetch_offset: int) -> None:
    """Bytes and records sent to consumers, for the metrics: per batch, never per record."""
    bucket.bytes_out += sum(len(b) for b in batches)
    # Records from the fetch offset to the end of the last batch (a first batch that starts
    # before the fetch offset is counted from it: the consumer skips the rest).
    bucket.records_out += max(0, next_offset(batches[-1]) - fetch_offset)


_READ_AHEAD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # wire cache -> ReadAhead


def _avro_read_ahead(ctx: RequestContext, bucket) -> ReadAhead | None:
    """The broker's read-ahead when this bucket's fetches re-encode Avro into the wire cache."""
    table = bucket.table
    if not table.kind.caches_reencoded(table):
        return None
    return _of_broker(_READ_AHEAD, ctx.broker, ReadAhead)


def _of_broker(registry: weakref.WeakKeyDictionary, broker, make):
    """The broker's own object of a registry (kept per wire cache: one per broker)."""
    found = registry.get(broker.wire_cache)
    if found is None:
        found = registry[broker.wire_cache] = make()
    return found


_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # wire cache -> PreparedReads


def _prepared_reads(ctx: RequestContext, bucket) -> PreparedReads | None:
    """The broker's held reads, when this bucket's large fetches are worth reading ahead."""
    table = bucket.table
    if not table.kind.prepares_reads(table) or not ctx.broker.config.fetch_read_ahead:
        return None
    return _of_broker(_PREPARED, ctx.broker, PreparedReads)


def prepared_reads_counts(broker) -> tuple[int, int]:
    """(reads started ahead, fetches answered with one) since the broker started."""
    prepared = _PREPARED.get(broker.wire_cache)
    return (prepared.started, prepared.used) if prepared is not None else (0, 0)


async def _read_large(ctx: RequestContext, bucket, offset: int, limit: int, min_one: bool, end: int,
                      loop) -> tuple[list, int]:
    """A large read (or a typed table's) on the CPU executor; for a table whose reads are
    held (`PreparedReads`), the read prepared for this fetch when there is one, and the next
    read started when this one stopped short of ``end``."""
    prepared = _prepared_reads(ctx, bucket) if min_one else None
    result = None
    if prepared is not None:
        held = prepared.take(bucket, offset, limit, bucket.leader_epoch, loop.time())
        if held is not None:
            try:
                batches, size = await held
            except Exception:  # noqa: BLE001 - read again below: this fetch meets the error itself
                pass
            else:
                # As this fetch's own read would give: from the batch holding the offset, which
                # the log still holds.
                if batches and bucket.tablet.log_start_offset <= offset and \
                        _BASE.unpack_from(batches[0], 0)[0] <= offset < next_offset(batches[0]):
                    result = batches, size
                    prepared.used += 1
    if result is None:
        result = await loop.run_in_executor(ctx.broker.cpu_executor, _read_bucket, ctx, bucket, offset, limit, min_one)
    batches = result[0]
    if prepared is not None and batches and (after := next_offset(batches[-1])) < end:
        prepared.start(bucket, after, limit, bucket.leader_epoch, loop.time(),
                       lambda: loop.run_in_executor(ctx.broker.cpu_executor, _read_bucket, ctx, bucket, after, limit))
    return result


async def _collect(ctx: RequestContext, request, wanted, loop) -> tuple[list, int]:
    results = []
    total = 0
    budget = request.max_bytes if request.max_bytes > 0 else 1 << 30
    read_committed = request.isolation_level == 1
    index = ctx.broker.extensions.get("txn_index")
    read_committed = read_committed and index is not None
    for key, p, target in wanted:
        if isinstance(target, int):
            results.append((key, _partition_result(p.partition, target)))
            continue
        bucket = target
        limit = min(p.partition_max_bytes, max(budget - total, 0))
        # Kafka's rule: only the first partition with data may go over the limits (one batch).
        min_one = total == 0
        if limit <= 0 and total > 0:
            results.append((key, _partition_result(p.partition, 0, bucket)))
            continue
        try:
            ahead = _avro_read_ahead(ctx, bucket)
            if ahead is not None:
                await ahead.settled(bucket.table.name, bucket.index)
            tablet = bucket.tablet
            tablet.check_online()
            # Readers see up to the high watermark: under flush policy `ack`, the durable end.
            end = tablet.high_watermark
            cached = None
            if end <= p.fetch_offset <= tablet.log_end_offset:
                cached = [], 0
            elif tablet.log_start_offset <= p.fetch_offset < end:
                # A tailing consumer: the producers' own batches, with no thread hop.
                cached = bucket.table.kind.cached_tail(ctx.broker, bucket, p.fetch_offset, end, limit)
                if cached is not None and total > 0 and cached[1] > limit:
                    cached = [], 0  # only the response's first partition with data may exceed the limit
            if cached is not None:
                batches, size = cached
            elif p.fetch_offset < tablet.log_start_offset and ctx.broker.remote_log.serves(bucket, p.fetch_offset):
                # Tiered offsets: object store reads, never on the event loop, and never waited
                # on for longer than remote.fetch.max.wait.ms.
                batches, size = await ctx.broker.remote_log.fetches.read(
                    (tablet, p.fetch_offset),
                    lambda b=bucket, o=p.fetch_offset, n=limit, m=min_one: _read_bucket(ctx, b, o, n, m))
            elif limit > 256 * 1024 or bucket.table.value_format is not kafka_batches.RAW:
                # Large reads and typed tables (values re-encoded from columns) are CPU work.
                batches, size = await _read_large(ctx, bucket, p.fetch_offset, limit, min_one, end, loop)
            else:
                batches, size = _read_bucket(ctx, bucket, p.fetch_offset, limit, min_one)
            if ahead is not None and batches and (after := next_offset(batches[-1])) < end:
                ahead.start(bucket.table.name, bucket.index, lambda b=bucket, o=after, n=limit: loop.run_in_executor(
                    ctx.broker.cpu_executor, _read_bucket, ctx, b, o, n))
        except FluvialError as exc:
            results.append((key, _partition_result(p.partition, exc.code, bucket)))
            continue
        total += size
        result = _partition_result(p.partition, 0, bucket, batches)
        if read_committed:
            state = index.get(bucket) if index.known(bucket) else await loop.run_in_executor(
                ctx.broker.io_executor, index.get, bucket)
            if state is not None:
                total -= size
                batches, size = _committed_view(state, result, batches, p.fetch_offset)
                total += size
        results.append((key, result))
    return results, total
