"""DescribeConfigs: topic configs with their defaults and sources, and the broker's."""
from __future__ import annotations

from fluvial.broker.config import TOPIC_CONFIGS
from fluvial.broker.handlers import RequestContext, handles
from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class

R = response_class(ApiKey.DESCRIBE_CONFIGS)
Result = R.DescribeConfigsResult
Entry = Result.DescribeConfigsResourceResult
Synonym = Entry.DescribeConfigsSynonym

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
# DescribeConfigs v3+ config types.
CONFIG_TYPE = {"bool": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7, "duration": 2}


def topic_config_entries(table, keys: list[str] | None, synonyms: bool, docs: bool) -> list:
    entries = []
    for name, d in TOPIC_CONFIGS.items():
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


def broker_config_entries(ctx: RequestContext, keys: list[str] | None) -> list:
    cfg = ctx.broker.config
    values = {
        "broker.id": str(cfg.node_id), "node.id": str(cfg.node_id),
        "auto.create.topics.enable": str(cfg.auto_create_topics).lower(),
        "num.partitions": str(cfg.default_partitions),
        "socket.request.max.bytes": str(cfg.max_request_bytes),
        "log.dirs": str(ctx.broker.data_dir / "log"),
        "fluvial.flush.policy": cfg.flush_policy,
        "remote.storage.enable": str(cfg.remote_storage_enable).lower(),
        "fluvial.object.store": ctx.broker.object_store.url,
    }
    return [Entry(name=k, value=v, read_only=True, config_source=SOURCE_STATIC_BROKER, is_default=False,
                  is_sensitive=False, synonyms=[], config_type=2, documentation=None)
            for k, v in values.items() if keys is None or k in keys]


@handles(ApiKey.DESCRIBE_CONFIGS, 1, 4)
async def describe_configs(ctx: RequestContext, request):
    results = []
    for res in request.resources:
        keys = list(res.configuration_keys) if res.configuration_keys is not None else None
        r = Result(error_code=0, error_message=None, resource_type=res.resource_type,
                   resource_name=res.resource_name, configs=[])
        try:
            if res.resource_type == RESOURCE_TOPIC:
                table = ctx.broker.tables.get(res.resource_name)
                r.configs = topic_config_entries(table, keys, request.include_synonyms,
                                                 ctx.version >= 3 and request.include_documentation)
            elif res.resource_type == RESOURCE_BROKER:
                if res.resource_name not in ("", str(ctx.broker.config.node_id)):
                    raise FluvialError(f"Unknown broker {res.resource_name}", code=ErrorCode.INVALID_REQUEST)
                r.configs = broker_config_entries(ctx, keys)
            else:
                raise FluvialError(f"Unsupported resource type {res.resource_type}", code=ErrorCode.INVALID_REQUEST)
        except FluvialError as exc:
            r.error_code, r.error_message = exc.code, exc.message
        results.append(r)
    return ctx.response(throttle_time_ms=0, results=results)
