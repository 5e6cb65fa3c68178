"""Record batch v2: what the clients send parses, what we build the clients read, bad bytes are refused."""
from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fluvial.errors import CorruptRecordError, FluvialError, InvalidRecordError, UnsupportedCompressionError
from fluvial.protocol import records as R
from fluvial.protocol.compression import Compression, compress
from fluvial.protocol.records import (
    CONTROL_MASK,
    HEADERS_TYPE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    RecordColumns,
    build_batch,
    decode_records,
    parse_batch_header,
    set_base_offset,
    split_batches,
    verify_crc,
)
from fluvial.protocol.varint import encode_varint

IMPLEMENTATIONS = ["native", "python"] if R.HAS_NATIVE else ["python"]
CODECS = list(Compression)
INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)


def test_compiled_codec_is_built() -> None:
    # `pip install -e .` builds it; without it every produce and fetch takes the slow path.
    import fluvial.protocol._records  # noqa: F401

    assert R.HAS_NATIVE
    assert R._native_check is not None, "the compiled codec is older than this checkout: rebuild it"


# ------------------------------------------------------------------ helpers


def rows(columns: RecordColumns) -> list[tuple]:
    for array in (columns.keys, columns.values, columns.headers):
        array.validate(full=True)
    assert columns.timestamp_delta.dtype == np.int64 and columns.offset_delta.dtype == np.int32
    assert columns.headers.type == HEADERS_TYPE
    return list(
        zip(
            columns.timestamp_delta.tolist(),
            columns.offset_delta.tolist(),
            columns.keys.to_pylist(),
            columns.values.to_pylist(),
            [[(h["key"], h["value"]) for h in row] for row in columns.headers.to_pylist()],
        )
    )


def make_batch(columns: RecordColumns, compression: Compression = Compression.NONE, **overrides) -> bytes:
    fields = dict(
        base_offset=0,
        partition_leader_epoch=-1,
        attributes=0,
        base_timestamp=1_700_000_000_000,
        max_timestamp=1_700_000_000_000,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
    )
    fields.update(overrides)
    return build_batch(columns=columns, compression=compression, **fields)


def read_batch(data: bytes) -> tuple[BatchHeader, RecordColumns]:
    [batch] = split_batches(data)
    header = parse_batch_header(batch)
    verify_crc(batch, header)
    return header, decode_records(batch, header)


def raw_record(*fields: bytes, attributes: bytes = b"\x00", length: int | None = None) -> bytes:
    """One record from hand-written field bytes, with its length prefix."""
    body = attributes + b"".join(fields)
    out = bytearray()
    encode_varint(len(body) if length is None else length, out)
    return bytes(out) + body


def v(value: int) -> bytes:
    out = bytearray()
    encode_varint(value, out)
    return bytes(out)


def decode_both(section: bytes, count: int):
    """Run every implementation; return each one's result or exception class."""
    outcomes = []
    for impl in IMPLEMENTATIONS:
        try:
            outcomes.append(rows(R.decode_records_section(section, count, impl)))
        except FluvialError as exc:
            outcomes.append(type(exc))
    return outcomes


# ------------------------------------------------------------------ strategies

header_entries = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=8)), max_size=3)
record = st.tuples(INT64, INT32, st.none() | st.binary(max_size=20), st.none() | st.binary(max_size=40), header_entries)


@st.composite
def record_columns(draw) -> tuple[RecordColumns, list[tuple]]:
    """Columns, possibly slices of larger arrays (non-zero Arrow offsets), and the rows they hold."""
    records = draw(st.lists(record, max_size=25))
    start = draw(st.integers(0, len(records)))
    stop = draw(st.integers(start, len(records)))
    columns = RecordColumns.from_lists(
        keys=[r[2] for r in records],
        values=[r[3] for r in records],
        headers=[r[4] for r in records],
        timestamp_delta=[r[0] for r in records],
        offset_delta=[r[1] for r in records],
    )
    sliced = RecordColumns(
        timestamp_delta=columns.timestamp_delta[start:stop],
        offset_delta=columns.offset_delta[start:stop],
        keys=columns.keys.slice(start, stop - start),
        values=columns.values.slice(start, stop - start),
        headers=columns.headers.slice(start, stop - start),
    )
    return sliced, [(r[0], r[1], r[2], r[3], r[4]) for r in records[start:stop]]


