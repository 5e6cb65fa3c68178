"""Produce: verify each partition's batch, convert it to Arrow, append, acknowledge.

Per partition: one v2 batch (v3+), size checked, CRC-32C checked (where the batch is
converted, before its decode: on the executor for large and typed batches), converted to the
stored Arrow batch off the event loop, then appended in request order. acks=0 gets no
response; acks=all waits for the bucket's group-commit fsync (flush policy "ack").
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
import weakref
from dataclasses import dataclass

from fluvial.broker import kafka_batches
from fluvial.broker.authorization import allowed
from fluvial.broker.handlers import Deferred, Reply, RequestContext, handles
from fluvial.broker.log.batch_meta import ATTR_TRANSACTIONAL
from fluvial.broker.log.tablet import COALESCE_MAX_BYTES
from fluvial.broker.log_table import LogTable as _LogTable, _cache_wire
from fluvial.errors import FluvialError, InvalidRecordError, MessageTooLargeError, UnknownTableError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.fetch_response import EncodedResponse
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.protocol.produce_response import ProducedPartition, encode_accepted, encode_produce_response
from fluvial.protocol.records import check_produced, parse_batch_header, split_batches, verify_crc
from fluvial.security.acls import AclOperation, ResourceType

log = logging.getLogger(__name__)
R = response_class(ApiKey.PRODUCE)
PartitionResponse = R.TopicProduceResponse.PartitionProduceResponse

try:
    from fluvial.broker._netio import Frame as _IoFrame
except ImportError:  # not built: frames are the asyncio path's bytearrays
    _IoFrame = bytearray
# Request frames a batch may be used in place of: the asyncio path's bytearrays and the
# compiled I/O thread's frames, both writable buffers owned by that one request.
_OWNED_FRAMES = (bytearray, _IoFrame)

# Batches smaller than this are converted on the loop: a thread hop costs more.
INLINE_CONVERT_BYTES = 16 * 1024

# Requests of a bucket whose batches are converted and appended on the executor that may be
# under way at once (see _Pipeline): one appending while the next is decoded and the loop
# receives a third. More would only hold more request buffers.
PIPELINE_DEPTH = 2


@dataclass
class _Part:
    topic: str
    index: int
    response: object
    bucket: object = None
    wire: bytearray | None = None
    header: object = None
    converted: object = None  # (records, meta) | FluvialError
    written: object = None  # BatchMeta, when appended on the executor that converted it
    handed_back: bool = False  # `written` handed to the table's kind on the loop (`_hand_back`)


def _error(index: int, exc: FluvialError | ErrorCode, message: str | None = None) -> ProducedPartition:
    code = exc.code if isinstance(exc, FluvialError) else exc
    msg = exc.message if isinstance(exc, FluvialError) else message
    errors = list(exc.record_errors) if isinstance(exc, InvalidRecordError) else []
    return ProducedPartition(index, int(code), record_errors=errors, error_message=msg)


def _owned_wire(batch: memoryview) -> bytearray | memoryview:
    """The batch as bytes the broker may patch (base offset, leader epoch) and keep in the
    wire cache. A request frame is a writable buffer of its own (broker/frames.py, or the
    compiled I/O thread's frame): a batch that is most of it is used in place, without
    copying it. A small batch of a
    larger frame (many partitions in one request) is copied, so that a cached batch never
    keeps much more than itself alive."""
    if not batch.readonly and isinstance(batch.obj, _OWNED_FRAMES) and 2 * batch.nbytes >= len(batch.obj):
        return batch
    return bytearray(batch)


def _prepare(ctx: RequestContext, topic: str, index: int, records) -> _Part:
    part = _Part(topic, index, None)
    try:
        table = ctx.broker.tables.get(topic)
        table.kind.check_producible(table)
        part.bucket = table.bucket(index)
        if records is None:
            raise InvalidRecordError("produce request without records")
        max_bytes = int(table.config("max.message.bytes"))
        if len(records) > max_bytes:
            raise MessageTooLargeError(f"batch of {len(records)} bytes exceeds max.message.bytes={max_bytes}")
        batches = split_batches(records)
        if len(batches) != 1:
            raise InvalidRecordError("a produce request (v3+) must carry exactly one record batch per partition")
        header = parse_batch_header(batches[0])
        if header.is_control:
            verify_crc(batches[0], header)  # a damaged marker is refused as damaged
            # Commit and abort markers are the transaction coordinator's alone: a client's
            # would end (or forge the end of) a transaction in a read_committed reader's view.
            raise InvalidRecordError("control batches are written by the broker only, not produced by clients")
        part.wire = _owned_wire(batches[0])
        part.header = header
    except UnknownTableError as exc:
        part.response = _error(index, exc.code, exc.message)
    except FluvialError as exc:
        part.response = _error(index, exc)
    return part


def _convert(part: _Part, log_append_time: int | None, coalesced: bool = False) -> None:
    """``coalesced``: the batch will be a coalesced append (acks=all under flush policy
    ``ack``); a small raw-table batch is then only checked here, and converted to Arrow by
    the log tablet together with the others of its flush window."""
    try:
        # Every produced batch's CRC is checked here, first: on the executor for the batches
        # converted there, so the loop does not spend its time on it.
        verify_crc(part.wire, part.header)
        part.converted = part.bucket.table.kind.decode_produced(part.bucket, memoryview(part.wire), part.header,
                                                                log_append_time_ms=log_append_time,
                                                                coalesced=coalesced)
    except FluvialError as exc:
        part.converted = exc


def _appends_off_loop(part: _Part, log_append_time: int | None, coalesced: bool) -> bool:
    """A batch converted on the executor may be appended there too when nothing about it
    needs the loop between conversion and append: no producer id (idempotent and
    transactional producers are checked and recorded against the producer state on the
    loop, with no await between check and append), no broker timestamps (the wire batch
    then does not stand for the stored one), and not a batch small enough to be coalesced
    with the others of its flush window (a small typed batch). The table's kind decides
    the rest."""
    return (part.header.producer_id < 0 and not part.header.attributes & ATTR_TRANSACTIONAL
            and log_append_time is None
            and not (coalesced and len(part.wire) < COALESCE_MAX_BYTES))


def _append_converted(part: _Part) -> None:
    """Append a converted part on this (executor) thread; a refusal becomes its answer."""
    if isinstance(part.converted, FluvialError):
        return
    records, meta = part.converted
    try:
        part.written = part.bucket.table.kind.append_in_thread(part.bucket, records, meta)
    except FluvialError as exc:
        part.converted = exc


def _hand_back(broker, part: _Part) -> None:
    """On the loop: what follows an append made on the executor (`appended_in_thread`: the
    flush requested or readers woken, the wire cache), once per part."""
    if part.handed_back:
        return
    part.handed_back = True
    part.bucket.table.kind.appended_in_thread(broker, part.bucket, part.written, wire=part.wire)


def _append_and_hand_back(broker, loop: asyncio.AbstractEventLoop, part: _Part) -> None:
    """Append on this (executor) thread, then ask the loop for `_hand_back` at once: the
    bucket's flush starts with the loop's next pass, not after the job's future has reached
    the request's coroutine (several passes later, each behind the frames and callbacks due
    meanwhile), which under flush policy ``ack`` is time every acknowledgement waits. The
    callback comes before the job's completion in the loop's queue, so appends of a bucket
    are handed back in their order; `_respond` hands back a part the callback did not."""
    _append_converted(part)
    if part.written is not None:
        try:
            loop.call_soon_threadsafe(_hand_back, broker, part)
        except RuntimeError:
            pass  # the loop is closing: `_respond` is not reached either


def _convert_and_append(broker, loop: asyncio.AbstractEventLoop, part: _Part, log_append_time: int | None) -> None:
    _convert(part, log_append_time)
    _append_and_hand_back(broker, loop, part)


class _Pipeline:
    """The requests of one bucket whose batches are converted and appended on the executor
    and not finished yet, oldest first.

    A produce request of large batches (nothing about them checked on the loop, see
    `_appends_off_loop`) is answered later (a Deferred) instead of holding its connection's
    reader until its append is written: the loop receives the next request and the
    executor decodes it while the previous one is compressed and written, so the decode,
    the storage encoding and the request reading of one producer's stream overlap on the
    cores. Appends stay in request order: each job appends only once the bucket's previous
    job (its concurrent future, done also when cancelled before it ran) has finished, and a
    request appended on the loop first waits for the bucket's pipelined jobs."""

    __slots__ = ("jobs", "tail")

    def __init__(self) -> None:
        self.jobs: collections.deque = collections.deque()  # (concurrent.futures.Future, asyncio.Future)
        self.tail: concurrent.futures.Future | None = None  # the job the next one appends after

    async def settle(self, depth: int) -> None:
        """Wait until fewer than ``depth`` jobs are under way (0: none)."""
        jobs = self.jobs
        while jobs:
            job, waiter = jobs[0]
            if not job.done():
                if len(jobs) < depth:
                    return
                await asyncio.wait((waiter,))
            if jobs and jobs[0][0] is job:
                jobs.popleft()


