"""FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups,
ListGroups, DeleteGroups: the classic group protocol on top of the group coordinator.

Join and Sync answers wait on the coordinator inside the handler, so the connection
reads nothing else meanwhile: Kafka mutes a connection the same way while its
JoinGroup or SyncGroup is pending.
"""
from __future__ import annotations

from fluvial.broker.authorization import allowed, allowed_on_cluster, group_operations
from fluvial.broker.broker import on_start, on_stop
from fluvial.broker.groups import GroupConfig, GroupCoordinator, GroupStorage
from fluvial.broker.groups.consumer_coordinator import ConsumerGroupCoordinator, ConsumerGroupSettings
from fluvial.broker.groups.share_coordinator import ShareGroupCoordinator, ShareGroupSettings
from fluvial.broker.handlers import RequestContext, handles
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

FC = response_class(ApiKey.FIND_COORDINATOR)
JG = response_class(ApiKey.JOIN_GROUP)
LG = response_class(ApiKey.LEAVE_GROUP)
DG = response_class(ApiKey.DESCRIBE_GROUPS)
LS = response_class(ApiKey.LIST_GROUPS)
DEL = response_class(ApiKey.DELETE_GROUPS)

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
def group_config(broker) -> GroupConfig:
    """Group settings from the broker's command line (Kafka's names and defaults)."""
    cfg = broker.config
    return GroupConfig(min_session_timeout_ms=cfg.group_min_session_timeout_ms,
                       max_session_timeout_ms=cfg.group_max_session_timeout_ms,
                       initial_rebalance_delay_ms=cfg.group_initial_rebalance_delay_ms,
                       offsets_retention_ms=cfg.offsets_retention_minutes * 60_000)


def coordinator(ctx: RequestContext) -> GroupCoordinator:
    return ctx.broker.extensions["groups"]


def consumer_groups(ctx: RequestContext) -> ConsumerGroupCoordinator:
    return ctx.broker.extensions["consumer_groups"]


@on_start
async def start_group_coordinator(broker) -> None:
    tables = broker.tables

    def partition_exists(topic: str, partition: int) -> bool:
        table = tables.tables.get(topic)
        return table is not None and 0 <= partition < len(table.buckets)

    def topic_catalog() -> dict:
        return {name: (table.topic_id, len(table.buckets)) for name, table in list(tables.tables.items())}

    storage = GroupStorage(broker.store)
    coord = GroupCoordinator(storage, group_config(broker), partition_exists=partition_exists)
    await coord.start()
    cfg = broker.config
    modern = ConsumerGroupCoordinator(coord, storage, topic_catalog, ConsumerGroupSettings(
        session_timeout_ms=cfg.group_consumer_session_timeout_ms,
        heartbeat_interval_ms=cfg.group_consumer_heartbeat_interval_ms,
        assignors=tuple(a.strip() for a in cfg.group_consumer_assignors.split(",") if a.strip())))
    await modern.start()

    def other_kind(group_id: str) -> bool:
        classic = coord.group(group_id)
        return modern.owns(group_id) or (classic is not None and bool(classic.members))

    share = ShareGroupCoordinator(storage, topic_catalog, other_kind, ShareGroupSettings(
        session_timeout_ms=cfg.group_share_session_timeout_ms,
        heartbeat_interval_ms=cfg.group_share_heartbeat_interval_ms,
        record_lock_duration_ms=cfg.group_share_record_lock_duration_ms,
        delivery_count_limit=cfg.group_share_delivery_count_limit,
        auto_offset_reset=cfg.share_auto_offset_reset))
    await share.start()
    broker.kafka.connection_closed_hooks.append(share.connection_closed)
    broker.extensions["groups"] = coord
    broker.extensions["consumer_groups"] = modern
    broker.extensions["share_groups"] = share


@on_stop
async def stop_group_coordinator(broker) -> None:
    share = broker.extensions.pop("share_groups", None)
    if share is not None:
        if share.connection_closed in broker.kafka.connection_closed_hooks:
            broker.kafka.connection_closed_hooks.remove(share.connection_closed)
        await share.close()
    modern = broker.extensions.pop("consumer_groups", None)
    if modern is not None:
        await modern.close()
    coord = broker.extensions.pop("groups", None)
    if coord is not None:
        await coord.close()


def _group_allowed(ctx: RequestContext, operation: AclOperation, group: str) -> bool:
    return allowed(ctx, operation, ResourceType.GROUP, group)


_GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED


def _client_host(ctx: RequestContext) -> str:
    # Kafka shows the client address as InetAddress.toString() does: "/host".
    return "/" + ctx.peer.rsplit(":", 1)[0]


# -- FindCoordinator ------------------------------------------------------------------------