# ------------------------------------------------------------------ round trips and cross-checks


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_columns())
def test_compiled_and_python_codecs_agree(case) -> None:
    columns, expected = case
    sections = {impl: R.encode_records_section(columns, impl) for impl in IMPLEMENTATIONS}
    assert len(set(sections.values())) == 1
    section = sections[IMPLEMENTATIONS[0]]
    for impl in IMPLEMENTATIONS:
        assert rows(R.decode_records_section(section, len(expected), impl)) == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_columns(), st.sampled_from(CODECS), INT64, INT32, st.integers(-1, 2**31 - 1))
def test_build_then_parse_round_trips_with_every_codec(case, codec, base_offset, epoch, sequence) -> None:
    columns, expected = case
    data = make_batch(
        columns,
        codec,
        base_offset=base_offset,
        partition_leader_epoch=epoch,
        producer_id=12345,
        producer_epoch=7,
        base_sequence=sequence,
        attributes=TRANSACTIONAL_MASK,
    )
    header, decoded = read_batch(data)
    assert rows(decoded) == expected
    assert header.compression is codec
    assert (header.base_offset, header.partition_leader_epoch) == (base_offset, epoch)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (12345, 7, sequence)
    assert header.is_transactional and not header.is_control
    assert header.records_count == len(expected)
    assert header.last_offset_delta == (expected[-1][1] if expected else 0)
    assert header.size == len(data)


def test_decoded_columns_are_arrow_arrays_of_the_contract_types() -> None:
    columns = RecordColumns.from_lists([b"k", None], [None, b"v"], [[("h", b"1"), ("n", None)], []])
    decoded = R.decode_records_section(R.encode_records_section(columns), 2)
    assert decoded.keys.type == pa.binary() and decoded.keys.null_count == 1
    assert decoded.values.type == pa.binary() and decoded.values.null_count == 1
    assert decoded.headers.type.value_type.field("key").nullable is False
    assert decoded.headers.flatten().field("value").null_count == 1


def test_encoder_accepts_string_and_large_binary_columns() -> None:
    columns = RecordColumns(
        timestamp_delta=np.array([1, 2]),
        offset_delta=np.array([0, 1]),
        keys=pa.array(["a", None], pa.string()),
        values=pa.chunked_array([pa.array([b"x"], pa.large_binary()), pa.array([b"yz"], pa.large_binary())]),
        headers=pa.array([[], [{"key": "k", "value": b"v"}]], HEADERS_TYPE),
    )
    for impl in IMPLEMENTATIONS:
        decoded = R.decode_records_section(R.encode_records_section(columns, impl), 2, impl)
        assert rows(decoded) == [(1, 0, b"a", b"x", []), (2, 1, None, b"yz", [("k", b"v")])]


def test_null_header_lists_encode_as_no_headers() -> None:
    # A null list backed by a non-empty child range must not leak those headers.
    child = pa.array([{"key": "hidden", "value": b"x"}, {"key": "shown", "value": None}], HEADERS_TYPE.value_type)
    headers = pa.ListArray.from_arrays(pa.array([0, 1, 2], pa.int32()), child, mask=pa.array([True, False]))
    columns = RecordColumns(np.zeros(2, np.int64), np.arange(2, dtype=np.int32), pa.array([None, None], pa.binary()),
                            pa.array([b"a", b"b"]), headers)
    for impl in IMPLEMENTATIONS:
        decoded = R.decode_records_section(R.encode_records_section(columns, impl), 2, impl)
        assert [r[4] for r in rows(decoded)] == [[], [("shown", None)]]