_pipelines: "weakref.WeakKeyDictionary[object, _Pipeline]" = weakref.WeakKeyDictionary()


def _append_after(broker, loop: asyncio.AbstractEventLoop, part: _Part, log_append_time: int | None,
                  before: concurrent.futures.Future | None, waiter: asyncio.Future) -> None:
    """Convert (in parallel with the bucket's previous job), then append after it, then wake
    the loop once: `_finish_job` hands the append back and completes the request's
    ``waiter`` in one callback (an `asyncio.wrap_future` of the job would be a second wake,
    besides the hand-back's). A job whose request was cancelled before the job started is
    not run, as a cancelled concurrent future is not."""
    if waiter.cancelled():
        return
    failure = None
    try:
        _convert(part, log_append_time)
        if before is not None:
            concurrent.futures.wait((before,))
        _append_converted(part)
    except BaseException as exc:  # noqa: BLE001 - the request's coroutine raises it, as from the job
        failure = exc
    try:
        # Queued before this job's future is done, so before the next job of the bucket
        # appends: the bucket's appends are handed back in their order.
        loop.call_soon_threadsafe(_finish_job, broker, part, waiter, failure)
    except RuntimeError:
        pass  # the loop is closing: nobody waits for the answer


def _finish_job(broker, part: _Part, waiter: asyncio.Future, failure: BaseException | None) -> None:
    """On the loop: a pipelined job's append handed back, and its request woken."""
    if part.written is not None:
        _hand_back(broker, part)
    if waiter.done():
        return
    if failure is None:
        waiter.set_result(None)
    else:
        waiter.set_exception(failure)


