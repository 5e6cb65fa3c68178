"""The single-key lookup path (storage key as bytes, one RocksDB get, one row decoded:
`KeyLayout.few_key_bytes`, `KvTablet.value_at`/`row_batch`, `RowCodec.decode_one`)
against the batch path: the same rows for found and missing keys, nulls and every column
type the KV row codec stores; rows of an older row schema; the same errors for malformed
stored values."""
from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.kv import KeyLayout, KvTablet, MergeSpec
from fluvial.kv.row_codec import RowCodec, struct_of

# The primary key: every type a single-key lookup encodes as bytes (string, integers, binary).
KEY_FIELDS = [pa.field("k_str", pa.string(), False), pa.field("k_i32", pa.int32(), False),
              pa.field("k_bin", pa.binary(), False), pa.field("k_i64", pa.int64(), False)]
VALUE_FIELDS = [pa.field("b", pa.bool_()), pa.field("i8", pa.int8()), pa.field("i16", pa.int16()),
                pa.field("f32", pa.float32()), pa.field("f64", pa.float64()), pa.field("s", pa.string()),
                pa.field("bin", pa.binary()), pa.field("d", pa.date32()), pa.field("t_ms", pa.time32("ms")),
                pa.field("t_us", pa.time64("us")), pa.field("ts_ms", pa.timestamp("ms", tz="UTC")),
                pa.field("ts_us", pa.timestamp("us", tz="UTC")), pa.field("ts_local", pa.timestamp("ms")),
                pa.field("dec", pa.decimal128(12, 3)), pa.field("lst", pa.list_(pa.int64())),
                pa.field("st", pa.struct([pa.field("x", pa.int32()), pa.field("y", pa.string())])),
                pa.field("mp", pa.map_(pa.string(), pa.int64()))]
SCHEMA = pa.schema(KEY_FIELDS + VALUE_FIELDS)
PK = [f.name for f in KEY_FIELDS]


def opt(strategy):
    return st.one_of(st.none(), strategy)


KEY = st.fixed_dictionaries({"k_str": st.text(max_size=6), "k_i32": st.integers(-2**31, 2**31 - 1),
                             "k_bin": st.binary(max_size=4), "k_i64": st.integers(-2**63, 2**63 - 1)})
VALUES = st.fixed_dictionaries({
    "b": opt(st.booleans()), "i8": opt(st.integers(-128, 127)), "i16": opt(st.integers(-2**15, 2**15 - 1)),
    "f32": opt(st.floats(width=32, allow_nan=False)), "f64": opt(st.floats(allow_nan=False)),
    "s": opt(st.text(max_size=20)), "bin": opt(st.binary(max_size=20)),
    "d": opt(st.dates(datetime.date(1970, 1, 1), datetime.date(2200, 1, 1))),
    "t_ms": opt(st.integers(0, 86_399_999)), "t_us": opt(st.integers(0, 86_399_999_999)),
    "ts_ms": opt(st.integers(0, 2**45)), "ts_us": opt(st.integers(0, 2**52)), "ts_local": opt(st.integers(0, 2**45)),
    "dec": opt(st.decimals(-10**8, 10**8, places=3, allow_nan=False, allow_infinity=False)),
    "lst": opt(st.lists(opt(st.integers(-2**63, 2**63 - 1)), max_size=4)),
    "st": opt(st.fixed_dictionaries({"x": opt(st.integers(-2**31, 2**31 - 1)), "y": opt(st.text(max_size=5))})),
    "mp": opt(st.lists(st.tuples(st.text(max_size=4), opt(st.integers(-5, 5))), max_size=3)),
})


def open_tablet(path, schema=SCHEMA) -> KvTablet:
    return KvTablet.open(path, schema, KeyLayout(schema, PK), MergeSpec.of(schema, PK, "last_row", None))


def key_table(key: dict) -> pa.Table:
    return pa.Table.from_pylist([key], schema=pa.schema(KEY_FIELDS))


def point_lookup(tablet: KvTablet, keys: pa.Table) -> pa.RecordBatch:
    (key,) = tablet.layout.few_key_bytes(keys)
    return tablet.row_batch(tablet.value_at(key))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(KEY, VALUES), min_size=1, max_size=12, unique_by=lambda kv: tuple(kv[0].items())),
       st.lists(KEY, max_size=6))