def test_null_header_key_cannot_be_encoded() -> None:
    struct_type = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    headers = pa.array([[{"key": None, "value": b"v"}]], pa.list_(struct_type))
    columns = RecordColumns(np.zeros(1, np.int64), np.zeros(1, np.int32), pa.array([b"k"]), pa.array([b"v"]), headers)
    for impl in IMPLEMENTATIONS:
        with pytest.raises(InvalidRecordError):
            R.encode_records_section(columns, impl)


def test_columns_of_different_lengths_are_refused() -> None:
    columns = RecordColumns.from_lists([b"a", b"b"], [b"1", b"2"])
    columns.keys = columns.keys.slice(0, 1)
    with pytest.raises(ValueError):
        R.encode_records_section(columns)


def test_empty_batch() -> None:
    header, decoded = read_batch(make_batch(RecordColumns.from_lists([], [])))
    assert header.records_count == 0 and len(decoded) == 0 and header.last_offset_delta == 0


def test_attributes_codec_bits_are_replaced_and_flags_kept() -> None:
    attributes = Compression.GZIP | TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK
    header, _ = read_batch(make_batch(RecordColumns.from_lists([b"k"], [b"v"]), Compression.LZ4, attributes=attributes))
    assert header.compression is Compression.LZ4
    assert header.timestamp_type == 1 and header.is_transactional and header.is_control


def test_set_base_offset_keeps_the_crc_valid() -> None:
    data = bytearray(make_batch(RecordColumns.from_lists([None] * 3, [b"a", b"b", b"c"]), Compression.ZSTD))
    set_base_offset(data, 1_000_000, 42)
    header, decoded = read_batch(bytes(data))
    assert (header.base_offset, header.partition_leader_epoch, header.last_offset) == (1_000_000, 42, 1_000_002)
    view = memoryview(data)
    set_base_offset(view[:], 7, 1)
    assert parse_batch_header(view).base_offset == 7


def test_several_batches_in_one_records_field() -> None:
    first = make_batch(RecordColumns.from_lists([None], [b"one"]), base_offset=0)
    second = make_batch(RecordColumns.from_lists([None, None], [b"two", b"three"]), Compression.SNAPPY, base_offset=1)
    batches = split_batches(first + second)
    assert [bytes(b) for b in batches] == [first, second]
    values = [decode_records(b, parse_batch_header(b)).values.to_pylist() for b in batches]
    assert values == [[b"one"], [b"two", b"three"]]
    assert split_batches(b"") == []


# ------------------------------------------------------------------ the real clients


def client_records(n: int = 50) -> list[tuple]:
    """(offset, timestamp, key, value, headers): compressible values so no client skips the codec."""
    return [
        (
            i,
            1_700_000_000_000 + (i * 7) % 13,
            None if i % 5 == 0 else f"key-{i}".encode(),
            None if i % 11 == 3 else (f"value {i} " * 10).encode(),
            [] if i % 3 else [("trace", f"t{i}".encode()), ("empty", None)],
        )
        for i in range(n)
    ]


def client_batch(builder_class, codec: Compression, records: list[tuple]) -> bytes:
    builder = builder_class(
        magic=2, compression_type=int(codec), is_transactional=False,
        producer_id=99, producer_epoch=1, base_sequence=10, batch_size=1 << 20,
    )
    for offset, timestamp, key, value, headers in records:
        assert builder.append(offset, timestamp=timestamp, key=key, value=value, headers=headers) is not None
    return bytes(builder.build())


def builders():
    from aiokafka.record.default_records import DefaultRecordBatchBuilder as AiokafkaBuilder
    from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder

    return {"aiokafka": AiokafkaBuilder, "kafka-python": KafkaPythonBuilder}


def readers():
    from aiokafka.record.default_records import DefaultRecordBatch as AiokafkaBatch
    from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch

    return {"aiokafka": AiokafkaBatch, "kafka-python": KafkaPythonBatch}