@handles(ApiKey.FIND_COORDINATOR, 0, 6)
async def find_coordinator(ctx: RequestContext, request):
    """This single broker coordinates every group and transactional id."""
    cfg = ctx.broker.config
    node, host, port = cfg.node_id, cfg.advertised, ctx.broker.kafka_port
    key_type = request.key_type if ctx.version >= 1 else GROUP_KEY_TYPE
    error, message = ErrorCode.NONE, None
    if key_type not in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE):
        error, message = ErrorCode.INVALID_REQUEST, f"coordinator key type {key_type} is not supported"

    def key_error(key: str) -> tuple[ErrorCode, str | None]:
        # DESCRIBE on the group, or on the transactional id, as Kafka asks.
        if error != ErrorCode.NONE:
            return error, message
        if key_type == GROUP_KEY_TYPE:
            if not _group_allowed(ctx, AclOperation.DESCRIBE, key):
                return _GROUP_DENIED, "Group authorization failed."
        elif not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "Transactional Id authorization failed."
        return ErrorCode.NONE, None

    if ctx.version < 4:
        code, msg = key_error(request.key)
        ok = code == ErrorCode.NONE
        return ctx.response(throttle_time_ms=0, error_code=code, error_message=msg,
                            node_id=node if ok else -1, host=host if ok else "", port=port if ok else -1)
    coordinators = []
    for key in request.coordinator_keys:
        code, msg = key_error(key)
        ok = code == ErrorCode.NONE
        coordinators.append(FC.Coordinator(key=key, node_id=node if ok else -1, host=host if ok else "",
                                           port=port if ok else -1, error_code=code, error_message=msg))
    return ctx.response(throttle_time_ms=0, coordinators=coordinators)


# -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup ------------------------------------------------


@handles(ApiKey.JOIN_GROUP, 0, 9)
async def join_group(ctx: RequestContext, request):
    share_group = ctx.broker.extensions["share_groups"].owns(request.group_id)
    if share_group or not _group_allowed(ctx, AclOperation.READ, request.group_id):
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.INCONSISTENT_GROUP_PROTOCOL if share_group
                            else _GROUP_DENIED, generation_id=-1,
                            protocol_type=None, protocol_name=None if ctx.version >= 7 else "", leader="",
                            skip_assignment=False, member_id=request.member_id, members=[])
    result = await coordinator(ctx).join_group(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if ctx.version >= 5 else None,
        client_id=ctx.header.client_id or "",
        client_host=_client_host(ctx),
        session_timeout_ms=request.session_timeout_ms,
        rebalance_timeout_ms=request.rebalance_timeout_ms if ctx.version >= 1 else -1,
        protocol_type=request.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
        # KIP-394: from v4 a first join without a member id is asked to come back with one.
        require_known_member_id=ctx.version >= 4,
    )
    protocol_name = result.protocol_name
    if protocol_name is None and ctx.version < 7:
        protocol_name = ""
    return ctx.response(
        throttle_time_ms=0, error_code=result.error, generation_id=result.generation_id,
        protocol_type=result.protocol_type, protocol_name=protocol_name, leader=result.leader_id,
        skip_assignment=False, member_id=result.member_id,
        members=[JG.JoinGroupResponseMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                            metadata=m.metadata) for m in result.members])


@handles(ApiKey.SYNC_GROUP, 0, 5)
async def sync_group(ctx: RequestContext, request):
    if not _group_allowed(ctx, AclOperation.READ, request.group_id):
        return ctx.response(throttle_time_ms=0, error_code=_GROUP_DENIED, protocol_type=None, protocol_name=None,
                            assignment=b"")
    result = await coordinator(ctx).sync_group(
        group_id=request.group_id,
        generation_id=request.generation_id,
        member_id=request.member_id,
        group_instance_id=request.group_instance_id if ctx.version >= 3 else None,
        protocol_type=request.protocol_type if ctx.version >= 5 else None,
        protocol_name=request.protocol_name if ctx.version >= 5 else None,
        assignments={a.member_id: bytes(a.assignment) for a in request.assignments},
    )
    return ctx.response(throttle_time_ms=0, error_code=result.error, protocol_type=result.protocol_type,
                        protocol_name=result.protocol_name, assignment=result.assignment)


@handles(ApiKey.HEARTBEAT, 0, 4)
async def heartbeat(ctx: RequestContext, request):
    if not _group_allowed(ctx, AclOperation.READ, request.group_id):
        return ctx.response(throttle_time_ms=0, error_code=_GROUP_DENIED)
    error = coordinator(ctx).heartbeat(
        group_id=request.group_id, generation_id=request.generation_id, member_id=request.member_id,
        group_instance_id=request.group_instance_id if ctx.version >= 3 else None)
    return ctx.response(throttle_time_ms=0, error_code=error)


@handles(ApiKey.LEAVE_GROUP, 0, 5)
async def leave_group(ctx: RequestContext, request):
    if not _group_allowed(ctx, AclOperation.READ, request.group_id):
        return ctx.response(throttle_time_ms=0, error_code=_GROUP_DENIED, members=[])
    if ctx.version < 3:
        result = coordinator(ctx).leave_group(request.group_id, [(request.member_id, None)])
        error = result.error
        if error == ErrorCode.NONE and result.members:
            error = result.members[0].error
        return ctx.response(throttle_time_ms=0, error_code=error)
    result = coordinator(ctx).leave_group(
        request.group_id, [(m.member_id, m.group_instance_id) for m in request.members])
    return ctx.response(throttle_time_ms=0, error_code=result.error, members=[
        LG.MemberResponse(member_id=m.member_id, group_instance_id=m.group_instance_id, error_code=m.error)
        for m in result.members])


