"""Segment format: batch messages carry their BatchMeta and checksum; garbage never parses."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.broker.log import BatchMeta
from fluvial.broker.log.segment_format import (
    SegmentFormatError,
    checksum_matches,
    encode_batch,
    parse_batch_header,
    read_batch,
    read_schema_message,
    schema_checksum,
)

metas = st.builds(
    BatchMeta,
    base_offset=st.integers(0, 2**62),
    last_offset_delta=st.integers(0, 2**31 - 1),
    record_count=st.integers(0, 2**31 - 1),
    base_timestamp=st.integers(-1, 2**62),
    max_timestamp=st.integers(-1, 2**62),
    producer_id=st.integers(-1, 2**62),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
    attributes=st.integers(0, 2**15 - 1),
    partition_leader_epoch=st.integers(-1, 2**31 - 1),
    schema_id=st.integers(-1, 2**31 - 1),
)


def segment_bytes(batch: pa.RecordBatch, meta: BatchMeta) -> tuple[bytes, int]:
    encoded = encode_batch(batch, meta)
    data = encoded.schema_message + encoded.header + encoded.body.to_pybytes()
    return data, len(encoded.schema_message)


@settings(max_examples=100, deadline=None)
@given(meta=metas, values=st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=1, max_size=30))
def test_batch_meta_and_rows_round_trip(meta, values):
    batch = pa.record_batch({"_offset": pa.array(range(len(values)), pa.int64()), "value": pa.array(values, pa.binary())})
    data, schema_length = segment_bytes(batch, meta)
    view = memoryview(data)

    length, schema = read_schema_message(view, len(data))
    header = parse_batch_header(view, length, len(data))

    assert length == schema_length and schema == batch.schema
    assert header.meta == meta and header.end == len(data)
    assert checksum_matches(view, header, schema_checksum(data[:length]))
    assert read_batch(pa.py_buffer(data), header, schema).equals(batch)
    # Plain pyarrow sees an ordinary stream with the metadata attached.
    [(read_back, custom)] = list(ipc.open_stream(pa.py_buffer(data)).iter_batches_with_custom_metadata())
    assert read_back.equals(batch) and BatchMeta.decode(custom[b"fluvial.batch"]) == meta


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_damaged_batches_are_rejected_not_misread(data):
    batch = pa.record_batch({"_offset": pa.array([1, 2, 3], pa.int64()), "value": pa.array([b"a", b"bb", None])})
    raw, schema_length = segment_bytes(batch, BatchMeta(1, 2, 3, 10, 20, producer_id=5))
    damaged = bytearray(raw)
    position = data.draw(st.integers(schema_length, len(raw) - 1))
    damaged[position] ^= data.draw(st.integers(1, 255))
    view = memoryview(bytes(damaged))
    try:
        header = parse_batch_header(view, schema_length, len(view))
    except SegmentFormatError:
        return
    assert not checksum_matches(view, header, schema_checksum(raw[:schema_length]))


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=600), position=st.integers(0, 64))
def test_garbage_raises_only_segment_format_error(garbage, position):
    view = memoryview(garbage)
    for parse in (lambda: parse_batch_header(view, position, len(view)), lambda: read_schema_message(view, len(view))):
        try:
            parse()
        except SegmentFormatError:
            pass


def test_a_changed_schema_invalidates_the_batch_checksum():
    batch = pa.record_batch({"_offset": pa.array([1], pa.int64())})
    raw, schema_length = segment_bytes(batch, BatchMeta(0, 0, 1, 0, 0))
    header = parse_batch_header(memoryview(raw), schema_length, len(raw))
    assert not checksum_matches(memoryview(raw), header, schema_checksum(raw[:schema_length] + b"x"))


@given(st.lists(st.integers(-2**63, 2**63 - 1) | st.sampled_from([-1, 0]), min_size=12, max_size=12))
@settings(max_examples=300, deadline=None)
def test_batch_meta_text_is_version_then_fields_then_optional_fields_unless_default(values):
    meta = BatchMeta(*values)
    fields, optional = values[:11], [v for v in values[11:] if v != -1]
    assert meta.encode() == ";".join(["1", *map(str, fields + optional)]).encode()
    assert BatchMeta.decode(meta.encode()) == meta


def _fresh_writer_bytes(batch: pa.RecordBatch, custom: dict) -> tuple[bytes, bytes]:
    """The schema and batch messages as a new pyarrow stream writer writes them."""
    sink = pa.BufferOutputStream()
    writer = ipc.new_stream(sink, batch.schema, options=ipc.IpcWriteOptions(use_threads=False))
    writer.write_batch(batch, custom_metadata=custom)
    data = sink.getvalue().to_pybytes()
    schema_length = 8 + int.from_bytes(data[4:8], "little")
    return data[:schema_length], data[schema_length:]


@settings(max_examples=60, deadline=None)
@given(metas=st.lists(metas, min_size=1, max_size=40),
       sizes=st.lists(st.integers(0, 6000), min_size=1, max_size=40),
       typed=st.booleans(), stats=st.binary(max_size=30))
def test_small_batches_through_the_kept_writer_are_byte_identical_to_a_fresh_writer(metas, sizes, typed, stats):
    # Small batches are encoded by a stream writer kept per schema (and thread), whose
    # buffer fills message after message and is replaced when full; what it gives must be
    # exactly what a new writer per batch gives, the checksum included.
    from fluvial.broker.log.segment_format import _CRC_PLACEHOLDER, CRC_KEY, META_KEY
    from fluvial.broker.log.statistics import STATS_KEY
    for i, meta in enumerate(metas):
        n = sizes[i % len(sizes)] // 100 + 1
        columns = {"_offset": pa.array(range(n), pa.int64()),
                   "value": pa.array([b"v" * (sizes[i % len(sizes)] % 97)] * n, pa.binary())}
        if typed:
            columns["x"] = pa.array([float(i)] * n, pa.float64())
        batch = pa.record_batch(columns)
        encoded = encode_batch(batch, meta, stats)
        custom = {META_KEY: meta.encode(), CRC_KEY: _CRC_PLACEHOLDER}
        if stats:
            custom[STATS_KEY] = stats
        schema_message, message = _fresh_writer_bytes(batch, custom)
        assert encoded.schema_message == schema_message
        produced = encoded.header + encoded.body.to_pybytes()
        assert len(produced) == len(message)
        header = parse_batch_header(memoryview(encoded.schema_message + produced), len(schema_message),
                                    len(schema_message) + len(produced))
        crc_at = header.crc_at
        # Identical but for the checksum text, which covers the rest and is checked as well.
        assert produced[:crc_at] == message[:crc_at] and produced[crc_at + 8:] == message[crc_at + 8:]
        data = encoded.schema_message + produced
        assert checksum_matches(memoryview(data), header, schema_checksum(schema_message))
        assert read_batch(pa.py_buffer(data), header, batch.schema).equals(batch)


def test_the_kept_writer_starts_a_new_buffer_when_full_and_earlier_messages_stay_intact():
    from fluvial.broker.log import segment_format
    meta = BatchMeta(0, 0, 1, 0, 0)
    encoded = []
    # Enough 2 KB batches to fill several of the writer's buffers.
    rounds = 3 * segment_format._ENCODER_BUFFER_BYTES // 2048
    for i in range(rounds):
        batch = pa.record_batch({"_offset": pa.array([i], pa.int64()), "value": pa.array([bytes([i % 251]) * 2048])})
        encoded.append((batch, encode_batch(batch, meta)))
    for batch, e in encoded:
        data = e.schema_message + e.header + e.body.to_pybytes()
        header = parse_batch_header(memoryview(data), len(e.schema_message), len(data))
        assert checksum_matches(memoryview(data), header, schema_checksum(e.schema_message))
        assert read_batch(pa.py_buffer(data), header, batch.schema).equals(batch)


@settings(max_examples=25, deadline=None)
@given(metas=st.lists(metas, min_size=1, max_size=6),
       sizes=st.lists(st.integers(24 * 1024, 300 * 1024), min_size=1, max_size=6),
       offset=st.integers(0, 5), nulls=st.booleans(),
       # Statistics are JSON numbers in the broker: never the checksum placeholder text.
       stats=st.binary(max_size=30).filter(lambda b: b"CRC?" not in b))
def test_large_batches_gathered_from_their_buffers_are_byte_identical_to_a_fresh_writer(metas, sizes, offset,
                                                                                     nulls, stats):
    # Large uncompressed batches are not copied into a message buffer: the body is written
    # from the column buffers themselves (gathered). The bytes must be a new writer's, for
    # sliced columns (non-zero offsets, which the writer rebases) and nested ones too.
    from fluvial.broker.log import segment_format
    from fluvial.broker.log.segment_format import _CRC_PLACEHOLDER, CRC_KEY, META_KEY
    from fluvial.broker.log.statistics import STATS_KEY
    headers_type = pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]))
    for i, meta in enumerate(metas):
        size = sizes[i % len(sizes)]
        n = size // 1000 + 1
        values = [None if nulls and j % 7 == 3 else bytes([j % 251]) * (size // n) for j in range(n + offset)]
        batch = pa.record_batch({
            "_offset": pa.array(range(n + offset), pa.int64()),
            "_key": pa.array([None if j % 3 else b"k%d" % j for j in range(n + offset)], pa.binary()),
            "_headers": pa.array([[{"key": "h", "value": b"v%d" % j}] if j % 2 else [] for j in range(n + offset)],
                                 headers_type),
            "value": pa.array(values, pa.binary()),
        }).slice(offset, n)
        assert batch.get_total_buffer_size() > segment_format._REUSED_MAX_BATCH_BYTES
        encoded = encode_batch(batch, meta, stats)
        assert len(encoded.body_parts) > 1  # gathered, not one message buffer
        custom = {META_KEY: meta.encode(), CRC_KEY: _CRC_PLACEHOLDER}
        if stats:
            custom[STATS_KEY] = stats
        schema_message, message = _fresh_writer_bytes(batch, custom)
        assert encoded.schema_message == schema_message
        produced = encoded.header + b"".join(bytes(memoryview(p)) for p in encoded.body_parts)
        assert len(produced) == len(message) == encoded.size
        data = encoded.schema_message + produced
        header = parse_batch_header(memoryview(data), len(schema_message), len(data))
        crc_at = header.crc_at
        assert produced[:crc_at] == message[:crc_at] and produced[crc_at + 8:] == message[crc_at + 8:]
        assert checksum_matches(memoryview(data), header, schema_checksum(schema_message))
        assert read_batch(pa.py_buffer(data), header, batch.schema).equals(batch)


def _large_batch() -> pa.RecordBatch:
    from fluvial.broker.log import segment_format
    n = 40
    batch = pa.record_batch({"_offset": pa.array(range(n), pa.int64()),
                             "value": pa.array([bytes([j]) * 2000 for j in range(n)], pa.binary())})
    assert batch.get_total_buffer_size() > segment_format._REUSED_MAX_BATCH_BYTES
    return batch


def test_a_gather_writer_that_fails_falls_back_to_one_message_buffer_and_is_reopened():
    """If the kept gather writer raises, the batch is still encoded (through one message
    buffer, same bytes) and the next large batch gets a fresh gather writer."""
    from fluvial.broker.log import segment_format

    batch = _large_batch()
    meta = BatchMeta(0, 39, 0, -1, -1)
    expected = encode_batch(batch, meta)
    encoder = segment_format._gatherers.get(batch.schema)

    class Broken:
        def write_batch(self, *_args, **_kwargs):
            raise pa.ArrowIOError("sink failed")

    encoder._writer = Broken()
    fallback = encode_batch(batch, meta)
    assert len(fallback.body_parts) == 1  # the message-buffer path
    assert fallback.header == expected.header and bytes(fallback.body) == bytes(expected.body)
    again = encode_batch(batch, meta)
    assert len(again.body_parts) > 1 and not isinstance(encoder._writer, Broken)
    assert again.header == expected.header and bytes(again.body) == bytes(expected.body)


def test_a_short_gather_write_is_finished(tmp_path, monkeypatch):
    """pwritev may write less than asked (huge batches): the rest is written after it."""
    import os

    from fluvial.broker.log import segment

    parts = [b"head", memoryview(b"0123456789" * 100), pa.py_buffer(b"tail" * 50)]
    real_pwritev = os.pwritev
    monkeypatch.setattr(segment.os, "pwritev", lambda fd, bufs, pos: real_pwritev(fd, [bytes(bufs[0])[:3]], pos))
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, b"X" * 7, 0)
        assert segment.pwrite_parts(fd, parts, 7) == 4 + 1000 + 200
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"X" * 7 + b"head" + b"0123456789" * 100 + b"tail" * 50


def test_a_column_named_like_the_checksum_placeholder_is_stored_and_checked():
    """Statistics name the columns: a column called like the checksum's placeholder text
    puts that text twice in the header, and the checksum still goes in its own field."""
    from fluvial.broker.log.segment_format import _CRC_PLACEHOLDER
    from fluvial.broker.log.statistics import compute_stats
    batch = pa.record_batch({"_offset": pa.array(range(3), pa.int64()),
                             _CRC_PLACEHOLDER.decode(): pa.array([1, 2, 3], pa.int64())})
    for compression in ("none", "zstd"):
        encoded = encode_batch(batch, BatchMeta(0, 2, 3, 0, 0), compute_stats(batch), compression=compression)
        data = encoded.schema_message + encoded.header + encoded.body.to_pybytes()
        header = parse_batch_header(memoryview(data), len(encoded.schema_message), len(data))
        assert checksum_matches(memoryview(data), header, schema_checksum(encoded.schema_message))
        assert _CRC_PLACEHOLDER in encoded.header  # the column's name in the statistics
        assert read_batch(pa.py_buffer(data), header, batch.schema).equals(batch)


_INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
_METAS = st.lists(st.builds(
    BatchMeta, _INT64, _INT64, _INT64, _INT64, _INT64, _INT64, _INT64, _INT64, _INT64, _INT64, _INT64,
    st.one_of(st.just(-1), _INT64), st.one_of(st.just(-1), _INT64)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(_METAS)
def test_compiled_parts_text_is_the_python_text_and_decodes_back(metas):
    from fluvial.broker.log import batch_meta

    assert batch_meta._native is not None, "the compiled BatchMeta text encoder is not built"
    text = batch_meta._native.encode_parts(metas)
    assert text == batch_meta.encode_parts_py(metas)
    assert batch_meta.encode_parts(tuple(metas)) == text
    if metas:
        assert batch_meta.decode_parts(text) == tuple(metas)


def test_parts_text_of_fields_beyond_int64_falls_back_to_python():
    from fluvial.broker.log import batch_meta

    metas = [BatchMeta(1, 0, 1, 5, 5), BatchMeta(2, 0, 1, 1 << 64, 5)]
    assert batch_meta.encode_parts(metas) == batch_meta.encode_parts_py(metas) == (
        b"1;1;0;1;5;5;-1;-1;-1;0;0;-1\n1;2;0;1;%d;5;-1;-1;-1;0;0;-1" % (1 << 64))


def test_parts_text_of_objects_that_are_not_batch_metas_is_read_by_name():
    import dataclasses

    from fluvial.broker.log import batch_meta

    @dataclasses.dataclass
    class Lookalike:  # another class: its fields are looked up by name
        base_offset: int = 7
        last_offset_delta: int = 1
        record_count: int = 2
        base_timestamp: int = 3
        max_timestamp: int = 4
        producer_id: int = 5
        producer_epoch: int = 6
        base_sequence: int = 8
        attributes: int = 0
        partition_leader_epoch: int = 9
        schema_id: int = -1
        producer_record_count: int = 3
        delete_horizon_ms: int = -1

    metas = [BatchMeta(1, 0, 1, 5, 5), Lookalike()]
    assert batch_meta._native.encode_parts(metas) == (
        b"1;1;0;1;5;5;-1;-1;-1;0;0;-1\n1;7;1;2;3;4;5;6;8;0;9;-1;3")
