"""Topic administration: CreatePartitions, AlterConfigs, IncrementalAlterConfigs,
DeleteRecords, DescribeLogDirs."""
from __future__ import annotations

import asyncio
import shutil

from fluvial.broker.tables import check_bucket_growth
from fluvial.broker.config import TOPIC_CONFIGS
from fluvial.broker.config_resources import RESOURCE_BROKER, RESOURCE_GROUP, RESOURCE_TOPIC
from fluvial.broker.authorization import allowed_on_cluster, require, require_config_access
from fluvial.broker.handlers import RequestContext, handles
from fluvial.broker.replica_assignment import check_create_partitions
from fluvial.errors import FluvialError, InvalidConfigError, InvalidPartitionsError, OffsetOutOfRangeError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclOperation, ResourceType

CPR = response_class(ApiKey.CREATE_PARTITIONS)
ACR = response_class(ApiKey.ALTER_CONFIGS)
IACR = response_class(ApiKey.INCREMENTAL_ALTER_CONFIGS)
DRR = response_class(ApiKey.DELETE_RECORDS)
DLR = response_class(ApiKey.DESCRIBE_LOG_DIRS)

OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
HIGH_WATERMARK = -1


@handles(ApiKey.CREATE_PARTITIONS, 0, 3)
async def create_partitions(ctx: RequestContext, request):
    results = []
    for t in request.topics:
        r = CPR.CreatePartitionsTopicResult(name=t.name, error_code=0, error_message=None)
        try:
            require(ctx, AclOperation.ALTER, ResourceType.TOPIC, t.name)
            table = ctx.broker.tables.get(t.name)
            reason = table.fixed_buckets_reason()
            if reason:
                raise InvalidPartitionsError(f"Table {t.name} cannot change its bucket count: {reason}")
            check_bucket_growth(t.count)
            if t.count <= len(table.buckets):
                raise InvalidPartitionsError(
                    f"Topic currently has {len(table.buckets)} partitions, which is higher than or equal to the "
                    f"requested {t.count}.")
            if t.assignments:
                check_create_partitions(t.assignments, len(table.buckets), t.count, ctx.broker.config.node_id)
            if not request.validate_only:
                await ctx.broker.tables.add_buckets(t.name, t.count)
        except FluvialError as exc:
            r.error_code, r.error_message = exc.code, exc.message
        results.append(r)
    return ctx.response(throttle_time_ms=0, results=results)


def _apply_ops(current: dict[str, str], configs, list_value) -> dict[str, str]:
    """IncrementalAlterConfigs operations applied to a resource's overrides."""
    overrides = dict(current)
    for c in configs:
        if c.config_operation == OP_SET:
            if c.value is None:
                raise InvalidConfigError(f"Null value for config {c.name}")
            overrides[c.name] = c.value
        elif c.config_operation == OP_DELETE:
            overrides.pop(c.name, None)
        elif c.config_operation in (OP_APPEND, OP_SUBTRACT):
            present = list_value(c.name, overrides)
            if present is None:
                raise InvalidConfigError(f"Config {c.name} is not a list: APPEND and SUBTRACT do not apply")
            current_items = [v for v in present.split(",") if v]
            items = [v for v in (c.value or "").split(",") if v]
            if c.config_operation == OP_APPEND:
                current_items += [v for v in items if v not in current_items]
            else:
                current_items = [v for v in current_items if v not in items]
            overrides[c.name] = ",".join(current_items)
        else:
            raise InvalidConfigError(f"Unknown config operation {c.config_operation}")
    return overrides


async def _alter_resource(ctx: RequestContext, resource_type: int, name: str, overrides: dict[str, str],
                          validate_only: bool) -> None:
    """Replace the overrides of a topic, broker or group resource (checked also when only validating)."""
    resources = ctx.broker.extensions["config_resources"]
    loop = asyncio.get_running_loop()
    if resource_type == RESOURCE_TOPIC:
        await ctx.broker.tables.alter_configs(name, overrides, validate_only=validate_only)
    elif resource_type == RESOURCE_BROKER:
        resources.check_broker_name(name)
        resources.validate_broker(overrides)
        if not validate_only:
            await loop.run_in_executor(ctx.broker.io_executor, resources.alter_broker, name, overrides)
            resources.apply_broker()
    elif resource_type == RESOURCE_GROUP:
        resources.validate_group(name, overrides)
        if not validate_only:
            await loop.run_in_executor(ctx.broker.io_executor, resources.alter_group, name, overrides)
    else:
        raise FluvialError(f"Unsupported resource type {resource_type}", code=ErrorCode.INVALID_REQUEST)


def _current(ctx: RequestContext, resource_type: int, name: str) -> dict[str, str]:
    if resource_type == RESOURCE_TOPIC:
        return dict(ctx.broker.tables.get(name).configs)
    if resource_type in (RESOURCE_BROKER, RESOURCE_GROUP):
        return ctx.broker.extensions["config_resources"].stored(resource_type, name)
    raise FluvialError(f"Unsupported resource type {resource_type}", code=ErrorCode.INVALID_REQUEST)


