"""Log tablet crash recovery: torn tails, corrupt bytes and lost indexes recover to whole batches."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.broker.log.tablet import RECOVERY_POINT_CHECKPOINT
from fluvial.broker.log import FlushPolicy
from tests.unit.test_log_support import all_rows, meta, open_tablet, records

SEGMENT_BYTES = 6000
BATCHES = 24


def build_log(directory: Path) -> None:
    """A log of several segments, left as after a crash (never closed, nothing fsynced)."""
    tablet = open_tablet(directory, segment_bytes=SEGMENT_BYTES, index_interval_bytes=700)
    rng = np.random.default_rng(1)
    for i in range(BATCHES):
        count = int(rng.integers(1, 9))
        tablet.append(records(count, value_size=int(rng.integers(1, 300)), tag=i), meta(producer_id=i))


def batch_ends(segment: Path) -> list[tuple[int, int]]:
    """(end position, record count) of each batch message, found with plain pyarrow."""
    reader = pa.BufferReader(pa.py_buffer(segment.read_bytes()))
    ipc.read_message(reader)  # the schema
    ends = []
    while True:
        try:
            message = ipc.read_message(reader)
        except (pa.ArrowInvalid, OSError, EOFError):
            break
        if message is None:
            break
        ends.append(reader.tell())
    return ends


def surviving_offsets(directory: Path, damaged: Path, damage_at: int) -> list[int]:
    """Offsets recovery must keep: every batch before the damage, nothing after it."""
    offsets = []
    for segment in sorted(directory.glob("*.arrows")):
        base = int(segment.stem)
        batches = list(ipc.open_stream(segment))
        if segment == damaged and damage_at < segment.stat().st_size:
            ends = batch_ends(segment)
            whole = sum(1 for end in ends if end <= damage_at)
            for batch in batches[:whole]:
                offsets += batch.column("_offset").to_pylist()
            return offsets
        assert batches[0].column("_offset")[0].as_py() == base
        for batch in batches:
            offsets += batch.column("_offset").to_pylist()
    return offsets


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("pristine")
    build_log(directory)
    assert len(list(directory.glob("*.arrows"))) >= 4
    return directory


def reopen_and_check(directory: Path, expected_offsets: list[int], reference: pa.Table) -> None:
    tablet = open_tablet(directory, segment_bytes=SEGMENT_BYTES)
    rows = all_rows(tablet)
    end = expected_offsets[-1] + 1 if expected_offsets else 0
    assert tablet.log_end_offset == end
    assert rows.num_rows == len(expected_offsets)
    if expected_offsets:
        assert rows.column("_offset").to_pylist() == expected_offsets
        assert rows.equals(reference.slice(0, len(expected_offsets)))
    # The recovered log takes new appends right after the last whole batch, and keeps them.
    written = tablet.append(records(3, tag=99), meta())
    assert written.base_offset == end
    tablet.close()
    again = open_tablet(directory, segment_bytes=SEGMENT_BYTES)
    assert again.log_end_offset == end + 3
    assert all_rows(again).column("_offset").to_pylist() == list(range(end + 3))


def reference_rows(pristine: Path) -> pa.Table:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "log"
        shutil.copytree(pristine, copy)
        return all_rows(open_tablet(copy, segment_bytes=SEGMENT_BYTES))


@pytest.fixture(scope="module")
def pristine_closed(pristine, tmp_path_factory) -> Path:
    """The same log after a clean close: every segment trusted, none verified on open."""
    directory = tmp_path_factory.mktemp("closed") / "log"
    shutil.copytree(pristine, directory)
    open_tablet(directory, segment_bytes=SEGMENT_BYTES).close()
    return directory


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), drop_indexes=st.booleans(), closed=st.booleans())
def test_any_truncation_recovers_to_a_prefix_of_whole_batches(pristine, pristine_closed, data, drop_indexes, closed):
    reference = reference_rows(pristine)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "log"
        shutil.copytree(pristine_closed if closed else pristine, directory)
        segments = sorted(directory.glob("*.arrows"))
        damaged = data.draw(st.sampled_from(segments), label="segment")
        cut = data.draw(st.integers(0, damaged.stat().st_size), label="cut")
        expected = surviving_offsets(directory, damaged, cut)
        with open(damaged, "r+b") as f:
            f.truncate(cut)
        if drop_indexes:
            for index in directory.glob("*index"):
                index.unlink()

        reopen_and_check(directory, expected, reference)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_corrupt_byte_cuts_the_log_before_its_batch(pristine, data):
    reference = reference_rows(pristine)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "log"
        shutil.copytree(pristine, directory)
        # The active segment is the one a crash leaves unverified.
        damaged = sorted(directory.glob("*.arrows"))[-1]
        raw = bytearray(damaged.read_bytes())
        position = data.draw(st.integers(0, len(raw) - 1), label="position")
        raw[position] ^= data.draw(st.integers(1, 255), label="xor")
        damaged.write_bytes(bytes(raw))

        # Batches wholly before the damaged byte survive; the damaged batch and later ones go.
        pristine_ends = batch_ends(pristine / damaged.name)
        if position < _schema_length(pristine / damaged.name):
            kept_batches = 0
        else:
            kept_batches = sum(1 for end in pristine_ends if end <= position)
        expected = []
        for segment in sorted(pristine.glob("*.arrows")):
            batches = list(ipc.open_stream(segment))
            if segment.name == damaged.name:
                batches = batches[:kept_batches]
            for batch in batches:
                expected += batch.column("_offset").to_pylist()

        reopen_and_check(directory, expected, reference)


def _schema_length(segment: Path) -> int:
    reader = pa.BufferReader(pa.py_buffer(segment.read_bytes()))
    ipc.read_message(reader)
    return reader.tell()


def test_corruption_in_an_older_segment_drops_everything_after_it(pristine, tmp_path):
    directory = tmp_path / "log"
    shutil.copytree(pristine, directory)
    second = sorted(directory.glob("*.arrows"))[1]
    ends = batch_ends(second)
    raw = bytearray(second.read_bytes())
    raw[ends[1] - 3] ^= 0xFF  # inside the second batch of the second segment
    second.write_bytes(bytes(raw))

    tablet = open_tablet(directory, segment_bytes=SEGMENT_BYTES)

    first_batch = list(ipc.open_stream(second))[0]
    assert tablet.log_end_offset == first_batch.column("_offset")[-1].as_py() + 1
    assert len(list(directory.glob("*.arrows"))) == 2


@pytest.mark.parametrize("damage", ["delete", "garbage", "shifted", "truncated", "time_index_lost_entries"])
def test_bad_or_missing_indexes_are_rebuilt_after_a_clean_close(pristine, tmp_path, damage):
    directory = tmp_path / "log"
    shutil.copytree(pristine, directory)
    reference = reference_rows(pristine)
    closing = open_tablet(directory, segment_bytes=SEGMENT_BYTES, index_interval_bytes=700)
    expected_lookup = closing.offset_for_timestamp(1_700_000_000_003)
    expected_max = closing.max_timestamp()
    closing.close()
    rng = np.random.default_rng(3)
    for index in sorted(directory.glob("*index")):
        raw = index.read_bytes()
        if damage == "delete":
            index.unlink()
        elif damage == "garbage":
            index.write_bytes(rng.bytes(len(raw)))
        elif damage == "time_index_lost_entries":
            if index.suffix == ".timeindex":
                index.write_bytes(raw[:16])  # whole entries, sorted: only the offsets tell
        elif damage == "shifted":
            entries = np.frombuffer(raw, dtype="<i8").copy()
            entries[1::2] += 8  # every position/offset now points into the middle of something
            index.write_bytes(entries.tobytes())
        else:
            index.write_bytes(raw[: len(raw) - 5])

    tablet = open_tablet(directory, segment_bytes=SEGMENT_BYTES, index_interval_bytes=700)

    assert all_rows(tablet).equals(reference)
    assert tablet.offset_for_timestamp(1_700_000_000_003) == expected_lookup
    assert tablet.max_timestamp() == expected_max
    assert [i.max_timestamp for i in tablet.segment_infos()] == [
        max(b.column("_timestamp").cast(pa.int64()).to_pylist()) for b in
        (pa.Table.from_batches(list(ipc.open_stream(p))) for p in sorted(directory.glob("*.arrows")))
    ]
    for offset in range(0, tablet.log_end_offset, 7):
        assert tablet.read(offset, 1)[0].meta.base_offset <= offset < tablet.read(offset, 1)[0].meta.next_offset


def test_a_torn_tail_after_a_clean_close_is_cut(pristine, tmp_path):
    directory = tmp_path / "log"
    shutil.copytree(pristine, directory)
    reference = reference_rows(pristine)
    open_tablet(directory, segment_bytes=SEGMENT_BYTES).close()
    assert int((directory / RECOVERY_POINT_CHECKPOINT).read_text()) == reference.num_rows
    last = sorted(directory.glob("*.arrows"))[-1]
    size = last.stat().st_size
    ends = batch_ends(last)
    with open(last, "ab") as f:  # half of a copy of the last batch
        f.write(last.read_bytes()[ends[-2] : (ends[-2] + ends[-1]) // 2])

    tablet = open_tablet(directory, segment_bytes=SEGMENT_BYTES)

    assert last.stat().st_size == size
    assert all_rows(tablet).equals(reference)


CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from fluvial.broker.log import FlushPolicy, LogConfig, LogTablet
    from tests.unit.test_log_support import meta, records

    tablet = LogTablet.open(Path(sys.argv[1]), LogConfig(segment_bytes=64 * 1024, flush_policy=FlushPolicy.ACK))
    i = 0
    while True:
        written = tablet.append(records(1 + i % 7, value_size=50 + (i * 37) % 400, tag=i), meta(producer_id=i))
        if i % 3 == 0:
            tablet.flush_up_to(written.next_offset)
            print(i, written.base_offset, written.next_offset, flush=True)
        i += 1
    """
)


