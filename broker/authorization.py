"""Authorized operations as Kafka reports them (Metadata, DescribeCluster, DescribeGroups).

Fluvial has no authorizer yet, so every client may do everything; Kafka answers that case
with every operation the resource type supports (AclOperation codes as bits), which is
what tools such as `kafka-topics.sh --describe` and the admin clients' `authorizedOperations()`
show.
"""
from __future__ import annotations

import enum


class AclOperation(enum.IntEnum):
    """Kafka's AclOperation codes (org.apache.kafka.common.acl.AclOperation)."""

    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


# What a response carries when the client did not ask: the message classes encode None as
# INT32_MIN, and a set of operation codes as the bitfield with those bits set.
OMITTED = None


def _bits(*ops: AclOperation) -> frozenset[int]:
    return frozenset(int(op) for op in ops)


def bitfield(operations: frozenset[int] | set[int]) -> int:
    """The int32 a response carries for these operations (e.g. 3576 for every topic operation)."""
    return sum(1 << op for op in operations)


A = AclOperation
# The operations each resource type supports (Kafka's AclEntry.supportedOperations).
TOPIC_OPERATIONS = _bits(A.READ, A.WRITE, A.CREATE, A.DELETE, A.ALTER, A.DESCRIBE, A.DESCRIBE_CONFIGS,
                         A.ALTER_CONFIGS)
CLUSTER_OPERATIONS = _bits(A.CREATE, A.CLUSTER_ACTION, A.DESCRIBE_CONFIGS, A.ALTER_CONFIGS, A.IDEMPOTENT_WRITE,
                           A.ALTER, A.DESCRIBE)
GROUP_OPERATIONS = _bits(A.READ, A.DESCRIBE, A.DELETE)


def topic_operations(asked: bool) -> set[int] | None:
    return set(TOPIC_OPERATIONS) if asked else OMITTED


def cluster_operations(asked: bool) -> set[int] | None:
    return set(CLUSTER_OPERATIONS) if asked else OMITTED


def group_operations(asked: bool) -> set[int] | None:
    return set(GROUP_OPERATIONS) if asked else OMITTED
