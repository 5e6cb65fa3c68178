"""Manual replica assignments (CreateTopics, CreatePartitions) on a single-node broker.

Kafka lets a client place each partition's replicas itself. This broker is the only one, so
an assignment is valid when every partition has exactly this broker as its one replica;
anything else is refused the way Kafka refuses it (INVALID_REPLICA_ASSIGNMENT, or
INVALID_REQUEST when it is combined with a partition count or replication factor).
"""
from __future__ import annotations

from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode


def _invalid(message: str) -> FluvialError:
    return FluvialError(message, code=ErrorCode.INVALID_REPLICA_ASSIGNMENT)


def check_replicas(broker_ids: list[int], node_id: int, partition: int | str) -> None:
    if len(set(broker_ids)) != len(broker_ids):
        raise _invalid(f"The manual partition assignment of partition {partition} contains duplicate broker ids")
    unknown = [b for b in broker_ids if b != node_id]
    if unknown:
        raise _invalid(f"The manual partition assignment includes broker {unknown[0]}, but no such broker is "
                       f"registered (this cluster has broker {node_id} only)")
    if not broker_ids:
        raise _invalid(f"The manual partition assignment of partition {partition} names no broker")


def partitions_of_create(assignments, num_partitions: int, replication_factor: int, node_id: int) -> int:
    """The partition count of a CreateTopics entry with `assignments` (partition_index, broker_ids)."""
    if num_partitions != -1 or replication_factor != -1:
        raise FluvialError("Both numPartitions or replicationFactor and replicasAssignments were set. "
                           "Both cannot be used at the same time.", code=ErrorCode.INVALID_REQUEST)
    indexes = sorted(a.partition_index for a in assignments)
    if indexes != list(range(len(indexes))):
        raise _invalid("Partitions should be a consecutive 0-based integer sequence")
    for a in assignments:
        check_replicas(list(a.broker_ids), node_id, a.partition_index)
    return len(indexes)


def check_create_partitions(assignments, current: int, count: int, node_id: int) -> None:
    """CreatePartitions: one assignment (broker_ids) for each new partition."""
    if len(assignments) != count - current:
        raise _invalid(f"Increasing the number of partitions by {count - current} but {len(assignments)} "
                       f"assignments provided.")
    for i, a in enumerate(assignments):
        check_replicas(list(a.broker_ids), node_id, current + i)
