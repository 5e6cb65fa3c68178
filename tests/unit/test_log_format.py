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
