"""The compiled whole-batch Avro decoder (`_avro.decode_batch`) gives exactly the columns of
the NumPy decoder for every Avro type the table mapping knows, refuses (hands over to the
NumPy decoder, which names each record's problem) exactly the batches that decoder refuses,
and never crashes on malformed values or programs."""
from __future__ import annotations

import decimal
import io
import random

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.schema import avro_binary
from fluvial.schema.avro_binary import DecodeErrors, decode_avro, pad
from fluvial.schema.avro_schema import parse_avro

pytestmark = pytest.mark.skipif(avro_binary._native is None, reason="compiled Avro step not built")

EVERY_TYPE = {
    "type": "record", "name": "All", "fields": [
        {"name": "n", "type": "null"},
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "by", "type": "bytes"},
        {"name": "s", "type": "string"},
        {"name": "big", "type": {"type": "string", "arrow.type": "large_string"}},
        {"name": "i8", "type": {"type": "int", "arrow.type": "int8"}},
        {"name": "u32", "type": {"type": "long", "arrow.type": "uint32"}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
        {"name": "fx", "type": {"type": "fixed", "name": "F3", "size": 3}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 3}},
        {"name": "dec_wide", "type": {"type": "bytes", "logicalType": "decimal", "precision": 60, "scale": 0}},
        {"name": "dec_fixed", "type": {"type": "fixed", "name": "D5", "size": 5, "logicalType": "decimal",
                                       "precision": 10, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tus", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "opt", "type": ["null", "long"]},
        {"name": "opt_last", "type": ["string", "null"]},
        {"name": "single", "type": ["double"]},
        {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [
            {"name": "x", "type": "int"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "maybe", "type": ["null", {"type": "record", "name": "Leaf", "fields": [
                {"name": "v", "type": "boolean"}]}]},
        ]}},
        {"name": "ints", "type": {"type": "array", "items": "int"}},
        {"name": "doubles", "type": {"type": "array", "items": "double"}},
        {"name": "nested", "type": {"type": "array", "items": {"type": "array", "items": "long"}}},
        {"name": "recs", "type": {"type": "array", "items": "Leaf"}},
        {"name": "opt_items", "type": {"type": "array", "items": ["null", "string"]}},
        {"name": "m", "type": {"type": "map", "values": "long"}},
        {"name": "m_opt", "type": {"type": "map", "values": ["null", "bytes"]}},
        {"name": "m_arr", "type": {"type": "map", "values": {"type": "array", "items": "E"}}},
        {"name": "opt_map", "type": ["null", {"type": "map", "values": "string"}]},
    ],
}

TEXT = "abé漢🙂"


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(TEXT) for _ in range(rng.randint(0, 6)))


