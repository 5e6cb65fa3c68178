"""The zstd record-batch writer: what it writes is Arrow IPC that pyarrow reads back as the
batch, for any schema the log stores, as pyarrow's own compressing writer's output reads."""
from __future__ import annotations

import decimal
import os
import struct
import threading

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.broker.log.flatbuffer_read import deref, field, root, vector_span
from fluvial.broker.log import ipc_compression
from fluvial.broker.log.ipc_compression import MIN_COMPRESSED_BUFFER_BYTES, compress_record_batch
from fluvial.broker.log.segment_format import (
    _custom_metadata,
    checksum_matches,
    encode_batch,
    parse_batch_header,
    read_batch,
    schema_checksum,
)
from tests.unit.test_log_support import meta

CODECS = ("zstd", "lz4")
CUSTOM = {b"fluvial.batch": b"envelope", b"k": b"", b"longer key": b"v" * 13}


def _read(schema: pa.Schema, header: bytes, body: bytes) -> pa.RecordBatch:
    """Read a message as any Arrow reader does: a stream of the schema and the message."""
    return ipc.open_stream(schema.serialize().to_pybytes() + header + body).read_next_batch()


def _arrow_written(batch: pa.RecordBatch, codec: str) -> pa.RecordBatch:
    """The batch through pyarrow's own compressing writer and reader."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema, options=ipc.IpcWriteOptions(compression=codec)) as writer:
        writer.write_batch(batch)
    return ipc.open_stream(sink.getvalue()).read_next_batch()


# Random schemas of the types tables store, nested a few levels, with random values (from
# small alphabets, so that repeated rows make buffers worth compressing) and nulls.
_LEAVES = [
    (pa.int8(), st.integers(-128, 127)),
    (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    (pa.uint16(), st.integers(0, 2**16 - 1)),
    (pa.float32(), st.floats(width=32, allow_nan=False)),
    (pa.float64(), st.floats(allow_nan=False)),
    (pa.bool_(), st.booleans()),
    (pa.string(), st.text(alphabet="abcé☃", max_size=12)),
    (pa.large_string(), st.text(alphabet="xyz", max_size=30)),
    (pa.binary(), st.binary(max_size=20)),
    (pa.large_binary(), st.binary(max_size=5)),
    (pa.string_view(), st.text(alphabet="pq", max_size=40)),  # inline and out-of-line views
    (pa.binary(4), st.binary(min_size=4, max_size=4)),
    (pa.decimal128(10, 2), st.decimals(min_value=-10**7, max_value=10**7, places=2, allow_nan=False,
                                       allow_infinity=False).map(lambda d: d.quantize(decimal.Decimal("0.01")))),
    (pa.date32(), st.integers(-10**5, 10**5)),
    (pa.timestamp("us", tz="UTC"), st.integers(0, 2**50)),
    (pa.time64("us"), st.integers(0, 86_400 * 10**6 - 1)),
    (pa.null(), st.none()),
]


def _nullable(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), values)


@st.composite
def _typed_values(draw, depth: int = 0) -> tuple[pa.DataType, st.SearchStrategy]:
    kinds = ["leaf"] * 4 + (["list", "large_list", "fixed_list", "struct", "map"] if depth < 2 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "leaf":
        return draw(st.sampled_from(_LEAVES))
    if kind == "struct":
        children = [draw(_typed_values(depth + 1)) for _ in range(draw(st.integers(1, 3)))]
        struct_type = pa.struct([pa.field(f"f{i}", t) for i, (t, _) in enumerate(children)])
        return struct_type, st.fixed_dictionaries({f"f{i}": _nullable(v) for i, (_, v) in enumerate(children)})
    item_type, item_values = draw(_typed_values(depth + 1))
    if kind == "list":
        return pa.list_(item_type), st.lists(_nullable(item_values), max_size=4)
    if kind == "large_list":
        return pa.large_list(item_type), st.lists(_nullable(item_values), max_size=4)
    if kind == "fixed_list":
        return pa.list_(item_type, 2), st.lists(_nullable(item_values), min_size=2, max_size=2)
    key_type, key_values = draw(st.sampled_from(_LEAVES[:4] + _LEAVES[7:8]))
    return pa.map_(key_type, item_type), st.lists(st.tuples(key_values, _nullable(item_values)), max_size=3)


@st.composite
def batches(draw) -> pa.RecordBatch:
    """A batch of random columns; rows repeated to make buffers compressible; perhaps sliced."""
    columns = [draw(_typed_values()) for _ in range(draw(st.integers(1, 5)))]
    rows = draw(st.integers(0, 12))
    repeat = draw(st.sampled_from([1, 1, 8, 40]))
    arrays = []
    for type_, values in columns:
        drawn = draw(st.lists(_nullable(values), min_size=rows, max_size=rows))
        arrays.append(pa.array(drawn * repeat, type=type_))
    batch = pa.RecordBatch.from_arrays(arrays, names=[f"c{i}" for i in range(len(arrays))])
    if batch.num_rows and draw(st.booleans()):
        start = draw(st.integers(0, batch.num_rows))
        batch = batch.slice(start, draw(st.integers(0, batch.num_rows - start)))
    return batch


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=batches())
def test_written_batches_read_back_as_pyarrows_own_writer_reads_them(batch):
    message = compress_record_batch(batch, CUSTOM)
    assert len(message.header) % 8 == 0 and len(message.body) % 8 == 0
    got = _read(batch.schema, message.header, message.body)
    got.validate(full=True)
    assert got.equals(batch)
    assert got.equals(_arrow_written(batch, "zstd"))
    # The header says what it holds: the codec, the custom metadata, the body's length.
    parsed = ipc.read_message(message.header + message.body)
    assert parsed.metadata_version == ipc.MetadataVersion.V5 and parsed.body.size == len(message.body)
    header = memoryview(message.header)[8:]
    spans = _custom_metadata(header, root(header))
    assert {key: bytes(header[start:end]) for key, (start, end) in spans.items()} == CUSTOM


def _stored_buffers(message) -> list[tuple[int, bytes]]:
    """Each buffer of a message's body: its length prefix (-1: stored as it is) and bytes."""
    meta = memoryview(message.header)[8:]
    record_batch = deref(meta, field(meta, root(meta), 2))
    start, end = vector_span(meta, record_batch, 2, 16)
    spans = struct.unpack_from(f"<{(end - start) // 8}q", meta, start)
    out = []
    for offset, size in zip(spans[::2], spans[1::2]):
        assert offset % 8 == 0
        if size:
            out.append((struct.unpack_from("<q", message.body, offset)[0], message.body[offset + 8 : offset + size]))
    return out


