"""ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch and ShareAcknowledge: share groups
(KIP-932, queues), at the versions Apache Kafka 4.2 clients use.

ACLs as Kafka checks them: READ on the group for heartbeats, fetches and acknowledgements,
READ on each topic fetched or acknowledged, DESCRIBE on the subscribed topics of a heartbeat
and on the group to describe it.
"""
from __future__ import annotations

import asyncio
import time
import uuid

from fluvial.broker.authorization import allowed, group_operations
from fluvial.broker.groups.share_coordinator import ShareGroupCoordinator
from fluvial.broker.handlers import RequestContext, handles
from fluvial.broker.handlers.consumer_groups import _bitfield
from fluvial.broker.handlers.fetch import _read_bucket
from fluvial.broker.read_ahead import next_offset
from fluvial.errors import UnknownTableError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

HB = response_class(ApiKey.SHARE_GROUP_HEARTBEAT)
SGD = response_class(ApiKey.SHARE_GROUP_DESCRIBE)
SF = response_class(ApiKey.SHARE_FETCH)
SA = response_class(ApiKey.SHARE_ACKNOWLEDGE)
READ_CHUNK = 1 << 20


def share_groups(ctx: RequestContext) -> ShareGroupCoordinator:
    return ctx.broker.extensions["share_groups"]


def _group_read(ctx: RequestContext, group_id: str | None) -> bool:
    return allowed(ctx, AclOperation.READ, ResourceType.GROUP, group_id or "")


@handles(ApiKey.SHARE_GROUP_HEARTBEAT, 1, 1)
async def share_group_heartbeat(ctx: RequestContext, request):
    def refuse(code: ErrorCode, message: str | None):
        return ctx.response(throttle_time_ms=0, error_code=code, error_message=message, member_id=None,
                            member_epoch=-1, heartbeat_interval_ms=0, assignment=None)

    if not _group_read(ctx, request.group_id):
        return refuse(ErrorCode.GROUP_AUTHORIZATION_FAILED, "Group authorization failed.")
    names = request.subscribed_topic_names
    if names and any(not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, n) for n in names):
        return refuse(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed.")
    r = await share_groups(ctx).heartbeat(
        group_id=request.group_id, member_id=request.member_id, member_epoch=request.member_epoch,
        rack_id=request.rack_id, subscribed=list(names) if names is not None else None,
        client_id=ctx.header.client_id or "", client_host="/" + ctx.peer.rsplit(":", 1)[0])
    if r.error != ErrorCode.NONE:
        return refuse(r.error, r.message)
    assignment = None
    if r.assignment is not None:
        assignment = HB.Assignment(topic_partitions=[
            HB.Assignment.TopicPartitions(topic_id=t, partitions=ps)
            for t, ps in sorted(r.assignment.items(), key=lambda kv: str(kv[0]))])
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, member_id=r.member_id,
                        member_epoch=r.member_epoch, heartbeat_interval_ms=r.heartbeat_interval_ms,
                        assignment=assignment)