def test_kill_9_loses_nothing_that_was_flushed(tmp_path):
    directory = tmp_path / "bucket"
    repo = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory)],
        stdout=subprocess.PIPE, text=True, cwd=repo,
    )
    reported = []
    try:
        for line in child.stdout:
            reported.append(tuple(map(int, line.split())))
            if len(reported) >= 150:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert len(reported) >= 150, "the child stopped before reporting enough flushed batches"

    tablet = open_tablet(directory)

    assert tablet.log_end_offset >= reported[-1][2]
    rows = all_rows(tablet)
    # No duplicates, no gaps.
    assert rows.column("_offset").to_pylist() == list(range(tablet.log_end_offset))
    stored = {s.meta.producer_id: s for s in tablet.read(0, 1 << 40)}
    for tag, base, next_offset in reported:
        batch = stored[tag]
        assert (batch.meta.base_offset, batch.meta.next_offset) == (base, next_offset)
        assert batch.batch.drop_columns(["_offset"]).equals(
            records(1 + tag % 7, value_size=50 + (tag * 37) % 400, tag=tag)
        )


def test_segments_written_after_the_last_flush_are_verified(tmp_path):
    directory = tmp_path / "log"
    tablet = open_tablet(directory, segment_bytes=4096, flush_policy=FlushPolicy.ACK)
    for i in range(20):
        tablet.append(records(4, value_size=100, tag=i), meta(producer_id=i))
    tablet.flush()
    flushed = tablet.log_end_offset
    assert int((directory / RECOVERY_POINT_CHECKPOINT).read_text()) == flushed
    for i in range(20, 60):  # several more segments, never flushed
        tablet.append(records(4, value_size=100, tag=i), meta(producer_id=i))
    segments = sorted(directory.glob("*.arrows"))
    unflushed = [s for s in segments if int(s.stem) >= flushed]
    assert len(unflushed) >= 3
    # Damage a middle segment that was written after the last flush.
    victim = unflushed[1]
    ends = batch_ends(victim)
    raw = bytearray(victim.read_bytes())
    raw[ends[0] + 20] ^= 0x40  # inside its second batch
    victim.write_bytes(bytes(raw))

    reopened = open_tablet(directory, segment_bytes=4096)

    first_batch = list(ipc.open_stream(victim))[0]
    assert reopened.log_end_offset == first_batch.column("_offset")[-1].as_py() + 1
    assert all_rows(reopened).column("_offset").to_pylist() == list(range(reopened.log_end_offset))