def _decimal(rng: random.Random, digits: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(rng.randint(-10 ** digits + 1, 10 ** digits - 1)).scaleb(-scale)


def every_type_record(rng: random.Random) -> dict:
    def maybe(value):
        return None if rng.random() < 0.3 else value

    return {
        "n": None, "b": rng.random() < 0.5, "i": rng.randint(-2 ** 31, 2 ** 31 - 1),
        "l": rng.randint(-2 ** 63, 2 ** 63 - 1), "f": float(np.float32(rng.uniform(-1e3, 1e3))),
        "d": rng.uniform(-1e9, 1e9), "by": rng.randbytes(rng.randint(0, 9)), "s": _text(rng), "big": _text(rng),
        "i8": rng.randint(-128, 127), "u32": rng.randint(0, 2 ** 32 - 1), "e": rng.choice("ABC"),
        "fx": rng.randbytes(3), "dec": _decimal(rng, 20, 3), "dec_wide": _decimal(rng, 60, 0),
        "dec_fixed": _decimal(rng, 10, 2), "day": rng.randint(-10 ** 5, 10 ** 5),
        "tms": rng.randint(0, 86_399_999), "tus": rng.randint(0, 86_399_999_999), "ts": rng.randint(0, 2 ** 52),
        "opt": maybe(rng.randint(-5, 5)), "opt_last": maybe(_text(rng)), "single": rng.random(),
        "inner": {"x": rng.randint(-9, 9), "tags": [_text(rng) for _ in range(rng.randint(0, 3))],
                  "maybe": maybe({"v": rng.random() < 0.5})},
        "ints": [rng.randint(-2 ** 31, 2 ** 31 - 1) for _ in range(rng.randint(0, 4))],
        "doubles": [rng.random() for _ in range(rng.randint(0, 3))],
        "nested": [[rng.randint(-300, 300) for _ in range(rng.randint(0, 3))] for _ in range(rng.randint(0, 3))],
        "recs": [{"v": rng.random() < 0.5} for _ in range(rng.randint(0, 3))],
        "opt_items": [maybe(_text(rng)) for _ in range(rng.randint(0, 3))],
        "m": {_text(rng) + str(k): rng.randint(-2 ** 40, 2 ** 40) for k in range(rng.randint(0, 3))},
        "m_opt": {str(k): maybe(rng.randbytes(2)) for k in range(rng.randint(0, 3))},
        "m_arr": {str(k): [rng.choice("ABC") for _ in range(rng.randint(0, 2))] for k in range(rng.randint(0, 2))},
        "opt_map": maybe({str(k): _text(rng) for k in range(rng.randint(0, 2))}),
    }


SCHEMA = parse_avro(EVERY_TYPE)
PARSED = fastavro.parse_schema(EVERY_TYPE)


def encode(records: list[dict]) -> list[bytes]:
    out = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, PARSED, r)
        out.append(buf.getvalue())
    return out


def both(root, bodies: list[bytes]) -> tuple[pa.Array | None, pa.Array, list]:
    """(the compiled decoder's array or None when it hands over, the NumPy decoder's array,
    the NumPy decoder's per-record problems)."""
    lens = np.array([len(b) for b in bodies], np.int64)
    end = np.cumsum(lens)
    pos = end - lens
    data = pad(np.frombuffer(b"".join(bodies), np.uint8))
    native = avro_binary._decode_native(root, data, pos, end)
    saved, avro_binary.USE_NATIVE = avro_binary.USE_NATIVE, False
    try:
        errors = DecodeErrors(np.full(len(bodies), -1, np.int64))
        reference = decode_avro(root, data, pos, end, np.arange(len(bodies)), errors)
    finally:
        avro_binary.USE_NATIVE = saved
    return native, reference, errors.by_record()


def test_every_avro_type_decodes_to_the_reference_columns():
    rng = random.Random(7)
    bodies = encode([every_type_record(rng) for _ in range(400)])
    native, reference, problems = both(SCHEMA.root, bodies)
    assert problems == []
    assert native is not None, "the compiled decoder handed a valid batch over"
    assert native.type == reference.type
    assert native.equals(reference)
    # Spot values against fastavro's own reading.
    first = fastavro.schemaless_reader(io.BytesIO(bodies[0]), PARSED)
    row = native.slice(0, 1).to_pylist()[0]
    assert row["s"] == first["s"] and row["l"] == first["l"] and row["dec"] == first["dec"]
    assert row["dec_wide"] == first["dec_wide"] and row["m"] == list(first["m"].items())


