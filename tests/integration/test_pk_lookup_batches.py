"""Pipelined lookups (`Table.lookup_batches`: several batches of keys on their way over one
lookup session): the same answers, in order, as one lookup at a time; batches too large to
send ahead; key schemas changing mid-way; a table whose columns change mid-way; bad keys;
an abandoned iterator; a session busy with another thread."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from fluvial.client import connect
from fluvial.client import pk as client_pk
from fluvial.errors import InvalidRecordError

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string())])
ROWS = 20_000


@pytest.fixture(scope="module")
def client(broker):
    with connect(broker.flight_url) as c:
        yield c


@pytest.fixture(scope="module")
def table(client):
    t = client.create_table("pipelined-lookups", SCHEMA, buckets=2, kafka_format="avro", primary_key=["id"])
    t.upsert(pa.table({"id": pa.array(range(0, 2 * ROWS, 2), pa.int64()), "name": [f"n{i}" for i in range(0, 2 * ROWS, 2)]}))
    return t


def key_batches(sizes, start=0, type_=pa.int64()):
    out, at = [], start
    for n in sizes:
        out.append(pa.table({"id": pa.array(range(at, at + n), type_)}))  # odd ids: missing
        at += n
    return out


def found(rows: pa.Table) -> list[dict]:
    """The rows of a lookup by id (a lookup gives each bucket's rows together)."""
    return sorted(rows.to_pylist(), key=lambda r: r["id"])


def expected(batch: pa.Table) -> list[dict]:
    return [{"id": i, "name": f"n{i}"} for i in batch.column("id").to_pylist() if i % 2 == 0 and i < 2 * ROWS]


@pytest.mark.parametrize("in_flight", [1, 2, 4])
def test_answers_in_order_equal_one_lookup_at_a_time(table, in_flight, monkeypatch):
    batches = key_batches([1, 1000, 0, 7, 1000, 1, 3000, 1000], start=5)
    one_at_a_time = []
    monkeypatch.setattr(client_pk, "lookup", lambda *a: one_at_a_time.append(a))
    got = list(table.lookup_batches(batches, in_flight=in_flight))
    assert not one_at_a_time  # every batch went over the pipelined session
    monkeypatch.undo()
    assert len(got) == len(batches)
    for batch, rows in zip(batches, got):
        assert found(rows) == sorted(expected(batch), key=lambda r: r["id"])
        assert rows.equals(table.lookup(batch))


def test_batches_larger_than_the_window_go_one_at_a_time_without_blocking(table):
    big = key_batches([30_000, 30_000, 5, 30_000])  # 240 KB of keys each: never sent ahead
    got = list(table.lookup_batches(big, in_flight=3))
    assert [r.num_rows for r in got] == [len(expected(b)) for b in big]
    assert found(got[2]) == expected(big[2])


def test_key_schemas_may_change_between_batches(table):
    batches = key_batches([10, 10], 0) + key_batches([10], 100, pa.int32()) + key_batches([10], 200)
    got = list(table.lookup_batches(batches))
    assert [found(r) for r in got] == [expected(b) for b in batches]


def test_bad_keys_raise_and_the_next_lookups_work(table):
    nullable = pa.schema([pa.field("id", pa.int64())])
    batches = key_batches([10, 10]) + [pa.table({"id": pa.array([1, None], pa.int64())}, schema=nullable)]
    it = table.lookup_batches(batches + key_batches([10]))
    with pytest.raises(InvalidRecordError, match="is null"):
        list(it)
    assert found(table.lookup(key_batches([4])[0])) == expected(key_batches([4])[0])
    assert [r.num_rows for r in table.lookup_batches(key_batches([10, 10]))] == [5, 5]
    with pytest.raises(ValueError, match="in_flight"):
        next(table.lookup_batches(key_batches([1]), in_flight=0))


def test_an_abandoned_iterator_leaves_no_answer_behind(client, table):
    it = table.lookup_batches(key_batches([100] * 10), in_flight=4)
    assert next(it).num_rows == 50
    it.close()  # answers still due: the session goes, the next lookup gets its own answer
    assert client._lookups._open.get(table.name) is None
    batch = key_batches([6], 1000)[0]
    assert found(table.lookup(batch)) == expected(batch)


def test_a_session_busy_with_another_thread_answers_one_batch_at_a_time(client, table):
    batch = key_batches([8])[0]
    held = client._lookups.acquire(table.name, batch.to_batches()[0].schema)
    try:
        got = list(table.lookup_batches(key_batches([8, 8, 8])))
    finally:
        held.lock.release()
    assert [found(r) for r in got] == [expected(b) for b in key_batches([8, 8, 8])]


def test_columns_changed_mid_way_reopen_the_session(broker, client, topic_name):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from fluvial.schema.arrow_mapping import arrow_to_avro
    t = client.create_table(topic_name, SCHEMA, kafka_format="avro", primary_key=["id"])
    t.upsert(pa.table({"id": pa.array(range(0, 40, 2), pa.int64()), "name": [f"n{i}" for i in range(0, 40, 2)]}))
    it = t.lookup_batches(key_batches([10, 10, 10, 10]), in_flight=2)
    assert next(it).schema.names == ["id", "name"]
    wider = SCHEMA.append(pa.field("city", pa.string()))
    SchemaRegistryClient({"url": broker.http_url}).register_schema(
        f"{topic_name}-value", Schema(json.dumps(arrow_to_avro(wider, topic_name.replace("-", "_"))), "AVRO"))
    t.upsert(pa.table({"id": pa.array([30], pa.int64()), "name": ["x"], "city": ["c"]}))
    rest = list(it)
    assert len(rest) == 3
    assert rest[-1].schema.names == ["id", "name", "city"]
    assert {"id": 30, "name": "x", "city": "c"} in rest[-1].to_pylist()
    assert sum(r.num_rows for r in rest) == 15
    assert client_pk.PIPELINE_BYTES <= 48 << 10  # under the stream's first flow-control window
