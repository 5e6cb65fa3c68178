"""Coalesced appends that cannot be written: they were given offsets (and producer state)
before their write, so a failed write takes the tablet offline, fails every waiting
acknowledgement and loses nothing acknowledged; a tablet closed or deleted with pending
appends answers their waits."""
from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from fluvial.broker.log import BatchMeta, FlushPolicy, LogConfig, LogTablet
from fluvial.broker.tables import GroupCommit
from fluvial.errors import StorageError
from tests.unit.test_log_coalesced import kafka_rows


def _meta() -> BatchMeta:
    return BatchMeta(-1, 0, 0, -1, -1)


def _break_writes(tablet: LogTablet) -> None:
    """The active segment's descriptor becomes read-only: the next write fails (EBADF)."""
    segment = tablet._view.segments[-1]
    os.close(segment._fd)
    segment._fd = os.open(segment.data_path, os.O_RDONLY)


def test_a_failed_write_of_pending_appends_takes_the_tablet_offline(tmp_path):
    tablet = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK))
    tablet.append(kafka_rows([b"a"], 1, 1), _meta())
    tablet.flush()
    for i in range(3):
        tablet.append(kafka_rows([b"k"], 2 + i, 2 + i), _meta(), coalesce=True)
    assert tablet.log_end_offset == 4
    _break_writes(tablet)
    with pytest.raises(StorageError):
        tablet.write_pending()
    assert tablet.failure is not None
    # Nothing takes the offsets the pending appends were given, nothing is acknowledged.
    with pytest.raises(StorageError):
        tablet.append(kafka_rows([b"x"], 9, 9), _meta())
    with pytest.raises(StorageError):
        tablet.flush_up_to(4)
    assert tablet.high_watermark == 1
    tablet.close()
    reopened = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK))
    assert reopened.log_end_offset == 1
    assert [s.meta.base_offset for s in reopened.read(0, 1 << 20)] == [0]
    reopened.close()


def _waits(tablet: LogTablet, action) -> list:
    """Coalesced appends with a wait each (as acks=all produces have), then ``action``; how
    every wait ended (None: durable, or the exception)."""
    async def run():
        with ThreadPoolExecutor(1) as executor:
            commit = GroupCommit(tablet, executor)
            waits = []
            for i in range(3):
                written = tablet.append(kafka_rows([b"k"], i, i), _meta(), coalesce=True)
                waits.append(commit.wait_durable(written.next_offset))
            action()
            done, pending = await asyncio.wait(waits, timeout=5)
            assert not pending, "a wait was never answered"
            return [w.exception() for w in waits]
    return asyncio.run(run())


def test_waits_of_pending_appends_fail_when_their_write_fails(tmp_path):
    tablet = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK))
    tablet.append(kafka_rows([b"a"], 1, 1), _meta())
    tablet.flush()
    outcomes = _waits(tablet, lambda: _break_writes(tablet))
    assert all(isinstance(e, StorageError) for e in outcomes), outcomes
    tablet.close()


def test_waits_of_pending_appends_are_answered_when_the_tablet_closes(tmp_path):
    tablet = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK))
    outcomes = _waits(tablet, tablet.close)
    # close() writes and flushes them: durable.
    assert outcomes == [None, None, None]
    reopened = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK))
    assert reopened.log_end_offset == 3
    reopened.close()


def test_waits_of_pending_appends_fail_when_the_tablet_is_deleted(tmp_path):
    tablet = LogTablet.open(tmp_path / "b", LogConfig(flush_policy=FlushPolicy.ACK))
    outcomes = _waits(tablet, tablet.delete)
    assert all(isinstance(e, StorageError) for e in outcomes), outcomes


def test_an_unexpected_error_writing_pending_appends_takes_the_tablet_offline(tmp_path, monkeypatch):
    """Whatever fails while the pending appends are converted (here: memory runs out), their
    offsets were handed out: the tablet goes offline and their waits fail, instead of the
    offsets going to later appends and the flush never running again."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from fluvial.broker import kafka_batches
    from fluvial.protocol.records import parse_batch_header

    def wire_batch(value: bytes):
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        b.append(0, timestamp=1000, key=b"k", value=value, headers=[])
        wire = memoryview(bytes(b.build()))
        return kafka_batches.to_wire_records(wire, parse_batch_header(wire))

    def out_of_memory(items):
        raise MemoryError("out of memory converting records")

    tablet = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK))
    tablet.append(kafka_rows([b"a"], 1, 1), _meta())
    tablet.flush()

    async def run():
        with ThreadPoolExecutor(1) as executor:
            commit = GroupCommit(tablet, executor)
            waits = []
            for i in range(3):
                records, meta = wire_batch(b"v%d" % i)
                written = tablet.append(records, meta, coalesce=True)
                waits.append(commit.wait_durable(written.next_offset))
            monkeypatch.setattr(kafka_batches.WireRecords, "convert_together", staticmethod(out_of_memory))
            done, pending = await asyncio.wait(waits, timeout=5)
            assert not pending, "a wait was never answered"
            return [w.exception() for w in waits]

    outcomes = asyncio.run(run())
    assert all(isinstance(e, StorageError) for e in outcomes), outcomes
    assert tablet.failure is not None
    with pytest.raises(StorageError):
        tablet.append(kafka_rows([b"x"], 9, 9), _meta())
    tablet.close()
