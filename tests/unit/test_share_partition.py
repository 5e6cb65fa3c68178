"""The share-partition state machine (KIP-932): acquire, acknowledge, release, the delivery
limit, lock expiry, and the start offset moving past what is done."""
from __future__ import annotations

import pytest

from fluvial.broker.groups.share_partition import (ACK_ACCEPT, ACK_GAP, ACK_REJECT, ACK_RELEASE, ACK_RENEW,
                                                   InvalidRecordState, SharePartition)


def test_acquire_acknowledge_release_and_limit():
    sp = SharePartition(10, 10)
    lock_a, ranges = sp.acquire("a", log_end=16, log_start=0, max_records=4)
    assert ranges == [(10, 13, 1)]
    lock_b, ranges = sp.acquire("b", log_end=16, log_start=0, max_records=10)
    assert ranges == [(14, 15, 1)] and sp.end_offset == 16
    assert sp.acquire("c", 16, 0, 10)[1] == []
    with pytest.raises(InvalidRecordState):  # b does not hold 10; nothing changes
        sp.acknowledge("b", [(14, 14, [ACK_ACCEPT]), (10, 10, [ACK_ACCEPT])], limit=2)
    assert sp.start_offset == 10
    with pytest.raises(InvalidRecordState):
        sp.acknowledge("a", [(10, 12, [ACK_ACCEPT, ACK_ACCEPT])], limit=2)  # wrong number of types
    sp.acknowledge("a", [(10, 12, [ACK_ACCEPT, ACK_RELEASE, ACK_REJECT])], limit=2)
    assert sp.start_offset == 11  # 10 done; 11 available again
    assert sp.acquire("b", 16, 0, 10)[1] == [(11, 11, 2)]
    sp.acknowledge("b", [(11, 11, [ACK_RELEASE])], limit=2)  # second delivery: archived
    assert sp.start_offset == 13 and sp.acquire("c", 16, 0, 10)[1] == []
    # a's lock on 13 times out; b's renew keeps 14-15.
    assert sp.acknowledge("b", [(14, 15, [ACK_RENEW])], limit=2) == {lock_b}
    assert sp.release_lock(lock_a, limit=5) and sp.acquire("c", 16, 0, 10)[1] == [(13, 13, 2)]
    sp.acknowledge("c", [(13, 13, [ACK_ACCEPT])], limit=5)
    assert sp.release_member("b", limit=5) and sp.acquire("c", 17, 0, 10)[1] == [(14, 15, 2), (16, 16, 1)]
    sp.acknowledge("c", [(14, 16, [ACK_ACCEPT]), (17, 20, [ACK_GAP])], limit=5)
    assert (sp.start_offset, sp.end_offset, len(sp.state)) == (17, 17, 0)


def test_state_survives_as_json_with_locks_released_and_log_start_skips():
    sp = SharePartition(0, 0)
    sp.acquire("a", 5, 0, 3)
    sp.acknowledge("a", [(1, 1, [ACK_ACCEPT])], limit=5)
    again = SharePartition.from_json(sp.to_json())
    assert (again.start_offset, again.end_offset) == (0, 3)
    assert again.acquire("b", 5, 0, 10)[1] == [(0, 0, 2), (2, 2, 2), (3, 4, 1)]
    with pytest.raises(InvalidRecordState):  # 1 was acknowledged before the restart
        again.acknowledge("b", [(0, 4, [ACK_ACCEPT])], limit=5)
    again.acknowledge("b", [(0, 0, [ACK_ACCEPT]), (2, 4, [ACK_ACCEPT])], limit=5)
    assert (again.start_offset, len(again.state)) == (5, 0)
    # Records deleted from the log by retention are skipped.
    assert SharePartition(0, 0).acquire("a", 10, 7, 2)[1] == [(7, 8, 1)]
