"""Server-side partition assignors of KIP-848 consumer groups: "uniform" and "range".

An assignor maps each member's subscribed topics to partitions. Both are deterministic
(members and topics are visited in sorted order) so that a restarted broker computes the
same target assignment from the same group state.
"""
from __future__ import annotations

import uuid
from typing import Callable

# topic id -> partitions
Partitions = dict[uuid.UUID, set[int]]
# member id -> assignment
Assignment = dict[str, Partitions]


def range_assign(subscriptions: dict[str, set[uuid.UUID]], partition_counts: dict[uuid.UUID, int],
                 current: Assignment) -> Assignment:
    """Per topic, the subscribed members (sorted by id) take contiguous ranges of partitions,
    the first `n % m` members one more; so members subscribed to co-partitioned topics get
    the same partition numbers of each."""
    result: Assignment = {m: {} for m in subscriptions}
    for topic_id in sorted(partition_counts, key=str):
        members = sorted(m for m, topics in subscriptions.items() if topic_id in topics)
        if not members:
            continue
        count = partition_counts[topic_id]
        quota, extra = divmod(count, len(members))
        start = 0
        for i, member in enumerate(members):
            size = quota + (1 if i < extra else 0)
            if size:
                result[member][topic_id] = set(range(start, start + size))
            start += size
    return result


def uniform_assign(subscriptions: dict[str, set[uuid.UUID]], partition_counts: dict[uuid.UUID, int],
                   current: Assignment) -> Assignment:
    """Balance the number of partitions per member while keeping partitions where they are.

    A partition stays with its current owner while that member is still subscribed to its
    topic and not above its fair share; the others go to the least loaded eligible member;
    then partitions move from the most to the least loaded eligible member until no move
    lowers the spread (differences of at most one partition where subscriptions allow)."""
    members = sorted(subscriptions)
    result: Assignment = {m: {} for m in members}
    if not members:
        return result
    load = {m: 0 for m in members}
    owner: dict[tuple[uuid.UUID, int], str] = {}
    all_partitions = [(t, p) for t in sorted(partition_counts, key=str) for p in range(partition_counts[t])
                      if any(t in subscriptions[m] for m in members)]
    ceiling = -(-len(all_partitions) // len(members))
    for member in members:
        for topic_id, parts in sorted(current.get(member, {}).items(), key=lambda kv: str(kv[0])):
            if topic_id not in subscriptions[member] or topic_id not in partition_counts:
                continue
            for p in sorted(parts):
                if p < partition_counts[topic_id] and (topic_id, p) not in owner and load[member] < ceiling:
                    owner[(topic_id, p)] = member
                    load[member] += 1
    eligible = {t: [m for m in members if t in subscriptions[m]] for t in partition_counts}
    for tp in all_partitions:
        if tp not in owner:
            member = min(eligible[tp[0]], key=lambda m: (load[m], m))
            owner[tp] = member
            load[member] += 1
    # Move partitions while a move narrows the gap between two members by two or more.
    moved = True
    while moved:
        moved = False
        for tp, holder in sorted(owner.items(), key=lambda kv: (-load[kv[1]], str(kv[0][0]), kv[0][1])):
            target = min(eligible[tp[0]], key=lambda m: (load[m], m))
            if load[holder] - load[target] > 1:
                owner[tp] = target
                load[holder] -= 1
                load[target] += 1
                moved = True
    for (topic_id, p), member in owner.items():
        result[member].setdefault(topic_id, set()).add(p)
    return result


ASSIGNORS: dict[str, Callable[[dict[str, set[uuid.UUID]], dict[uuid.UUID, int], Assignment], Assignment]] = {
    "uniform": uniform_assign,
    "range": range_assign,
}
