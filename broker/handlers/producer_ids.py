"""InitProducerId, and the producer state the produce path checks idempotent batches with."""
from __future__ import annotations

import asyncio
import logging

from fluvial.broker.broker import on_start, on_stop
from fluvial.broker.authorization import allowed, allowed_on_any, allowed_on_cluster
from fluvial.broker.handlers import RequestContext, handles
from fluvial.broker.producer_state import ProducerIdManager, ProducerStateRegistry
from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey
from fluvial.security.acls import AclOperation, ResourceType

log = logging.getLogger(__name__)

# How often the producer state of buckets that changed is written to their snapshots.
SNAPSHOT_INTERVAL_S = 15.0


@on_start
async def start_producer_state(broker) -> None:
    broker.extensions["producer_ids"] = ProducerIdManager(broker.store)
    loop = asyncio.get_running_loop()
    registry = ProducerStateRegistry(io_executor=broker.io_executor, loop=loop)
    # Every bucket's state is loaded in the background (its newest snapshot plus the batch
    # headers after it, on the I/O threads): the listener opens without waiting, and only
    # an idempotent produce to a bucket still loading waits for it.
    registry.start_loading(list(broker.tables.all_buckets()))
    broker.extensions["producer_state"] = registry
    broker.extensions["producer_state_snapshots"] = loop.create_task(_snapshot_periodically(broker, registry))


async def _snapshot_periodically(broker, registry: ProducerStateRegistry) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(SNAPSHOT_INTERVAL_S)
        try:
            prepared = registry.prepare_snapshots(only_changed=True)
            if prepared:
                await loop.run_in_executor(broker.io_executor, registry.write_snapshots, prepared)
        except Exception:
            log.exception("producer state snapshot failed")


@on_stop
async def stop_producer_state(broker) -> None:
    task = broker.extensions.pop("producer_state_snapshots", None)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    registry = broker.extensions.get("producer_state")
    if registry is not None:
        # The listener is closed: no append can slip in between encoding and writing.
        prepared = registry.prepare_snapshots()
        await asyncio.get_running_loop().run_in_executor(broker.io_executor, registry.write_snapshots, prepared)


@handles(ApiKey.INIT_PRODUCER_ID, 0, 5)
async def init_producer_id(ctx: RequestContext, request):
    ids: ProducerIdManager = ctx.broker.extensions["producer_ids"]
    # A transactional producer needs WRITE on its transactional id; an idempotent one
    # IDEMPOTENT_WRITE on the cluster or WRITE on some topic (Kafka 3+).
    if request.transactional_id is not None:
        if not allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
            return ctx.response(throttle_time_ms=0, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                producer_id=-1, producer_epoch=-1)
    elif not (allowed_on_cluster(ctx, AclOperation.IDEMPOTENT_WRITE)
              or allowed_on_any(ctx, AclOperation.WRITE, ResourceType.TOPIC)):
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            producer_id=-1, producer_epoch=-1)
    pid = request.producer_id if ctx.version >= 3 else -1
    epoch = request.producer_epoch if ctx.version >= 3 else -1
    loop = asyncio.get_running_loop()
    if request.transactional_id:
        # The transaction coordinator: epoch bump, fencing, abort of the previous
        # instance's open transaction.
        try:
            result = await ctx.broker.extensions["transactions"].init_producer_id(
                request.transactional_id, request.transaction_timeout_ms, pid, epoch, ids.next_producer_id)
        except FluvialError as exc:
            code = exc.code
            if code == ErrorCode.PRODUCER_FENCED and ctx.version < 4:
                code = ErrorCode.INVALID_PRODUCER_EPOCH
            return ctx.response(throttle_time_ms=0, error_code=code, producer_id=-1, producer_epoch=-1)
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.NONE, producer_id=result[0],
                            producer_epoch=result[1])
    try:
        # The metadata store fsyncs: keep that off the event loop.
        result = await loop.run_in_executor(
            ctx.broker.io_executor, ids.init_producer_id, request.transactional_id,
            request.transaction_timeout_ms, pid, epoch)
    except FluvialError as exc:
        code = exc.code
        if code == ErrorCode.PRODUCER_FENCED and ctx.version < 4:
            code = ErrorCode.INVALID_PRODUCER_EPOCH  # PRODUCER_FENCED is known from v4 (KIP-588)
        return ctx.response(throttle_time_ms=0, error_code=code, producer_id=-1, producer_epoch=-1)
    return ctx.response(throttle_time_ms=0, error_code=ErrorCode.NONE, producer_id=result.producer_id,
                        producer_epoch=result.producer_epoch)
