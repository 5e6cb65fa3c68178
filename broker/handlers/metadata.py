"""Metadata: brokers, cluster id and the topics with their partitions (auto-creates topics)."""
from __future__ import annotations

from fluvial.broker.authorization import allowed, allowed_on_cluster, cluster_operations, topic_operations
from fluvial.broker.handlers import RequestContext, handles
from fluvial.errors import FluvialError, UnknownTableError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

R = response_class(ApiKey.METADATA)


def broker_entries(ctx: RequestContext) -> list:
    cfg = ctx.broker.config
    return [R.MetadataResponseBroker(node_id=cfg.node_id, host=cfg.advertised, port=ctx.broker.kafka_port, rack=None)]


def topic_entry(ctx: RequestContext, table, operations: set[int] | None = None) -> object:
    node = ctx.broker.config.node_id
    # A bucket whose log went offline keeps its leader, so producers get KAFKA_STORAGE_ERROR
    # at once instead of waiting for a leader that will not come; it is listed as offline
    # (and out of the ISR) for tools, as Kafka lists a replica on a failed log directory.
    parts = [R.MetadataResponseTopic.MetadataResponsePartition(
        error_code=0, partition_index=b.index, leader_id=node, leader_epoch=b.leader_epoch,
        replica_nodes=[node], isr_nodes=[] if b.tablet.failure else [node],
        offline_replicas=[node] if b.tablet.failure else []) for b in table.buckets]
    return R.MetadataResponseTopic(error_code=0, name=table.name, topic_id=table.topic_id, is_internal=False,
                                   partitions=parts, authorized_operations=operations)


def error_topic(name: str | None, code: ErrorCode, topic_id=None) -> object:
    return R.MetadataResponseTopic(error_code=code, name=name, topic_id=topic_id, is_internal=False,
                                   partitions=[], authorized_operations=None)


@handles(ApiKey.METADATA, 0, 12)
async def metadata(ctx: RequestContext, request):
    tables = ctx.broker.tables
    asked_ops = ctx.version >= 8 and request.include_topic_authorized_operations
    check_acls = ctx.broker.authorizer.enabled

    def describable(name: str) -> bool:
        return not check_acls or allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, name)

    def entry(table) -> object:
        return topic_entry(ctx, table, topic_operations(asked_ops, ctx, table.name))

    if request.topics is None or (ctx.version == 0 and not request.topics):
        # Every topic the principal may describe; the others are not mentioned at all.
        topics = [entry(t) for t in tables.tables.values() if describable(t.name)]
    else:
        allow_create = ctx.broker.config.auto_create_topics and (ctx.version < 4 or request.allow_auto_topic_creation)
        topics = []
        for wanted in request.topics:
            name = wanted.name
            if name is None:
                try:
                    table = tables.get_by_id(wanted.topic_id)
                except UnknownTableError:
                    topics.append(error_topic(None, ErrorCode.UNKNOWN_TOPIC_ID, wanted.topic_id))
                    continue
                if describable(table.name):
                    topics.append(entry(table))
                else:
                    topics.append(error_topic(None, ErrorCode.TOPIC_AUTHORIZATION_FAILED, wanted.topic_id))
                continue
            if not describable(name):
                topics.append(error_topic(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            table = tables.tables.get(name)
            if table is None and allow_create:
                # Auto-creation needs CREATE on the cluster or on the topic, as Kafka asks.
                if check_acls and not (allowed_on_cluster(ctx, AclOperation.CREATE)
                                       or allowed(ctx, AclOperation.CREATE, ResourceType.TOPIC, name)):
                    topics.append(error_topic(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                    continue
                try:
                    table = await tables.get_or_create(name, ctx.broker.config.default_partitions)
                except FluvialError as exc:
                    topics.append(error_topic(name, exc.code))
                    continue
            if table is None:
                topics.append(error_topic(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            else:
                topics.append(entry(table))
    return ctx.response(throttle_time_ms=0, brokers=broker_entries(ctx), cluster_id=ctx.broker.cluster_id,
                        controller_id=ctx.broker.config.node_id, topics=topics,
                        authorized_operations=cluster_operations(
                            8 <= ctx.version <= 10 and request.include_cluster_authorized_operations, ctx))
