"""Primary-key tables through the native client: upserts, deletes, partial updates, merge
engines, lookups, prefix lookups, full reads, the changelog scan, and refused writes."""
from __future__ import annotations

import pyarrow as pa
import pytest

from fluvial.client import connect
from fluvial.errors import InvalidConfigError, InvalidRecordError, InvalidRequestError

SCHEMA = pa.schema([pa.field("user", pa.string(), False), pa.field("item", pa.int64(), False),
                    pa.field("qty", pa.int64()), pa.field("note", pa.string()), pa.field("ver", pa.int64())])


@pytest.fixture
def client(broker):
    with connect(broker.flight_url) as c:
        yield c


def rows(*items):
    return pa.Table.from_pylist([dict(zip(["user", "item", "qty", "note", "ver"], r)) for r in items], schema=SCHEMA)


def current(t) -> list[dict]:
    return sorted(t.full_read().rows.to_pylist(), key=lambda r: (r["user"], r["item"]))


def test_upsert_delete_partial_update_lookups_and_changelog(client, topic_name):
    t = client.create_table(topic_name, SCHEMA, buckets=3, primary_key=["user", "item"], bucket_key=["user"])
    assert t.info.kind == "primary_key" and t.info.primary_key == ["user", "item"]
    t.upsert(rows(("ann", 1, 5, "a", 0), ("ann", 2, 6, "b", 0), ("bob", 1, 7, "c", 0)))
    t.upsert(pa.table({"user": ["ann"], "item": pa.array([1], pa.int64()), "qty": pa.array([50], pa.int64())}),
             columns=["user", "item", "qty"])
    t.delete([{"user": "bob", "item": 1}])
    t.delete([{"user": "nobody", "item": 9}])  # nothing to delete: no change

    assert current(t) == [dict(user="ann", item=1, qty=50, note="a", ver=0),
                          dict(user="ann", item=2, qty=6, note="b", ver=0)]
    found = t.lookup([{"user": "ann", "item": 2}, {"user": "bob", "item": 1}])
    assert found.to_pylist() == [dict(user="ann", item=2, qty=6, note="b", ver=0)]
    assert sorted(r["item"] for r in t.prefix_lookup([{"user": "ann"}]).to_pylist()) == [1, 2]
    assert t.prefix_lookup([{"user": "bob"}]).num_rows == 0

    log = client.table(f"{topic_name}.changelog").scan(columns=["_change", "user", "item", "qty"]).to_arrow()
    changes = sorted(zip(log["user"].to_pylist(), log["item"].to_pylist(), log["_change"].to_pylist(),
                         log["qty"].to_pylist()))
    assert [c for c in changes if c[:2] == ("ann", 1)] == sorted(
        [("ann", 1, 1, 5), ("ann", 1, 2, 5), ("ann", 1, 3, 50)])
    assert [c[2] for c in changes if c[:2] == ("bob", 1)] == [1, 4]

    # A full read: the rows, then the changelog exactly from where they end.
    full = t.full_read()
    t.upsert(rows(("cy", 3, 1, None, 0)))
    after = full.changelog(columns=["_change", "user"]).to_arrow()
    assert after["user"].to_pylist() == ["cy"] and after["_change"].to_pylist() == [1]


def test_versioned_and_first_row_engines(client, topic_name):
    v = client.create_table(topic_name, SCHEMA, primary_key=["user", "item"], merge_engine="versioned",
                            version_column="ver")
    v.upsert(rows(("a", 1, 1, "v2", 2)))
    v.upsert(rows(("a", 1, 2, "v1", 1)))  # stale: no change
    v.upsert(rows(("a", 1, 3, "v3", 3)))
    assert current(v) == [dict(user="a", item=1, qty=3, note="v3", ver=3)]
    assert [o.high_watermark for o in v.offsets()] == [3]  # +I, -U, +U
    with pytest.raises(InvalidRecordError, match="version column"):
        v.upsert(pa.table({"user": ["a"], "item": pa.array([2], pa.int64()), "qty": pa.array([1], pa.int64()),
                           "note": ["x"]}))

    f = client.create_table(topic_name + "f", SCHEMA, primary_key=["user", "item"], merge_engine="first_row")
    f.upsert(rows(("a", 1, 1, "first", 0)))
    f.upsert(rows(("a", 1, 2, "second", 0), ("b", 1, 3, "other", 0)))
    assert [r["note"] for r in current(f)] == ["first", "other"]
    with pytest.raises(InvalidRecordError, match="deletes are not supported"):
        f.delete([{"user": "a", "item": 1}])


@pytest.mark.parametrize("data, kwargs, message", [
    (pa.table({"user": ["a"], "qty": pa.array([1], pa.int64())}), {}, "primary-key column"),
    (pa.table({"user": pa.array([None], pa.string()), "item": pa.array([1], pa.int64()),
               "qty": pa.array([1], pa.int64()), "note": ["x"], "ver": pa.array([1], pa.int64())}), {}, "is null"),
    (pa.table({"user": ["a"], "qty": pa.array([1], pa.int64())}), {"columns": ["user", "qty"]}, "primary-key"),
    (pa.table({"user": ["a"], "item": ["one"], "qty": pa.array([1], pa.int64()), "note": ["x"],
               "ver": pa.array([1], pa.int64())}), {}, "item"),
])
def test_bad_writes_are_refused_and_nothing_is_applied(client, topic_name, data, kwargs, message):
    t = client.create_table(topic_name, SCHEMA, buckets=2, primary_key=["user", "item"])
    t.upsert(rows(("a", 1, 1, "kept", 0)))
    with pytest.raises(InvalidRecordError, match=message):
        t.upsert(data, **kwargs)
    assert current(t) == [dict(user="a", item=1, qty=1, note="kept", ver=0)]
    assert sum(o.high_watermark for o in t.offsets()) == 1


def test_table_definitions_and_appends_are_checked(client, topic_name):
    with pytest.raises(InvalidConfigError, match="not columns of the table"):
        client.create_table(topic_name, SCHEMA, primary_key=["nope"])
    with pytest.raises(InvalidConfigError, match="only used by merge engine 'versioned'"):
        client.create_table(topic_name, SCHEMA, primary_key=["user"], version_column="ver")
    t = client.create_table(topic_name, SCHEMA, primary_key=["user", "item"])
    with pytest.raises(InvalidRequestError, match="upsert"):
        t.append(rows(("a", 1, 1, "x", 0)))


def test_schema_evolution_keeps_stored_rows_readable(broker, client, topic_name):
    import json

    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from fluvial.schema.arrow_mapping import arrow_to_avro

    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string())])
    t = client.create_table(topic_name, schema, kafka_format="avro", primary_key=["id"])
    t.upsert(pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]}))
    wider = schema.append(pa.field("city", pa.string()))
    sr = SchemaRegistryClient({"url": broker.http_url})
    avro = arrow_to_avro(wider, topic_name.replace("-", "_"))  # the record name the table was made with
    sr.register_schema(f"{topic_name}-value", Schema(json.dumps(avro), "AVRO"))
    t.upsert(pa.table({"id": pa.array([2, 3], pa.int64()), "name": ["b2", "c"], "city": ["x", "y"]}))
    got = sorted(t.lookup([{"id": 1}, {"id": 2}, {"id": 3}]).to_pylist(), key=lambda r: r["id"])
    assert got == [{"id": 1, "name": "a", "city": None}, {"id": 2, "name": "b2", "city": "x"},
                   {"id": 3, "name": "c", "city": "y"}]