def test_buffers_that_do_not_shrink_are_stored_uncompressed():
    random_values = pa.array([os.urandom(64) for _ in range(200)], pa.binary(64))
    batch = pa.record_batch([random_values, pa.array(["the same text"] * 200), pa.array([None, True] * 100, pa.bool_())],
                            names=["random", "text", "tiny"])
    message = compress_record_batch(batch, CUSTOM)
    random_data, text_offsets, text_data, tiny_validity, tiny_data = _stored_buffers(message)
    assert random_data == (-1, random_values.buffers()[1].to_pybytes())
    # Compressed: the prefix is the uncompressed length, the bytes are smaller.
    assert text_data[0] == 200 * len("the same text") and len(text_data[1]) < 100
    assert text_data[1][:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    assert text_offsets[0] == 201 * 4
    assert tiny_validity[0] == -1 and tiny_data[0] == -1  # under MIN_COMPRESSED_BUFFER_BYTES
    assert len(tiny_data[1]) < MIN_COMPRESSED_BUFFER_BYTES
    assert _read(batch.schema, message.header, message.body).equals(batch)


def test_buffers_that_shrink_by_less_than_the_minimum_saving_are_stored_uncompressed():
    """Random doubles: zstd's frame is a few percent smaller than the buffer (the sign and
    exponent bits are not random), under 1/MIN_SAVING_FRACTION: stored as they are, and
    so in the next batches of that schema; doubles of a few distinct values are compressed.
    Through the log's encoding too: the segment reads back."""
    rng = np.random.default_rng(5)
    doubles = pa.array(rng.uniform(-1e12, 1e12, 4000))
    few = pa.array(rng.choice([0.5, 1.25, 3.0], 4000))
    raw = doubles.buffers()[1].to_pybytes()
    frame = zstandard.ZstdCompressor(level=ipc_compression.ZSTD_LEVEL).compress(raw)
    # The premise: the frame saves something, but less than the minimum.
    assert len(raw) - len(raw) // ipc_compression.MIN_SAVING_FRACTION < len(frame) < len(raw)
    batch = pa.record_batch([doubles, few], names=["random", "few"])
    key = pa.schema(batch.schema)
    for _ in range(3):
        message = compress_record_batch(batch, CUSTOM, schema=key)
        (random_length, random_bytes), (few_length, few_bytes) = _stored_buffers(message)
        assert (random_length, random_bytes) == (-1, raw)
        assert few_length == 4000 * 8 and len(few_bytes) < 4000
        assert _read(batch.schema, message.header, message.body).equals(batch)
    encoded = encode_batch(batch, meta(record_count=4000, last_offset_delta=3999), b"", compression="zstd")
    segment = encoded.schema_message + encoded.header + encoded.body.to_pybytes()
    header = parse_batch_header(memoryview(segment), len(encoded.schema_message), len(segment))
    assert read_batch(pa.py_buffer(segment), header, batch.schema).equals(batch)
    assert ipc.open_stream(segment).read_all().equals(pa.Table.from_batches([batch]))


def test_a_buffer_that_did_not_shrink_is_not_tried_again_for_a_while():
    """The buffer that zstd could not shrink is stored as it is, without a try, in the next
    INCOMPRESSIBLE_SKIP_BATCHES batches of the same schema (object); then tried again. Every
    message reads back as its batch."""
    schema = pa.schema([pa.field("payload", pa.binary(64)), pa.field("text", pa.string())])
    text = pa.array(["the same text"] * 200)

    def batch(payload: bytes) -> pa.RecordBatch:
        return pa.record_batch([pa.array([payload] * 200 if len(payload) == 64 else
                                         [os.urandom(64) for _ in range(200)], pa.binary(64)), text],
                               schema=schema)

    def stored(message) -> list[int]:
        return [length for length, _ in _stored_buffers(message)]

    skips = ipc_compression.INCOMPRESSIBLE_SKIP_BATCHES
    key = pa.schema(schema)  # the caller's kept schema object
    first = batch(b"")
    message = compress_record_batch(first, CUSTOM, schema=key)
    assert stored(message)[0] == -1 and stored(message)[2] > 0
    assert _read(schema, message.header, message.body).equals(first)
    repetitive = batch(b"x" * 64)  # would shrink now, but is not tried
    for _ in range(skips):
        message = compress_record_batch(repetitive, CUSTOM, schema=key)
        assert stored(message)[0] == -1 and stored(message)[2] > 0
        assert _read(schema, message.header, message.body).equals(repetitive)
    # Under another schema object the buffer is tried at once.
    assert stored(compress_record_batch(repetitive, CUSTOM, schema=pa.schema(schema)))[0] == 200 * 64
    message = compress_record_batch(repetitive, CUSTOM, schema=key)  # tried again, and it shrinks
    assert stored(message)[0] == 200 * 64
    assert _read(schema, message.header, message.body).equals(repetitive)
    assert stored(compress_record_batch(repetitive, CUSTOM, schema=key))[0] == 200 * 64


def test_writes_do_not_depend_on_the_thread_or_what_it_compressed_before():
    batch = pa.record_batch([pa.array([f"value {i % 97}" for i in range(5000)]), pa.array(range(5000))],
                            names=["s", "n"])
    first = compress_record_batch(batch, CUSTOM)
    compress_record_batch(pa.record_batch([pa.array(["other"] * 3000)], names=["x"]), CUSTOM, level=3)
    assert compress_record_batch(batch, CUSTOM) == first
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        [compress_record_batch(batch, CUSTOM) for _ in range(20)])) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(message == first for result in results for message in result)


