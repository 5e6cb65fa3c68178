"""Log tablet under concurrent use: readers beside an appender, shared fsyncs, interval flushes."""
from __future__ import annotations

import random
import threading

import pyarrow as pa

from fluvial.broker.log import FlushPolicy, LogConfig, LogTablet
from fluvial.errors import OffsetOutOfRangeError
from tests.unit.test_log_support import meta, open_tablet, records

BATCHES = 250


def check_batches(stored, tablet) -> None:
    """Every returned batch is whole, in order, and holds what its producer wrote."""
    previous_end = None
    for s in stored:
        offsets = s.batch.column("_offset").to_pylist()
        assert offsets == list(range(s.meta.base_offset, s.meta.next_offset))
        if previous_end is not None:
            assert s.meta.base_offset == previous_end
        previous_end = s.meta.next_offset
        tag = s.meta.producer_id
        assert s.batch.column("amount").to_pylist() == [tag * 1000 + i for i in range(s.meta.record_count)]


def test_readers_see_consistent_batches_while_an_appender_rolls_segments(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=16 * 1024, index_interval_bytes=1024)
    done = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    def append() -> None:
        try:
            for i in range(BATCHES):
                tablet.append(records(1 + i % 9, value_size=100 + i % 50, tag=i), meta(producer_id=i))
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)
        finally:
            done.set()

    def read(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not done.is_set() or reads[0] < 50:
                end = tablet.log_end_offset
                offset = rng.randint(0, end)
                stored = tablet.read(offset, rng.choice([1, 2000, 1 << 20]))
                if offset == end:
                    assert stored == [] or stored[0].meta.base_offset == end
                else:
                    assert stored[0].meta.base_offset <= offset < stored[0].meta.next_offset
                check_batches(stored, tablet)
                tablet.read(offset, 1 << 16, columns=["_offset", "amount"])
                reads[0] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=append)] + [threading.Thread(target=read, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert not errors, errors[0]
    assert len(tablet.segment_infos()) > 3
    check_batches(tablet.read(0, 1 << 40), tablet)
    assert tablet.log_end_offset == sum(1 + i % 9 for i in range(BATCHES))


def test_readers_and_retention_on_other_threads(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=8 * 1024, retention_ms=-1, retention_bytes=32 * 1024)
    done = threading.Event()
    errors: list[BaseException] = []

    def append_and_expire() -> None:
        try:
            for i in range(BATCHES):
                tablet.append(records(5, value_size=150, tag=i), meta(producer_id=i))
                if i % 10 == 0:
                    tablet.enforce_retention(0)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def read() -> None:
        try:
            while not done.is_set():
                start = tablet.log_start_offset
                try:
                    check_batches(tablet.read(start, 1 << 20), tablet)
                except OffsetOutOfRangeError:
                    # Only legitimate when retention moved the start past what we asked for.
                    assert tablet.log_start_offset > start
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=append_and_expire), threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert not errors, errors[0]
    assert tablet.log_start_offset > 0
    tablet.enforce_retention(0)
    assert 32 * 1024 <= tablet.size_bytes < (32 + 8) * 1024


def test_one_flush_covers_every_append_before_it(tmp_path):
    tablet = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK))
    first = tablet.append(records(2), meta())
    tablet.append(records(2), meta())
    last = tablet.append(records(2), meta())
    assert tablet.flushed_offset == 0

    tablet.flush_up_to(first.next_offset)

    # The fsync for the first append made the later ones durable too: their waits return at once.
    assert tablet.flushed_offset == last.next_offset


def test_concurrent_flush_waiters_all_return_durable(tmp_path):
    tablet = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK, segment_bytes=4096))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def produce(tag: int) -> None:
        try:
            for i in range(30):
                with lock:  # the broker serialises appends per tablet
                    written = tablet.append(records(3, tag=tag * 100 + i), meta())
                tablet.flush_up_to(written.next_offset)
                assert tablet.flushed_offset >= written.next_offset
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert not errors, errors[0]
    assert tablet.flushed_offset == tablet.log_end_offset == 4 * 30 * 3


def test_interval_policy_flushes_when_due(tmp_path):
    tablet = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.INTERVAL, flush_interval_ms=1000))
    tablet.append(records(2), meta())
    now = tablet._last_flush_ms
    assert not tablet.maybe_flush(now + 10)
    assert tablet.flushed_offset == 0
    assert tablet.maybe_flush(now + 1000)
    assert tablet.flushed_offset == 2
    assert not tablet.maybe_flush(now + 5000)  # nothing new to flush


def test_reads_are_zero_copy_views_that_outlive_retention(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4096, retention_ms=-1, retention_bytes=0)
    for i in range(20):
        tablet.append(records(5, value_size=100, tag=i), meta(producer_id=i))
    held = tablet.read(0, 1 << 20)
    tablet.enforce_retention(0)
    assert tablet.log_start_offset > 0
    # Deleted files stay mapped while batches still reference them.
    check_batches(held, tablet)
    assert pa.concat_arrays([s.batch.column("_offset") for s in held]).to_pylist()[0] == 0