def test_only_batches_past_the_recovery_point_are_checked(tmp_path, monkeypatch):
    """The active segment holds the recovery point: batches below it were fsynced and are
    not checked again; the rest is, and a damaged batch there is cut. The result equals a
    full recovery's: rows, indexes, timestamps."""
    from fluvial.broker.log import segment as segment_module

    directory = tmp_path / "log"
    tablet = open_tablet(directory, index_interval_bytes=700, flush_policy=FlushPolicy.ACK)
    for i in range(60):
        tablet.append(records(1 + i % 5, value_size=120, tag=i), meta(producer_id=i))
    tablet.flush()
    flushed = tablet.log_end_offset
    assert int((directory / RECOVERY_POINT_CHECKPOINT).read_text()) == flushed
    for i in range(60, 70):  # never flushed
        tablet.append(records(3, value_size=120, tag=i), meta(producer_id=i))
    [segment] = sorted(directory.glob("*.arrows"))
    ends = batch_ends(segment)
    raw = bytearray(segment.read_bytes())
    raw[ends[-3] + 40] ^= 0x10  # inside the second batch from the end
    segment.write_bytes(bytes(raw))
    full = tmp_path / "full"
    shutil.copytree(directory, full)
    (full / RECOVERY_POINT_CHECKPOINT).unlink()  # no recovery point: everything is checked

    checked = []
    real = segment_module.checksum_matches
    monkeypatch.setattr(segment_module, "checksum_matches", lambda *a: checked.append(1) or real(*a))
    reopened = open_tablet(directory, index_interval_bytes=700)
    tail_checks = len(checked)
    reference = open_tablet(full, index_interval_bytes=700)

    assert 8 <= tail_checks < 20, f"{tail_checks} batches checked of {len(ends)}"
    assert len(checked) - tail_checks == len(ends) - 1  # the full recovery stops at the damage
    assert reopened.log_end_offset == reference.log_end_offset == flushed + 8 * 3
    assert all_rows(reopened).equals(all_rows(reference))
    a, b = reopened._view.segments[0], reference._view.segments[0]
    assert a.state == b.state
    for x, y in ((a.offset_index, b.offset_index), (a.time_index, b.time_index)):
        assert np.array_equal(x.keys(), y.keys()) and np.array_equal(x.values(), y.values())
        assert x.path.read_bytes() == y.path.read_bytes()