@pytest.mark.parametrize("client", ["aiokafka", "kafka-python"])
@pytest.mark.parametrize("codec", CODECS)
def test_parse_batches_the_python_clients_build(client: str, codec: Compression) -> None:
    records = client_records()
    header, decoded = read_batch(client_batch(builders()[client], codec, records))
    assert header.compression is codec
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (99, 1, 10)
    base = header.base_timestamp
    assert header.max_timestamp == max(r[1] for r in records)
    assert rows(decoded) == [(ts - base, off, key, value, headers) for off, ts, key, value, headers in records]


@pytest.mark.parametrize("client", ["aiokafka", "kafka-python"])
@pytest.mark.parametrize("codec", CODECS)
def test_the_python_clients_parse_batches_we_build(client: str, codec: Compression) -> None:
    records = client_records()
    base = 1_700_000_000_000
    columns = RecordColumns.from_lists(
        keys=[r[2] for r in records],
        values=[r[3] for r in records],
        headers=[r[4] for r in records],
        timestamp_delta=[r[1] - base for r in records],
    )
    data = make_batch(
        columns, codec, base_offset=500, base_timestamp=base, max_timestamp=max(r[1] for r in records),
        producer_id=99, producer_epoch=1, base_sequence=10,
    )
    batch = readers()[client](data)
    assert batch.validate_crc()
    assert batch.compression_type == codec
    got = [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in batch]
    assert got == [(500 + off, ts, key, value, headers) for off, ts, key, value, headers in records]


# ------------------------------------------------------------------ refusing bad input


def good_section() -> bytes:
    return R.encode_records_section(RecordColumns.from_lists([b"k", None], [b"v", b"w"], [[("h", b"x")], []]))


@pytest.mark.parametrize(
    ("section", "count", "error"),
    [
        (good_section(), 3, CorruptRecordError),  # fewer records than declared
        (good_section(), 1, CorruptRecordError),  # bytes left after the declared records
        (good_section()[:-1], 2, CorruptRecordError),  # truncated
        (b"", -1, CorruptRecordError),  # negative count
        (b"\x00" * 100, 2**31 - 1, CorruptRecordError),  # a count the bytes cannot hold
        (raw_record(v(0), v(0), v(1000), b"k", v(-1), v(0)), 1, CorruptRecordError),  # key past its record
        (raw_record(v(0), v(0), v(-2), v(-1), v(0)), 1, CorruptRecordError),  # key length below -1
        (raw_record(v(0), v(0), v(-1), v(-1), v(0), length=50), 1, CorruptRecordError),  # record past the end
        (raw_record(v(0), v(0), v(-1), v(-1), v(0), b"\x00"), 1, CorruptRecordError),  # length > its fields
        (raw_record(v(0), v(0), v(-1), v(-1), v(-1)), 1, CorruptRecordError),  # negative header count
        (raw_record(v(0), v(0), v(-1), v(-1), v(1), v(-1), v(-1)), 1, CorruptRecordError),  # null header key
        (raw_record(v(0), v(0), v(-1), v(-1), v(1), v(2), b"\xc3\x28", v(-1)), 1, InvalidRecordError),  # bad UTF-8
        (raw_record(v(0), b"\xff\xff\xff\xff\x7f", v(-1), v(-1), v(0)), 1, CorruptRecordError),  # offset delta > 32 bits
        (raw_record(v(0), b"\x80\x80\x80\x80\x80\x00", v(-1), v(-1), v(0)), 1, CorruptRecordError),  # 6-byte varint
        (raw_record(b"\xff" * 9 + b"\x02", v(0), v(-1), v(-1), v(0)), 1, CorruptRecordError),  # varlong > 64 bits
        (raw_record(b"\x80", length=1), 1, CorruptRecordError),  # record shorter than its fixed fields
        (b"\x80\x80\x80\x80\x80\x80\x80", 1, CorruptRecordError),  # unterminated record length
    ],
)
def test_malformed_records_are_refused(section: bytes, count: int, error: type) -> None:
    for impl in IMPLEMENTATIONS:
        with pytest.raises(error):
            R.decode_records_section(section, count, impl)


