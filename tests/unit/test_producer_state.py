"""Idempotent producer state: sequence checks, duplicates, epochs, snapshots, rebuild, ids."""
from __future__ import annotations

import asyncio
import errno
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.broker.log import BatchMeta, LogConfig, LogTablet
from fluvial.broker.metadata import MetadataStore
from fluvial.broker.producer_state import (
    INT32_MAX, Duplicate, ProducerIdManager, ProducerStateManager, ProducerStateRegistry,
    last_sequence, list_snapshots,
)
from fluvial.errors import FluvialError, OutOfOrderSequenceError, ProducerFencedError, StorageError
from fluvial.protocol.errors import ErrorCode

PID = 4000


def append(state: ProducerStateManager, log: list, epoch: int, base_seq: int, count: int, pid: int = PID):
    """What the produce path does: check, then append at the log end and record."""
    last = last_sequence(base_seq, count - 1)
    dup = state.check(pid, epoch, base_seq, last)
    if dup is not None:
        return dup
    base = len(log)
    log.extend((pid, epoch, base_seq + i) for i in range(count))
    state.update(pid, epoch, base_seq, last, base, base + count - 1, timestamp=1)
    return Duplicate(base, base + count - 1)  # where it went, same shape as a duplicate answer


def test_unknown_producer_may_start_anywhere_then_must_be_in_sequence():
    s, log = ProducerStateManager(), []
    append(s, log, 0, 17, 3)            # sequences 17..19
    append(s, log, 0, 20, 2)
    with pytest.raises(OutOfOrderSequenceError) as gap:
        s.check(PID, 0, 23, 23)
    assert gap.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert s.check(PID, 0, 22, 24) is None


def test_retries_of_the_last_five_batches_get_their_original_offsets():
    s, log = ProducerStateManager(), []
    placed = [append(s, log, 0, seq, 2) for seq in range(0, 14, 2)]  # seven batches
    for i in range(2, 7):
        assert s.check(PID, 0, 2 * i, 2 * i + 1) == placed[i]
    # Older than the five remembered: neither a known duplicate nor in sequence.
    with pytest.raises(OutOfOrderSequenceError):
        s.check(PID, 0, 2, 3)
    assert len(log) == 14


def test_stale_epoch_is_fenced_and_new_epoch_starts_at_zero():
    s, log = ProducerStateManager(), []
    append(s, log, 3, 0, 5)
    with pytest.raises(ProducerFencedError) as fenced:
        s.check(PID, 2, 5, 5)
    assert fenced.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    with pytest.raises(OutOfOrderSequenceError):
        s.check(PID, 4, 5, 5)
    append(s, log, 4, 0, 1)
    # The new epoch forgets the old one's batches: a retry of epoch 3 is now fenced.
    with pytest.raises(ProducerFencedError):
        s.check(PID, 3, 0, 4)


def test_sequence_wraps_after_int32_max():
    s, log = ProducerStateManager(), []
    append(s, log, 0, INT32_MAX - 1, 2)
    assert s.check(PID, 0, 0, 9) is None
    assert last_sequence(INT32_MAX - 1, 4) == 2
    append(s, log, 0, 0, 3)
    assert s.check(PID, 0, 0, 2) == Duplicate(2, 4)


def test_producers_are_independent():
    s, log = ProducerStateManager(), []
    append(s, log, 0, 0, 1, pid=1)
    append(s, log, 0, 0, 1, pid=2)
    assert s.check(1, 0, 0, 0) == Duplicate(0, 0)
    assert s.check(2, 0, 0, 0) == Duplicate(1, 1)
    assert s.check(2, 0, 1, 1) is None


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=30),
    retries=st.lists(st.tuples(st.integers(0, 29), st.integers(0, 10)), max_size=40),
)
def test_retried_batches_are_never_written_twice(sizes, retries):
    """A producer sends batches in order; retries of anything in flight (the last five) are
    interleaved. The log holds every sequence exactly once, in order, and each retry is
    answered with the offsets of the original."""
    s, log = ProducerStateManager(), []
    placed: list[Duplicate] = []
    bases = []
    seq = 0
    retry_at: dict[int, list[int]] = {}
    for after, back in retries:
        retry_at.setdefault(after, []).append(back)
    for i, n in enumerate(sizes):
        bases.append(seq)
        placed.append(append(s, log, 0, seq, n))
        seq += n
        for back in retry_at.get(i, []):
            j = i - back
            if j < 0:
                continue
            if i - j < 5:
                assert append(s, log, 0, bases[j], sizes[j]) == placed[j]
            else:
                with pytest.raises(OutOfOrderSequenceError):
                    append(s, log, 0, bases[j], sizes[j])
    assert [entry[2] for entry in log] == list(range(seq))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 2**40), st.tuples(st.integers(0, 100), st.integers(0, 20)), max_size=20))
