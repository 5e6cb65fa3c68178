"""Single-key lookups over a lookup session take the broker's direct path (one key as
bytes, its bucket hashed in Python, one RocksDB get, one row decoded): the same answers
as the batch path (the lookup action, and the key inside a larger batch) for found and
missing keys, nulls, Avro and JSON Kafka keys, both bucket functions, and the same
refusals for bad keys."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluvial.client import connect
from fluvial.client import pk as client_pk
from fluvial.errors import InvalidRecordError

KEY_FIELDS = [pa.field("s", pa.string(), False), pa.field("i", pa.int64(), False), pa.field("b", pa.binary(), False)]
SCHEMA = pa.schema(KEY_FIELDS + [pa.field("v", pa.string()), pa.field("x", pa.float64()),
                                 pa.field("at", pa.timestamp("ms", tz="UTC")), pa.field("l", pa.list_(pa.int32()))])
KEY_SCHEMA = pa.schema(KEY_FIELDS)
PK = [f.name for f in KEY_FIELDS]


def key_of(n: int) -> dict:
    return {"s": f"k{n % 13}-é", "i": n * 7_919 - 40_000, "b": bytes([n % 256, 7])}


def row_of(n: int) -> dict:
    nulls = n % 4 == 0
    return {**key_of(n), "v": None if nulls else f"value {n}", "x": None if nulls else n / 3,
            "at": None if nulls else n * 1000, "l": None if nulls else [n, None, -n]}


@pytest.fixture(scope="module")
def client(broker):
    with connect(broker.flight_url) as c:
        yield c


@pytest.fixture(scope="module", params=[("avro", None), ("json", None), ("avro", "crc32")],
                ids=["avro-murmur2", "json", "avro-crc32"])
def table(request, client):
    kafka_format, function = request.param
    name = f"point-{kafka_format}-{function or 'default'}"
    t = client.create_table(name, SCHEMA, buckets=3, primary_key=PK, kafka_format=kafka_format,
                            bucket_function=function)
    t.upsert(pa.Table.from_pylist([row_of(n) for n in range(0, 400, 2)], schema=SCHEMA))  # odd n: missing
    return t


def rows(ns) -> list[dict]:
    return pa.Table.from_pylist([row_of(n) for n in ns], schema=SCHEMA).to_pylist()


def by_action(client, name: str, keys: pa.Table) -> pa.Table:
    body = {"table": name, "keys": client_pk._ipc(keys)}
    return pa.ipc.open_stream(client_pk._call(client, client_pk.LOOKUP, body)).read_all()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 420), st.lists(st.integers(0, 420), min_size=9, max_size=20, unique=True))
def test_a_single_key_answers_as_the_batch_path(client, table, n, others):
    keys = pa.Table.from_pylist([key_of(n)], schema=KEY_SCHEMA)
    one = table.lookup(keys)  # over the session: the direct path
    assert one.to_pylist() == (rows([n]) if n % 2 == 0 and n < 400 else [])
    assert one.equals(by_action(client, table.name, keys))
    batch = table.lookup(pa.Table.from_pylist([key_of(m) for m in [n, *(m for m in others if m != n)]], schema=KEY_SCHEMA))
    assert [r for r in batch.to_pylist() if r["i"] == key_of(n)["i"]] == one.to_pylist()


def test_bad_single_keys_are_refused_clearly_and_the_next_lookup_works(client, table):
    nullable = pa.schema([f.with_nullable(True) for f in KEY_FIELDS])
    with pytest.raises(InvalidRecordError, match="primary-key column 's' is null"):
        table.lookup(pa.Table.from_pylist([{**key_of(2), "s": None}], schema=nullable))
    with pytest.raises(InvalidRecordError, match="lack primary-key column"):
        table.lookup(pa.table({"s": ["k2"], "i": pa.array([1], pa.int64())}))
    with pytest.raises(InvalidRecordError):
        table.lookup(pa.table({"s": ["k2"], "i": ["not a number"], "b": [b"x"]}))
    # A key column of another type is cast by the batch path: same row.
    cast = pa.table({"s": [key_of(2)["s"]], "i": pa.array([key_of(2)["i"]], pa.int32()), "b": [key_of(2)["b"]]})
    assert table.lookup(cast).to_pylist() == rows([2])
    assert table.lookup(pa.Table.from_pylist([key_of(4)], schema=KEY_SCHEMA)).to_pylist() == rows([4])
