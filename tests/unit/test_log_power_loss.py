"""Power loss: every write not fsynced is taken away, then the log tablet is opened again.

What must hold: the log is a prefix of what was appended (no hole, no foreign record, no
torn batch), and under flush policy `ack` everything readers could see (the high
watermark) is still there.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.broker.log import FlushPolicy, sync_journal
from fluvial.broker.log.checkpoint import fsync_directory
from fluvial.broker.log.segment import LogSegment
from tests.support.power_loss import lose_unsynced_writes
from tests.unit.test_log_support import all_rows, meta, open_tablet, records

SEGMENT_BYTES = 6000


@pytest.fixture
def journal(tmp_path):
    path = tmp_path / "sync.journal"
    sync_journal.enable(path)
    yield path
    sync_journal.disable()


def crash(tablet) -> None:
    """Stop using the tablet as a kill -9 would: no flush, no checkpoint."""
    for segment in tablet._view.segments:
        segment.close_for_append()


def keys_of(tablet) -> list[bytes]:
    table = all_rows(tablet, ["_offset", "_key"])
    if table.num_rows == 0:
        return []
    assert table.column("_offset").to_pylist() == list(range(tablet.log_start_offset, tablet.log_end_offset))
    return table.column("_key").to_pylist()


def test_unsynced_appends_are_lost_and_synced_ones_kept(tmp_path, journal):
    directory = tmp_path / "t-0"
    tablet = open_tablet(directory, segment_bytes=SEGMENT_BYTES, flush_policy=FlushPolicy.ACK)
    for tag in range(10):
        tablet.append(records(5, tag=tag, value_size=200), meta())
    tablet.flush()
    assert tablet.high_watermark == 50
    for tag in range(10, 20):
        tablet.append(records(5, tag=tag, value_size=200), meta())
    assert (tablet.high_watermark, tablet.log_end_offset) == (50, 100)
    crash(tablet)

    report = lose_unsynced_writes(journal, tmp_path, random.Random(1), torn=False)
    assert report.bytes_lost > 0

    reopened = open_tablet(directory, segment_bytes=SEGMENT_BYTES, flush_policy=FlushPolicy.ACK)
    assert reopened.log_end_offset == 50
    assert keys_of(reopened) == [b"key-%d-%d" % (tag, i) for tag in range(10) for i in range(5)]
    # The log goes on after what survived.
    written = reopened.append(records(1, tag=99), meta())
    assert written.base_offset == 50
    reopened.close()


def _swap_last_two_syncs(journal: Path) -> tuple[int, int]:
    """Put the journal's last two sync lines in the other order, as two flushes of one segment
    syncing at once record them when the one that covered more finishes first (seen in the
    power-loss soak: `flush_up_to` lets two flushes sync at once). Returns their sizes in
    the new order."""
    lines = journal.read_text(encoding="utf-8").splitlines(keepends=True)
    syncs = [i for i, line in enumerate(lines) if line.startswith("sync\t")]
    a, b = syncs[-2], syncs[-1]
    lines[a], lines[b] = lines[b], lines[a]
    journal.write_text("".join(lines), encoding="utf-8")
    return int(lines[a].split("\t")[2]), int(lines[b].split("\t")[2])


@pytest.mark.parametrize("seed", range(8))
def test_fsyncs_recorded_out_of_order_keep_what_either_covered(tmp_path, journal, seed):
    directory = tmp_path / "t-0"
    tablet = open_tablet(directory, segment_bytes=1 << 20, flush_policy=FlushPolicy.ACK)
    for tag in range(4):
        tablet.append(records(5, tag=tag, value_size=300), meta())
    tablet.flush()
    for tag in range(4, 8):
        tablet.append(records(5, tag=tag, value_size=300), meta())
    tablet.flush()
    tablet.append(records(5, tag=8, value_size=300), meta())  # never fsynced
    visible = tablet.high_watermark
    assert visible == 40
    crash(tablet)
    first, second = _swap_last_two_syncs(journal)
    assert first > second  # the larger fsync is now recorded first

    lose_unsynced_writes(journal, tmp_path, random.Random(seed), torn=seed % 2 == 1)

    reopened = open_tablet(directory, segment_bytes=1 << 20, flush_policy=FlushPolicy.ACK)
    assert reopened.log_end_offset >= visible, "a record readers could see was lost"
    assert keys_of(reopened)[:visible] == [b"key-%d-%d" % (tag, i) for tag in range(8) for i in range(5)]
    reopened.close()


def test_a_directory_fsync_begun_before_a_segment_was_created_does_not_keep_it(tmp_path, journal):
    racing, after = tmp_path / "t-0", tmp_path / "t-1"
    racing.mkdir()
    after.mkdir()
    begun_at = sync_journal.position()
    early = LogSegment.create(racing, 0, 4096)  # created while that directory fsync runs
    sync_journal.directory_synced(racing, begun_at)
    late = LogSegment.create(after, 0, 4096)
    fsync_directory(after)  # begins after the creation: the entry is durable
    for segment in (early, late):
        segment.close_for_append()
        segment.data_path.write_bytes(b"x" * 100)
    report = lose_unsynced_writes(journal, tmp_path, random.Random(0), torn=False)
    assert report.segments_vanished == 1
    assert not early.data_path.exists()
    assert late.data_path.exists()


_round = st.lists(st.tuples(st.integers(1, 12), st.integers(0, 600), st.booleans()), min_size=1, max_size=20)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(_round, min_size=1, max_size=3), seed=st.integers(0, 2**31),
       torn=st.booleans(), policy=st.sampled_from([FlushPolicy.ACK, FlushPolicy.NONE]))
def test_power_loss_leaves_a_prefix_holding_everything_visible(tmp_path_factory, rounds, seed, torn, policy):
    root = tmp_path_factory.mktemp("power")
    journal = root / "sync.journal"
    sync_journal.enable(journal)
    try:
        directory = root / "log" / "t-0"
        rng = random.Random(seed)
        history: list[bytes] = []  # the key appended at each offset, as the log last assigned it
        tag = 0
        for ops in rounds:
            tablet = open_tablet(directory, segment_bytes=SEGMENT_BYTES, index_interval_bytes=700,
                                 flush_policy=policy)
            survived = keys_of(tablet)
            assert survived == history[tablet.log_start_offset:tablet.log_end_offset]
            del history[tablet.log_end_offset:]
            for count, value_size, flush in ops:
                tablet.append(records(count, tag=tag, value_size=value_size), meta())
                history.extend(b"key-%d-%d" % (tag, i) for i in range(count))
                tag += 1
                if flush:
                    tablet.flush()
            visible = tablet.high_watermark
            crash(tablet)
            lose_unsynced_writes(journal, root, rng, torn=torn)
            reopened = open_tablet(directory, segment_bytes=SEGMENT_BYTES, index_interval_bytes=700,
                                   flush_policy=policy)
            if policy is FlushPolicy.ACK:
                assert reopened.log_end_offset >= visible, "a record readers could see was lost"
            assert keys_of(reopened) == history[reopened.log_start_offset:reopened.log_end_offset]
            crash(reopened)
    finally:
        sync_journal.disable()
