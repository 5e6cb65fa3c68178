"""DescribeConfigs: topic configs with their defaults and sources, the broker's and groups'."""
from __future__ import annotations

import asyncio

from fluvial.broker.broker import on_start
from fluvial.broker.config import AGG_CONFIG_PREFIX, TOPIC_CONFIGS, config_def
from fluvial.broker.config_resources import (BROKER_CONFIGS, GROUP_CONFIGS, RESOURCE_BROKER, RESOURCE_GROUP,
                                             RESOURCE_TOPIC, ConfigResources)
from fluvial.broker.authorization import require_config_access
from fluvial.broker.handlers import RequestContext, handles
from fluvial.security.acls import AclOperation
from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class

R = response_class(ApiKey.DESCRIBE_CONFIGS)
Result = R.DescribeConfigsResult
Entry = Result.DescribeConfigsResourceResult
Synonym = Entry.DescribeConfigsSynonym

SOURCE_DYNAMIC_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
SOURCE_GROUP = 8
# DescribeConfigs v3+ config types.
CONFIG_TYPE = {"bool": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7, "duration": 2}


def topic_config_entries(table, keys: list[str] | None, synonyms: bool, docs: bool) -> list:
    entries = []
    # Per-column aggregate functions are named after the table's columns: listed as set.
    agg = {n: config_def(n) for n in table.configs if n.startswith(AGG_CONFIG_PREFIX)}
    for name, d in {**TOPIC_CONFIGS, **agg}.items():
        if keys is not None and name not in keys:
            continue
        overridden = name in table.configs
        broker_default = getattr(table, "broker_defaults", {}).get(name)
        value = table.configs.get(name, broker_default if broker_default is not None else d.default)
        source = SOURCE_DYNAMIC_TOPIC if overridden else SOURCE_STATIC_BROKER if broker_default is not None \
            else SOURCE_DEFAULT
        syn = []
        if synonyms:
            if overridden:
                syn.append(Synonym(name=name, value=value, source=SOURCE_DYNAMIC_TOPIC))
            if broker_default is not None:
                syn.append(Synonym(name=name, value=broker_default, source=SOURCE_STATIC_BROKER))
            syn.append(Synonym(name=name, value=d.default, source=SOURCE_DEFAULT))
        entries.append(Entry(name=name, value=value, read_only=False,
                             config_source=source,
                             is_default=source == SOURCE_DEFAULT, is_sensitive=False, synonyms=syn,
                             config_type=CONFIG_TYPE[d.kind], documentation=d.doc if docs else None))
    return entries


def broker_config_entries(ctx: RequestContext, name: str, keys: list[str] | None, synonyms: bool,
                          docs: bool) -> list:
    """The broker's configs: dynamic overrides (this broker's, then cluster-wide) over the
    command line; read-only ones flagged so."""
    resources: ConfigResources = ctx.broker.extensions["config_resources"]
    cluster, own = resources.broker_overrides()
    entries = []
    for d in BROKER_CONFIGS.values():
        if keys is not None and d.name not in keys:
            continue
        static = d.read(ctx.broker) if not d.topic_default else TOPIC_CONFIGS[d.topic_default].default
        if d.field and hasattr(resources, "_static"):
            static = str(resources._static[d.field])
        layers = [(v, src) for v, src in ((own.get(d.name), SOURCE_DYNAMIC_BROKER),
                                          (cluster.get(d.name), SOURCE_DYNAMIC_DEFAULT_BROKER),
                                          (static, SOURCE_STATIC_BROKER if not d.topic_default else SOURCE_DEFAULT))
                  if v is not None]
        if name == "":
            layers = [layer for layer in layers if layer[1] != SOURCE_DYNAMIC_BROKER]
        value, source = layers[0]
        entries.append(Entry(name=d.name, value=value, read_only=not d.dynamic, config_source=source,
                             is_default=source == SOURCE_DEFAULT, is_sensitive=False,
                             synonyms=[Synonym(name=d.name, value=v, source=src) for v, src in layers] if synonyms else [],
                             config_type=CONFIG_TYPE[d.kind], documentation=d.doc if docs else None))
    return entries


def group_config_entries(ctx: RequestContext, group_id: str, keys: list[str] | None, docs: bool) -> list:
    resources: ConfigResources = ctx.broker.extensions["config_resources"]
    if not group_id:
        raise FluvialError("A group config resource needs a group id", code=ErrorCode.INVALID_GROUP_ID)
    stored = resources.stored(RESOURCE_GROUP, group_id)
    return [Entry(name=d.name, value=stored.get(d.name, str(d.default)), read_only=False,
                  config_source=SOURCE_GROUP if d.name in stored else SOURCE_DEFAULT,
                  is_default=d.name not in stored, is_sensitive=False, synonyms=[], config_type=CONFIG_TYPE["int"],
                  documentation=d.doc if docs else None)
            for d in GROUP_CONFIGS.values() if keys is None or d.name in keys]


@handles(ApiKey.DESCRIBE_CONFIGS, 1, 4)
async def describe_configs(ctx: RequestContext, request):
    results = []
    for res in request.resources:
        keys = list(res.configuration_keys) if res.configuration_keys is not None else None
        r = Result(error_code=0, error_message=None, resource_type=res.resource_type,
                   resource_name=res.resource_name, configs=[])
        try:
            require_config_access(ctx, AclOperation.DESCRIBE_CONFIGS, res.resource_type, res.resource_name)
            if res.resource_type == RESOURCE_TOPIC:
                table = ctx.broker.tables.get(res.resource_name)
                r.configs = topic_config_entries(table, keys, request.include_synonyms,
                                                 ctx.version >= 3 and request.include_documentation)
            elif res.resource_type == RESOURCE_BROKER:
                ctx.broker.extensions["config_resources"].check_broker_name(res.resource_name)
                r.configs = broker_config_entries(ctx, res.resource_name, keys, request.include_synonyms,
                                                  ctx.version >= 3 and request.include_documentation)
            elif res.resource_type == RESOURCE_GROUP:
                r.configs = group_config_entries(ctx, res.resource_name, keys,
                                                 ctx.version >= 3 and request.include_documentation)
            else:
                raise FluvialError(f"Unsupported resource type {res.resource_type}", code=ErrorCode.INVALID_REQUEST)
        except FluvialError as exc:
            r.error_code, r.error_message = exc.code, exc.message
        results.append(r)
    return ctx.response(throttle_time_ms=0, results=results)


@on_start
async def load_config_resources(broker) -> None:
    """Dynamic broker configs set earlier take effect again before any client is served."""
    resources = ConfigResources(broker)
    broker.extensions["config_resources"] = resources
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(broker.io_executor, resources.load)
    resources.apply_broker()
