"""The typed produce path's one-pass decode of Confluent wire-format values
(`_avro.decode_framed`, `AvroValueCodec._decode_uniform`) gives exactly what the general
path gives: the same columns for a valid batch, and for anything else (another magic byte
or schema id, a short value, a null, a malformed value, several writer schemas in one
batch) the same InvalidRecordError naming the same records. Never a crash."""
from __future__ import annotations

import functools
import json
import random
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.broker.metadata import MetadataStore
from fluvial.errors import InvalidRecordError
from fluvial.schema import avro_binary
from fluvial.schema.codecs import AvroValueCodec, value_codec
from fluvial.schema.registry import SchemaRegistry, parse_schema
from fluvial.schema.avro_schema import parse_avro
from tests.unit.test_avro_batch_native import EVERY_TYPE, both, encode, every_type_record

pytestmark = pytest.mark.skipif(avro_binary._native is None, reason="compiled Avro step not built")

OTHER = {"type": "record", "name": "All", "fields": EVERY_TYPE["fields"][:5]}


@functools.lru_cache(maxsize=None)
def _setup() -> tuple[AvroValueCodec, int, int]:
    """A typed table's codec, its schema id and an evolved version's id (one registry for
    every example of the property tests)."""
    registry = SchemaRegistry(MetadataStore(Path(tempfile.mkdtemp(prefix="fluvial-framed-")) / "meta.db"))
    sid = registry.register("t-value", parse_schema(json.dumps(EVERY_TYPE)))[0]
    codec = value_codec(registry, "t")
    other = registry.register("o-value", parse_schema(json.dumps(OTHER)))[0]
    return codec, sid, other


def framed(schema_id: int, bodies: list[bytes]) -> list[bytes]:
    return [b"\x00" + schema_id.to_bytes(4, "big") + b for b in bodies]


def outcome(codec: AvroValueCodec, values: pa.Array, uniform: bool):
    """(columns, ids) or the refusal (message, record errors), by the one-pass path or by
    the general path alone."""
    saved = codec._decode_uniform
    if not uniform:
        codec._decode_uniform = lambda values: None
    try:
        cols, ids = codec.decode(values)
        return "ok", cols, ids.tolist()
    except InvalidRecordError as exc:
        return "refused", exc.message, list(exc.record_errors)
    finally:
        codec._decode_uniform = saved


def assert_same(codec: AvroValueCodec, values: pa.Array) -> tuple:
    fast, reference = outcome(codec, values, True), outcome(codec, values, False)
    assert fast[0] == reference[0]
    if fast[0] == "ok":
        assert fast[1].equals(reference[1]) and fast[2] == reference[2]
    else:
        assert fast[1:] == reference[1:]
    return fast


def test_a_valid_batch_takes_the_one_pass_path_and_matches_the_general_one(monkeypatch):
    codec, sid, _ = _setup()
    rng = random.Random(1)
    values = pa.array(framed(sid, encode([every_type_record(rng) for _ in range(300)])), pa.binary())
    calls = []
    real = avro_binary._native.decode_framed
    monkeypatch.setattr(avro_binary._native, "decode_framed", lambda *a: calls.append(1) or real(*a), raising=False)
    result = assert_same(codec, values)
    assert result[0] == "ok" and len(result[1]) == 300 and set(result[2]) == {sid}
    assert calls, "the one-pass decoder did not run"


def test_a_sliced_column_is_read_at_its_offset():
    codec, sid, _ = _setup()
    rng = random.Random(2)
    values = pa.array(framed(sid, encode([every_type_record(rng) for _ in range(40)])), pa.binary())
    assert assert_same(codec, values.slice(7, 20))[0] == "ok"


def test_first_record_much_larger_or_smaller_than_the_rest():
    """Columns are sized for the batch from the first record: a batch unlike its first
    record still decodes whole."""
    codec, sid, _ = _setup()
    rng = random.Random(3)
    small = every_type_record(rng)
    small.update(by=b"", s="", big="", ints=[], doubles=[], nested=[], recs=[], opt_items=[], m={}, m_opt={},
                 m_arr={}, opt_map=None)
    small["inner"]["tags"] = []
    large = every_type_record(rng)
    large.update(by=b"x" * 5000, s="é" * 3000, ints=list(range(300)), m={str(k): k for k in range(200)})
    for records in ([small] + [large] * 50, [large] + [small] * 2000):
        assert assert_same(codec, pa.array(framed(sid, encode(records)), pa.binary()))[0] == "ok"


@pytest.mark.parametrize("case", ["magic", "other id", "unknown id", "short", "null", "empty", "malformed",
                                  "left over", "two writers"])
def test_batches_the_one_pass_path_refuses_get_the_general_paths_answer(case):
    codec, sid, other = _setup()
    rng = random.Random(4)
    bodies = encode([every_type_record(rng) for _ in range(5)])
    values: list = framed(sid, bodies)
    if case == "magic":
        values[2] = b"\x01" + values[2][1:]
    elif case == "other id":
        values[0] = framed(other, [b"\x00"])[0]
    elif case == "unknown id":
        values[3] = framed(999_999, bodies[3:4])[0]
    elif case == "short":
        values[1] = values[1][:3]
    elif case == "null":
        values[4] = None
    elif case == "empty":
        values[0] = b""
    elif case == "malformed":
        values[2] = values[2][:-1]
    elif case == "left over":
        values[2] = values[2] + b"\x00"
    elif case == "two writers":
        values[1] = framed(other, [b"\x01\x02\x04\x00\x00\x80\x3f"])[0]  # a valid value of OTHER
    result = assert_same(codec, pa.array(values, pa.binary()))
    assert result[0] == "refused" or case == "two writers"


