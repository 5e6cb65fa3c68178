"""Lookups over the client's lookup session (one DoExchange per client and table): found
and missing keys of every key type, nulls, merge engines, refused keys, key-schema and
table-schema changes, threads, and a broker restart under an open session."""
from __future__ import annotations

import datetime
import decimal
import json
import threading

import pyarrow as pa
import pytest

from fluvial.client import connect
from fluvial.client import pk as client_pk
from fluvial.errors import FluvialError, InvalidRecordError
from tests.support.broker_process import free_port

# A composite key of every key type a primary key may have.
KEY_FIELDS = [pa.field("k_str", pa.string(), False), pa.field("k_i32", pa.int32(), False),
              pa.field("k_i64", pa.int64(), False), pa.field("k_bin", pa.binary(), False),
              pa.field("k_bool", pa.bool_(), False), pa.field("k_date", pa.date32(), False),
              pa.field("k_ts", pa.timestamp("ms", tz="UTC"), False),
              pa.field("k_dec", pa.decimal128(10, 2), False)]
SCHEMA = pa.schema(KEY_FIELDS + [pa.field("v", pa.string()), pa.field("n", pa.float64())])
KEYS = [f.name for f in KEY_FIELDS]


@pytest.fixture
def client(broker):
    with connect(broker.flight_url) as c:
        yield c


def key_of(i: int) -> dict:
    return {"k_str": f"s{i % 7}-é", "k_i32": -i, "k_i64": i * 1_000_003, "k_bin": bytes([i % 256, 0, 255]),
            "k_bool": i % 2 == 0, "k_date": datetime.date(2020, 1, 1) + datetime.timedelta(days=i),
            "k_ts": datetime.datetime(2024, 5, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(seconds=i),
            "k_dec": decimal.Decimal(i) / 100}


def row_of(i: int) -> dict:
    # Every third row has null values: nulls come back as nulls.
    return {**key_of(i), "v": None if i % 3 == 0 else f"value {i}", "n": None if i % 3 == 0 else i / 4}


def keys_table(ids) -> pa.Table:
    return pa.Table.from_pylist([key_of(i) for i in ids], schema=pa.schema(KEY_FIELDS))


def session_of(client, name):
    return client._lookups._open.get(name)


# Avro keys: buckets from the storage keys' bodies (encoded once); JSON keys: from their own encoding.
@pytest.mark.parametrize("kafka_format", ["avro", "json"])
def test_found_and_missing_keys_of_every_key_type_over_one_session(client, topic_name, kafka_format):
    t = client.create_table(topic_name, SCHEMA, buckets=3, primary_key=KEYS, kafka_format=kafka_format)
    t.upsert(pa.Table.from_pylist([row_of(i) for i in range(300)], schema=SCHEMA))

    got = t.lookup(keys_table([5, 1000, 0, 299, 77, 1001, 3]))  # found and missing, asked out of order
    assert got.schema.names == SCHEMA.names
    expected = [row_of(i) for i in (5, 0, 299, 77, 3)]
    assert sorted(got.to_pylist(), key=lambda r: r["k_i64"]) == sorted(expected, key=lambda r: r["k_i64"])
    session = session_of(client, topic_name)
    assert session is not None and session.used

    assert t.lookup(keys_table([42])).to_pylist() == [row_of(42)]
    assert t.lookup(keys_table([4242])).num_rows == 0  # one missing key
    assert t.lookup(keys_table([])).num_rows == 0  # no keys at all
    assert t.lookup(keys_table(range(0, 300, 2))).num_rows == 150
    assert t.lookup([key_of(7)]).to_pylist() == [row_of(7)]  # keys as dicts: their own key schema
    # Lookups with the same key schema share the one session.
    assert t.lookup(keys_table([8])).to_pylist() == [row_of(8)]
    assert session_of(client, topic_name) is not None

    # A delete and an update are seen by the next lookup on the same session.
    t.delete(keys_table([5]))
    t.upsert(pa.Table.from_pylist([{**row_of(0), "v": "changed", "n": 1.5}], schema=SCHEMA))
    got = t.lookup(keys_table([5, 0]))
    assert got.to_pylist() == [{**row_of(0), "v": "changed", "n": 1.5}]


def test_big_batches_match_the_lookup_action(client, topic_name):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string())])
    t = client.create_table(topic_name, schema, buckets=2, primary_key=["id"])
    t.upsert(pa.table({"id": pa.array(range(5000), pa.int64()), "name": [f"n{i}" for i in range(5000)]}))
    keys = pa.table({"id": pa.array(list(range(0, 6000, 3)), pa.int64())})
    got = t.lookup(keys)
    found = sorted(got.to_pylist(), key=lambda r: r["id"])
    assert found == [{"id": i, "name": f"n{i}"} for i in range(0, 5000, 3)]
    body = {"table": topic_name, "keys": client_pk._ipc(keys)}
    by_action = pa.ipc.open_stream(client_pk._call(client, client_pk.LOOKUP, body)).read_all()
    assert by_action.equals(got)


@pytest.mark.parametrize("engine,extra", [("versioned", {"version_column": "ver"}), ("first_row", {}),
                                          ("aggregation", {"aggregates": {"qty": "sum"}})])