def test_largest_varints_are_accepted() -> None:
    section = raw_record(v(-(2**63)), v(-(2**31)), v(-1), v(0), v(0)) + raw_record(v(2**63 - 1), v(2**31 - 1), v(-1), v(0), v(0))
    for impl in IMPLEMENTATIONS:
        decoded = R.decode_records_section(section, 2, impl)
        assert decoded.timestamp_delta.tolist() == [-(2**63), 2**63 - 1]
        assert decoded.offset_delta.tolist() == [-(2**31), 2**31 - 1]


def test_split_refuses_truncation_garbage_and_old_magic() -> None:
    data = make_batch(RecordColumns.from_lists([None], [b"v"]))
    for cut in (1, 16, 30, 60, len(data) - 1):
        with pytest.raises(CorruptRecordError):
            split_batches(data[:cut])
    with pytest.raises(CorruptRecordError):
        split_batches(data + data[:20])
    for magic in (0, 1, 3):
        old = bytearray(data)
        old[16] = magic
        with pytest.raises(CorruptRecordError, match="magic"):
            split_batches(bytes(old))
    short = bytearray(data)
    short[8:12] = struct.pack(">i", 10)
    with pytest.raises(CorruptRecordError):
        split_batches(bytes(short))


def test_parse_header_refuses_short_and_lying_batches() -> None:
    data = make_batch(RecordColumns.from_lists([None], [b"v"]))
    with pytest.raises(CorruptRecordError):
        parse_batch_header(memoryview(data)[:60])
    with pytest.raises(CorruptRecordError):
        parse_batch_header(data[:-1])
    negative = bytearray(data)
    negative[57:61] = struct.pack(">i", -1)
    with pytest.raises(CorruptRecordError):
        parse_batch_header(bytes(negative))


def test_crc_mismatch_is_corrupt_and_fields_before_attributes_are_not_covered() -> None:
    data = bytearray(make_batch(RecordColumns.from_lists([b"k"], [b"value"])))
    data[12:16] = struct.pack(">i", 77)  # leader epoch: outside the CRC
    [batch] = split_batches(bytes(data))
    verify_crc(batch, parse_batch_header(batch))
    data[-1] ^= 0x01
    [batch] = split_batches(bytes(data))
    with pytest.raises(CorruptRecordError, match="CRC"):
        verify_crc(batch, parse_batch_header(batch))


def test_unknown_codec_in_attributes_is_unsupported() -> None:
    data = bytearray(make_batch(RecordColumns.from_lists([None], [b"v"])))
    data[22] |= 0x05
    [batch] = split_batches(bytes(data))
    with pytest.raises(UnsupportedCompressionError):
        decode_records(batch, parse_batch_header(batch))


def test_compressed_garbage_is_corrupt() -> None:
    columns = RecordColumns.from_lists([None], [b"v" * 100])
    for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        data = bytearray(make_batch(columns, codec))
        data[70:80] = b"\xee" * 10
        [batch] = split_batches(bytes(data))
        with pytest.raises(CorruptRecordError):
            decode_records(batch, parse_batch_header(batch))


def test_compressed_records_that_lie_about_their_count_are_corrupt() -> None:
    section = good_section()
    for codec in CODECS:
        data = bytearray(make_batch(RecordColumns.from_lists([None], [b"v"]), codec))
        body = compress(codec, section)  # two records behind a header that says one
        data = data[:61] + body
        data[8:12] = struct.pack(">i", len(data) - 12)
        [batch] = split_batches(bytes(data))
        with pytest.raises(CorruptRecordError):
            decode_records(batch, parse_batch_header(batch))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(-2, 40))
def test_random_sections_are_refused_alike_never_crash(section: bytes, count: int) -> None:
    outcomes = decode_both(section, count)
    assert all(o == outcomes[0] for o in outcomes)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_columns(), st.data())