_SEEDS = encode([every_type_record(random.Random(s)) for s in range(6)])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seeds=st.lists(st.integers(0, 5), min_size=1, max_size=6),
       edits=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
       cut=st.one_of(st.none(), st.tuples(st.integers(0, 5), st.integers(0, 400))),
       start=st.integers(0, 3))
def test_mutated_batches_get_the_same_answer_from_both_paths(seeds, edits, cut, start):
    """Edits anywhere, the header included (magic byte, schema id), cuts, and a column that
    starts at an offset: the one-pass path agrees with the general one, or hands over."""
    codec, sid, _ = _setup()
    values = [bytearray(v) for v in framed(sid, [_SEEDS[s] for s in seeds])]
    for which, at, byte in edits:
        v = values[which % len(values)]
        v[at % len(v)] = byte
    if cut is not None:
        which, keep = cut
        del values[which % len(values)][keep:]
    column = pa.array([b"pad"] * start + [bytes(v) for v in values], pa.binary()).slice(start)
    assert_same(codec, column)


@settings(max_examples=150, deadline=None)
@given(body=st.binary(max_size=60))
def test_arbitrary_values_never_crash(body):
    codec, sid, _ = _setup()
    assert_same(codec, pa.array([b"\x00" + sid.to_bytes(4, "big") + body, body], pa.binary()))


def test_offsets_outside_the_data_are_reported_not_read():
    codec, sid, _ = _setup()
    program = avro_binary._program(codec._writer(sid).avro.root)
    data = np.frombuffer(framed(sid, _SEEDS[:1])[0], np.uint8)

    def run(offsets):
        return avro_binary._native.decode_framed(program.code, program.symbols, program.symbol_offsets, data,
                                                  np.array(offsets, np.int32), sid)

    good = run([0, len(data)])
    assert good >= 0
    pa.Array._import_from_c(good, program.type)  # taken over (and released) by Arrow
    for offsets in ([0, len(data) + 1], [-1, 4], [6, 2], [0, 4], [0, len(data), len(data) + 9]):
        assert run(offsets) < 0
    with pytest.raises(ValueError):
        run([])
    with pytest.raises(TypeError):
        avro_binary._native.decode_framed(program.code, program.symbols, program.symbol_offsets, data,
                                          np.array([0, len(data)], np.int64), sid)


def test_a_batch_of_two_writer_versions_is_decoded_by_the_general_path(tmp_path):
    """Values of an older and a newer version of the table's schema in one batch: the
    one-pass path hands over at the first value of the other version, and the general
    path reads each version's values into the evolved columns."""
    registry = SchemaRegistry(MetadataStore(tmp_path / "meta.db"))
    old = registry.register("e-value", parse_schema(json.dumps(OTHER)))[0]
    newer = {**OTHER, "fields": OTHER["fields"] + [{"name": "extra", "type": ["null", "long"], "default": None}]}
    new = registry.register("e-value", parse_schema(json.dumps(newer)))[0]
    codec = value_codec(registry, "e")
    old_value = b"\x01\x02\x04\x00\x00\x80\x3f"
    values = pa.array(framed(new, [old_value + b"\x02\x0a"]) + framed(old, [old_value]), pa.binary())
    result = assert_same(codec, values)
    assert result[0] == "ok" and result[2] == [new, old]
    assert result[1].field("extra").to_pylist() == [5, None]
    # All of one version (the older one): one pass, read into the evolved columns.
    only_old = pa.array(framed(old, [old_value] * 3), pa.binary())
    result = assert_same(codec, only_old)
    assert result[0] == "ok" and result[1].field("extra").to_pylist() == [None] * 3


FLAT = parse_avro({"type": "record", "name": "Flat", "fields": [
    {"name": "i", "type": "int"}, {"name": "l", "type": "long"}, {"name": "d", "type": "double"},
    {"name": "s", "type": "string"}]})


@pytest.mark.parametrize("case, body", [
    ("valid", b"\x02\x04" + b"\x00" * 8 + b"\x02a"),
    ("int beyond 32 bits", b"\x80\x80\x80\x80\x10\x04" + b"\x00" * 8 + b"\x02a"),
    ("long of ten bytes", b"\x02" + b"\xff" * 9 + b"\x01" + b"\x00" * 8 + b"\x02a"),
    ("long longer than 64 bits", b"\x02" + b"\xff" * 9 + b"\x02" + b"\x00" * 8 + b"\x02a"),
    ("non-canonical long", b"\x02\x84\x00" + b"\x00" * 8 + b"\x02a"),
    ("long cut at the end", b"\x02\x04" + b"\x00" * 8 + b"\x02a" + b"\x80"),
    ("double cut short", b"\x02\x04" + b"\x00" * 7),
    ("string past the end", b"\x02\x04" + b"\x00" * 8 + b"\x04a"),
    ("negative string length", b"\x02\x04" + b"\x00" * 8 + b"\x01a"),
])
def test_the_fields_read_inline_agree_with_the_reference(case, body):
    """A record's long, int, double and string fields are read without a call per field
    (and varints with ten bytes left without a bound check per byte): the same values and
    the same refusals as the reference, at the record's end too."""
    native, reference, problems = both(FLAT.root, [b"\x02\x04" + b"\x00" * 8 + b"\x02b", body])
    if case in ("valid", "long of ten bytes"):
        assert problems == [] and native is not None and native.equals(reference)
    else:
        assert native is None and [i for i, _ in problems] == [1]
