"""ConsumerGroupHeartbeat and ConsumerGroupDescribe: KIP-848 consumer groups.

ACLs as Kafka checks them: a heartbeat needs READ on the group and DESCRIBE on every
subscribed topic name; describing needs DESCRIBE on the group and on the topics of its
assignments.
"""
from __future__ import annotations

import uuid

from fluvial.broker.authorization import allowed, group_operations
from fluvial.broker.groups.consumer_coordinator import ConsumerGroupCoordinator, HeartbeatRequest
from fluvial.broker.handlers import RequestContext, handles
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

HB = response_class(ApiKey.CONSUMER_GROUP_HEARTBEAT)
CGD = response_class(ApiKey.CONSUMER_GROUP_DESCRIBE)


def consumer_groups(ctx: RequestContext) -> ConsumerGroupCoordinator:
    return ctx.broker.extensions["consumer_groups"]


def _client_host(ctx: RequestContext) -> str:
    return "/" + ctx.peer.rsplit(":", 1)[0]


def _owned(topic_partitions) -> dict[uuid.UUID, set[int]] | None:
    if topic_partitions is None:
        return None
    owned: dict[uuid.UUID, set[int]] = {}
    for tp in topic_partitions:
        owned.setdefault(tp.topic_id, set()).update(tp.partitions)
    return owned


@handles(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1)
async def consumer_group_heartbeat(ctx: RequestContext, request):
    def refuse(code: ErrorCode, message: str):
        return ctx.response(throttle_time_ms=0, error_code=code, error_message=message, member_id=None,
                            member_epoch=-1, heartbeat_interval_ms=0, assignment=None)

    if not allowed(ctx, AclOperation.READ, ResourceType.GROUP, request.group_id):
        return refuse(ErrorCode.GROUP_AUTHORIZATION_FAILED, "Group authorization failed.")
    names = request.subscribed_topic_names
    if names and any(not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, n) for n in names):
        return refuse(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed.")
    if ctx.broker.extensions["share_groups"].owns(request.group_id):
        return refuse(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {request.group_id} is not a consumer group.")
    result = await consumer_groups(ctx).heartbeat(HeartbeatRequest(
        group_id=request.group_id, member_id=request.member_id, member_epoch=request.member_epoch,
        instance_id=request.instance_id, rack_id=request.rack_id,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        subscribed_topic_names=list(names) if names is not None else None,
        subscribed_topic_regex=request.subscribed_topic_regex if ctx.version >= 1 else None,
        server_assignor=request.server_assignor, owned=_owned(request.topic_partitions),
        client_id=ctx.header.client_id or "", client_host=_client_host(ctx), version=ctx.version))
    if result.error != ErrorCode.NONE:
        return refuse(result.error, result.message)
    assignment = None
    if result.assignment is not None:
        assignment = HB.Assignment(topic_partitions=[
            HB.Assignment.TopicPartitions(topic_id=t, partitions=sorted(p))
            for t, p in sorted(result.assignment.items(), key=lambda kv: str(kv[0])) if p])
    return ctx.response(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
                        member_id=result.member_id, member_epoch=result.member_epoch,
                        heartbeat_interval_ms=result.heartbeat_interval_ms, assignment=assignment)


OPERATIONS_OMITTED = -2**31


def _bitfield(operations: set[int] | None) -> int:
    """Kafka's authorized-operations field: one bit per operation code, or INT32 min if not asked."""
    if operations is None:
        return OPERATIONS_OMITTED
    return sum(1 << op for op in operations)


@handles(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1)
async def consumer_group_describe(ctx: RequestContext, request):
    Group = CGD.DescribedGroup
    Member = Group.Member
    Assignment = Member.Assignment
    by_id = ctx.broker.tables.by_id
    modern = consumer_groups(ctx)
    groups = []

    def assignment(parts) -> "Assignment":
        topics = []
        for topic_id, ps in sorted(parts.items(), key=lambda kv: str(kv[0])):
            table = by_id.get(topic_id)
            if ps and table is not None:
                topics.append(Assignment.TopicPartitions(topic_id=topic_id, topic_name=table.name,
                                                         partitions=sorted(ps)))
        return Assignment(topic_partitions=topics)

    for group_id in request.group_ids:
        def failed(code: ErrorCode, message: str | None):
            return Group(error_code=code, error_message=message, group_id=group_id, group_state="",
                         group_epoch=-1, assignment_epoch=-1, assignor_name="", members=[])

        if not allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            groups.append(failed(ErrorCode.GROUP_AUTHORIZATION_FAILED, "Group authorization failed."))
            continue
        view = modern.describe(group_id)
        if view.error != ErrorCode.NONE:
            groups.append(failed(view.error, view.message))
            continue
        topics = {by_id[t].name for m in view.members for parts in (m.assignment, m.target)
                  for t in parts if t in by_id}
        if any(not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t) for t in topics):
            groups.append(failed(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed."))
            continue
        groups.append(Group(
            error_code=ErrorCode.NONE, error_message=None, group_id=group_id, group_state=view.state,
            group_epoch=view.group_epoch, assignment_epoch=view.assignment_epoch,
            assignor_name=view.assignor_name,
            members=[Member(member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
                            member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
                            subscribed_topic_names=m.subscribed_topic_names,
                            subscribed_topic_regex=m.subscribed_topic_regex,
                            assignment=assignment(m.assignment), target_assignment=assignment(m.target),
                            member_type=1)  # 1: the consumer protocol (0 would be classic)
                     for m in view.members],
            authorized_operations=_bitfield(group_operations(request.include_authorized_operations, ctx, group_id))))
    return ctx.response(throttle_time_ms=0, groups=groups)