async def _admit_transactional(ctx: RequestContext, transactional_id: str | None, part: _Part, meta) -> bool:
    """A transactional batch goes in only as part of its producer's ongoing transaction,
    with that partition added to it (Kafka 4.x's partition verification). True when the
    table's kind holds the batch until the transaction ends (nothing to append now)."""
    coordinator = ctx.broker.extensions["transactions"]
    if ctx.version >= 12:
        # Transactions v2 (KIP-890): the first batch to a partition adds it to the transaction.
        await coordinator.add_implicitly(transactional_id, meta.producer_id, meta.producer_epoch,
                                         part.topic, part.index)
    code = coordinator.verify_produce(
        transactional_id, meta.producer_id, meta.producer_epoch, part.topic, part.index)
    if code is not None:
        raise FluvialError(f"transactional batch of producer {meta.producer_id} epoch {meta.producer_epoch} "
                           f"is not part of an ongoing transaction with {part.topic}-{part.index}", code=code)
    return await part.bucket.table.kind.hold_transactional(ctx.broker, part.bucket, meta, bytes(part.wire))


def produce_one(broker, header, acks: int, topic: str, index: int, records) -> Deferred | EncodedResponse | None:
    """The request of many small producers, answered without the general path's steps: one
    partition of a raw log table (not compacted, CreateTime), acks=all under flush policy
    ``ack``, a small batch that is neither transactional nor a control batch, no authorizer.
    Every check comes before the one side effect (the append), and anything unusual or
    refused returns None before it, so the general path (`produce`) handles the request from
    the start and gives the same answer it always did. The steps and their order are those
    of `produce` and `_respond` for this case. Takes the fields `read_common` read from a
    one-topic, one-partition request (its body's objects are made only for the general path)."""
    if acks != -1 or header.api_version < 3 or broker.config.flush_policy != "ack" \
            or broker.authorizer.enabled:
        return None
    table = broker.tables.tables.get(topic)
    if table is None or type(records) is not memoryview or len(records) >= INLINE_CONVERT_BYTES \
            or type(table.kind) is not _LogTable or table.value_format is not kafka_batches.RAW or table.compacted:
        return None
    try:
        table.kind.check_producible(table)
        bucket = table.bucket(index)
        if len(records) > int(table.config("max.message.bytes")) \
                or table.config("message.timestamp.type") == "LogAppendTime":
            return None
        if _pipelines:
            pipeline = _pipelines.get(bucket)
            if pipeline is not None and pipeline.jobs:
                return None
        checked = check_produced(records)
        if checked is not None:
            # The usual batch: the steps below in one compiled call.
            wire = _owned_wire(records)
            write, meta = kafka_batches.checked_wire_records(memoryview(wire), checked)
        else:
            # Anything else than one plain batch (several, trailing bytes, control or
            # transactional) goes the general way.
            batch_header = kafka_batches.lone_batch_header(records)
            if batch_header is None:
                return None
            wire = _owned_wire(records)
            write, meta = kafka_batches.to_wire_records(memoryview(wire), batch_header)
        bucket.tablet.check_online()
        producer_state = broker.extensions.get("producer_state")
        idempotent = producer_state is not None and meta.producer_id >= 0
        if idempotent:
            producers = producer_state.loaded_manager(bucket)
            if producers is None:
                return None
            # As ProducerStateRegistry.check, with the bucket's state looked up once.
            duplicate = producers.check_meta(meta) if meta.base_sequence >= 0 else None
    except FluvialError:
        return None
    group_commit = bucket.group_commit
    if idempotent and duplicate is not None:
        # The original may still be waiting for its fsync.
        response = ProducedPartition(index, 0, duplicate.base_offset, -1, bucket.log_start_offset)
        offset = duplicate.last_offset + 1
    else:
        try:
            written = bucket.append(write, meta, coalesce=True)
        except FluvialError as exc:
            # As `_respond`: refused at the append (an offline bucket), answered at once.
            response = _error(index, exc)
            broker.kafka.request_stats.error(ApiKey.PRODUCE, response.error_code)
            return EncodedResponse([encode_produce_response(header, [(topic, [response])])])
        if idempotent:
            producers.apply(written, int(time.time() * 1000))  # ProducerStateRegistry.record
        _cache_wire(broker, bucket, written, wire)
        response = ProducedPartition(index, 0, written.base_offset, -1, bucket.log_start_offset)
        offset = written.base_offset + written.record_count
    reply = Reply()
    group_commit.when_durable(offset, _OnDurable(reply, header, topic, response, broker.kafka.request_stats, index))
    return Deferred(reply)


