"""Two flushes of one log tablet under way at once: the later one syncs the appends written
after the earlier began, but the flushed offset (what readers see and what acks=all answers
wait for) moves only in the order the flushes began, and never past a failed one."""
from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from fluvial.broker.log import FlushPolicy, fault_injection
from fluvial.broker.tables import Bucket, Table
from fluvial.errors import StorageError
from tests.unit.test_log_support import meta, open_tablet, records


class _HeldFirstFsync:
    """The first segment fsync waits until released (then fails when told to); later ones
    go through at once."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = False
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, path) -> None:
        with self._lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            self.entered.set()
            assert self.release.wait(10)
            if self.fail:
                raise OSError(5, "Input/output error")


def _flush_in_thread(tablet, offset: int) -> tuple[threading.Thread, list]:
    outcome: list = []

    def run() -> None:
        try:
            tablet.flush_up_to(offset)
            outcome.append(None)
        except StorageError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _second_flush_beside_a_held_first(tmp_path, monkeypatch, fail: bool):
    """Three records flushed by a thread whose fsync is held, then four more flushed by
    another thread: (tablet, held fsync, first thread and outcome, second thread and outcome)."""
    held = _HeldFirstFsync()
    held.fail = fail
    monkeypatch.setattr(fault_injection, "before_fsync", held)
    tablet = open_tablet(tmp_path / "t-0", flush_policy=FlushPolicy.ACK)
    tablet.append(records(3), meta())
    first, first_outcome = _flush_in_thread(tablet, 3)
    assert held.entered.wait(10)
    tablet.append(records(4), meta())
    second, second_outcome = _flush_in_thread(tablet, 7)
    return tablet, held, first, first_outcome, second, second_outcome


def test_a_later_flush_is_published_only_after_the_earlier_one(tmp_path, monkeypatch):
    tablet, held, first, first_outcome, second, second_outcome = \
        _second_flush_beside_a_held_first(tmp_path, monkeypatch, fail=False)
    # The second fsync runs beside the held first one (it does not queue behind it) ...
    deadline = threading.Event()
    for _ in range(500):
        if held.calls >= 2:
            break
        deadline.wait(0.01)
    assert held.calls == 2
    second.join(0.3)
    # ... but finishing first, it is not published: nothing is visible yet.
    assert second.is_alive() and tablet.high_watermark == 0 and tablet.flushed_offset == 0
    held.release.set()
    first.join(10)
    second.join(10)
    assert first_outcome == [None] and second_outcome == [None]
    assert tablet.flushed_offset == tablet.high_watermark == 7


def test_a_later_flush_never_covers_an_earlier_failed_one(tmp_path, monkeypatch):
    tablet, held, first, first_outcome, second, second_outcome = \
        _second_flush_beside_a_held_first(tmp_path, monkeypatch, fail=True)
    second.join(0.3)
    held.release.set()
    first.join(10)
    second.join(10)
    # The second fsync succeeded, but the kernel may have dropped the first one's pages:
    # neither flush counts, and the tablet is offline.
    assert isinstance(first_outcome[0], StorageError) and isinstance(second_outcome[0], StorageError)
    assert tablet.flushed_offset == tablet.high_watermark == 0
    with pytest.raises(StorageError, match="offline"):
        tablet.check_online()


def _shares_open_file(fd: int, other: int) -> bool:
    """Whether two descriptors are one open file (a dup): a status flag set through one is
    seen through the other only then."""
    fcntl.fcntl(other, fcntl.F_SETFL, fcntl.fcntl(other, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        return bool(fcntl.fcntl(other, fcntl.F_GETFL) & os.O_NONBLOCK)
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)


def test_two_flushes_in_flight_sync_through_open_files_of_their_own(tmp_path, monkeypatch):
    """Linux reports a write-back error once per open file. Two flushes in flight that
    shared one (or shared the append descriptor's) could see a lost write reported to one
    of them only, and the other would publish its offset as durable."""
    real_fdatasync = os.fdatasync
    synced: list[int] = []
    first_entered, release = threading.Event(), threading.Event()
    shared: list[bool] = []
    tablet = open_tablet(tmp_path / "t-0", flush_policy=FlushPolicy.ACK)

    def fdatasync(fd: int) -> None:
        synced.append(fd)
        if len(synced) == 1:
            first_entered.set()
            assert release.wait(10)
        else:
            append = tablet._view.segments[-1]._fd
            shared.extend([_shares_open_file(fd, synced[0]), _shares_open_file(fd, append),
                           _shares_open_file(synced[0], append)])
            release.set()
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    tablet.append(records(3), meta())
    first, first_outcome = _flush_in_thread(tablet, 3)
    assert first_entered.wait(10)
    tablet.append(records(4), meta())
    second, second_outcome = _flush_in_thread(tablet, 7)
    first.join(10)
    second.join(10)
    assert first_outcome == [None] and second_outcome == [None]
    assert len(synced) == 2 and shared == [False, False, False]
    assert tablet.high_watermark == 7


def _bucket(tmp_path, executor) -> Bucket:
    table = Table("t", uuid.uuid4(), {}, 0)
    bucket = Bucket(table, 0, open_tablet(tmp_path / "t-0", flush_policy=FlushPolicy.ACK), executor)
    table.buckets.append(bucket)
    return bucket


@pytest.mark.parametrize("first_fails", [False, True])
def test_group_commit_starts_a_second_flush_while_one_is_held(tmp_path, monkeypatch, first_fails):
    held = _HeldFirstFsync()
    held.fail = first_fails
    monkeypatch.setattr(fault_injection, "before_fsync", held)
    executor = ThreadPoolExecutor(4)

    async def scenario():
        bucket = _bucket(tmp_path, executor)
        loop = asyncio.get_running_loop()
        bucket.append(records(3), meta())
        first = bucket.group_commit.wait_durable(3)
        assert await loop.run_in_executor(None, held.entered.wait, 10)
        bucket.append(records(4), meta())
        second = bucket.group_commit.wait_durable(7)
        # A second flush began for the newer append (it did not wait for the held one) ...
        for _ in range(500):
            if held.calls >= 2:
                break
            await asyncio.sleep(0.01)
        assert held.calls == 2
        await asyncio.sleep(0.2)
        # ... and is not answered before the first.
        assert not first.done() and not second.done()
        held.release.set()
        return await asyncio.gather(first, second, return_exceptions=True), bucket

    try:
        outcomes, bucket = asyncio.run(scenario())
    finally:
        executor.shutdown()
    if first_fails:
        assert all(isinstance(o, StorageError) for o in outcomes), outcomes
        assert bucket.tablet.high_watermark == 0
    else:
        assert outcomes == [None, None]
        assert bucket.tablet.high_watermark == 7