def test_snapshot_round_trip(producers):
    s, log = ProducerStateManager(), []
    for pid, (epoch, n) in producers.items():
        for k in range(n):
            append(s, log, epoch, k * 3, 3, pid=pid)
    next_offset, restored = ProducerStateManager.decode_snapshot(s.encode_snapshot())
    assert next_offset == s.next_offset
    assert {p: (e.epoch, list(e.batches), e.last_timestamp) for p, e in restored.items()} == {
        p: (e.epoch, list(e.batches), e.last_timestamp) for p, e in s.producers.items()}


def test_corrupt_snapshot_is_refused():
    s, log = ProducerStateManager(), []
    append(s, log, 0, 0, 4)
    data = bytearray(s.encode_snapshot())
    data[-1] ^= 0xFF
    with pytest.raises(ValueError):
        ProducerStateManager.decode_snapshot(bytes(data))


# -- with a real log tablet -------------------------------------------------------------


class BucketOnDisk:
    """The part of a broker bucket the registry uses: its log tablet."""

    def __init__(self, directory, config: LogConfig | None = None):
        self.tablet = LogTablet.open(directory, config or LogConfig())


def rows(n: int) -> pa.RecordBatch:
    return pa.record_batch({
        "_timestamp": pa.array([1_700_000_000_000 + i for i in range(n)], pa.timestamp("ms", tz="UTC")),
        "value": pa.array([b"v%d" % i for i in range(n)], pa.binary()),
    })


def produce(registry: ProducerStateRegistry, bucket: BucketOnDisk, epoch: int, base_seq: int, n: int,
            pid: int = PID) -> int:
    meta = BatchMeta(base_offset=-1, last_offset_delta=n - 1, record_count=n, base_timestamp=-1,
                     max_timestamp=-1, producer_id=pid, producer_epoch=epoch, base_sequence=base_seq)
    dup = registry.check(bucket, meta)
    if dup is not None:
        return dup.base_offset
    written = bucket.tablet.append(rows(n), meta)
    registry.record(bucket, written)
    return written.base_offset


@pytest.mark.parametrize("with_snapshot", [True, False])
def test_state_survives_reopen_from_snapshot_or_log(tmp_path, with_snapshot):
    bucket = BucketOnDisk(tmp_path / "t-0")
    registry = ProducerStateRegistry()
    offsets = [produce(registry, bucket, 0, seq, 10) for seq in range(0, 60, 10)]
    produce(registry, bucket, 0, 0, 4, pid=77)
    if with_snapshot:
        ProducerStateRegistry.write_snapshots(registry.prepare_snapshots())
        assert [o for o, _ in list_snapshots(tmp_path / "t-0")] == [bucket.tablet.log_end_offset]
        # Appends after the snapshot are replayed from the log on reopen.
        offsets.append(produce(registry, bucket, 0, 60, 10))
    bucket.tablet.close()

    reopened = BucketOnDisk(tmp_path / "t-0")
    registry2 = ProducerStateRegistry()
    end = reopened.tablet.log_end_offset
    # A retry of the newest batches is recognised; nothing is appended.
    assert produce(registry2, reopened, 0, 50, 10) == offsets[5]
    if with_snapshot:
        assert produce(registry2, reopened, 0, 60, 10) == offsets[6]
    assert produce(registry2, reopened, 0, 0, 4, pid=77) == 60
    assert reopened.tablet.log_end_offset == end
    with pytest.raises(OutOfOrderSequenceError):
        produce(registry2, reopened, 0, 200, 1)
    next_seq = 70 if with_snapshot else 60
    assert produce(registry2, reopened, 0, next_seq, 1) == end
    reopened.tablet.close()


