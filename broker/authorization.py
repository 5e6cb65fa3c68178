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
    return _operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME, CLUSTER_OPERATIONS) if asked else OMITTED


def group_operations(asked: bool, ctx: "RequestContext | None" = None, group: str = "") -> set[int] | None:
    return _operations(ctx, ResourceType.GROUP, group, GROUP_OPERATIONS) if asked else OMITTED
