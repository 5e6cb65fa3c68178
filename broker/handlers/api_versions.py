"""ApiVersions: the APIs and version ranges this broker serves (the registered handlers)."""
from fluvial.broker.handlers import RequestContext, handles, supported_versions
from fluvial.protocol.messages import ApiKey, response_class


@handles(ApiKey.API_VERSIONS, 0, 4)
async def api_versions(ctx: RequestContext, request):
    cls = response_class(ApiKey.API_VERSIONS)
    keys = [cls.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in supported_versions().items()]
    return ctx.response(error_code=0, api_keys=keys, throttle_time_ms=0)
