"""Authorization checks of the Kafka handlers, and authorized operations as Kafka reports them.

Every handler asks through `allowed(ctx, operation, resource_type, name)`: with the
authorizer off that is one attribute test; with it on, the broker's `Authorizer` decides for
the connection's principal and address (decisions cached per principal and resource).

A primary-key table's `<table>.changelog` topic is the table seen as a log: it has no ACLs
of its own and follows its table's.

Authorized operations (Metadata, DescribeCluster, DescribeGroups, DescribeTopicPartitions)
are the operations the resource type supports that the principal may perform, as AclOperation
codes set as bits of an int32; without an authorizer that is every supported operation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from fluvial.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from fluvial.security.authorizer import host_of

if TYPE_CHECKING:
    from fluvial.broker.handlers import RequestContext

_CHANGELOG_SUFFIX = ".changelog"
_TOPIC = ResourceType.TOPIC

# What a response carries when the client did not ask: the message classes encode None as
# INT32_MIN, and a set of operation codes as the bitfield with those bits set.
OMITTED = None


def _bits(*ops: AclOperation) -> frozenset[int]:
    return frozenset(int(op) for op in ops)


def bitfield(operations: Iterable[int]) -> int:
    """The int32 a response carries for these operations (e.g. 3576 for every topic operation)."""
    return sum(1 << op for op in operations)


A = AclOperation
# The operations each resource type supports (Kafka's AclEntry.supportedOperations).
TOPIC_OPERATIONS = _bits(A.READ, A.WRITE, A.CREATE, A.DELETE, A.ALTER, A.DESCRIBE, A.DESCRIBE_CONFIGS,
                         A.ALTER_CONFIGS)
CLUSTER_OPERATIONS = _bits(A.CREATE, A.CLUSTER_ACTION, A.DESCRIBE_CONFIGS, A.ALTER_CONFIGS, A.IDEMPOTENT_WRITE,
                           A.ALTER, A.DESCRIBE)
GROUP_OPERATIONS = _bits(A.READ, A.DESCRIBE, A.DELETE)


def acl_name(resource_type: ResourceType, name: str) -> str:
    """The resource name ACLs are looked up under (a changelog topic is its table)."""
    if resource_type == _TOPIC and name.endswith(_CHANGELOG_SUFFIX) and len(name) > len(_CHANGELOG_SUFFIX):
        return name[:-len(_CHANGELOG_SUFFIX)]
    return name


def allowed(ctx: "RequestContext", operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
    authorizer = ctx.broker.authorizer
    if not authorizer.enabled:
        return True
    return authorizer.authorize(ctx.principal, host_of(ctx.peer), operation, resource_type,
                                acl_name(resource_type, name))


def allowed_on_cluster(ctx: "RequestContext", operation: AclOperation) -> bool:
    return allowed(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME)


def allowed_on_any(ctx: "RequestContext", operation: AclOperation, resource_type: ResourceType) -> bool:
    """May the principal perform `operation` on at least one resource of the type."""
    authorizer = ctx.broker.authorizer
    if not authorizer.enabled:
        return True
    return authorizer.authorize_any(ctx.principal, host_of(ctx.peer), operation, resource_type)


def _operations(ctx: "RequestContext | None", resource_type: ResourceType, name: str,
                supported: frozenset[int]) -> set[int]:
    if ctx is None or not ctx.broker.authorizer.enabled:
        return set(supported)
    return ctx.broker.authorizer.authorized_operations(ctx.principal, host_of(ctx.peer), resource_type,
                                                       acl_name(resource_type, name), supported)


def topic_operations(asked: bool, ctx: "RequestContext | None" = None, name: str = "") -> set[int] | None:
    return _operations(ctx, _TOPIC, name, TOPIC_OPERATIONS) if asked else OMITTED


def cluster_operations(asked: bool, ctx: "RequestContext | None" = None) -> set[int] | None:
    if not asked:
        return OMITTED
    if ctx is not None and not allowed_on_cluster(ctx, AclOperation.DESCRIBE):
        return set()  # as Kafka: nothing is told to a principal that may not describe the cluster
    return _operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME, CLUSTER_OPERATIONS)


def group_operations(asked: bool, ctx: "RequestContext | None" = None, group: str = "") -> set[int] | None:
    return _operations(ctx, ResourceType.GROUP, group, GROUP_OPERATIONS) if asked else OMITTED


class AuthorizationFailed(FluvialError):
    """An operation the principal's ACLs do not allow (the code says on what: topic, group,
    cluster or transactional id)."""
    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    http_status = 403


_DENIED_CODES = {ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                 ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
                 ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                 ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}


def denied_code(resource_type: ResourceType) -> ErrorCode:
    return _DENIED_CODES.get(resource_type, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)


def require(ctx: "RequestContext", operation: AclOperation, resource_type: ResourceType, name: str) -> None:
    """Raise AuthorizationFailed (with Kafka's code for the resource type) unless allowed."""
    if not allowed(ctx, operation, resource_type, name):
        raise AuthorizationFailed(f"{operation.name} on {resource_type.name} {name!r} is not authorized",
                                  code=denied_code(resource_type))


# Config resource types (DescribeConfigs, AlterConfigs) and the ACL resource they are
# authorized on: a broker's configs and its loggers are the cluster's.
_CONFIG_TOPIC, _CONFIG_BROKER, _CONFIG_BROKER_LOGGER, _CONFIG_GROUP = 2, 4, 8, 32


def require_config_access(ctx: "RequestContext", operation: AclOperation, config_resource_type: int,
                          name: str) -> None:
    """DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic, group, or the cluster for broker configs."""
    if config_resource_type == _CONFIG_TOPIC:
        require(ctx, operation, ResourceType.TOPIC, name)
    elif config_resource_type == _CONFIG_GROUP:
        require(ctx, operation, ResourceType.GROUP, name)
    elif config_resource_type in (_CONFIG_BROKER, _CONFIG_BROKER_LOGGER):
        if config_resource_type == _CONFIG_BROKER_LOGGER:
            # Kafka: loggers are described with DESCRIBE and altered with ALTER_CONFIGS.
            operation = AclOperation.DESCRIBE if operation == AclOperation.DESCRIBE_CONFIGS else operation
        require(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME)