def test_mutated_sections_decode_alike_in_both_codecs(case, data) -> None:
    columns, expected = case
    section = bytearray(R.encode_records_section(columns))
    assume(section)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(section) - 1, 0)))
        if kind == "flip" and section:
            section[at] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del section[at:at + data.draw(st.integers(1, 6))]
        else:
            section[at:at] = data.draw(st.binary(min_size=1, max_size=6))
    count = len(expected) + data.draw(st.integers(-1, 1))
    outcomes = decode_both(bytes(section), count)
    assert all(o == outcomes[0] for o in outcomes)


def check_matches_decode(section: bytes, count: int) -> None:
    """check_records_stats (each implementation) refuses what decode refuses, with the same
    error class, and otherwise gives the decoded timestamps' first and largest delta and
    whether the offset deltas are 0..count-1."""
    try:
        decoded = R.decode_records_section(section, count, "python")
        ts, od = decoded.timestamp_delta, decoded.offset_delta
        expected = (int(ts[0]), int(ts.max()), bool((od == np.arange(count)).all()))
    except FluvialError as exc:
        expected = type(exc)
    for impl in IMPLEMENTATIONS:
        try:
            got = R.check_records_stats(section, count, impl)
        except FluvialError as exc:
            got = type(exc)
        assert got == expected, impl


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_columns(), st.data())
def test_checking_records_agrees_with_decoding_them(case, data) -> None:
    columns, expected = case
    assume(len(expected) > 0)
    section = bytearray(R.encode_records_section(columns))
    if data.draw(st.booleans()):
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(section) - 1))
            if data.draw(st.booleans()):
                section[at] = data.draw(st.integers(0, 255))
            else:
                del section[at:at + data.draw(st.integers(1, 6))]
    count = len(expected) + data.draw(st.integers(-1, 1))
    assume(count >= 1)
    check_matches_decode(bytes(section), count)


def test_checking_records_of_a_producer_batch() -> None:
    columns = RecordColumns(timestamp_delta=np.array([5, 1, 9], np.int64), offset_delta=np.array([0, 1, 2], np.int32),
                            keys=pa.array([b"a", None, b"c"], pa.binary()), values=pa.array([b"x", b"y", None], pa.binary()),
                            headers=pa.array([[], [], []], R.HEADERS_TYPE))
    section = R.encode_records_section(columns)
    for impl in IMPLEMENTATIONS:
        assert R.check_records_stats(section, 3, impl) == (5, 9, True)
        with pytest.raises(CorruptRecordError):
            R.check_records_stats(section, 0, impl)
    gap = R.encode_records_section(RecordColumns(
        timestamp_delta=columns.timestamp_delta, offset_delta=np.array([0, 2, 3], np.int32), keys=columns.keys,
        values=columns.values, headers=columns.headers))
    for impl in IMPLEMENTATIONS:
        assert R.check_records_stats(gap, 3, impl) == (5, 9, False)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_records_fields_raise_only_record_errors(data: bytes) -> None:
    # Make the garbage look like a batch often enough to reach the deeper checks.
    for candidate in (data, b"\x00" * 16 + b"\x02" + data[17:] if len(data) > 17 else data):
        try:
            for batch in split_batches(candidate):
                header = parse_batch_header(batch)
                decode_records(batch, header)
        except (CorruptRecordError, InvalidRecordError, UnsupportedCompressionError):
            pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_columns(), st.sampled_from(CODECS), st.data())
def test_mutated_batches_raise_only_record_errors(case, codec, data) -> None:
    columns, _ = case
    batch = bytearray(make_batch(columns, codec))
    at = data.draw(st.integers(R.HEADER_SIZE, len(batch) - 1)) if len(batch) > R.HEADER_SIZE else None
    if at is not None:
        batch[at] ^= data.draw(st.integers(1, 255))
    count = data.draw(st.integers(0, 40))
    batch[57:61] = struct.pack(">i", count)
    [view] = split_batches(bytes(batch))
    try:
        decode_records(view, parse_batch_header(view))
    except (CorruptRecordError, InvalidRecordError):
        pass


