"""CreateTopics and DeleteTopics."""
from __future__ import annotations

from fluvial.broker.config import TOPIC_CONFIGS
from fluvial.broker.authorization import AuthorizationFailed, allowed, allowed_on_cluster, require
from fluvial.broker.handlers import RequestContext, handles
from fluvial.broker.replica_assignment import partitions_of_create
from fluvial.errors import FluvialError, UnknownTableError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

CR = response_class(ApiKey.CREATE_TOPICS)
DR = response_class(ApiKey.DELETE_TOPICS)

# DescribeConfigs/CreateTopics config sources.
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_DEFAULT = 5


@handles(ApiKey.CREATE_TOPICS, 2, 7)
async def create_topics(ctx: RequestContext, request):
    results = []
    seen: set[str] = set()
    create_on_cluster = allowed_on_cluster(ctx, AclOperation.CREATE)
    for topic in request.topics:
        r = CR.CreatableTopicResult(name=topic.name, error_code=0, error_message=None, num_partitions=-1,
                                    replication_factor=-1, configs=None)
        try:
            if topic.name in seen:
                raise FluvialError(f"Duplicate topic {topic.name} in request", code=ErrorCode.INVALID_REQUEST)
            seen.add(topic.name)
            # CREATE on the cluster or on the topic, as Kafka asks.
            if not (create_on_cluster or allowed(ctx, AclOperation.CREATE, ResourceType.TOPIC, topic.name)):
                raise AuthorizationFailed("Authorization failed.", code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            if topic.assignments:
                buckets = partitions_of_create(topic.assignments, topic.num_partitions, topic.replication_factor,
                                               ctx.broker.config.node_id)
            else:
                if topic.replication_factor not in (-1, 1):
                    raise FluvialError(
                        f"Replication factor {topic.replication_factor} is larger than the 1 available broker",
                        code=ErrorCode.INVALID_REPLICATION_FACTOR)
                buckets = ctx.broker.config.default_partitions if topic.num_partitions == -1 else topic.num_partitions
            configs = {c.name: c.value for c in topic.configs}
            table = await ctx.broker.tables.create(topic.name, buckets, configs, validate_only=request.validate_only)
            r.topic_id = table.topic_id
            r.num_partitions = buckets
            r.replication_factor = 1
            if not allowed(ctx, AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, topic.name):
                # Created, but its configs are not shown to a principal that may not describe them.
                r.topic_config_error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                results.append(r)
                continue
            r.configs = [CR.CreatableTopicResult.CreatableTopicConfigs(
                name=name, value=table.config(name), read_only=False,
                config_source=SOURCE_DYNAMIC_TOPIC if name in table.configs else SOURCE_DEFAULT, is_sensitive=False)
                for name in TOPIC_CONFIGS]
        except FluvialError as exc:
            r.error_code = exc.code
            r.error_message = exc.message
        results.append(r)
    return ctx.response(throttle_time_ms=0, topics=results)


@handles(ApiKey.DELETE_TOPICS, 1, 6)
async def delete_topics(ctx: RequestContext, request):
    tables = ctx.broker.tables
    if ctx.version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    results = []
    for name, topic_id in wanted:
        r = DR.DeletableTopicResult(name=name, topic_id=topic_id, error_code=0, error_message=None)
        try:
            if name is not None:
                require(ctx, AclOperation.DELETE, ResourceType.TOPIC, name)
            table = tables.get(name) if name is not None else tables.get_by_id(topic_id)
            if name is None:
                require(ctx, AclOperation.DELETE, ResourceType.TOPIC, table.name)
            if name is not None and topic_id is not None and topic_id.int != 0 and table.topic_id != topic_id:
                raise FluvialError("topic id does not match the topic name", code=ErrorCode.INCONSISTENT_TOPIC_ID)
            await tables.delete(table.name)
            r.name, r.topic_id = table.name, table.topic_id
        except UnknownTableError as exc:
            r.error_code = ErrorCode.UNKNOWN_TOPIC_ID if name is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            r.error_message = exc.message
        except FluvialError as exc:
            r.error_code, r.error_message = exc.code, exc.message
        results.append(r)
    return ctx.response(throttle_time_ms=0, responses=results)