@pytest.mark.parametrize("codec", CODECS)
def test_stored_batches_carry_checksum_and_metadata_and_read_back(codec):
    batch = pa.record_batch([pa.array(range(3000)), pa.array([["a", None, "b"]] * 3000)], names=["_offset", "tags"])
    encoded = encode_batch(batch, meta(record_count=3000, last_offset_delta=2999), b"", compression=codec)
    assert encoded.compressed
    segment = encoded.schema_message + encoded.header + encoded.body.to_pybytes()
    # The schema message is the one a stream writer starts with: segments compare it by value.
    assert encoded.schema_message == encode_batch(batch, meta()).schema_message
    header = parse_batch_header(memoryview(segment), len(encoded.schema_message), len(segment))
    assert header.compressed and header.meta.record_count == 3000
    assert checksum_matches(memoryview(segment), header, schema_checksum(encoded.schema_message))
    damaged = bytearray(segment)
    damaged[-20] ^= 1
    assert not checksum_matches(memoryview(damaged), header, schema_checksum(encoded.schema_message))
    assert read_batch(pa.py_buffer(segment), header, batch.schema).equals(batch)
    projected = read_batch(pa.py_buffer(segment), header, batch.schema, [1], encoded.schema_message)
    assert projected.column(0).equals(batch.column(1))
    assert ipc.open_stream(segment).read_all().equals(pa.Table.from_batches([batch]))