def test_point_lookups_equal_the_batch_path(tmp_path_factory, rows, missing):
    tablet = open_tablet(tmp_path_factory.mktemp("kv") / "t")
    try:
        table = pa.Table.from_pylist([{**k, **v} for k, v in rows], schema=SCHEMA)
        tablet.apply(tablet.prepare(table), 1)
        stored = {tuple(k.items()) for k, _ in rows}
        for key in [k for k, _ in rows] + missing:
            keys = key_table(key)
            assert tablet.layout.few_key_bytes(keys) == tablet.layout._encode(keys, tablet.layout.key_schema).to_pylist()
            one = point_lookup(tablet, keys)
            general = tablet.lookup(keys)
            assert one.schema.equals(tablet.schema)
            assert one.num_rows == (1 if tuple(key.items()) in stored else 0)
            assert pa.Table.from_batches([one], schema=tablet.schema).equals(general)
    finally:
        tablet.close()


@settings(max_examples=60, deadline=None)
@given(st.tuples(KEY, VALUES))
def test_decode_one_equals_decode(row):
    codec = RowCodec(SCHEMA, {})
    value = codec.encode(struct_of(pa.Table.from_pylist([{**row[0], **row[1]}], schema=SCHEMA)))
    assert codec.decode_one(value[0].as_py()).equals(codec.decode(value))


def test_rows_of_an_older_row_schema_read_alike(tmp_path):
    old = pa.schema(KEY_FIELDS + [pa.field("s", pa.string())])
    tablet = open_tablet(tmp_path / "t", old)
    key = {"k_str": "a", "k_i32": 1, "k_bin": b"\x00", "k_i64": -5}
    tablet.apply(tablet.prepare(pa.Table.from_pylist([{**key, "s": "x"}], schema=old)), 1)
    tablet.evolve(old.append(pa.field("n", pa.int64())))
    one = point_lookup(tablet, key_table(key))
    assert one.to_pylist() == [{**key, "s": "x", "n": None}]
    assert pa.Table.from_batches([one]).equals(tablet.lookup(key_table(key)))
    tablet.close()


def test_malformed_stored_values_give_the_batch_paths_errors():
    codec = RowCodec(SCHEMA, {})
    key = {"k_str": "a", "k_i32": 1, "k_bin": b"", "k_i64": 2}
    good = codec.encode(struct_of(pa.Table.from_pylist([{**key, "dec": decimal.Decimal("1.500")}],
                                                       schema=SCHEMA)))[0].as_py()
    for bad, message in ((b"\x00", "shorter than its 2-byte"), (b"", "shorter than its 2-byte"),
                         (good[:-3], "cannot be read"), (good + b"\x01\x02", "cannot be read"),
                         (b"\x7f\x7f" + good[2:], "unknown row schema number")):
        with pytest.raises(ValueError, match=message):
            codec.decode_one(bad)
        with pytest.raises(ValueError, match=message):
            codec.decode(pa.array([bad], pa.binary()))


def test_keys_the_bytes_path_does_not_take_go_to_the_batch_path():
    layout = KeyLayout(SCHEMA, PK)
    key = {"k_str": "a", "k_i32": 1, "k_bin": b"", "k_i64": 2}
    other_type = pa.table({**{k: [v] for k, v in key.items()}, "k_i32": pa.array([1], pa.int64())})
    assert layout.few_key_bytes(other_type) is None  # cast by the array path
    with_null = pa.Table.from_pylist([{**key, "k_str": None}],
                                     schema=pa.schema([f.with_nullable(True) for f in KEY_FIELDS]))
    assert layout.few_key_bytes(with_null) is None
    dec = pa.schema([pa.field("k", pa.decimal128(5, 2), False), pa.field("v", pa.string())])
    assert KeyLayout(dec, ["k"]).few_key_bytes(pa.table({"k": pa.array([decimal.Decimal("1.00")], dec[0].type)})) is None


def test_keys_the_bytes_path_takes_pass_the_key_check():
    layout = KeyLayout(SCHEMA, PK)
    key = {"k_str": "a", "k_i32": 1, "k_bin": b"", "k_i64": 2}
    missing = pa.table({k: [v] for k, v in key.items() if k != "k_bin"})
    assert layout.few_key_bytes(missing) is None  # check_keys refuses it on the batch path
    twice = pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"]), pa.array([1], pa.int32()), pa.array([b""]),
                                  pa.array([2], pa.int64())], names=["k_str", "k_str", "k_i32", "k_bin", "k_i64"])
    assert layout.few_key_bytes(twice) is None
    batch = pa.RecordBatch.from_pylist([key], schema=pa.schema(KEY_FIELDS))
    assert layout.few_key_bytes(batch) == layout._encode(batch, layout.key_schema).to_pylist()
    layout.check_keys(batch, "key")
