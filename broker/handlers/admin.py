"""Topic administration: CreatePartitions, AlterConfigs, IncrementalAlterConfigs,
DeleteRecords, DescribeLogDirs."""
from __future__ import annotations

import asyncio
import shutil

from fluvial.broker import pk_tables
from fluvial.broker.tables import check_bucket_growth
from fluvial.broker.handlers import RequestContext, handles
from fluvial.errors import FluvialError, InvalidConfigError, InvalidPartitionsError, OffsetOutOfRangeError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class

CPR = response_class(ApiKey.CREATE_PARTITIONS)
ACR = response_class(ApiKey.ALTER_CONFIGS)
IACR = response_class(ApiKey.INCREMENTAL_ALTER_CONFIGS)
DRR = response_class(ApiKey.DELETE_RECORDS)
DLR = response_class(ApiKey.DESCRIBE_LOG_DIRS)

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
HIGH_WATERMARK = -1


@handles(ApiKey.CREATE_PARTITIONS, 0, 3)
async def create_partitions(ctx: RequestContext, request):
    results = []
    for t in request.topics:
        r = CPR.CreatePartitionsTopicResult(name=t.name, error_code=0, error_message=None)
        try:
            table = ctx.broker.tables.get(t.name)
            reason = table.fixed_buckets_reason()
            if reason:
                raise InvalidPartitionsError(f"Table {t.name} cannot change its bucket count: {reason}")
            if t.assignments:
                raise FluvialError("Manual replica assignment is not supported by a single-node broker",
                                   code=ErrorCode.INVALID_REPLICA_ASSIGNMENT)
            check_bucket_growth(t.count)
            if t.count <= len(table.buckets):
                raise InvalidPartitionsError(
                    f"Topic currently has {len(table.buckets)} partitions, which is higher than or equal to the "
                    f"requested {t.count}.")
            if not request.validate_only:
                await ctx.broker.tables.add_buckets(t.name, t.count)
        except FluvialError as exc:
            r.error_code, r.error_message = exc.code, exc.message
        results.append(r)
    return ctx.response(throttle_time_ms=0, results=results)


def _check_resource(resource_type: int, name: str) -> None:
    if resource_type == RESOURCE_BROKER:
        raise FluvialError("Broker configs are set on the command line and cannot be altered at runtime",
                           code=ErrorCode.INVALID_REQUEST)
    if resource_type != RESOURCE_TOPIC:
        raise FluvialError(f"Unsupported resource type {resource_type}", code=ErrorCode.INVALID_REQUEST)


@handles(ApiKey.ALTER_CONFIGS, 0, 2)
async def alter_configs(ctx: RequestContext, request):
    """AlterConfigs replaces a topic's whole set of overrides."""
    out = []
    for res in request.resources:
        r = ACR.AlterConfigsResourceResponse(error_code=0, error_message=None, resource_type=res.resource_type,
                                             resource_name=res.resource_name)
        try:
            _check_resource(res.resource_type, res.resource_name)
            overrides = {c.name: c.value for c in res.configs if c.value is not None}
            await ctx.broker.tables.alter_configs(res.resource_name, overrides, validate_only=request.validate_only)
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
            _check_resource(res.resource_type, res.resource_name)
            table = ctx.broker.tables.get(res.resource_name)
            overrides = dict(table.configs)
            for c in res.configs:
                if c.config_operation == OP_SET:
                    if c.value is None:
                        raise InvalidConfigError(f"Null value for config {c.name}")
                    overrides[c.name] = c.value
                elif c.config_operation == OP_DELETE:
                    overrides.pop(c.name, None)
                elif c.config_operation in (OP_APPEND, OP_SUBTRACT):
                    current = [v for v in overrides.get(c.name, table.config(c.name)).split(",") if v]
                    items = [v for v in (c.value or "").split(",") if v]
                    if c.config_operation == OP_APPEND:
                        current += [v for v in items if v not in current]
                    else:
                        current = [v for v in current if v not in items]
                    overrides[c.name] = ",".join(current)
                else:
                    raise InvalidConfigError(f"Unknown config operation {c.config_operation}")
            await ctx.broker.tables.alter_configs(res.resource_name, overrides, validate_only=request.validate_only)
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
                table = ctx.broker.tables.get(t.name)
                pk_tables.check_records_deletable(table)
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