def test_decode_avro_takes_the_compiled_path_for_valid_batches(monkeypatch):
    rng = random.Random(3)
    bodies = encode([every_type_record(rng) for _ in range(20)])
    lens = np.array([len(b) for b in bodies])
    end = np.cumsum(lens)
    data = pad(np.frombuffer(b"".join(bodies), np.uint8))
    calls = []
    real = avro_binary._decode_native
    monkeypatch.setattr(avro_binary, "_decode_native", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(avro_binary._Cursor, "read_long", None)  # the NumPy decoder would fail
    errors = DecodeErrors(np.full(len(bodies), -1, np.int64))
    arr = decode_avro(SCHEMA.root, data, end - lens, end, np.arange(len(bodies)), errors)
    assert calls and len(arr) == len(bodies) and errors.by_record() == []


def test_empty_batch_and_empty_collections():
    rng = random.Random(5)
    rec = every_type_record(rng)
    rec.update(ints=[], doubles=[], nested=[], recs=[], opt_items=[], m={}, m_opt={}, m_arr={}, opt_map=None)
    rec["inner"]["tags"] = []
    native, reference, problems = both(SCHEMA.root, encode([rec] * 3))
    assert problems == [] and native is not None and native.equals(reference)
    native, reference, problems = both(SCHEMA.root, [])
    assert native is not None and len(native) == 0 and native.type == reference.type


@pytest.mark.parametrize("case, body", [
    ("truncated", lambda b: b[:-1]),
    ("bytes left over", lambda b: b + b"\x00"),
    ("non-canonical varint", lambda b: b"\x80\x00" + b[1:]),  # field n is null: b[0] is boolean b
    ("boolean 2", lambda b: b"\x02" + b[1:]),
    ("empty", lambda b: b""),
])
def test_malformed_values_hand_over_to_the_reference_which_names_them(case, body):
    rng = random.Random(11)
    good = encode([every_type_record(rng) for _ in range(3)])
    bad = [good[0], body(good[1]), good[2]]
    native, _, problems = both(SCHEMA.root, bad)
    assert native is None
    assert [i for i, _ in problems] == [1]


def test_invalid_utf8_string_and_out_of_range_narrow_int_are_refused():
    schema = parse_avro({"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "i8", "type": {"type": "int", "arrow.type": "int8"}}]})
    ok = b"\x02a\x02"
    native, _, problems = both(schema.root, [ok, b"\x02\xff\x02"])
    assert native is None and problems[0][0] == 1 and "UTF-8" in problems[0][1]
    native, _, problems = both(schema.root, [ok, b"\x02a\x80\x04"])  # 256 does not fit int8
    assert native is None and problems[0][0] == 1 and "range" in problems[0][1]


def test_non_minimal_decimals_are_refused_but_fastavros_extra_sign_byte_is_taken():
    schema = parse_avro({"type": "record", "name": "R", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 0}}]})
    native, reference, problems = both(schema.root, [b"\x06\xff\x80\x00"])  # -32768 as fastavro writes it
    assert problems == [] and native is not None and native.equals(reference)
    assert native.to_pylist() == [{"d": decimal.Decimal(-32768)}]
    for loose in (b"\x04\x00\x01", b"\x04\xff\xff", b"\x00", b"\x22" + b"\x01" * 17):
        native, _, problems = both(schema.root, [loose])
        assert native is None and problems and problems[0][0] == 0


def test_sized_and_multi_block_arrays_and_maps_are_refused():
    schema = parse_avro({"type": "record", "name": "R", "fields": [
        {"name": "a", "type": {"type": "array", "items": "long"}},
        {"name": "m", "type": {"type": "map", "values": "int"}}]})
    good = b"\x02\x02\x00\x02\x02k\x04\x00"
    native, reference, problems = both(schema.root, [good])
    assert problems == [] and native is not None and native.equals(reference)
    for bad in (b"\x01\x02\x02\x00\x00",  # negative (sized) block count
                b"\x02\x02\x02\x02\x00\x00",  # a second block
                b"\x7e\x00\x00",  # more items than bytes left
                b"\x02\x02\x00\x02\x02k\x04"):  # map without its closing 0
        native, _, problems = both(schema.root, [bad])
        assert native is None and problems


