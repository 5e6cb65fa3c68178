"""ApiVersions: the APIs and version ranges this broker serves (the registered handlers)."""
from fluvial.broker.handlers import RequestContext, handles, supported_versions
from fluvial.protocol.messages import ApiKey, response_class


@handles(ApiKey.API_VERSIONS, 0, 4)
async def api_versions(ctx: RequestContext, request):
    cls = response_class(ApiKey.API_VERSIONS)
    keys = [cls.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in supported_versions().items()]
    if ctx.version < 3:
        return ctx.response(error_code=0, api_keys=keys, throttle_time_ms=0)
    # Features (KIP-584): transaction.version 2 is served (KIP-890: Produce v12 adds
    # partitions, EndTxn v5 bumps the epoch per transaction), so clients may use it.
    features = [cls.SupportedFeatureKey(name=name, min_version=lo, max_version=hi)
                for name, (lo, hi) in FEATURES.items()]
    finalized = [cls.FinalizedFeatureKey(name=name, max_version_level=hi, min_version_level=hi)
                 for name, (lo, hi) in FEATURES.items()]
    return ctx.response(error_code=0, api_keys=keys, throttle_time_ms=0, supported_features=features,
                        finalized_features_epoch=1, finalized_features=finalized, zk_migration_ready=False)


# name -> (min, max) level served; each is finalized at its max.
FEATURES: dict[str, tuple[int, int]] = {"transaction.version": (0, 2)}