def test_lookups_see_what_each_merge_engine_kept(client, topic_name, engine, extra):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("qty", pa.int64()),
                        pa.field("ver", pa.int64())])
    t = client.create_table(topic_name, schema, primary_key=["id"], merge_engine=engine, **extra)
    t.upsert(pa.table({"id": pa.array([1, 2], pa.int64()), "qty": pa.array([10, None], pa.int64()),
                       "ver": pa.array([5, 5], pa.int64())}))
    t.upsert(pa.table({"id": pa.array([1, 2], pa.int64()), "qty": pa.array([3, 4], pa.int64()),
                       "ver": pa.array([4, 6], pa.int64())}))
    got = {r["id"]: r for r in t.lookup(pa.table({"id": pa.array([1, 2, 3], pa.int64())})).to_pylist()}
    assert set(got) == {1, 2}
    if engine == "versioned":  # the higher version wins: key 1 keeps 10, key 2 takes 4
        assert (got[1]["qty"], got[2]["qty"]) == (10, 4)
    elif engine == "first_row":
        assert (got[1]["qty"], got[2]["qty"]) == (10, None)
    else:  # sum ignores nulls
        assert (got[1]["qty"], got[2]["qty"]) == (13, 4)


def test_refused_keys_end_the_session_and_the_next_lookup_opens_another(client, topic_name):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string())])
    t = client.create_table(topic_name, schema, primary_key=["id"])
    t.upsert(pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]}))
    assert t.lookup(pa.table({"id": pa.array([1], pa.int64())})).num_rows == 1
    with pytest.raises(InvalidRecordError, match="primary-key column"):
        t.lookup(pa.table({"other": [1]}))
    with pytest.raises(InvalidRecordError, match="is null"):
        t.lookup(pa.table({"id": pa.array([1, None], pa.int64())}))
    with pytest.raises(InvalidRecordError):
        t.lookup(pa.table({"id": ["not a number"]}))
    # int32 keys are a different key schema: a new session, cast by the broker.
    assert t.lookup(pa.table({"id": pa.array([2], pa.int32())})).column("name").to_pylist() == ["b"]
    assert t.lookup(pa.table({"id": pa.array([1], pa.int64())})).column("name").to_pylist() == ["a"]

    log_table = client.create_table(f"{topic_name}-log", schema)
    with pytest.raises(FluvialError, match="primary-key|primary key"):
        log_table.lookup(pa.table({"id": pa.array([1], pa.int64())}))
    assert t.lookup(pa.table({"id": pa.array([2], pa.int64())})).num_rows == 1


def test_a_schema_change_reopens_the_session(broker, client, topic_name):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from fluvial.schema.arrow_mapping import arrow_to_avro

    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string())])
    t = client.create_table(topic_name, schema, kafka_format="avro", primary_key=["id"])
    t.upsert(pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]}))
    keys = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    assert t.lookup(keys).schema.names == ["id", "name"]
    before = session_of(client, topic_name)
    wider = schema.append(pa.field("city", pa.string()))
    sr = SchemaRegistryClient({"url": broker.http_url})
    sr.register_schema(f"{topic_name}-value", Schema(json.dumps(arrow_to_avro(wider, topic_name.replace("-", "_"))),
                                                     "AVRO"))
    t.upsert(pa.table({"id": pa.array([2, 3], pa.int64()), "name": ["b2", "c"], "city": ["x", "y"]}))
    got = t.lookup(keys)
    assert got.to_pylist() == [{"id": 1, "name": "a", "city": None}, {"id": 2, "name": "b2", "city": "x"},
                               {"id": 3, "name": "c", "city": "y"}]
    assert session_of(client, topic_name) is not before


def test_threads_sharing_a_client_get_their_own_answers(client, topic_name):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string())])
    t = client.create_table(topic_name, schema, buckets=2, primary_key=["id"])
    t.upsert(pa.table({"id": pa.array(range(400), pa.int64()), "name": [f"n{i}" for i in range(400)]}))
    errors: list[str] = []

    def work(offset: int) -> None:
        for i in range(offset, 400, 8):
            ids = [i, i + 1000]
            got = t.lookup(pa.table({"id": pa.array(ids, pa.int64())})).to_pylist()
            if got != [{"id": i, "name": f"n{i}"}]:
                errors.append(f"{ids}: {got}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors[:3]


def test_an_open_session_survives_a_broker_restart(fresh_broker, topic_name):
    b = fresh_broker("--flight-port", str(free_port()))  # the same table API address after the restart
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string())])
    with connect(b.flight_url) as c:
        t = c.create_table(topic_name, schema, primary_key=["id"])
        t.upsert(pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}))
        assert t.lookup(pa.table({"id": pa.array([1], pa.int64())})).num_rows == 1
        b.restart()
        # The old stream is gone: the lookup is retried once on a new session.
        assert t.lookup(pa.table({"id": pa.array([1], pa.int64())})).column("name").to_pylist() == ["a"]
    with pytest.raises(ValueError, match="closed"):
        t.lookup(pa.table({"id": pa.array([1], pa.int64())}))


def test_idle_sessions_close_so_a_stopping_broker_never_waits_for_them(fresh_broker, topic_name):
    import time

    b = fresh_broker()
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string())])
    with connect(b.flight_url) as c:
        t = c.create_table(topic_name, schema, primary_key=["id"])
        t.upsert(pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}))
        assert t.lookup(pa.table({"id": pa.array([1], pa.int64())})).num_rows == 1
        assert session_of(c, topic_name) is not None
        deadline = time.monotonic() + client_pk.SESSION_IDLE_S * 5
        while session_of(c, topic_name) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert session_of(c, topic_name) is None  # closed once idle
        assert t.lookup(pa.table({"id": pa.array([1], pa.int64())})).num_rows == 1  # and reopened on use
        # The client is still connected, its session just used: the broker stops on its own
        # (SIGTERM, exit 0), not killed after the stop timeout.
        started = time.monotonic()
        assert b.stop() == 0
        assert time.monotonic() - started < 15