def test_unions_other_than_nullable_are_left_to_the_reference():
    schema = parse_avro({"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]})
    assert avro_binary._program(schema.root) is None


def test_malformed_programs_are_refused_not_run():
    data = pad(np.frombuffer(b"\x02", np.uint8))
    pos, end = np.zeros(1, np.int64), np.ones(1, np.int64)
    no_symbols = (b"", np.zeros(1, np.int64))

    def run(code, symbols=no_symbols, p=pos, e=end):
        return avro_binary._native.decode_batch(np.array(code, np.int64), *symbols, data, p, e)

    for code in ([], [1, 0, 99, 0, 0, 0, 0], [2, 1, 7, 0, 0, 0, 1, 3, 0, 0, 0, 0, 0],  # kid out of range
                 [2, 1, 7, 0, 0, 0, 1, 7, 0, 0, 0, 1, 0],  # a kid pointing back: a loop
                 [3, 2, 7, 0, 0, 0, 2, 3, 0, 0, 0, 0, 3, 0, 0, 0, 0, 2, 2],  # one column under two parents
                 [1, 0, 12, 99, 0, 0, 0],  # decimal wider than 256 bits
                 [1, 0, 6, 0, 5, 0, 0],  # enum symbols past the symbol table
                 [1, 0, 2, 0, 3, 0, 0]):  # an int column 3 bytes wide
        with pytest.raises(ValueError):
            run(code)
    with pytest.raises(ValueError):
        run([1, 0, 6, 0, 1, 0, 0], (b"A", np.array([0, 5], np.int64)))  # symbol past its bytes
    with pytest.raises(TypeError):
        avro_binary._native.decode_batch(np.array([1, 0, 3, 0, 0, 0, 0], np.int32), *no_symbols, data, pos, end)
    # Positions outside the buffer: the record is reported (-index - 1), nothing is read.
    assert run([1, 0, 3, 0, 0, 0, 0], p=np.array([5], np.int64), e=np.array([99], np.int64)) == -1


def test_released_columns_free_the_batch_and_outlive_it():
    rng = random.Random(9)
    bodies = encode([every_type_record(rng) for _ in range(50)])
    native, reference, _ = both(SCHEMA.root, bodies)
    tags = native.field("inner").field("tags")
    del native
    assert tags.equals(reference.field("inner").field("tags"))


_SEEDS = [encode([every_type_record(random.Random(s))])[0] for s in range(8)]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 7), edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
       cut=st.integers(0, 10_000), tail=st.binary(max_size=3))
def test_fuzzed_values_decode_as_the_reference_or_are_refused_as_it_refuses_them(seed, edits, cut, tail):
    body = bytearray(_SEEDS[seed])
    for at, byte in edits:
        body[at % len(body)] = byte
    body = bytes(body[:max(1, cut % (len(body) + 1))]) + tail if cut % 3 == 0 else bytes(body) + tail
    native, reference, problems = both(SCHEMA.root, [_SEEDS[(seed + 1) % 8], body])
    if problems:
        assert native is None
    else:
        assert native is not None and native.equals(reference)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=80))
def test_arbitrary_bytes_never_crash_and_agree_with_the_reference(body):
    native, reference, problems = both(SCHEMA.root, [body])
    assert (native is None) == bool(problems)
    if native is not None:
        assert native.equals(reference)


def test_fixed_wider_than_a_program_takes_is_left_to_the_reference():
    schema = parse_avro({"type": "record", "name": "R", "fields": [
        {"name": "f", "type": {"type": "fixed", "name": "Huge", "size": (1 << 20) + 1}}]})
    assert avro_binary._program(schema.root) is None


def test_values_their_column_cannot_hold_are_refused_naming_the_field():
    schema = parse_avro({"type": "record", "name": "R", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 0}},
        {"name": "t", "type": {"type": "int", "logicalType": "time-millis"}}]})
    ok = b"\x02\x63\x02"  # 99, 1 ms
    too_many_digits = b"\x02\x64\x02"  # 100 in a decimal of 2 digits
    before_midnight = b"\x02\x01\x01"  # -1 ms
    native, reference, problems = both(schema.root, [ok])
    assert problems == [] and native is not None and native.equals(reference)
    native, _, problems = both(schema.root, [ok, too_many_digits, before_midnight])
    assert native is None
    assert [(i, m.split(":")[0]) for i, m in problems] == [(1, "field 'd'"), (2, "field 't'")]


# ------------------------------------------------------------ string columns of ASCII alone

TEXTS = parse_avro({"type": "record", "name": "T", "fields": [
    {"name": "s", "type": "string"},
    {"name": "big", "type": {"type": "string", "arrow.type": "large_string"}},
    {"name": "opt", "type": ["null", "string"]},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "m", "type": {"type": "map", "values": "string"}},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
    {"name": "by", "type": "bytes"},
]})


