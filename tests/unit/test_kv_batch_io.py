"""The KV tablet's one-pass batch steps (kv/batch_io.py) against their references: integer
keys byte for byte the Avro encoder's, key order the byte order, lists of bytes <-> Arrow
binary arrays with reordering, and bad input refused with an error, not a crash."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.kv import batch_io
from fluvial.kv.row_codec import DATA_PREFIX, KeyLayout

SCHEMA = pa.schema([pa.field("a", pa.int64(), False), pa.field("b", pa.int32(), False),
                    pa.field("c", pa.int8(), False), pa.field("d", pa.int16(), False)])
ROW = st.fixed_dictionaries({"a": st.integers(-2**63, 2**63 - 1), "b": st.integers(-2**31, 2**31 - 1),
                             "c": st.integers(-128, 127), "d": st.integers(-2**15, 2**15 - 1)})
native = pytest.mark.skipif(not batch_io.USE_NATIVE, reason="the compiled kv/_kvbatch.c is not built")


@settings(max_examples=120, deadline=None)
@given(st.lists(ROW, min_size=9, max_size=60), st.sampled_from([["a"], ["b", "a"], ["c", "d", "b"]]))
def test_integer_keys_equal_the_avro_encoding(rows, key):
    layout = KeyLayout(SCHEMA, key)
    data = pa.Table.from_pylist(rows, schema=SCHEMA)
    expected = layout._encode(data, layout.key_schema).to_pylist()
    assert layout._long_keys(data).to_pylist() == expected
    columns = [data.column(c).to_numpy().astype(np.int64) for c in layout.key_schema.names]
    assert batch_io._long_keys_numpy(DATA_PREFIX, columns, len(rows)).to_pylist() == expected
    assert layout.storage_keys(data).to_pylist() == expected


def test_key_columns_of_other_types_or_with_nulls_take_the_avro_encoder():
    layout = KeyLayout(SCHEMA, ["a"])
    assert layout._long_keys(pa.table({"a": pa.array(range(20), pa.int32())})) is None  # cast first
    assert layout._long_keys(pa.table({"a": pa.array([1, None] * 10, pa.int64())})) is None
    assert not KeyLayout(pa.schema([pa.field("s", pa.string(), False)]), ["s"])._long_key


@settings(max_examples=120, deadline=None)
@given(st.lists(st.binary(max_size=14), min_size=0, max_size=80), st.integers(0, 2))
def test_key_order_sorts_bytes(keys, skip):
    keys = [b"d" * skip + k for k in keys]
    arr = pa.array(keys, pa.binary())
    order = batch_io.key_order(arr, skip)
    assert sorted(order.tolist()) == list(range(len(keys)))
    ordered = [keys[i] for i in order]
    # Byte order of the first skip + 8 bytes (zero-padded); beyond them ties keep positions.
    def head(k):
        return k[:skip + 8].ljust(skip + 8, b"\0")
    assert [head(k) for k in ordered] == sorted(head(k) for k in keys)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=30)), max_size=60), st.randoms(use_true_random=False),
       st.integers(0, 3))
def test_lists_and_binary_arrays_round_trip_with_a_reorder(values, rnd, start):
    order = np.arange(len(values))
    rnd.shuffle(order)
    out = batch_io.binary_at(values, order)
    out.validate(full=True)
    expected = [None] * len(values)
    for i, p in enumerate(order):
        expected[p] = values[i]
    assert out.to_pylist() == expected
    assert out.null_count == sum(v is None for v in values)
    assert batch_io.binary_at(values).to_pylist() == values
    present = pa.array([v for v in values if v is not None] or [b""], pa.binary()).slice(min(start, 1))
    picks = np.array([rnd.randrange(len(present)) for _ in range(len(present))], np.int64) if len(present) else \
        np.zeros(0, np.int64)
    assert batch_io.take_bytes(present, picks) == present.take(pa.array(picks)).to_pylist()
    assert batch_io.take_bytes(pc.cast(present, pa.binary())) == present.to_pylist()


@native
def test_bad_input_is_refused_with_an_error():
    from fluvial.kv import _kvbatch
    with pytest.raises(ValueError, match="permutation"):
        _kvbatch.scatter_bytes([b"a", b"b"], np.array([0, 0], np.int64))
    with pytest.raises(ValueError, match="permutation"):
        _kvbatch.scatter_bytes([b"a"], np.array([5], np.int64))
    with pytest.raises(ValueError, match="one position per value"):
        _kvbatch.scatter_bytes([b"a"], np.array([0, 1], np.int64))
    with pytest.raises(TypeError, match="not bytes"):
        _kvbatch.scatter_bytes([b"a", "text"], None)
    keys = pa.array([b"ab", b"c"], pa.binary())
    offsets, data = batch_io._buffers(keys)
    with pytest.raises(IndexError, match="outside"):
        _kvbatch.gather_bytes(offsets, data, np.array([2], np.int64))
    with pytest.raises(IndexError, match="outside"):
        _kvbatch.gather_bytes(offsets, data, np.array([-1], np.int64))
    broken = np.array([0, 2, 99], np.int32)  # an offset past the data
    with pytest.raises(IndexError, match="outside"):
        _kvbatch.gather_bytes(broken, data, np.array([1], np.int64))
    with pytest.raises(ValueError, match="outside the data"):
        _kvbatch.key_prefixes(broken, data, 0)
    with pytest.raises(ValueError, match="lengths"):
        _kvbatch.encode_long_keys(b"d", [np.zeros(2, np.int64), np.zeros(3, np.int64)])
    with pytest.raises(ValueError, match="8-byte"):
        _kvbatch.encode_long_keys(b"d", [np.zeros(3, np.int32)[:3].tobytes()[:5]])


def test_the_fallback_gives_the_same_answers(monkeypatch):
    rng = np.random.default_rng(3)
    values = [None if i % 7 == 0 else bytes(rng.integers(0, 256, i % 9, dtype=np.uint8)) for i in range(200)]
    order = rng.permutation(200)
    keys = pa.array([v or b"x" for v in values], pa.binary())
    ids = rng.integers(-2**40, 2**40, 300)
    compiled = (batch_io.binary_at(values, order), batch_io.take_bytes(keys, order), batch_io.key_order(keys),
                batch_io.long_keys(DATA_PREFIX, [ids]))
    monkeypatch.setattr(batch_io, "USE_NATIVE", False)
    fallback = (batch_io.binary_at(values, order), batch_io.take_bytes(keys, order), batch_io.key_order(keys),
                batch_io.long_keys(DATA_PREFIX, [ids]))
    assert compiled[0].equals(fallback[0]) and compiled[1] == fallback[1]
    assert [keys[int(i)].as_py() for i in compiled[2]] == [keys[int(i)].as_py() for i in fallback[2]]
    assert compiled[3].equals(fallback[3])


@native
@settings(max_examples=120, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=0, max_size=40), st.binary(max_size=6))
def test_murmur2_of_reheaded_keys_equals_the_kafka_key_hash(keys, header):
    from fluvial.kv.bucketing import murmur2_array
    from fluvial.kv.pk_tables import reheaded
    arr = pa.array(keys, pa.binary())
    expected = murmur2_array(reheaded(arr, 1, header)) if keys else np.zeros(0, np.uint32)
    assert batch_io.murmur2_reheaded(arr, 1, header).tolist() == expected.tolist()


@native
def test_murmur2_refuses_keys_shorter_than_their_header():
    from fluvial.kv import _kvbatch
    offsets, data = batch_io._buffers(pa.array([b"ab", b""], pa.binary()))
    with pytest.raises(ValueError, match="shorter"):
        _kvbatch.murmur2_keys(offsets, data, 1, b"\x00")


ROW_SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()),
                        pa.field("amount", pa.float64()), pa.field("at", pa.timestamp("ms", tz="UTC"))])
FULL_ROW = st.fixed_dictionaries({
    "id": st.integers(-2**63, 2**63 - 1), "name": st.one_of(st.none(), st.text(max_size=40)),
    "amount": st.one_of(st.none(), st.floats(allow_nan=False)),
    "at": st.one_of(st.none(), st.integers(0, 2**45))})


@settings(max_examples=80, deadline=None)
@given(st.lists(FULL_ROW, min_size=1, max_size=40))
def test_batch_decoding_of_stored_rows_equals_the_reference_decoder(rows):
    from fluvial.kv.row_codec import RowCodec, struct_of
    from fluvial.schema import avro_binary
    codec = RowCodec(ROW_SCHEMA, {})
    table = pa.Table.from_pylist(rows, schema=ROW_SCHEMA)
    values = codec.encode(struct_of(table))
    decoded = codec.decode(values)
    assert decoded.to_pylist() == struct_of(table).to_pylist()
    native, avro_binary.USE_NATIVE = avro_binary.USE_NATIVE, False
    try:
        assert RowCodec(ROW_SCHEMA, {}).decode(values).equals(decoded)  # the NumPy reference decoder
    finally:
        avro_binary.USE_NATIVE = native


def test_malformed_stored_values_give_a_clear_error():
    from fluvial.kv.row_codec import RowCodec, struct_of
    codec = RowCodec(ROW_SCHEMA, {})
    good = codec.encode(struct_of(pa.Table.from_pylist([{"id": 1, "name": "a", "amount": 1.0, "at": 5}] * 20,
                                                        schema=ROW_SCHEMA))).to_pylist()
    for bad, message in (([b"\x00"], "shorter than its 2-byte"), ([b""], "shorter than its 2-byte"),
                         ([good[0][:-3]], "cannot be read"), ([good[0] + b"\x01\x02"], "cannot be read"),
                         ([b"\x7f\x7f" + good[0][2:]], "unknown row schema number")):
        with pytest.raises(ValueError, match=message):
            codec.decode(pa.array(good + bad, pa.binary()))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(max_size=20), min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_take_binary_equals_arrow_take(values, rnd):
    arr = pa.array(values, pa.binary()).slice(1)
    rows = np.array([rnd.randrange(len(arr)) for _ in range(rnd.randrange(0, 30))] if len(arr) else [], np.int64)
    out = batch_io.take_binary(arr, rows)
    out.validate(full=True)
    assert out.to_pylist() == arr.take(pa.array(rows, pa.int64())).to_pylist()
    if batch_io.USE_NATIVE and len(arr):
        with pytest.raises(IndexError, match="outside"):
            batch_io.take_binary(arr, np.array([len(arr)], np.int64))