def test_index_entries_are_written_in_groups_and_whole_once_a_segment_closes(tmp_path):
    """Index entries reach their files WRITE_EVERY at a time; a rolled segment's and a
    closed tablet's index files hold every entry; after a crash (the files as they were,
    without a close) the next open serves every row and rebuilds the same indexes."""
    from fluvial.broker.log.index import ENTRY_DTYPE, WRITE_EVERY, SparseIndex

    directory = tmp_path / "log"
    tablet = open_tablet(directory, index_interval_bytes=1, segment_bytes=64 * 1024, flush_policy=FlushPolicy.ACK)

    def on_disk(segment) -> tuple[int, int]:
        return (len(SparseIndex.read_entries(segment.offset_index.path)),
                len(SparseIndex.read_entries(segment.time_index.path)))

    for i in range(WRITE_EVERY - 1):  # an entry for every batch
        tablet.append(records(2, value_size=40, tag=i), meta(producer_id=i))
    [active] = tablet._view.segments
    assert len(active.offset_index) == WRITE_EVERY - 1 and on_disk(active) == (0, 0)
    tablet.append(records(2, value_size=40, tag=99), meta(producer_id=99))
    assert on_disk(active) == (WRITE_EVERY, WRITE_EVERY)
    i = 100
    while len(tablet._view.segments) < 3:
        tablet.append(records(2, value_size=400, tag=i), meta(producer_id=i))
        i += 1
    for closed in tablet._view.segments[:-1]:
        stored = SparseIndex.read_entries(closed.offset_index.path)
        assert len(stored) == len(closed.offset_index)
        assert np.array_equal(stored["key"], closed.offset_index.keys())
        assert np.array_equal(SparseIndex.read_entries(closed.time_index.path)["key"], closed.time_index.keys())
    tablet.flush()
    active = tablet._view.segments[-1]
    assert on_disk(active)[0] < len(active.offset_index)  # the newest entries are in memory only

    crashed = tmp_path / "crashed"
    shutil.copytree(directory, crashed)  # what a kill -9 leaves (the page cache survives it)
    reference = all_rows(tablet)
    tablet.close()
    closed_active = SparseIndex.read_entries(active.offset_index.path)
    assert np.array_equal(closed_active["key"], active.offset_index.keys())

    reopened = open_tablet(crashed, index_interval_bytes=1, segment_bytes=64 * 1024)
    assert all_rows(reopened).equals(reference)
    for a, b in zip(reopened._view.segments, tablet._view.segments):
        for x, y in ((a.offset_index, b.offset_index), (a.time_index, b.time_index)):
            assert np.array_equal(x.keys(), y.keys()) and np.array_equal(x.values(), y.values())
    # Appends after the reopen go on from the entries the file holds.
    reopened.append(records(2, value_size=40, tag=7), meta(producer_id=7))
    reopened.close()
    last = reopened._view.segments[-1]
    stored = np.frombuffer(last.offset_index.path.read_bytes(), ENTRY_DTYPE)
    assert np.array_equal(stored["key"], last.offset_index.keys())