@handles(ApiKey.SHARE_GROUP_DESCRIBE, 1, 1)
async def share_group_describe(ctx: RequestContext, request):
    Group = SGD.DescribedGroup
    Member = Group.Member
    Assignment = Member.Assignment
    by_id = ctx.broker.tables.by_id
    coord = share_groups(ctx)
    out = []
    for group_id in request.group_ids:
        def failed(code, message):
            return Group(error_code=code, error_message=message, group_id=group_id, group_state="",
                         group_epoch=-1, assignment_epoch=-1, assignor_name="", members=[])
        if not allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            out.append(failed(ErrorCode.GROUP_AUTHORIZATION_FAILED, "Group authorization failed."))
            continue
        group = coord.describe(group_id)
        if group is None:
            out.append(failed(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found."))
            continue
        members = []
        for m in group.members.values():
            parts = coord.assignment_of(m)
            members.append(Member(
                member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.member_epoch, client_id=m.client_id,
                client_host=m.client_host, subscribed_topic_names=m.subscribed_topic_names,
                assignment=Assignment(topic_partitions=[
                    Assignment.TopicPartitions(topic_id=t, topic_name=by_id[t].name, partitions=ps)
                    for t, ps in parts.items() if t in by_id])))
        out.append(Group(error_code=0, error_message=None, group_id=group_id, group_state=group.state(),
                         group_epoch=group.group_epoch, assignment_epoch=group.group_epoch, assignor_name="simple",
                         members=members,
                         authorized_operations=_bitfield(group_operations(request.include_authorized_operations,
                                                                          ctx, group_id))))
    return ctx.response(throttle_time_ms=0, groups=out)


def _ack_batches(partition) -> list[tuple[int, int, list[int]]]:
    return [(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in partition.acknowledgement_batches]


def _topic_readable(ctx: RequestContext, topic_id: uuid.UUID):
    """(table, error code) for a topic id the principal wants to read."""
    try:
        table = ctx.broker.tables.get_by_id(topic_id)
    except UnknownTableError:
        return None, ErrorCode.UNKNOWN_TOPIC_ID
    if not allowed(ctx, AclOperation.READ, ResourceType.TOPIC, table.name):
        return None, ErrorCode.TOPIC_AUTHORIZATION_FAILED
    return table, ErrorCode.NONE


def _apply_acks(ctx: RequestContext, coord: ShareGroupCoordinator, group_id: str, member_id: str, topics
                ) -> tuple[dict[tuple[uuid.UUID, int], ErrorCode], set]:
    results: dict[tuple[uuid.UUID, int], ErrorCode] = {}
    touched = set()
    for t in topics:
        table, error = _topic_readable(ctx, t.topic_id)
        for p in t.partitions:
            batches = _ack_batches(p)
            if not batches:
                continue
            if error == ErrorCode.NONE and not 0 <= p.partition_index < len(table.buckets):
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif error != ErrorCode.NONE:
                code = error
            else:
                code = coord.acknowledge(group_id, member_id, t.topic_id, p.partition_index, batches)
                touched.add((group_id, t.topic_id, p.partition_index))
            results[(t.topic_id, p.partition_index)] = code
    return results, touched


async def _read_ranges(ctx: RequestContext, bucket, ranges: list[tuple[int, int, int]]) -> bytes:
    """The stored batches that hold the acquired offsets (whole batches, as Kafka sends them)."""
    loop = asyncio.get_running_loop()
    out: dict[int, bytes] = {}
    for first, last, _ in ranges:
        offset = first
        while offset <= last:
            batches, _ = await loop.run_in_executor(None, _read_bucket, ctx, bucket, offset, READ_CHUNK)
            if not batches:
                break
            for b in batches:
                base = int.from_bytes(b[:8], "big", signed=True)
                out.setdefault(base, b)
            offset = max(offset + 1, next_offset(batches[-1]))
    return b"".join(out[k] for k in sorted(out))


@handles(ApiKey.SHARE_FETCH, 1, 2)
async def share_fetch(ctx: RequestContext, request):
    coord = share_groups(ctx)
    Topic = SF.ShareFetchableTopicResponse
    Partition = Topic.PartitionData
    lock_ms = coord.settings.record_lock_duration_ms

    def top_level(code: ErrorCode, message: str | None):
        return ctx.response(throttle_time_ms=0, error_code=code, error_message=message,
                            acquisition_lock_timeout_ms=lock_ms, responses=[], node_endpoints=[])

    group_id, member_id, epoch = request.group_id, request.member_id, request.share_session_epoch
    if not group_id or not member_id:
        return top_level(ErrorCode.INVALID_REQUEST, "GroupId and MemberId must be set.")
    if not _group_read(ctx, group_id):
        return top_level(ErrorCode.GROUP_AUTHORIZATION_FAILED, "Group authorization failed.")
    if epoch == 0 and any(p.acknowledgement_batches for t in request.topics for p in t.partitions):
        return top_level(ErrorCode.INVALID_REQUEST, "Acknowledgements cannot be sent when opening a share session.")
    error, message, session = coord.open_session(group_id, member_id, epoch, ctx.peer)
    if error != ErrorCode.NONE:
        return top_level(error, message)
    for t in request.topics:
        for p in t.partitions:
            session.partitions.add((t.topic_id, p.partition_index))
    for f in request.forgotten_topics_data:
        for p in f.partitions:
            session.partitions.discard((f.topic_id, p))
    acks, touched = _apply_acks(ctx, coord, group_id, member_id, request.topics)
    answers: dict[tuple[uuid.UUID, int], dict] = {}
    renew_only = ctx.version >= 2 and request.is_renew_ack
    if epoch == -1:
        await coord.persist(touched)
        await coord.release_session(group_id, member_id)
    elif renew_only:
        # A fetch that carries renewals only (KIP-1222) acquires nothing new.
        await coord.persist(touched)
    else:
        deadline = time.monotonic() + max(0, request.max_wait_ms) / 1000
        remaining_records = request.max_records if request.max_records > 0 else 500
        while True:
            waits = []
            for topic_id, index in sorted(session.partitions, key=lambda k: (str(k[0]), k[1])):
                table, code = _topic_readable(ctx, topic_id)
                if code == ErrorCode.NONE and not 0 <= index < len(table.buckets):
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if code != ErrorCode.NONE:
                    answers[(topic_id, index)] = dict(error_code=code)
                    continue
                bucket = table.bucket(index)
                waits.append(bucket.data_arrived())
                ranges = coord.acquire(group_id, member_id, topic_id, index, bucket.log_start_offset,
                                       bucket.tablet.high_watermark, remaining_records)
                if ranges:
                    touched.add((group_id, topic_id, index))
                    remaining_records -= sum(last - first + 1 for first, last, _ in ranges)
                    answers[(topic_id, index)] = dict(records=await _read_ranges(ctx, bucket, ranges),
                                                      acquired=ranges)
            left = deadline - time.monotonic()
            if any("acquired" in a for a in answers.values()) or left <= 0 or not waits:
                break
            coord.released.clear()
            waits.append(coord.released)
            waiters = [asyncio.ensure_future(e.wait()) for e in waits]
            try:
                await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
        await coord.persist(touched)
    keys = set(answers) | set(acks)
    by_topic: dict[uuid.UUID, list] = {}
    for topic_id, index in sorted(keys, key=lambda k: (str(k[0]), k[1])):
        a = answers.get((topic_id, index), {})
        by_topic.setdefault(topic_id, []).append(Partition(
            partition_index=index, error_code=a.get("error_code", 0), error_message=None,
            acknowledge_error_code=acks.get((topic_id, index), 0), acknowledge_error_message=None,
            current_leader=Partition.LeaderIdAndEpoch(leader_id=ctx.broker.config.node_id, leader_epoch=0),
            records=a.get("records", b""),
            acquired_records=[Partition.AcquiredRecords(first_offset=f, last_offset=last, delivery_count=n)
                              for f, last, n in a.get("acquired", [])]))
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, acquisition_lock_timeout_ms=lock_ms,
                        responses=[Topic(topic_id=t, partitions=ps) for t, ps in by_topic.items()],
                        node_endpoints=[])


@handles(ApiKey.SHARE_ACKNOWLEDGE, 1, 2)
async def share_acknowledge(ctx: RequestContext, request):
    coord = share_groups(ctx)
    Topic = SA.ShareAcknowledgeTopicResponse
    Partition = Topic.PartitionData

    def top_level(code: ErrorCode, message: str | None):
        return ctx.response(throttle_time_ms=0, error_code=code, error_message=message,
                            acquisition_lock_timeout_ms=coord.settings.record_lock_duration_ms,
                            responses=[], node_endpoints=[])

    group_id, member_id, epoch = request.group_id, request.member_id, request.share_session_epoch
    if not group_id or not member_id:
        return top_level(ErrorCode.INVALID_REQUEST, "GroupId and MemberId must be set.")
    if not _group_read(ctx, group_id):
        return top_level(ErrorCode.GROUP_AUTHORIZATION_FAILED, "Group authorization failed.")
    if epoch == 0:
        return top_level(ErrorCode.INVALID_SHARE_SESSION_EPOCH, "ShareAcknowledge cannot open a share session.")
    error, message, _session = coord.open_session(group_id, member_id, epoch)
    if error != ErrorCode.NONE:
        return top_level(error, message)
    acks, touched = _apply_acks(ctx, coord, group_id, member_id, request.topics)
    await coord.persist(touched)
    if epoch == -1:
        await coord.release_session(group_id, member_id)
    by_topic: dict[uuid.UUID, list] = {}
    for (topic_id, index), code in sorted(acks.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        by_topic.setdefault(topic_id, []).append(Partition(
            partition_index=index, error_code=code, error_message=None,
            current_leader=Partition.LeaderIdAndEpoch(leader_id=ctx.broker.config.node_id, leader_epoch=0)))
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None,
                        acquisition_lock_timeout_ms=coord.settings.record_lock_duration_ms,
                        responses=[Topic(topic_id=t, partitions=ps) for t, ps in by_topic.items()],
                        node_endpoints=[])
