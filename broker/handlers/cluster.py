"""DescribeCluster and DescribeTopicPartitions."""
from __future__ import annotations

from fluvial.broker.authorization import allowed, bitfield, cluster_operations, topic_operations
from fluvial.broker.handlers import RequestContext, handles
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

CR = response_class(ApiKey.DESCRIBE_CLUSTER)
TR = response_class(ApiKey.DESCRIBE_TOPIC_PARTITIONS)
TopicEntry = TR.DescribeTopicPartitionsResponseTopic
# Kafka always answers DescribeTopicPartitions with the topic's authorized operations (the
# request has no flag), an int32 bitfield in this message.
PartitionEntry = TopicEntry.DescribeTopicPartitionsResponsePartition


@handles(ApiKey.DESCRIBE_CLUSTER, 0, 1)
async def describe_cluster(ctx: RequestContext, request):
    cfg = ctx.broker.config
    if ctx.version >= 1 and request.endpoint_type not in (1,):
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.MISMATCHED_ENDPOINT_TYPE,
                            error_message="This node serves brokers, not controllers", endpoint_type=1,
                            cluster_id=ctx.broker.cluster_id, controller_id=-1, brokers=[],
                            authorized_operations=None)
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=1,
                        cluster_id=ctx.broker.cluster_id, controller_id=cfg.node_id,
                        brokers=[CR.DescribeClusterBroker(broker_id=cfg.node_id, host=cfg.advertised,
                                                          port=ctx.broker.kafka_port, rack=None)],
                        authorized_operations=cluster_operations(request.include_cluster_authorized_operations, ctx))


@handles(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, 0)
async def describe_topic_partitions(ctx: RequestContext, request):
    node = ctx.broker.config.node_id
    tables = ctx.broker.tables
    check_acls = ctx.broker.authorizer.enabled
    if request.topics:
        names = sorted({t.name for t in request.topics})
        # A named topic the principal may not describe is refused without telling whether
        # it exists; listing every topic leaves such topics out.
        denied = [n for n in names if check_acls and not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, n)]
    else:
        names = sorted(tables.tables)
        denied = []
    if denied:
        names = [n for n in names if n not in set(denied)]
    elif not request.topics and check_acls:
        names = [n for n in names if allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, n)]
    if request.cursor is not None:
        names = [n for n in names if n >= request.cursor.topic_name]
    limit = request.response_partition_limit if request.response_partition_limit > 0 else 2000
    topics, count, next_cursor = [], 0, None
    for name in names:
        table = tables.tables.get(name)
        if table is None:
            topics.append(TopicEntry(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name,
                                     is_internal=False, partitions=[], topic_authorized_operations=-2147483648))
            continue
        first = request.cursor.partition_index if request.cursor is not None and name == request.cursor.topic_name else 0
        parts = []
        for b in table.buckets[first:]:
            if count >= limit:
                next_cursor = TR.Cursor(topic_name=name, partition_index=b.index)
                break
            offline = [node] if b.tablet.failure else []   # as in Metadata
            parts.append(PartitionEntry(error_code=0, partition_index=b.index, leader_id=node,
                                        leader_epoch=b.leader_epoch, replica_nodes=[node],
                                        isr_nodes=[] if offline else [node], eligible_leader_replicas=[],
                                        last_known_elr=[], offline_replicas=offline))
            count += 1
        topics.append(TopicEntry(error_code=0, name=name, topic_id=table.topic_id, is_internal=False,
                                 partitions=parts,
                                 topic_authorized_operations=bitfield(topic_operations(True, ctx, name))))
        if next_cursor is not None:
            break
    topics.extend(TopicEntry(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=n, is_internal=False,
                             partitions=[], topic_authorized_operations=-2147483648) for n in denied)
    return ctx.response(throttle_time_ms=0, topics=topics, next_cursor=next_cursor)
