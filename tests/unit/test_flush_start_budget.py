"""The broker-wide bound of flush starts: a burst, then one start per spacing, shared by
every group commit of one I/O executor and by no other."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from fluvial.broker.tables import (BROKER_FLUSH_BURST, BROKER_FLUSH_SPACING_S, FLUSH_BURST, FLUSH_SPACING_S,
                                   FlushStartBudget, flush_start_budget)


def test_a_burst_starts_at_once_and_later_starts_are_spaced():
    budget = FlushStartBudget()
    now = 100.0
    starts = [budget.reserve(now) for _ in range(BROKER_FLUSH_BURST + 3)]
    assert starts[:BROKER_FLUSH_BURST] == [now] * BROKER_FLUSH_BURST
    gaps = [b - a for a, b in zip(starts[BROKER_FLUSH_BURST - 1:], starts[BROKER_FLUSH_BURST:])]
    assert gaps == pytest.approx([BROKER_FLUSH_SPACING_S] * len(gaps))
    # After a quiet spell the burst is available again.
    later = starts[-1] + 1.0
    assert [budget.reserve(later) for _ in range(BROKER_FLUSH_BURST)] == [later] * BROKER_FLUSH_BURST


def test_one_bucket_at_its_own_bound_never_waits_for_the_broker_budget():
    # A bucket starts at most FLUSH_BURST flushes at once and then one per FLUSH_SPACING_S:
    # every such start is due at once under the broker's budget.
    assert FLUSH_SPACING_S >= BROKER_FLUSH_SPACING_S and FLUSH_BURST <= BROKER_FLUSH_BURST
    budget = FlushStartBudget()
    t = 5.0
    for step in range(200):
        for _ in range(FLUSH_BURST if step == 0 else 1):
            assert budget.reserve(t) == t
        t += FLUSH_SPACING_S


def test_one_budget_per_executor():
    with ThreadPoolExecutor(1) as a, ThreadPoolExecutor(1) as b:
        assert flush_start_budget(a) is flush_start_budget(a)
        assert flush_start_budget(a) is not flush_start_budget(b)