def test_a_batch_of_another_schema_than_the_stored_one_is_refused():
    batch = pa.record_batch([pa.array(range(3000))], names=["a"])
    with pytest.raises(ValueError):
        encode_batch(batch, meta(), compression="zstd", schema=pa.schema([("a", pa.int32())]))


def test_a_codec_failure_is_a_value_error_the_log_tablet_handles(monkeypatch):
    class Failing:
        def multi_compress_to_buffer(self, segments):
            raise zstandard.ZstdError("out of memory")

    monkeypatch.setattr(ipc_compression._compressors, "get", lambda level: Failing())
    batch = pa.record_batch([pa.array(range(3000))], names=["a"])
    with pytest.raises(ValueError, match="zstd compression"):
        encode_batch(batch, meta(), compression="zstd")


def test_batches_are_laid_out_in_the_threads_kept_buffer_as_serialize_lays_them_out(monkeypatch):
    """The layout buffer is reused from batch to batch (no fresh pages per batch), grows for
    a larger batch, leaves batches above its limit to a buffer of their own, and what a
    write returns never refers to it."""
    layout = ipc_compression._LayoutBuffer()
    monkeypatch.setattr(ipc_compression, "_layout", layout)
    small = pa.record_batch([pa.array([f"v{i}" for i in range(50)]), pa.array(range(50))], names=["s", "n"])
    large = pa.record_batch([pa.array([b"x" * 300] * 3000), pa.array(range(3000))], names=["b", "n"])  # ~0.9 MB
    larger = pa.record_batch([pa.array([b"y" * 300] * 5000), pa.array(range(5000))], names=["b", "n"])
    big_schema = pa.schema([pa.field("n", pa.int64(), metadata={b"doc": b"d" * 10_000})])
    wide_schema = pa.record_batch([pa.array(range(10))], schema=big_schema)  # schema message > the slack
    first = compress_record_batch(small, CUSTOM)
    kept = layout.buffer
    assert kept is not None and kept.size >= 1 << 20
    for batch in (small, small.slice(7, 30), wide_schema, large, large.slice(3, 4000)):
        assert bytes(layout.layout(batch)) == batch.serialize().to_pybytes()
        message = compress_record_batch(batch, CUSTOM)
        assert _read(batch.schema, message.header, message.body).equals(batch)
    assert layout.buffer is kept  # each fitted the first buffer: nothing was allocated again
    message = compress_record_batch(larger, CUSTOM)  # 1.5 MB: the buffer grows, and stays
    assert _read(larger.schema, message.header, message.body).equals(larger)
    kept = layout.buffer
    assert kept.size >= larger.get_total_buffer_size()
    compress_record_batch(small, CUSTOM)
    assert layout.buffer is kept
    # A schema message larger than the room left for it: the buffer doubles and the write is redone.
    layout.buffer = pa.allocate_buffer(ipc.get_record_batch_size(wide_schema) + 4096 + 64, resizable=False)
    assert bytes(layout.layout(wide_schema)) == wide_schema.serialize().to_pybytes()
    assert layout.buffer.size > 8192
    layout.buffer = kept
    monkeypatch.setattr(ipc_compression, "MAX_KEPT_LAYOUT_BYTES", 64 << 10)
    assert bytes(layout.layout(large)) == large.serialize().to_pybytes()
    assert layout.buffer is kept
    # A message returned earlier is unchanged by later writes into the same buffer.
    assert _read(small.schema, first.header, first.body).equals(small)
    assert compress_record_batch(small, CUSTOM) == first


# Delta-coded offsets (storage codec zstd-delta).
def _delta_indexes(message) -> tuple[int, ...] | None:
    header = memoryview(message.header)[8:]
    spans = _custom_metadata(header, root(header))
    if ipc_compression.DELTA_KEY not in spans:
        return None
    start, end = spans[ipc_compression.DELTA_KEY]
    return tuple(int(i) for i in bytes(header[start:end]).split(b","))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=batches())