# -- DescribeGroups, ListGroups, DeleteGroups ---------------------------------------------------


@handles(ApiKey.DESCRIBE_GROUPS, 0, 6)
async def describe_groups(ctx: RequestContext, request):
    groups = []
    asked_ops = ctx.version >= 3 and request.include_authorized_operations
    wanted = list(request.groups)
    refused = {g for g in wanted if not _group_allowed(ctx, AclOperation.DESCRIBE, g)}
    described = {d.group_id: d for d in coordinator(ctx).describe_groups([g for g in wanted if g not in refused])}
    for group_id in wanted:
        if group_id in refused:
            groups.append(DG.DescribedGroup(error_code=_GROUP_DENIED, error_message="Group authorization failed.",
                                            group_id=group_id, group_state="", protocol_type="", protocol_data="",
                                            members=[], authorized_operations=None))
            continue
        d = described[group_id]
        error, message = d.error, None
        if consumer_groups(ctx).owns(group_id):
            # As Kafka 4.x: DescribeGroups describes classic groups only.
            groups.append(DG.DescribedGroup(
                error_code=ErrorCode.GROUP_ID_NOT_FOUND if ctx.version >= 6 else ErrorCode.NONE,
                error_message=f"Group {group_id} is not a classic group." if ctx.version >= 6 else None,
                group_id=group_id, group_state="Dead", protocol_type="", protocol_data="", members=[],
                authorized_operations=group_operations(asked_ops, ctx, group_id)))
            continue
        if not d.found and error == ErrorCode.NONE and ctx.version >= 6:
            # Since v6 a missing group is an error rather than a "Dead" description.
            error, message = ErrorCode.GROUP_ID_NOT_FOUND, f"Group {d.group_id} not found."
        groups.append(DG.DescribedGroup(
            error_code=error, error_message=message, group_id=d.group_id, group_state=d.state,
            protocol_type=d.protocol_type, protocol_data=d.protocol_name,
            members=[DG.DescribedGroup.DescribedGroupMember(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
                for m in d.members],
            authorized_operations=group_operations(asked_ops, ctx, d.group_id)))
    return ctx.response(throttle_time_ms=0, groups=groups)


@handles(ApiKey.LIST_GROUPS, 0, 5)
async def list_groups(ctx: RequestContext, request):
    states = list(request.states_filter) if ctx.version >= 4 and request.states_filter else None
    types = list(request.types_filter) if ctx.version >= 5 and request.types_filter else None
    modern = consumer_groups(ctx)
    listed = [(g.group_id, g.protocol_type, g.state, "classic") for g in coordinator(ctx).list_groups(states, types)
              if not modern.owns(g.group_id)]
    wanted_states = {s.lower() for s in states} if states else None
    if types is None or "consumer" in {t.lower() for t in types}:
        listed += [(group_id, "consumer", state, "consumer") for group_id, state in modern.listings()
                   if wanted_states is None or state.lower() in wanted_states]
    if types is None or "share" in {t.lower() for t in types}:
        listed += [(group_id, "share", state, "share") for group_id, state in ctx.broker.extensions[
            "share_groups"].listings() if wanted_states is None or state.lower() in wanted_states]
    if ctx.broker.authorizer.enabled and not allowed_on_cluster(ctx, AclOperation.DESCRIBE):
        # Without DESCRIBE on the cluster, only the groups the principal may describe.
        listed = [g for g in listed if _group_allowed(ctx, AclOperation.DESCRIBE, g[0])]
    return ctx.response(throttle_time_ms=0, error_code=ErrorCode.NONE, groups=[
        LS.ListedGroup(group_id=group_id, protocol_type=protocol_type, group_state=state, group_type=group_type)
        for group_id, protocol_type, state, group_type in listed])


@handles(ApiKey.DELETE_GROUPS, 0, 2)
async def delete_groups(ctx: RequestContext, request):
    names = list(request.groups_names)
    refused = {n for n in names if not _group_allowed(ctx, AclOperation.DELETE, n)}
    modern = consumer_groups(ctx)
    share = ctx.broker.extensions["share_groups"]
    errors = {n: await modern.delete_empty(n) for n in names if n not in refused and modern.owns(n)}
    errors.update({n: await share.delete_empty(n) for n in names if n not in refused and share.owns(n)})
    errors.update(await coordinator(ctx).delete_groups(
        [n for n in names if n not in refused and n not in errors]))
    errors.update({n: _GROUP_DENIED for n in refused})
    return ctx.response(throttle_time_ms=0, results=[
        DEL.DeletableGroupResult(group_id=name, error_code=errors[name]) for name in names])
