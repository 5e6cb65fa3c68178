"""ListOffsets: earliest, latest, max timestamp, or the first offset at/after a timestamp."""
from __future__ import annotations

import asyncio

from fluvial.broker.authorization import require
from fluvial.broker.handlers import RequestContext, handles
from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

R = response_class(ApiKey.LIST_OFFSETS)
PartitionResponse = R.ListOffsetsTopicResponse.ListOffsetsPartitionResponse

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5


def lookup(bucket, timestamp: int, remote_log=None) -> tuple[int, int]:
    """(timestamp, offset) answered for one bucket; (-1, -1) when nothing matches.

    With a remote log (``remote_log`` given and the bucket has tiered data) this reads the
    object store: the caller runs it on an executor."""
    tablet = bucket.tablet
    tiered = remote_log is not None and bucket.remote_log_start is not None
    if timestamp == LATEST:
        return -1, tablet.high_watermark
    if timestamp == EARLIEST:
        return -1, bucket.log_start_offset
    if timestamp == EARLIEST_LOCAL:
        return -1, tablet.log_start_offset
    if timestamp == LATEST_TIERED:
        manifest = remote_log.manifest(bucket) if tiered else None
        return -1, (manifest.end_offset - 1 if manifest is not None and manifest.segments else -1)
    if timestamp == MAX_TIMESTAMP:
        found = tablet.max_timestamp()
        if found is not None and found[0] >= tablet.high_watermark:
            # As Kafka: a record past the high watermark (not yet fsynced under flush policy
            # ack) is not answered; the lookup finds it once it is visible.
            found = None
        remote = remote_log.max_timestamp(bucket) if tiered else None
        if remote is not None and (found is None or remote[1] >= found[1]):
            found = remote  # the earlier offset on ties
        return (found[1], found[0]) if found else (-1, -1)
    if timestamp < 0:
        raise FluvialError(f"unknown special timestamp {timestamp}", code=ErrorCode.INVALID_REQUEST)
    found = remote_log.offset_for_timestamp(bucket, timestamp) if tiered else None
    if found is None:
        found = tablet.offset_for_timestamp(timestamp)
    return (found[1], found[0]) if found else (-1, -1)


@handles(ApiKey.LIST_OFFSETS, 1, 9)
async def list_offsets(ctx: RequestContext, request):
    topics = []
    index = ctx.broker.extensions.get("txn_index")
    for t in request.topics:
        parts = []
        for p in t.partitions:
            try:
                require(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t.name)
                bucket = ctx.broker.tables.get(t.name).bucket(p.partition_index)
                if bucket.remote_log_start is not None and p.timestamp not in (LATEST, EARLIEST, EARLIEST_LOCAL):
                    remote_log = ctx.broker.remote_log
                    ts, offset = await asyncio.get_running_loop().run_in_executor(
                        remote_log.read_executor, lookup, bucket, p.timestamp, remote_log)
                else:
                    ts, offset = lookup(bucket, p.timestamp)
                if p.timestamp == LATEST and request.isolation_level == 1 and index is not None:
                    # read_committed: the last stable offset.
                    state = index.get(bucket) if index.known(bucket) else await asyncio.get_running_loop(
                        ).run_in_executor(ctx.broker.io_executor, index.get, bucket)
                    if state is not None:
                        offset = state.last_stable_offset(offset)
                parts.append(PartitionResponse(partition_index=p.partition_index, error_code=0, timestamp=ts,
                                               offset=offset, leader_epoch=bucket.leader_epoch))
            except FluvialError as exc:
                parts.append(PartitionResponse(partition_index=p.partition_index, error_code=exc.code,
                                               timestamp=-1, offset=-1, leader_epoch=-1))
        topics.append(R.ListOffsetsTopicResponse(name=t.name, partitions=parts))
    return ctx.response(throttle_time_ms=0, topics=topics)