def test_delta_coded_batches_decode_to_the_plain_zstd_message_for_any_schema(batch):
    layout = ipc_compression.offsets_buffers(batch.schema)
    plain = compress_record_batch(batch, CUSTOM)
    if layout is not None:  # the layout the walk predicts is the message's
        meta_view = memoryview(plain.header)[8:]
        record_batch = deref(meta_view, field(meta_view, root(meta_view), 2))
        start, end = vector_span(meta_view, record_batch, 2, 16)
        assert layout[0] == (end - start) // 16
    message = compress_record_batch(batch, CUSTOM, delta=True)
    indexes = _delta_indexes(message)
    if indexes is None:  # nothing to delta-code: the plain zstd message
        assert message == plain
        return
    assert layout is not None and set(indexes) <= set(layout[1])
    # A plain Arrow reader refuses it (codec 2) rather than reading differences as offsets.
    with pytest.raises(pa.ArrowInvalid, match="codec"):
        _read(batch.schema, message.header, message.body)
    decoded = ipc_compression.decode_delta(message.header + message.body, indexes)
    got = ipc.open_stream(batch.schema.serialize().to_pybytes() + decoded).read_next_batch()
    got.validate(full=True)
    assert got.equals(batch)


def test_delta_coded_offsets_are_stored_as_differences_and_shrink():
    rows = 4000
    names = pa.array([f"name-{i}-" + "x" * (i % 7) for i in range(rows)])
    uids = pa.array([f"{i:036d}" for i in range(rows)])
    tags = pa.array([[f"t{j}" for j in range(i % 3)] for i in range(rows)], pa.list_(pa.string()))
    batch = pa.record_batch([names, uids, tags], names=["name", "uid", "tags"])
    plain = compress_record_batch(batch, CUSTOM)
    message = compress_record_batch(batch, CUSTOM, delta=True)
    assert _delta_indexes(message) == (1, 4, 7, 9)  # name, uid, tags and tags' items
    uid_offsets_length, uid_offsets = _stored_buffers(message)[2]  # empty validity buffers left out
    assert uid_offsets_length == (rows + 1) * 4
    differences = zstandard.ZstdDecompressor().decompress(uid_offsets, max_output_size=uid_offsets_length)
    assert differences == struct.pack(f"<{rows + 1}i", 0, *[36] * rows)
    assert len(message.body) < len(plain.body) * 0.8
    decoded = ipc_compression.decode_delta(message.header + message.body, _delta_indexes(message))
    assert _read(batch.schema, decoded[: len(plain.header)], decoded[len(plain.header):]).equals(batch)


def test_delta_coding_wraps_offsets_of_any_value_exactly():
    """Differences and sums in int32 arithmetic: offsets that do not rise (a corrupt or
    unusual buffer) still round-trip bit for bit."""
    body = bytearray(struct.pack("<6i", 0, 2**31 - 1, -(2**31), 5, -7, 0))
    view = memoryview(body)
    schema = pa.schema([("s", pa.string())])
    coded = ipc_compression._delta_code(view, (0, 0, 0, 24, 24, 0), schema)
    assert coded is not None and coded[1] == [1]
    values = struct.unpack("<6i", body)
    import numpy as np
    assert np.cumsum(np.array(values, np.int32), dtype=np.int32).tolist() == [0, 2**31 - 1, -(2**31), 5, -7, 0]


@pytest.mark.parametrize("bad", [b"not a message", b"\xff\xff\xff\xff\x08\x00\x00\x00" + bytes(8)])
def test_a_damaged_delta_coded_message_is_a_value_error(bad):
    with pytest.raises(ValueError):
        ipc_compression.decode_delta(bad, (1,))


def test_a_delta_coded_stored_batch_reads_back_whole_and_projected():
    batch = pa.record_batch([pa.array(range(3000)), pa.array([["a", None, "bc"]] * 3000),
                             pa.array([f"v{i}" for i in range(3000)])], names=["_offset", "tags", "s"])
    encoded = encode_batch(batch, meta(record_count=3000, last_offset_delta=2999), b"", compression="zstd-delta")
    segment = encoded.schema_message + encoded.header + encoded.body.to_pybytes()
    header = parse_batch_header(memoryview(segment), len(encoded.schema_message), len(segment))
    assert header.compressed and header.delta == (3, 5, 8)  # tags, its items, s
    assert checksum_matches(memoryview(segment), header, schema_checksum(encoded.schema_message))
    assert read_batch(pa.py_buffer(segment), header, batch.schema).equals(batch)
    projected = read_batch(pa.py_buffer(segment), header, batch.schema, [2], encoded.schema_message)
    assert projected.column(0).equals(batch.column(2))
    with pytest.raises(pa.ArrowInvalid, match="codec"):
        ipc.open_stream(segment).read_all()
