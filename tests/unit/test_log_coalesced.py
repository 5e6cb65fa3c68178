"""Coalesced appends: small Kafka batches of one flush window stored as one message.

A coalesced log and a log of the same batches stored one message each must read back the
same through every reader of the log: reads from any offset, batch metadata (producer
state), statistics, timestamp lookups, recovery, compaction and the remote log's upload.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.broker import kafka_batches
from fluvial.broker.log import BatchMeta, FlushPolicy, LogConfig, LogTablet
from fluvial.broker.log.batch_meta import ATTR_TRANSACTIONAL
from fluvial.broker.log.cleaner import CompactionConfig, clean
from fluvial.broker.log.segment_format import PARTS_KEY
from fluvial.errors import FluvialError
from fluvial.broker.producer_state import ProducerStateManager
from fluvial.tiering.remote_segment import local_segment_batches

SCHEMA = kafka_batches.stored_schema()
TS = pa.timestamp("ms", tz="UTC")


def kafka_rows(keys: list[bytes], ts: int, tag: int) -> pa.RecordBatch:
    n = len(keys)
    return pa.record_batch([
        pa.array(np.arange(ts, ts + n, dtype=np.int64)).cast(TS),
        pa.array(np.zeros(n, np.int8)),
        pa.array(keys, pa.binary()),
        pa.array([[{"key": "h", "value": b"%d" % tag}] if tag % 2 else [] for _ in range(n)],
                 kafka_batches.HEADERS_TYPE),
        pa.array([b"value-%d-%d" % (tag, i) for i in range(n)], pa.binary()),
    ], schema=SCHEMA)


# One batch as a produce request brings it: rows (keys), timestamp, producer, attributes.
batch_specs = st.lists(st.tuples(
    st.lists(st.sampled_from([b"a", b"b", b"c", b"d"]), min_size=1, max_size=4),
    st.integers(0, 10_000),                   # timestamp
    st.integers(-1, 3),                       # producer id (-1: not idempotent)
    st.sampled_from([0, 2, ATTR_TRANSACTIONAL]),  # attributes (producer codec, transactional)
    st.booleans(),                            # write the pending ones after this batch
), min_size=1, max_size=30)


def append_all(tablet: LogTablet, specs, coalesce: bool) -> list[BatchMeta]:
    sequences: dict[int, int] = {}
    written = []
    for tag, (keys, ts, pid, attributes, cut) in enumerate(specs):
        seq = sequences.get(pid, 0) if pid >= 0 else -1
        if pid >= 0:
            sequences[pid] = seq + len(keys)
        meta = BatchMeta(-1, 0, 0, -1, -1, producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                         base_sequence=seq, attributes=attributes if pid >= 0 else attributes & 7)
        written.append(tablet.append(kafka_rows(keys, ts, tag), meta, coalesce=coalesce))
        if coalesce and cut:
            tablet.write_pending()
    tablet.write_pending()
    return written


def open_log(path, **config) -> LogTablet:
    config.setdefault("segment_bytes", 3000)
    return LogTablet.open(path, LogConfig(flush_policy=FlushPolicy.NONE, retention_ms=-1, **config))


def everything(tablet: LogTablet, start: int | None = None, max_bytes: int = 1 << 20) -> list:
    out = []
    offset = tablet.log_start_offset if start is None else start
    while offset < tablet.log_end_offset:
        stored = tablet.read(offset, max_bytes)
        assert stored
        out.extend((s.meta, s.batch) for s in stored)
        offset = stored[-1].meta.next_offset
    return out


def assert_same_reads(legacy: LogTablet, coalesced: LogTablet) -> None:
    assert coalesced.log_end_offset == legacy.log_end_offset
    end = legacy.log_end_offset
    mine, theirs = everything(coalesced), everything(legacy)
    assert [m for m, _ in mine] == [m for m, _ in theirs]
    for (meta, a), (_, b) in zip(mine, theirs):
        assert a.equals(b), meta
    for offset in range(0, end, max(1, end // 7)):
        assert [m for m, _ in everything(coalesced, offset, 200)] == [m for m, _ in everything(legacy, offset, 200)]
    assert list(coalesced.batch_metas()) == list(legacy.batch_metas())
    assert [m for m, _ in coalesced.batch_statistics(3)] == [m for m, _ in legacy.batch_statistics(3)]
    for ts in (0, 77, 5000, 10_002, 20_000):
        assert coalesced.offset_for_timestamp(ts) == legacy.offset_for_timestamp(ts)
    assert coalesced.max_timestamp() == legacy.max_timestamp()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=batch_specs)
def test_coalesced_and_separate_appends_read_back_the_same(tmp_path_factory, specs):
    base = tmp_path_factory.mktemp("log")
    legacy, coalesced = open_log(base / "legacy"), open_log(base / "coalesced")
    written_legacy = append_all(legacy, specs, coalesce=False)
    written = append_all(coalesced, specs, coalesce=True)
    assert written == written_legacy  # the answers' offsets
    assert_same_reads(legacy, coalesced)
    # Producer state rebuilt from either log agrees (duplicates answered with their offsets).
    rebuilt = [ProducerStateManager() for _ in range(2)]
    for manager, tablet in zip(rebuilt, (legacy, coalesced)):
        manager.rebuild(tablet.batch_metas(0), 0)
    last_of_producer = {meta.producer_id: meta for meta in written if meta.producer_id >= 0}
    for meta in last_of_producer.values():
        a, b = rebuilt[0].check_meta(meta), rebuilt[1].check_meta(meta)
        assert a == b and b is not None and b.base_offset == meta.base_offset
    # After a reopen with every index gone (full recovery), and after a clean reopen.
    for tablet in (legacy, coalesced):
        tablet.close()
        for name in os.listdir(tablet.directory):
            if name.endswith((".index", ".timeindex")) or name == "recovery-point.checkpoint":
                os.unlink(tablet.directory / name)
    legacy, coalesced = open_log(base / "legacy"), open_log(base / "coalesced")
    assert_same_reads(legacy, coalesced)
    legacy.close()
    coalesced.close()


def test_a_coalesced_message_is_one_ipc_message_with_each_kafka_batch(tmp_path):
    tablet = open_log(tmp_path, segment_bytes=1 << 20)
    metas = [tablet.append(kafka_rows([b"k"], 100 + i, i), BatchMeta(-1, 0, 0, -1, -1, producer_id=7,
                                                                      producer_epoch=0, base_sequence=i),
                           coalesce=True) for i in range(12)]
    assert tablet.log_end_offset == 12 and tablet.pending_records == 12
    assert tablet.read(0, 1 << 20) == []  # not written yet: nothing to read
    tablet.write_pending()
    [segment] = tablet.segment_infos()
    with ipc.open_stream(segment.path) as reader:
        messages = list(reader.iter_batches_with_custom_metadata())
    assert len(messages) == 1 and messages[0].batch.num_rows == 12
    assert messages[0].custom_metadata[PARTS_KEY].count(b"\n") == 11
    assert [s.meta for s in tablet.read(0, 1 << 20)] == metas
    assert [s.meta for s in tablet.read(5, 1 << 20)] == metas[5:]
    # Any Arrow reader sees the rows with their offsets.
    assert messages[0].batch.column("_offset").to_pylist() == list(range(12))


def test_torn_coalesced_message_is_cut_on_recovery(tmp_path):
    tablet = open_log(tmp_path, segment_bytes=1 << 20)
    for i in range(3):
        tablet.append(kafka_rows([b"k"], i, i), BatchMeta(-1, 0, 0, -1, -1), coalesce=True)
    tablet.write_pending()
    tablet.flush()
    for i in range(3, 15):
        tablet.append(kafka_rows([b"k"], i, i), BatchMeta(-1, 0, 0, -1, -1), coalesce=True)
    tablet.write_pending()
    [segment] = tablet.segment_infos()
    size = segment.size_bytes
    # No clean close: the second message is torn part-way through its body.
    with open(segment.path, "r+b") as f:
        f.truncate(size - 40)
    reopened = open_log(tmp_path, segment_bytes=1 << 20)
    assert reopened.log_end_offset == 3
    assert [s.meta.base_offset for s in reopened.read(0, 1 << 20)] == [0, 1, 2]
    # New appends continue right after what survived.
    assert reopened.append(kafka_rows([b"k"], 99, 99), BatchMeta(-1, 0, 0, -1, -1)).base_offset == 3


def test_compaction_of_coalesced_segments_matches_separate_ones(tmp_path):
    config = CompactionConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=0)
    specs = [([b"k%d" % (i % 5)], 1000 + i, -1, 0, i % 4 == 0) for i in range(80)]
    legacy, coalesced = open_log(tmp_path / "legacy"), open_log(tmp_path / "coalesced")
    append_all(legacy, specs, coalesce=False)
    append_all(coalesced, specs, coalesce=True)
    for tablet in (legacy, coalesced):
        tablet.roll()
        assert clean(tablet, config, force=True) is not None
    assert_same_reads(legacy, coalesced)


def test_remote_upload_of_a_coalesced_segment_sees_each_kafka_batch(tmp_path):
    specs = [([b"a", b"b"][: 1 + i % 2], 10 * i, i % 3, 0, i % 5 == 0) for i in range(40)]
    legacy, coalesced = (open_log(tmp_path / name, segment_bytes=1 << 20) for name in ("legacy", "coalesced"))
    append_all(legacy, specs, coalesce=False)
    append_all(coalesced, specs, coalesce=True)
    end = legacy.log_end_offset
    mine = list(local_segment_batches(coalesced, 0, end))
    theirs = list(local_segment_batches(legacy, 0, end))
    assert [s.meta for s, _ in mine] == [s.meta for s, _ in theirs]
    assert all(a.batch.equals(b.batch) for (a, _), (b, _) in zip(mine, theirs))


def test_pending_appends_are_written_by_close_and_flush(tmp_path):
    tablet = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK))
    tablet.append(kafka_rows([b"k"], 1, 1), BatchMeta(-1, 0, 0, -1, -1), coalesce=True)
    assert tablet.high_watermark == 0
    tablet.flush()
    assert tablet.high_watermark == 1 and tablet.pending_records == 0
    tablet.append(kafka_rows([b"k"], 2, 2), BatchMeta(-1, 0, 0, -1, -1), coalesce=True)
    # A plain append writes the pending ones first, so offsets stay in order.
    assert tablet.append(kafka_rows([b"k", b"l"], 3, 3), BatchMeta(-1, 0, 0, -1, -1)).base_offset == 2
    tablet.append(kafka_rows([b"k"], 4, 4), BatchMeta(-1, 0, 0, -1, -1), coalesce=True)
    tablet.close()
    reopened = LogTablet.open(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK))
    assert [s.meta.base_offset for s in reopened.read(0, 1 << 20)] == [0, 1, 2, 4]


# -- Kafka batches converted together --------------------------------------------------------

wire_record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=20)),
    st.one_of(st.none(), st.binary(max_size=60)),
    st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=6))), max_size=2),
    st.integers(0, 5_000),
)


def kafka_batch(rows, codec: int, base_ms: int) -> memoryview:
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 24)
    for i, (k, v, h, dt) in enumerate(rows):
        b.append(i, timestamp=base_ms + dt, key=k, value=v, headers=h)
    return memoryview(bytes(b.build()))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(wire_record, min_size=1, max_size=5), st.sampled_from([0, 1, 2, 4]),
                          st.integers(0, 10**6)), min_size=1, max_size=8))
def test_kafka_batches_converted_together_equal_each_converted_alone(batches):
    from fluvial.protocol.records import parse_batch_header
    alone, lazy = [], []
    for rows, codec, base_ms in batches:
        wire = kafka_batch(rows, codec, 1_700_000_000_000 + base_ms)
        header = parse_batch_header(wire)
        records, meta = kafka_batches.to_arrow(wire, header)
        checked, checked_meta = kafka_batches.to_wire_records(wire, header)
        assert checked_meta == meta and checked.num_rows == records.num_rows
        stamps = records.column("_timestamp").cast(pa.int64()).to_pylist()
        assert (checked.first_timestamp, checked.max_timestamp) == (stamps[0], max(stamps))
        alone.append(records)
        lazy.append(checked)
    together = kafka_batches.WireRecords.convert_together(lazy)
    assert together.equals(pa.concat_batches(alone))


def test_a_bad_kafka_batch_is_refused_when_checked_not_when_written():
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from fluvial.errors import InvalidRecordError
    from fluvial.protocol.records import parse_batch_header
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=1, key=None, value=b"a", headers=[])
    b.append(5, timestamp=1, key=None, value=b"b", headers=[])
    wire = memoryview(bytes(b.build()))
    import pytest
    with pytest.raises(InvalidRecordError):
        kafka_batches.to_wire_records(wire, parse_batch_header(wire))
    truncated = bytearray(kafka_batch([(b"k", b"v" * 30, [], 0)], 0, 1000))
    header = parse_batch_header(memoryview(truncated))
    with pytest.raises(FluvialError):
        kafka_batches.to_wire_records(memoryview(truncated)[:-10], header)


def test_checked_kafka_batches_and_arrow_batches_coalesce_into_one_message(tmp_path):
    from fluvial.protocol.records import parse_batch_header
    legacy, coalesced = open_log(tmp_path / "legacy"), open_log(tmp_path / "coalesced")
    for i in range(30):
        wire = kafka_batch([(b"k%d" % i, b"v" * i, [("h", b"x")] if i % 3 else [], i)], i % 2, 5000 + i)
        header = parse_batch_header(wire)
        meta = kafka_batches.to_arrow(wire, header)[1]
        legacy.append(kafka_batches.to_arrow(wire, header)[0], meta)
        source = kafka_batches.to_wire_records(wire, header)[0] if i % 4 else kafka_batches.to_arrow(wire, header)[0]
        coalesced.append(source, meta, coalesce=True)
        if i % 10 == 9:
            coalesced.write_pending()
    assert_same_reads(legacy, coalesced)
    assert len(list(coalesced._view.segments[0].headers_from(len(coalesced._view.segments[0].schema_message),
                                                              coalesced._view.segments[0].state))) <= 3


def test_cached_headers_of_a_segment_are_bounded_by_kafka_batches(tmp_path, monkeypatch):
    """Under many one-record producers each coalesced message holds tens of Kafka batches:
    the segment's cache of parsed headers counts those, not messages, so the BatchMetas it
    keeps alive (objects the garbage collector walks) stay bounded; reads are unchanged."""
    from fluvial.broker.log import segment as segment_module
    monkeypatch.setattr(segment_module, "_HEADER_CACHE_BATCHES", 64)
    tablet = open_log(tmp_path, segment_bytes=1 << 24)
    metas = []
    for window in range(40):
        for i in range(20):
            seq = window * 20 + i
            metas.append(tablet.append(kafka_rows([b"k"], seq, seq), BatchMeta(
                -1, 0, 0, -1, -1, producer_id=7, producer_epoch=0, base_sequence=seq), coalesce=True))
        tablet.write_pending()
        [segment] = tablet._view.segments
        assert sum(len(h.metas) for h in segment._headers.values()) <= 64
    assert [s.meta for s in tablet.read(0, 1 << 24)] == metas
    assert list(tablet.batch_metas(0)) == metas
    assert [s.meta for s in tablet.read(777, 1 << 24)] == metas[777:]
    [segment] = tablet._view.segments
    assert 0 < sum(len(h.metas) for h in segment._headers.values()) <= 64
    tablet.close()
