"""OffsetCommit, OffsetFetch (one group, or many from v8) and OffsetDelete."""
from __future__ import annotations

from fluvial.broker.groups import CommittedOffset, GroupCoordinator
from fluvial.broker.groups.coordinator import OffsetCommitEntry
from fluvial.broker.handlers import RequestContext, handles
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class

OC = response_class(ApiKey.OFFSET_COMMIT)
OF = response_class(ApiKey.OFFSET_FETCH)
OD = response_class(ApiKey.OFFSET_DELETE)

NO_OFFSET = -1


def coordinator(ctx: RequestContext) -> GroupCoordinator:
    return ctx.broker.extensions["groups"]


@handles(ApiKey.OFFSET_COMMIT, 2, 9)
async def offset_commit(ctx: RequestContext, request):
    entries = [
        OffsetCommitEntry(t.name, p.partition_index, p.committed_offset,
                          p.committed_leader_epoch if ctx.version >= 6 else -1, p.committed_metadata)
        for t in request.topics for p in t.partitions
    ]
    errors = await coordinator(ctx).commit_offsets(
        group_id=request.group_id,
        generation_id=request.generation_id_or_member_epoch,
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if ctx.version >= 7 else None,
        offsets=entries,
        retention_time_ms=request.retention_time_ms if ctx.version <= 4 else -1,
    )
    return ctx.response(throttle_time_ms=0, topics=[
        OC.OffsetCommitResponseTopic(name=t.name, partitions=[
            OC.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                partition_index=p.partition_index, error_code=errors[(t.name, p.partition_index)])
            for p in t.partitions])
        for t in request.topics])


def _fetch_group(ctx: RequestContext, group_id: str, topics) -> tuple[ErrorCode, list[tuple[str, list]]]:
    """One group's committed offsets, as (topic, [(partition, CommittedOffset | None)])."""
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    error, found = coordinator(ctx).fetch_offsets(group_id, wanted)
    by_topic: dict[str, list[tuple[int, CommittedOffset | None]]] = {}
    if wanted is None:
        for (topic, partition), committed in sorted(found.items()):
            by_topic.setdefault(topic, []).append((partition, committed))
    else:
        for tp in wanted:
            by_topic.setdefault(tp[0], []).append((tp[1], found.get(tp)))
    return error, list(by_topic.items())


def _partition_fields(partition: int, committed: CommittedOffset | None) -> dict:
    if committed is None:
        return dict(partition_index=partition, committed_offset=NO_OFFSET, committed_leader_epoch=-1,
                    metadata="", error_code=ErrorCode.NONE)
    return dict(partition_index=partition, committed_offset=committed.offset,
                committed_leader_epoch=committed.leader_epoch, metadata=committed.metadata,
                error_code=ErrorCode.NONE)


@handles(ApiKey.OFFSET_FETCH, 1, 9)
async def offset_fetch(ctx: RequestContext, request):
    if ctx.version < 8:
        # v1 has no "all topics" form; v2+ asks for all with a null topic list.
        topics = request.topics if ctx.version >= 2 else (request.topics or [])
        error, found = _fetch_group(ctx, request.group_id, topics)
        Topic = OF.OffsetFetchResponseTopic
        return ctx.response(throttle_time_ms=0, error_code=error, topics=[
            Topic(name=name, partitions=[Topic.OffsetFetchResponsePartition(**_partition_fields(p, c))
                                         for p, c in parts])
            for name, parts in found])
    Group = OF.OffsetFetchResponseGroup
    Topic = Group.OffsetFetchResponseTopics
    groups = []
    for g in request.groups:
        error, found = _fetch_group(ctx, g.group_id, g.topics)
        groups.append(Group(group_id=g.group_id, error_code=error, topics=[
            Topic(name=name, partitions=[Topic.OffsetFetchResponsePartitions(**_partition_fields(p, c))
                                         for p, c in parts])
            for name, parts in found]))
    return ctx.response(throttle_time_ms=0, groups=groups)


@handles(ApiKey.OFFSET_DELETE, 0, 0)
async def offset_delete(ctx: RequestContext, request):
    partitions = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    error, results = await coordinator(ctx).delete_offsets(request.group_id, partitions)
    if error != ErrorCode.NONE:
        return ctx.response(error_code=error, throttle_time_ms=0, topics=[])
    Topic = OD.OffsetDeleteResponseTopic
    return ctx.response(error_code=ErrorCode.NONE, throttle_time_ms=0, topics=[
        Topic(name=t.name, partitions=[
            Topic.OffsetDeleteResponsePartition(partition_index=p.partition_index,
                                                error_code=results[(t.name, p.partition_index)])
            for p in t.partitions])
        for t in request.topics])