def test_an_index_that_cannot_be_completed_at_close_is_logged_and_rebuilt_on_open(tmp_path, caplog):
    """Writing a segment's last index entries fails when the tablet closes: the close goes
    on (a shorter index is still a valid one), the failure is logged, and the next open
    serves every row with the index rebuilt from the segment."""
    import logging

    directory = tmp_path / "log"
    tablet = open_tablet(directory, index_interval_bytes=1, segment_bytes=1 << 20, flush_policy=FlushPolicy.ACK)
    for i in range(5):  # fewer than WRITE_EVERY entries: all still in memory only
        tablet.append(records(2, value_size=40, tag=i), meta(producer_id=i))
    tablet.flush()
    reference = all_rows(tablet)
    [active] = tablet._view.segments
    index_path = active.offset_index.path
    index_path.unlink(missing_ok=True)
    index_path.mkdir()  # the append to it fails (EISDIR) as a failing disk would
    with caplog.at_level(logging.WARNING, logger="fluvial.broker.log.segment"):
        tablet.close()
    assert any("not completed" in r.getMessage() for r in caplog.records)
    index_path.rmdir()
    reopened = open_tablet(directory, index_interval_bytes=1, segment_bytes=1 << 20)
    assert all_rows(reopened).equals(reference)
    [segment] = reopened._view.segments
    assert len(segment.offset_index) == 5
    reopened.close()
