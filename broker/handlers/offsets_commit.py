"""OffsetCommit, OffsetFetch (one group, or many from v8) and OffsetDelete.

ACLs as Kafka checks them: committing needs READ on the group and on each topic, fetching
DESCRIBE on the group and on each topic (topics the principal may not describe are left out
of an all-topics answer), deleting DELETE on the group and READ on each topic.
"""
from __future__ import annotations

from fluvial.broker.authorization import allowed
from fluvial.broker.groups import CommittedOffset, GroupCoordinator
from fluvial.broker.groups.coordinator import OffsetCommitEntry
from fluvial.broker.handlers import RequestContext, handles
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

OC = response_class(ApiKey.OFFSET_COMMIT)
OF = response_class(ApiKey.OFFSET_FETCH)
OD = response_class(ApiKey.OFFSET_DELETE)

NO_OFFSET = -1
_READ, _DESCRIBE, _DELETE = AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE


def _group_ok(ctx: RequestContext, operation: AclOperation, group: str) -> bool:
    return allowed(ctx, operation, ResourceType.GROUP, group)


def _topic_ok(ctx: RequestContext, operation: AclOperation, topic: str) -> bool:
    return allowed(ctx, operation, ResourceType.TOPIC, topic)


def coordinator(ctx: RequestContext) -> GroupCoordinator:
    return ctx.broker.extensions["groups"]


@handles(ApiKey.OFFSET_COMMIT, 2, 9)
async def offset_commit(ctx: RequestContext, request):
    refused: dict[tuple[str, int], ErrorCode] = {}
    if not _group_ok(ctx, _READ, request.group_id):
        refused = {(t.name, p.partition_index): ErrorCode.GROUP_AUTHORIZATION_FAILED
                   for t in request.topics for p in t.partitions}
    else:
        denied_topics = {t.name for t in request.topics if not _topic_ok(ctx, _READ, t.name)}
        refused = {(t.name, p.partition_index): ErrorCode.TOPIC_AUTHORIZATION_FAILED
                   for t in request.topics if t.name in denied_topics for p in t.partitions}
    entries = [
        OffsetCommitEntry(t.name, p.partition_index, p.committed_offset,
                          p.committed_leader_epoch if ctx.version >= 6 else -1, p.committed_metadata)
        for t in request.topics for p in t.partitions if (t.name, p.partition_index) not in refused
    ]
    errors = dict(refused)
    if entries or not refused:
        errors.update(await coordinator(ctx).commit_offsets(
        group_id=request.group_id,
        generation_id=request.generation_id_or_member_epoch,
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if ctx.version >= 7 else None,
        offsets=entries,
        retention_time_ms=request.retention_time_ms if ctx.version <= 4 else -1,
        api_version=ctx.version,
    ))
    return ctx.response(throttle_time_ms=0, topics=[
        OC.OffsetCommitResponseTopic(name=t.name, partitions=[
            OC.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                partition_index=p.partition_index, error_code=errors[(t.name, p.partition_index)])
            for p in t.partitions])
        for t in request.topics])


def _fetch_group(ctx: RequestContext, group_id: str, topics) -> tuple[ErrorCode, list[tuple[str, list]]]:
    """One group's committed offsets, as (topic, [(partition, CommittedOffset | ErrorCode | None)])."""
    if not _group_ok(ctx, _DESCRIBE, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, []
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    denied = set() if wanted is None else {t for t, _ in wanted if not _topic_ok(ctx, _DESCRIBE, t)}
    error, found = coordinator(ctx).fetch_offsets(group_id, None if wanted is None else
                                                  [tp for tp in wanted if tp[0] not in denied])
    by_topic: dict[str, list[tuple[int, CommittedOffset | ErrorCode | None]]] = {}
    if wanted is None:
        for (topic, partition), committed in sorted(found.items()):
            if _topic_ok(ctx, _DESCRIBE, topic):
                by_topic.setdefault(topic, []).append((partition, committed))
    else:
        for tp in wanted:
            by_topic.setdefault(tp[0], []).append(
                (tp[1], ErrorCode.TOPIC_AUTHORIZATION_FAILED if tp[0] in denied else found.get(tp)))
    return error, list(by_topic.items())


def _partition_fields(partition: int, committed: CommittedOffset | ErrorCode | None) -> dict:
    if committed is None or isinstance(committed, int):
        return dict(partition_index=partition, committed_offset=NO_OFFSET, committed_leader_epoch=-1,
                    metadata="", error_code=committed or ErrorCode.NONE)
    return dict(partition_index=partition, committed_offset=committed.offset,
                committed_leader_epoch=committed.leader_epoch, metadata=committed.metadata,
                error_code=ErrorCode.NONE)


@handles(ApiKey.OFFSET_FETCH, 1, 9)
async def offset_fetch(ctx: RequestContext, request):
    if ctx.version < 8:
        # v1 has no "all topics" form; v2+ asks for all with a null topic list.
        topics = request.topics if ctx.version >= 2 else (request.topics or [])
        error, found = _fetch_group(ctx, request.group_id, topics)
        if error and ctx.version < 2 and not found:
            # v0-1 have no group-level error: each partition asked about carries it.
            found = [(t.name, [(p, error) for p in t.partition_indexes]) for t in topics]
        Topic = OF.OffsetFetchResponseTopic
        return ctx.response(throttle_time_ms=0, error_code=error, topics=[
            Topic(name=name, partitions=[Topic.OffsetFetchResponsePartition(**_partition_fields(p, c))
                                         for p, c in parts])
            for name, parts in found])
    Group = OF.OffsetFetchResponseGroup
    Topic = Group.OffsetFetchResponseTopics
    groups = []
    modern = ctx.broker.extensions["consumer_groups"]
    for g in request.groups:
        error, found = _fetch_group(ctx, g.group_id, g.topics)
        if error == ErrorCode.NONE and ctx.version >= 9:
            # A consumer group's member fetches with its member id and epoch (KIP-848).
            stale = modern.validate_fetch(g.group_id, g.member_id, g.member_epoch)
            if stale != ErrorCode.NONE:
                error, found = stale, []
        groups.append(Group(group_id=g.group_id, error_code=error, topics=[
            Topic(name=name, partitions=[Topic.OffsetFetchResponsePartitions(**_partition_fields(p, c))
                                         for p, c in parts])
            for name, parts in found]))
    return ctx.response(throttle_time_ms=0, groups=groups)


@handles(ApiKey.OFFSET_DELETE, 0, 0)
async def offset_delete(ctx: RequestContext, request):
    if not _group_ok(ctx, _DELETE, request.group_id):
        return ctx.response(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, throttle_time_ms=0, topics=[])
    denied = {t.name for t in request.topics if not _topic_ok(ctx, _READ, t.name)}
    partitions = [(t.name, p.partition_index) for t in request.topics for p in t.partitions if t.name not in denied]
    error, results = await coordinator(ctx).delete_offsets(request.group_id, partitions)
    results = {**results, **{(t.name, p.partition_index): ErrorCode.TOPIC_AUTHORIZATION_FAILED
                             for t in request.topics if t.name in denied for p in t.partitions}}
    if error != ErrorCode.NONE:
        return ctx.response(error_code=error, throttle_time_ms=0, topics=[])
    Topic = OD.OffsetDeleteResponseTopic
    return ctx.response(error_code=ErrorCode.NONE, throttle_time_ms=0, topics=[
        Topic(name=t.name, partitions=[
            Topic.OffsetDeleteResponsePartition(partition_index=p.partition_index,
                                                error_code=results[(t.name, p.partition_index)])
            for p in t.partitions])
        for t in request.topics])