def _avro_string(raw: bytes) -> bytes:
    """An Avro string (or bytes) value holding exactly `raw`, valid UTF-8 or not."""
    n = len(raw) << 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + raw


def _block(items: list[bytes]) -> bytes:
    """An Avro array or map of already encoded items: one block, then the closing 0."""
    return (bytes([len(items) << 1]) + b"".join(items) if items else b"") + b"\x00"


def _texts_body(s: bytes, big: bytes, opt: bytes | None, tags: list[bytes], keys: list[bytes],
                values: list[bytes], e: int = 0, by: bytes = b"\xff") -> bytes:
    """A value of TEXTS with these raw string bytes (valid UTF-8 or not)."""
    return (_avro_string(s) + _avro_string(big) + (b"\x00" if opt is None else b"\x02" + _avro_string(opt))
            + _block([_avro_string(t) for t in tags])
            + _block([_avro_string(k) + _avro_string(v) for k, v in zip(keys, values)])
            + bytes([e << 1]) + _avro_string(by))


def test_checked_string_columns_skip_arrows_utf8_check_and_come_back_as_strings():
    program = avro_binary._program(TEXTS.root)
    bodies = [_texts_body(b"plain", "é".encode(), b"x", [b"t0", b"t1"], [b"k"], ["漢".encode()]),
              _texts_body(b"", b"abc", None, [], [], [], e=1)]
    lens = np.array([len(b) for b in bodies], np.int64)
    end = np.cumsum(lens)
    data = np.frombuffer(b"".join(bodies), np.uint8)
    checked = np.zeros(program.nodes, np.uint8)
    address = avro_binary._native.decode_batch(program.code, program.symbols, program.symbol_offsets, data,
                                               end - lens, end, checked)
    assert address > 0
    pa.Array._import_from_c(address, program.type)  # release it
    # Entries: record, s, big, opt (union), opt's string, tags, item, m, key, value, e, by.
    # Every string column is checked, ASCII ("s") or not ("big", the map's values); the
    # enum by its symbols.
    assert checked.tolist() == [0, 1, 1, 0, 1, 0, 1, 0, 1, 1, 1, 0]
    native, reference, problems = both(TEXTS.root, bodies)
    assert problems == [] and native is not None
    assert native.type == program.type and native.equals(reference)
    assert native.to_pylist()[0]["m"] == [("k", "漢")]
    assert native.to_pylist()[0]["big"] == "é"
    # The import type of this batch: the checked string columns as binary.
    import_type = program.import_type(checked)
    assert import_type.field("s").type == pa.binary() and import_type.field("big").type == pa.large_binary()
    assert import_type.field("m").type.item_type == pa.binary() and import_type.field("e").type == pa.binary()
    unchecked = checked.copy()
    unchecked[[2, 9]] = 0
    import_type = program.import_type(unchecked)
    assert import_type.field("big").type == pa.large_string() and import_type.field("m").type.item_type == pa.string()
    assert program.import_type(np.zeros(program.nodes, np.uint8)) is program.type


@pytest.mark.parametrize("where", ["s", "big", "opt", "tags", "key", "value"])
@pytest.mark.parametrize("bad", [b"\xff", b"a\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\x80"])
def test_invalid_utf8_in_any_string_column_is_refused_naming_the_record(where, bad):
    parts = {"s": b"ok", "big": b"ok", "opt": b"ok", "tags": b"ok", "key": b"ok", "value": b"ok", where: bad}
    good = _texts_body(b"a", b"b", b"c", [b"d"], [b"e"], [b"f"])
    bodies = [good, good, _texts_body(parts["s"], parts["big"], parts["opt"], [b"t", parts["tags"]],
                                      [parts["key"]], [parts["value"]])]
    native, _, problems = both(TEXTS.root, bodies)
    assert native is None
    assert [i for i, _ in problems] == [2] and "UTF-8" in problems[0][1]


