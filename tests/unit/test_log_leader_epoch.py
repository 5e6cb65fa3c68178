"""Leader epoch cache: Kafka's OffsetForLeaderEpoch answers, conflicts and persistence."""
from __future__ import annotations

import pytest

from fluvial.broker.log import LeaderEpochCache
from fluvial.broker.log.leader_epoch import UNDEFINED_EPOCH, UNDEFINED_OFFSET


def cache_with(tmp_path, *entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(tmp_path / "leader-epoch.checkpoint")
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def test_end_offset_for_follows_kafka_semantics(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 25))
    log_end = 40

    assert cache.end_offset_for(5, log_end) == (5, 40)  # the latest epoch ends at the log end
    assert cache.end_offset_for(3, log_end) == (3, 25)  # ends where the next one starts
    assert cache.end_offset_for(4, log_end) == (3, 25)  # unknown epoch: the largest one below it
    assert cache.end_offset_for(0, log_end) == (0, 0)  # older than all: ends where the first starts
    assert cache.end_offset_for(6, log_end) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache.end_offset_for(UNDEFINED_EPOCH, log_end) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def test_empty_cache_knows_no_epoch(tmp_path):
    assert cache_with(tmp_path).end_offset_for(0, 10) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache_with(tmp_path).latest_epoch is None


def test_assign_ignores_repeats_and_removes_conflicting_entries(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (2, 10), (2, 15), (4, 20))
    assert cache.entries() == [(1, 0), (2, 10), (4, 20)]
    # A new epoch starting below an existing entry replaces what it overlaps.
    cache.assign(5, 12)
    assert cache.entries() == [(1, 0), (2, 10), (5, 12)]
    # An epoch not newer than the latest evicts the newer ones.
    cache.assign(3, 30)
    assert cache.entries() == [(1, 0), (2, 10), (3, 30)]


def test_entries_survive_reopen(tmp_path):
    cache_with(tmp_path, (0, 0), (2, 7))
    reopened = LeaderEpochCache(tmp_path / "leader-epoch.checkpoint")
    assert reopened.entries() == [(0, 0), (2, 7)]
    assert reopened.latest_epoch == 2


def test_truncation_from_both_ends(tmp_path):
    cache = cache_with(tmp_path, (0, 0), (1, 10), (2, 20), (3, 30))
    cache.truncate_from_end(20)
    assert cache.entries() == [(0, 0), (1, 10)]
    cache.truncate_from_start(15)
    assert cache.entries() == [(1, 15)]
    assert LeaderEpochCache(tmp_path / "leader-epoch.checkpoint").entries() == [(1, 15)]


def test_corrupt_checkpoint_is_reported(tmp_path):
    path = tmp_path / "leader-epoch.checkpoint"
    path.write_text("0\n3\n1 0\n")
    with pytest.raises(ValueError):
        LeaderEpochCache(path)