def test_snapshot_ahead_of_a_truncated_log_is_ignored(tmp_path):
    bucket = BucketOnDisk(tmp_path / "t-0")
    registry = ProducerStateRegistry()
    produce(registry, bucket, 0, 0, 5)
    manager = registry.manager(bucket)
    manager.next_offset = 1_000  # claims to cover offsets the log does not have
    manager.write_snapshot()
    bucket.tablet.close()
    reopened = BucketOnDisk(tmp_path / "t-0")
    loaded = ProducerStateRegistry.load(reopened)
    assert loaded.next_offset == 5 and loaded.check(PID, 0, 0, 4) == Duplicate(0, 4)
    reopened.tablet.close()


def test_snapshot_at_segment_roll_bounds_the_replay(tmp_path, caplog):
    """Each roll snapshots the state (on the loop, written by an I/O thread); reopening after
    a crash replays only the batches after the newest snapshot."""
    config = LogConfig(segment_bytes=4096)

    async def write():
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as io:
            registry = ProducerStateRegistry(io_executor=io, loop=loop)
            bucket = BucketOnDisk(tmp_path / "t-0", config)
            seq = 0
            while len(bucket.tablet.segment_infos()) < 4:
                produce(registry, bucket, 0, seq, 20)
                seq += 20
                await asyncio.sleep(0)  # the roll's snapshot is taken on the loop
            produce(registry, bucket, 0, 0, 20, pid=PID + 1)  # after the last roll
            for _ in range(1000):  # the I/O thread writes it; a busy machine may take a while
                await asyncio.sleep(0.01)
                snapshots = list_snapshots(tmp_path / "t-0")
                if snapshots and snapshots[-1][0] >= bucket.tablet.segment_infos()[-1].base_offset:
                    break
            return bucket, seq

    bucket, seq = asyncio.run(write())
    active = bucket.tablet.segment_infos()[-1]
    snapshots = list_snapshots(tmp_path / "t-0")
    assert len(snapshots) == 2, "only the newest snapshots are kept"
    assert active.base_offset <= snapshots[-1][0] < active.next_offset
    # kill -9: no close, no snapshot at stop.
    reopened = BucketOnDisk(tmp_path / "t-0", config)
    with caplog.at_level("INFO", logger="fluvial.broker.producer_state"):
        manager = ProducerStateRegistry.load(reopened)
    replayed = [r.getMessage() for r in caplog.records if "rebuilt producer state" in r.getMessage()]
    assert replayed and int(replayed[0].split()[-2]) <= 2, replayed
    assert manager.check(PID, 0, seq - 20, seq - 1) is not None   # the last batch before it
    assert manager.check(PID + 1, 0, 0, 19) is not None           # replayed from the log
    assert manager.check(PID, 0, seq, seq) is None                # in sequence


def test_stale_snapshot_past_the_log_end_falls_back_to_an_older_one(tmp_path):
    bucket = BucketOnDisk(tmp_path / "t-0")
    registry = ProducerStateRegistry()
    produce(registry, bucket, 0, 0, 5)
    manager = registry.manager(bucket)
    manager.write_snapshot()
    produce(registry, bucket, 0, 5, 5)
    manager.next_offset = 1_000  # e.g. the log lost its unflushed tail after a power loss
    manager.write_snapshot()
    assert [o for o, _ in list_snapshots(tmp_path / "t-0")] == [5, 1_000]
    bucket.tablet.close()
    loaded = ProducerStateRegistry.load(BucketOnDisk(tmp_path / "t-0"))
    assert loaded.check(PID, 0, 5, 9) == Duplicate(5, 9) and loaded.check(PID, 0, 0, 4) == Duplicate(0, 4)
    assert [o for o, _ in list_snapshots(tmp_path / "t-0")] == [5]


def test_pk_changelog_meta_keeps_the_producers_sequence_span():
    """A primary-key batch stores m changelog rows for the producer's n records."""
    s = ProducerStateManager()
    written = BatchMeta(base_offset=10, last_offset_delta=34, record_count=35, base_timestamp=1, max_timestamp=1,
                        producer_id=PID, producer_epoch=0, base_sequence=20, producer_record_count=20)
    assert BatchMeta.decode(written.encode()) == written
    s.apply(written)
    assert s.check(PID, 0, 20, 39) == Duplicate(10, 44)
    assert s.check(PID, 0, 40, 40) is None
    noop = BatchMeta(base_offset=45, last_offset_delta=-1, record_count=0, base_timestamp=-1, max_timestamp=-1,
                     producer_id=PID, producer_epoch=0, base_sequence=40, producer_record_count=5)
    s.apply(noop)
    assert s.check(PID, 0, 40, 44) == Duplicate(45, 44)
    assert s.check(PID, 0, 45, 45) is None
    plain = BatchMeta(0, 2, 3, 1, 1, PID, 0, 0)
    assert b";".join(plain.encode().split(b";")[:12]) == plain.encode(), "no optional field when unused"