def test_decoding_without_the_checked_bytes_still_works_and_a_wrong_size_is_refused():
    program = avro_binary._program(TEXTS.root)
    body = _texts_body(b"a", b"b", None, [], [], [])
    data = np.frombuffer(body, np.uint8)
    pos, end = np.zeros(1, np.int64), np.array([len(body)], np.int64)
    address = avro_binary._native.decode_batch(program.code, program.symbols, program.symbol_offsets, data, pos, end)
    assert pa.Array._import_from_c(address, program.type).to_pylist()[0]["s"] == "a"
    with pytest.raises(ValueError):
        avro_binary._native.decode_batch(program.code, program.symbols, program.symbol_offsets, data, pos, end,
                                         np.zeros(program.nodes + 1, np.uint8))


def test_enum_symbols_other_than_ascii_are_left_to_arrows_check():
    program = avro_binary._program(TEXTS.root)
    symbols, offsets = "Aé".encode(), np.array([0, 1, 3], np.int64)
    data = np.frombuffer(b"\x00\x00\x00\x00\x00\x02\x00", np.uint8)  # e is its second symbol
    checked = np.zeros(program.nodes, np.uint8)
    address = avro_binary._native.decode_batch(program.code, symbols, offsets, data, np.zeros(1, np.int64),
                                               np.array([len(data)], np.int64), checked)
    pa.Array._import_from_c(address, program.type)
    assert checked[10] == 0  # the enum's entry: its symbols are not all ASCII


def utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.binary(max_size=12), min_size=6, max_size=6),
       text=st.lists(st.text(max_size=5), min_size=6, max_size=6), mix=st.lists(st.booleans(), min_size=6, max_size=6))
def test_fuzzed_string_bytes_are_taken_exactly_when_every_value_is_utf8(values, text, mix):
    raw = [v if m else t.encode("utf-8", "surrogatepass") for v, t, m in zip(values, text, mix)]
    body = _texts_body(raw[0], raw[1], raw[2], [raw[3]], [raw[4]], [raw[5]])
    native, reference, problems = both(TEXTS.root, [body])

    if all(map(utf8, raw)):
        assert problems == [] and native is not None and native.equals(reference)
        assert native.to_pylist()[0]["s"] == raw[0].decode()
    else:
        assert native is None and problems and "UTF-8" in problems[0][1]


# Pieces that are valid UTF-8 only together with their neighbour (a character split between
# two values), and every kind of invalid sequence.
_SPLIT = ["é".encode()[:1], "é".encode()[1:], "漢".encode()[:2], "漢".encode()[2:], "😀".encode()[:3],
          "😀".encode()[3:], b"\xed\xa0\x80", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xf4\x90\x80\x80",
          b"\xf5\x80\x80\x80", b"\xff", b"\x80"]


@settings(max_examples=400, deadline=None)
@given(values=st.lists(st.one_of(st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
                                 st.lists(st.sampled_from(_SPLIT), max_size=3).map(b"".join),
                                 st.binary(max_size=20)), min_size=1, max_size=12))
def test_a_string_column_of_many_values_is_taken_exactly_when_each_value_is_utf8(values):
    """The compiled check sees a column's bytes as a whole (16 at a time) and where each
    value starts: a character split between two values, or cut by the column's end, is
    refused as Arrow and the reference refuse it."""
    bodies = [_texts_body(v, b"b", None, [], [], []) for v in values]
    native, reference, problems = both(TEXTS.root, bodies)

    if all(map(utf8, values)):
        assert problems == [] and native is not None and native.equals(reference)
        assert native.field("s").to_pylist() == [v.decode() for v in values]
        # Known valid by the compiled check itself (Arrow's check of it is skipped).
        program = avro_binary._program(TEXTS.root)
        lens = np.array([len(b) for b in bodies], np.int64)
        end = np.cumsum(lens)
        checked = np.zeros(program.nodes, np.uint8)
        address = avro_binary._native.decode_batch(program.code, program.symbols, program.symbol_offsets,
                                                   np.frombuffer(b"".join(bodies), np.uint8), end - lens, end, checked)
        pa.Array._import_from_c(address, program.type)  # release it
        assert checked[1] == 1
    else:
        assert native is None and problems and "UTF-8" in problems[0][1]
        assert problems[0][0] == next(i for i, v in enumerate(values) if not utf8(v))