def raw_encoders():
    encoders = [R._encode_records_py]
    if R.HAS_NATIVE:
        encoders.append(R._native.encode_records)
    return encoders


def call_encoder(encode, **changes):
    """Call the flat-buffer encoder with two records (keys b'a', b'b'; values b'c', b'd'), changed as asked."""
    args = dict(
        n=2, ts=np.zeros(2, np.int64).tobytes(), od=np.zeros(2, np.int32).tobytes(),
        k_valid=None, k_offsets=struct.pack("<3i", 0, 1, 2), k_data=b"ab", k_offset=0,
        v_valid=None, v_offsets=struct.pack("<3i", 0, 1, 2), v_data=b"cd", v_offset=0,
        counts=None, n_headers=0,
        hk_valid=None, hk_offsets=None, hk_data=None, hk_offset=0,
        hv_valid=None, hv_offsets=None, hv_data=None, hv_offset=0,
    )
    args.update(changes)
    return encode(*args.values())


ONE_HEADER = dict(counts=struct.pack("<2i", 1, 0), n_headers=1, hk_offsets=struct.pack("<2i", 0, 1), hk_data=b"k",
                  hv_offsets=struct.pack("<2i", 0, 0), hv_data=b"")


@pytest.mark.parametrize("encode", raw_encoders())
def test_flat_buffer_encoder_checks_every_buffer(encode) -> None:
    good = call_encoder(encode)
    assert rows(R.decode_records_section(good, 2)) == [(0, 0, b"a", b"c", []), (0, 0, b"b", b"d", [])]
    with_validity = call_encoder(encode, k_valid=b"\x02")  # first key null
    assert rows(R.decode_records_section(with_validity, 2))[0][2] is None
    assert rows(R.decode_records_section(call_encoder(encode, **ONE_HEADER), 2))[0][4] == [("k", b"")]
    bad = [
        dict(k_data=b"a"),  # offsets past the data
        dict(k_offsets=struct.pack("<3i", 0, 5, 2)),  # decreasing offsets
        dict(k_offsets=struct.pack("<3i", -4, 1, 2)),  # negative offset
        dict(k_offset=1),  # slice past the offsets buffer
        dict(k_offset=-1),
        dict(n=3),  # more records than buffers
        dict(ts=b""),
        dict(k_valid=b""),  # validity bitmap too short
        dict(counts=struct.pack("<2i", 1, 0)),  # header counts without headers
        {**ONE_HEADER, "counts": struct.pack("<2i", -1, 2)},
        {**ONE_HEADER, "counts": struct.pack("<2i", 2, 0)},
    ]
    for changes in bad:
        with pytest.raises(ValueError):
            call_encoder(encode, **changes)
    with pytest.raises(InvalidRecordError):
        call_encoder(encode, **{**ONE_HEADER, "hk_valid": b"\x00"})


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.ZSTD])
def test_log_append_time_sets_type_and_max_timestamp_with_a_new_crc(codec: Compression) -> None:
    data = bytearray(make_batch(RecordColumns.from_lists([None, b"k"], [b"a", b"b"]), codec, attributes=TRANSACTIONAL_MASK))
    before, _ = read_batch(bytes(data))
    R.set_log_append_time(data, 1_800_000_000_123)
    header, decoded = read_batch(bytes(data))  # read_batch checks the CRC
    assert header.crc != before.crc
    assert header.timestamp_type == 1 and header.is_transactional and header.compression is codec
    assert header.max_timestamp == 1_800_000_000_123
    assert header.base_timestamp == before.base_timestamp
    assert decoded.values.to_pylist() == [b"a", b"b"]
    from aiokafka.record.default_records import DefaultRecordBatch

    batch = DefaultRecordBatch(bytes(data))
    assert batch.validate_crc() and batch.timestamp_type == 1
    # a LogAppendTime batch reports the broker's time for every record
    assert {r.timestamp for r in batch} == {1_800_000_000_123}