def test_an_unlogged_batch_whose_snapshot_fails_is_forgotten_and_refused(tmp_path):
    """A no-op write leaves nothing in the log: if its snapshot cannot be written it must
    not be acknowledged, nor taken for a duplicate when retried."""
    bucket = BucketOnDisk(tmp_path / "t-0")
    produce_pid = PID

    async def run():
        with ThreadPoolExecutor(1) as io:
            registry = ProducerStateRegistry(io_executor=io, loop=asyncio.get_running_loop())
            produce(registry, bucket, 0, 0, 5, pid=produce_pid)
            noop = BatchMeta(base_offset=5, last_offset_delta=-1, record_count=0, base_timestamp=-1,
                             max_timestamp=-1, producer_id=produce_pid, producer_epoch=0, base_sequence=5,
                             producer_record_count=3)
            registry.record(bucket, noop)
            manager = registry.manager(bucket)
            assert manager.check(produce_pid, 0, 5, 7) == Duplicate(5, 4)

            def disk_full(prepared=None):
                raise OSError(errno.ENOSPC, "No space left on device")

            manager.write_snapshot = disk_full
            with pytest.raises(StorageError):
                await registry.persist_unlogged(bucket, noop)
            del manager.write_snapshot
            assert manager.check(produce_pid, 0, 5, 7) is None  # applied anew when retried
            registry.record(bucket, noop)
            await registry.persist_unlogged(bucket, noop)
            return [o for o, _ in list_snapshots(tmp_path / "t-0")]

    assert asyncio.run(run()) == [5]
    loaded = ProducerStateRegistry.load(BucketOnDisk(tmp_path / "t-0"))
    assert loaded.check(PID, 0, 5, 7) == Duplicate(5, 4)


def test_silent_producers_expire():
    s, log = ProducerStateManager(), []
    append(s, log, 0, 0, 1, pid=1)
    s.update(2, 0, 0, 0, 1, 1, timestamp=10_000)
    assert s.remove_expired(now_ms=5_000, expiration_ms=1_000) == 1
    assert set(s.producers) == {2}


# -- producer ids -------------------------------------------------------------------------


def test_producer_ids_are_unique_across_restarts(tmp_path):
    store = MetadataStore(tmp_path / "m.db")
    ids = ProducerIdManager(store)
    first = [ids.init_producer_id(None, 60_000).producer_id for _ in range(5)]
    store.close()
    store2 = MetadataStore(tmp_path / "m.db")
    ids2 = ProducerIdManager(store2)
    second = [ids2.init_producer_id(None, 60_000) for _ in range(5)]
    assert all(p.producer_epoch == 0 for p in second)
    assert len(set(first) | {p.producer_id for p in second}) == 10
    assert min(p.producer_id for p in second) > max(first)
    store2.close()


def test_transactional_id_keeps_its_producer_id_and_bumps_the_epoch(tmp_path):
    store = MetadataStore(tmp_path / "m.db")
    ids = ProducerIdManager(store)
    a = ids.init_producer_id("tx-1", 60_000)
    b = ids.init_producer_id("tx-1", 60_000)
    assert b.producer_id == a.producer_id and b.producer_epoch == a.producer_epoch + 1
    # The current instance may bump its own epoch; the fenced one may not.
    c = ids.init_producer_id("tx-1", 60_000, b.producer_id, b.producer_epoch)
    assert c.producer_epoch == b.producer_epoch + 1
    with pytest.raises(ProducerFencedError) as fenced:
        ids.init_producer_id("tx-1", 60_000, a.producer_id, a.producer_epoch)
    assert fenced.value.code == ErrorCode.PRODUCER_FENCED
    with pytest.raises(FluvialError) as bad:
        ids.init_producer_id("tx-2", 10**9)
    assert bad.value.code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    store.close()
    again = ProducerIdManager(MetadataStore(tmp_path / "m.db")).init_producer_id("tx-1", 60_000)
    assert again.producer_id == a.producer_id and again.producer_epoch == c.producer_epoch + 1