class _OnDurable:
    """`produce_one`'s answer, encoded and handed to the connection once its records are
    durable (or refused when their flush failed: never acknowledged)."""

    __slots__ = ("reply", "header", "topic", "response", "stats", "index")

    def __init__(self, reply: Reply, header, topic: str, response: ProducedPartition, stats, index: int) -> None:
        self.reply, self.header, self.topic, self.response, self.stats, self.index = \
            reply, header, topic, response, stats, index

    def __call__(self, failure: BaseException | None) -> None:
        reply = self.reply
        if reply.finished:
            return
        try:
            if failure is None:
                # Durable: the answer is an acceptance (an error answers at once, never here).
                answer = encode_accepted(self.header, self.topic, self.response)
            elif isinstance(failure, asyncio.CancelledError):
                reply.set_failure(failure)
                return
            else:
                _refuse_unflushed(self.response, self.topic, self.index, failure, self.stats)
                answer = encode_produce_response(self.header, [(self.topic, [self.response])])
        except Exception as exc:  # noqa: BLE001 - an answer that cannot be made closes its connection
            # Left unfinished, the reply would hold back every later answer of the connection
            # until its client timed out; failed, the connection is closed (and logged).
            reply.set_failure(exc)
            return
        reply.set_result(answer)


@handles(ApiKey.PRODUCE, 0, 12)
async def produce(ctx: RequestContext, request):
    broker = ctx.broker
    if ctx.version < 3:
        # KIP-896: advertised from v0 so old librdkafka keeps compression on, refused below v3.
        return ctx.response(throttle_time_ms=0, responses=[
            R.TopicProduceResponse(name=t.name, partition_responses=[
                PartitionResponse(index=p.index, error_code=ErrorCode.UNSUPPORTED_VERSION, base_offset=-1,
                                  log_append_time_ms=-1, log_start_offset=-1, record_errors=[],
                                  error_message="Produce v0-2 are not supported (KIP-896)")
                for p in t.partition_data]) for t in request.topic_data])
    acks = request.acks
    parts: list[_Part] = []
    # ACLs (when the authorizer is on): WRITE on the transactional id for the whole request,
    # WRITE on each topic for its partitions; a refused partition is not looked at further.
    check_acls = broker.authorizer.enabled
    denied_all = None
    if check_acls and request.transactional_id is not None and not allowed(
            ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
        denied_all = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    for t in request.topic_data:
        denied = denied_all
        if check_acls and denied is None and not allowed(ctx, AclOperation.WRITE, ResourceType.TOPIC, t.name):
            denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        for p in t.partition_data:
            if denied is not None:
                parts.append(_Part(t.name, p.index, _error(p.index, denied)))
            elif acks not in (0, 1, -1):
                parts.append(_Part(t.name, p.index, _error(p.index, ErrorCode.INVALID_REQUIRED_ACKS)))
            else:
                parts.append(_prepare(ctx, t.name, p.index, p.records))

    todo = [p for p in parts if p.response is None]
    # Typed tables (primary-key tables among them) decode values into columns: always off the loop.
    big: list[_Part] = []
    small: list[_Part] = []
    for p in todo:
        typed = p.bucket.table.value_format is not kafka_batches.RAW
        (big if typed or len(p.wire) >= INLINE_CONVERT_BYTES else small).append(p)
    lat = {p.topic: kafka_batches.now_ms() for p in todo
           if p.bucket.table.config("message.timestamp.type") == "LogAppendTime"}
    loop = asyncio.get_running_loop()
    coalesced = acks == -1 and broker.config.flush_policy == "ack"
    if big and not small and all(_appends_off_loop(p, lat.get(p.topic), coalesced)
                                 and p.bucket.table.kind.appends_in_thread(p.bucket.table) for p in big):
        pending = []
        for p in big:
            pipeline = _pipelines.get(p.bucket)
            if pipeline is None:
                pipeline = _pipelines[p.bucket] = _Pipeline()
            await pipeline.settle(PIPELINE_DEPTH)
            waiter = loop.create_future()
            job = broker.cpu_executor.submit(_append_after, broker, loop, p, lat.get(p.topic), pipeline.tail,
                                             waiter)
            pipeline.jobs.append((job, waiter))
            pipeline.tail = job
            pending.append(waiter)
        return Deferred(_respond_when_written(ctx, request, parts, todo, lat, pending))
    if _pipelines:
        for p in todo:
            pipeline = _pipelines.get(p.bucket)
            if pipeline is not None and pipeline.jobs:
                await pipeline.settle(0)  # appended after the pipelined requests before it
    pending = [loop.run_in_executor(broker.cpu_executor, _convert_and_append, broker, loop, p, lat.get(p.topic))
               if _appends_off_loop(p, lat.get(p.topic), coalesced) else
               loop.run_in_executor(broker.cpu_executor, _convert, p, lat.get(p.topic)) for p in big]
    for p in small:
        _convert(p, lat.get(p.topic), coalesced)
    if pending:
        await asyncio.gather(*pending)
    return await _respond(ctx, request, parts, todo, lat)


async def _respond_when_written(ctx: RequestContext, request, parts: list[_Part], todo: list[_Part],
                                lat: dict[str, int], pending: list[asyncio.Future]):
    """A pipelined request's answer: once its batches are appended (and, with acks=all,
    durable)."""
    await asyncio.gather(*pending)
    result = await _respond(ctx, request, parts, todo, lat)
    return await result.awaitable if isinstance(result, Deferred) else result


def _accepted(p: _Part, written, lat: dict[str, int], durable_waits: list | None) -> None:
    bucket = p.bucket
    p.response = ProducedPartition(p.index, 0, written.base_offset, lat.get(p.topic, -1), bucket.log_start_offset)
    if durable_waits is not None:
        durable_waits.append((p, bucket.group_commit, written.base_offset + written.record_count))


def _not_acknowledged(p: _Part, outcome: BaseException, stats) -> None:
    """A partition whose flush failed: answered with the failure, not acknowledged."""
    _refuse_unflushed(p.response, p.topic, p.index, outcome, stats)


def _refuse_unflushed(response: ProducedPartition, topic: str, index: int, outcome: BaseException, stats) -> None:
    code = outcome.code if isinstance(outcome, FluvialError) else ErrorCode.KAFKA_STORAGE_ERROR
    log.error("produce to %s-%d not acknowledged: %s", topic, index, outcome)
    response.error_code, response.base_offset = code, -1
    stats.error(ApiKey.PRODUCE, code)
    response.error_message = str(outcome)


async def _respond(ctx: RequestContext, request, parts: list[_Part], todo: list[_Part], lat: dict[str, int]):
    """Append what the executor did not, then the answer (a Deferred when it waits for fsync)."""
    broker = ctx.broker
    acks = request.acks

    producer_state = broker.extensions.get("producer_state")
    # Partitions whose answer waits for their bucket's fsync: (part, group commit, offset).
    durable_waits = [] if acks == -1 and broker.config.flush_policy == "ack" else None
    for p in todo:
        if isinstance(p.converted, FluvialError):
            p.response = _error(p.index, p.converted)
            continue
        records, meta = p.converted
        bucket = p.bucket
        if p.written is not None:
            _hand_back(broker, p)
            _accepted(p, p.written, lat, durable_waits)
            continue
        try:
            # An offline bucket answers every batch with KAFKA_STORAGE_ERROR, retries included:
            # the duplicate answer would acknowledge data whose fsync failed.
            bucket.tablet.check_online()
            transactional = p.header.attributes & ATTR_TRANSACTIONAL  # as produced (a PK write's meta drops it)
            if transactional:
                # Before the idempotence check: no await may come between it and the append.
                if await _admit_transactional(ctx, request.transactional_id, p, meta):
                    # Held (durably) until the transaction ends, e.g. a primary-key table's
                    # writes, which reach its KV state only when the transaction commits.
                    p.response = ProducedPartition(p.index, 0, -1, -1, bucket.log_start_offset)
                    continue
            idempotent = producer_state is not None and meta.producer_id >= 0
            if idempotent:
                if not producer_state.loaded(bucket):
                    await producer_state.ensure_loaded(bucket)  # just after a restart
                duplicate = producer_state.check(bucket, meta)
                if duplicate is not None:
                    p.response = ProducedPartition(p.index, 0, duplicate.base_offset, -1, bucket.log_start_offset)
                    if durable_waits is not None:
                        # The original may still be waiting for its fsync.
                        durable_waits.append((p, bucket.group_commit, duplicate.last_offset + 1))
                    continue
            # Recorded right at the append (before a primary-key table's RocksDB is updated):
            # a producer-state snapshot taken meanwhile must not claim a log end its state
            # lacks. The meta keeps the producer's sequence span beside the log's offsets.
            on_append = (lambda w, b=bucket: producer_state.record(b, w)) if idempotent else None
            # The producer's bytes stand for the stored batch unless the broker set its time.
            written = await bucket.table.kind.append_produced(broker, bucket, records, meta,
                                                              wire=None if p.topic in lat else p.wire,
                                                              acks=acks, on_append=on_append)
            if idempotent and written.record_count == 0:
                # Nothing changed (a primary-key no-op), so the log holds no trace of this
                # batch: its sequences are made durable in a snapshot before the answer.
                await producer_state.persist_unlogged(bucket, written)
            if transactional:
                broker.extensions["txn_index"].on_append(bucket, meta.producer_id, written.base_offset)
        except FluvialError as exc:
            p.response = _error(p.index, exc)
            continue
        _accepted(p, written, lat, durable_waits)

    stats = broker.kafka.request_stats
    if len(parts) == 1:
        p = parts[0]
        topics = [(p.topic, [p.response])]
        if p.response.error_code:
            stats.error(ApiKey.PRODUCE, p.response.error_code)
    else:
        by_topic: dict[str, list] = {}
        for p in parts:
            by_topic.setdefault(p.topic, []).append(p.response)
            if p.response.error_code:
                stats.error(ApiKey.PRODUCE, p.response.error_code)
        topics = list(by_topic.items())
    if acks == 0:
        return None
    header = ctx.header
    if not durable_waits:
        # Encoded here rather than as kafka-python objects: a small request's answer would
        # otherwise cost about as much as its append.
        return EncodedResponse([encode_produce_response(header, topics)])

    if len(durable_waits) == 1:
        # The usual small request (one partition): the answer is encoded by a callback that
        # the bucket's flush calls when it completes, and written by the connection's
        # Answers from that call: no task, coroutine, future or loop callback per request.
        (part, group_commit, offset), = durable_waits
        reply = Reply()

        def on_durable(failure: BaseException | None) -> None:
            if reply.finished:
                return
            if isinstance(failure, asyncio.CancelledError):
                reply.set_failure(failure)
                return
            if failure is not None:
                _not_acknowledged(part, failure, stats)
            reply.set_result(encode_produce_response(header, topics))

        group_commit.when_durable(offset, on_durable)
        return Deferred(reply)

    waits = [group_commit.wait_durable(offset) for _, group_commit, offset in durable_waits]

    async def after_fsync():
        # Each partition is answered by its own bucket's fsync: one failing disk or bucket
        # does not fail the others' acknowledgements.
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
        for (p, _, _), outcome in zip(durable_waits, outcomes):
            if isinstance(outcome, BaseException):
                _not_acknowledged(p, outcome, stats)
        return encode_produce_response(header, topics)

    return Deferred(after_fsync())