@handles(ApiKey.ALTER_CONFIGS, 0, 2)
async def alter_configs(ctx: RequestContext, request):
    """AlterConfigs replaces a resource's whole set of overrides."""
    out = []
    for res in request.resources:
        r = ACR.AlterConfigsResourceResponse(error_code=0, error_message=None, resource_type=res.resource_type,
                                             resource_name=res.resource_name)
        try:
            require_config_access(ctx, AclOperation.ALTER_CONFIGS, res.resource_type, res.resource_name)
            overrides = {c.name: c.value for c in res.configs if c.value is not None}
            await _alter_resource(ctx, res.resource_type, res.resource_name, overrides, request.validate_only)
        except FluvialError as exc:
            r.error_code, r.error_message = exc.code, exc.message
        out.append(r)
    return ctx.response(throttle_time_ms=0, responses=out)


@handles(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1)
async def incremental_alter_configs(ctx: RequestContext, request):
    out = []
    for res in request.resources:
        r = IACR.AlterConfigsResourceResponse(error_code=0, error_message=None, resource_type=res.resource_type,
                                              resource_name=res.resource_name)
        try:
            require_config_access(ctx, AclOperation.ALTER_CONFIGS, res.resource_type, res.resource_name)
            current = _current(ctx, res.resource_type, res.resource_name)

            def list_value(name: str, overrides: dict[str, str], rtype=res.resource_type, rname=res.resource_name):
                if rtype != RESOURCE_TOPIC:
                    return None
                d = TOPIC_CONFIGS.get(name)
                if d is None or d.kind != "list":
                    return None
                return overrides.get(name, ctx.broker.tables.get(rname).config(name))

            overrides = _apply_ops(current, res.configs, list_value)
            await _alter_resource(ctx, res.resource_type, res.resource_name, overrides, request.validate_only)
        except FluvialError as exc:
            r.error_code, r.error_message = exc.code, exc.message
        out.append(r)
    return ctx.response(throttle_time_ms=0, responses=out)


@handles(ApiKey.DELETE_RECORDS, 0, 2)
async def delete_records(ctx: RequestContext, request):
    loop = asyncio.get_running_loop()
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            try:
                require(ctx, AclOperation.DELETE, ResourceType.TOPIC, t.name)
                table = ctx.broker.tables.get(t.name)
                table.kind.check_records_deletable(table)
                bucket = table.bucket(p.partition_index)
                tablet = bucket.tablet
                target = tablet.high_watermark if p.offset == HIGH_WATERMARK else p.offset
                if not 0 <= target <= tablet.high_watermark:
                    raise OffsetOutOfRangeError(
                        f"offset {p.offset} is outside [0, {tablet.high_watermark}] of {t.name}-{p.partition_index}")
                # Covers the remote log too: its start moves, expired objects go.
                low = await loop.run_in_executor(ctx.broker.remote_log.read_executor, ctx.broker.remote_log.delete_records,
                                                 bucket, target)
                parts.append(DRR.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
                    partition_index=p.partition_index, low_watermark=low, error_code=0))
            except FluvialError as exc:
                parts.append(DRR.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
                    partition_index=p.partition_index, low_watermark=-1, error_code=exc.code))
        topics.append(DRR.DeleteRecordsTopicResult(name=t.name, partitions=parts))
    return ctx.response(throttle_time_ms=0, topics=topics)


@handles(ApiKey.DESCRIBE_LOG_DIRS, 1, 4)
async def describe_log_dirs(ctx: RequestContext, request):
    tables = ctx.broker.tables
    if not allowed_on_cluster(ctx, AclOperation.DESCRIBE):
        # As Kafka: log directories are the cluster's (DESCRIBE on the cluster).
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, results=[])
    if request.topics is None:
        wanted = {name: [b.index for b in t.buckets] for name, t in tables.tables.items()}
    else:
        wanted = {t.topic: list(t.partitions) for t in request.topics if t.topic in tables.tables}
    topics = []
    for name, indexes in wanted.items():
        table = tables.tables[name]
        parts = [DLR.DescribeLogDirsResult.DescribeLogDirsTopic.DescribeLogDirsPartition(
            partition_index=i, partition_size=table.bucket(i).tablet.size_bytes, offset_lag=0, is_future_key=False)
            for i in indexes if 0 <= i < len(table.buckets)]
        topics.append(DLR.DescribeLogDirsResult.DescribeLogDirsTopic(name=name, partitions=parts))
    usage = shutil.disk_usage(tables.log_dir)
    result = DLR.DescribeLogDirsResult(error_code=0, log_dir=str(tables.log_dir.resolve()), topics=topics,
                                       total_bytes=usage.total, usable_bytes=usage.free)
    return ctx.response(throttle_time_ms=0, error_code=0, results=[result])
