"""CreateAcls, DescribeAcls and DeleteAcls, answered as Kafka answers them.

Creating and deleting ACLs needs ALTER on the cluster, listing them DESCRIBE on the cluster
(CLUSTER_AUTHORIZATION_FAILED otherwise); a broker without an authorizer answers
SECURITY_DISABLED. Changes are on disk before they are acknowledged (security/acl_store.py).
"""
from __future__ import annotations

from itertools import groupby

from fluvial.broker.authorization import allowed_on_cluster
from fluvial.broker.handlers import RequestContext, handles
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, response_class
from fluvial.security.acls import AclBinding, AclBindingFilter, AclOperation, InvalidAclError

DescribeR = response_class(ApiKey.DESCRIBE_ACLS)
CreateR = response_class(ApiKey.CREATE_ACLS)
DeleteR = response_class(ApiKey.DELETE_ACLS)
FilterResult = DeleteR.DeleteAclsFilterResult
MatchingAcl = FilterResult.DeleteAclsMatchingAcl

_NO_AUTHORIZER = "No Authorizer is configured on the broker"
_CLUSTER_DENIED = "Cluster authorization failed."


def _filter(f, prefix: str) -> AclBindingFilter:
    return AclBindingFilter.of(getattr(f, f"resource_type{prefix}"), getattr(f, f"resource_name{prefix}"),
                               getattr(f, "pattern_type_filter"), getattr(f, f"principal{prefix}"),
                               getattr(f, f"host{prefix}"), f.operation, f.permission_type)


@handles(ApiKey.DESCRIBE_ACLS, 1, 3)
async def describe_acls(ctx: RequestContext, request):
    if not allowed_on_cluster(ctx, AclOperation.DESCRIBE):
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            error_message=_CLUSTER_DENIED, resources=[])
    if not ctx.broker.authorizer.enabled:
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.SECURITY_DISABLED,
                            error_message=_NO_AUTHORIZER, resources=[])
    flt = _filter(request, "_filter")
    try:
        flt.validate()
    except InvalidAclError as exc:
        return ctx.response(throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST, error_message=str(exc),
                            resources=[])
    bindings = sorted(ctx.broker.authorizer.acls(flt), key=lambda b: (b.pattern.resource_type, b.pattern.name,
                                                                      b.pattern.pattern_type))
    resources = []
    for pattern, group in groupby(bindings, key=lambda b: b.pattern):
        resources.append(DescribeR.DescribeAclsResource(
            resource_type=pattern.resource_type, resource_name=pattern.name, pattern_type=pattern.pattern_type,
            acls=[DescribeR.DescribeAclsResource.AclDescription(
                principal=b.entry.principal, host=b.entry.host, operation=b.entry.operation,
                permission_type=b.entry.permission_type) for b in group]))
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, resources=resources)


@handles(ApiKey.CREATE_ACLS, 1, 3)
async def create_acls(ctx: RequestContext, request):
    def all_failed(code: ErrorCode, message: str):
        return ctx.response(throttle_time_ms=0, results=[
            CreateR.AclCreationResult(error_code=code, error_message=message) for _ in request.creations])

    if not allowed_on_cluster(ctx, AclOperation.ALTER):
        return all_failed(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, _CLUSTER_DENIED)
    if not ctx.broker.authorizer.enabled:
        return all_failed(ErrorCode.SECURITY_DISABLED, _NO_AUTHORIZER)
    bindings = [AclBinding.of(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host,
                              c.operation, c.permission_type) for c in request.creations]
    results = await ctx.broker.acl_store.create(bindings)
    return ctx.response(throttle_time_ms=0, results=[
        CreateR.AclCreationResult(error_code=0, error_message=None) if r.error is None else
        CreateR.AclCreationResult(error_code=ErrorCode.INVALID_REQUEST if r.invalid else
                                  ErrorCode.KAFKA_STORAGE_ERROR, error_message=r.error) for r in results])


@handles(ApiKey.DELETE_ACLS, 1, 3)
async def delete_acls(ctx: RequestContext, request):
    def all_failed(code: ErrorCode, message: str):
        return ctx.response(throttle_time_ms=0, filter_results=[
            FilterResult(error_code=code, error_message=message, matching_acls=[]) for _ in request.filters])

    if not allowed_on_cluster(ctx, AclOperation.ALTER):
        return all_failed(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, _CLUSTER_DENIED)
    if not ctx.broker.authorizer.enabled:
        return all_failed(ErrorCode.SECURITY_DISABLED, _NO_AUTHORIZER)
    filters = [_filter(f, "_filter") for f in request.filters]
    results = await ctx.broker.acl_store.delete(filters)
    out = []
    for r in results:
        if r.error is not None:
            out.append(FilterResult(error_code=ErrorCode.INVALID_REQUEST if r.invalid else
                                    ErrorCode.KAFKA_STORAGE_ERROR, error_message=r.error, matching_acls=[]))
            continue
        out.append(FilterResult(error_code=0, error_message=None, matching_acls=[
            MatchingAcl(error_code=0, error_message=None, resource_type=b.pattern.resource_type,
                        resource_name=b.pattern.name, pattern_type=b.pattern.pattern_type,
                        principal=b.entry.principal, host=b.entry.host, operation=b.entry.operation,
                        permission_type=b.entry.permission_type) for b in r.deleted]))
    return ctx.response(throttle_time_ms=0, filter_results=out)
