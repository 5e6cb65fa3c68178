"""OffsetForLeaderEpoch: the end offset of a leader epoch of a bucket (log truncation checks)."""
from __future__ import annotations

from fluvial.broker.authorization import require
from fluvial.broker.handlers import RequestContext, handles
from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

R = response_class(ApiKey.OFFSET_FOR_LEADER_EPOCH)
EpochEndOffset = R.OffsetForLeaderTopicResult.EpochEndOffset


@handles(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4)
async def offset_for_leader_epoch(ctx: RequestContext, request):
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            try:
                require(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t.topic)
                bucket = ctx.broker.tables.get(t.topic).bucket(p.partition)
                if p.current_leader_epoch > bucket.leader_epoch:
                    raise FluvialError("leader epoch is newer than the broker's", code=ErrorCode.UNKNOWN_LEADER_EPOCH)
                if 0 <= p.current_leader_epoch < bucket.leader_epoch:
                    raise FluvialError("leader epoch is fenced", code=ErrorCode.FENCED_LEADER_EPOCH)
                epoch, end = bucket.tablet.leader_epochs.end_offset_for(p.leader_epoch, bucket.tablet.log_end_offset)
                parts.append(EpochEndOffset(error_code=0, partition=p.partition, leader_epoch=epoch, end_offset=end))
            except FluvialError as exc:
                parts.append(EpochEndOffset(error_code=exc.code, partition=p.partition, leader_epoch=-1, end_offset=-1))
        topics.append(R.OffsetForLeaderTopicResult(topic=t.topic, partitions=parts))
    return ctx.response(throttle_time_ms=0, topics=topics)
