"""Bad input to the table API gets a clear, typed error, and the broker keeps serving."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import fluvial.client as fc

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


@pytest.fixture
def client(broker):
    with fc.connect(broker.flight_url) as c:
        yield c


@pytest.fixture
def table(client, topic_name):
    t = client.create_table(topic_name, SCHEMA, buckets=2)
    t.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", None]}, schema=SCHEMA), bucket=0)
    return t


def still_serving(table: fc.Table) -> None:
    assert table.scan(columns=["id"]).to_arrow().column("id").to_pylist() == [1, 2, 3]


def test_unknown_table(client, table):
    with pytest.raises(fc.UnknownTableError, match="Unknown table 'no-such-table'"):
        client.table("no-such-table")
    with pytest.raises(fc.UnknownTableError):
        client.drop_table("no-such-table")
    with pytest.raises(fc.UnknownTableError, match="no bucket 7"):
        table.scan(buckets=[7]).to_arrow()
    still_serving(table)


def test_unknown_column_names_the_columns_there_are(table):
    with pytest.raises(fc.UnknownColumnError, match=r"no column 'price'; its columns are \['id', 'name'\]"):
        table.scan(columns=["id", "price"]).to_arrow()
    with pytest.raises(fc.UnknownColumnError, match="no column 'price'"):
        table.scan(columns=["id"], filter=[("price", ">", 1)]).to_arrow()
    with pytest.raises(fc.InvalidRequestError, match="unknown filter operator 'like'"):
        table.scan(filter=[("name", "like", "a%")]).to_arrow()
    with pytest.raises(fc.InvalidRequestError, match="does not fit column 'id'"):
        table.scan(filter=[("id", "=", "one")]).to_arrow()
    still_serving(table)


def test_rows_that_do_not_match_the_schema_are_refused_whole(table):
    with pytest.raises(fc.SchemaMismatchError, match=r"missing columns \['name'\]"):
        table.append(pa.table({"id": [9]}))
    with pytest.raises(fc.SchemaMismatchError, match=r"unknown columns \['extra'\]"):
        table.append(pa.table({"id": [9], "name": ["x"], "extra": [1.5]}))
    with pytest.raises(fc.SchemaMismatchError, match="'id' is string, the table holds int64"):
        table.append(pa.table({"id": ["nine"], "name": ["x"]}))
    with pytest.raises(fc.SchemaMismatchError, match="'id' holds 1 nulls"):
        table.append(pa.table({"id": pa.array([None], pa.int64()), "name": ["x"]}))
    assert [o.high_watermark for o in table.offsets()] == [3, 0]  # nothing of them was written
    # A narrower type that fits is widened.
    table.append(pa.table({"id": pa.array([4], pa.int32()), "name": ["d"]}), bucket=1)
    assert table.scan(columns=["id"], buckets=[1]).to_arrow().column("id").to_pylist() == [4]


def test_offsets_out_of_range(table):
    with pytest.raises(fc.OffsetOutOfRangeError, match=r"start offset 10 is out of range: bucket 0 .* \[0, 3\)"):
        table.scan(start=10, buckets=[0]).to_arrow()
    with pytest.raises(fc.OffsetOutOfRangeError, match="end offset 9 is out of range"):
        table.scan(end=9, buckets=[0]).to_arrow()
    with pytest.raises(fc.OffsetOutOfRangeError, match="before the start offset"):
        table.scan(start=2, end=1, buckets=[0]).to_arrow()
    still_serving(table)


def test_table_definitions(client, table):
    with pytest.raises(fc.TableExistsError):
        client.create_table(table.name, SCHEMA)
    with pytest.raises(fc.InvalidTableError, match="reserved for system columns"):
        client.create_table(table.name + "-x", pa.schema([("_secret", pa.int64())]))
    with pytest.raises(fc.InvalidTableError, match="illegal"):
        client.create_table("bad/name", SCHEMA)
    with pytest.raises(fc.FluvialError, match="kafka_format must be one of"):
        client.create_table(table.name + "-y", SCHEMA, kafka_format="protobuf")
    assert table.name + "-x" not in client.list_tables()
    still_serving(table)


def test_plain_flight_clients_get_the_same_errors(broker, table):
    raw = flight.connect(broker.flight_url)
    with pytest.raises(flight.FlightServerError) as info:
        list(raw.do_action(flight.Action("describe", json.dumps({"table": "nope"}).encode())))
    assert json.loads(info.value.extra_info) == {"error": "UnknownTableError", "message": "Unknown table 'nope'"}
    with pytest.raises(flight.FlightServerError, match="unknown action"):
        list(raw.do_action(flight.Action("explode", b"{}")))
    # Generic Flight tools can list and read tables too.
    infos = {i.descriptor.path[0].decode(): i for i in raw.list_flights()}
    assert infos[table.name].schema.names == ["id", "name"]
    got = pa.concat_tables(raw.do_get(e.ticket).read_all() for e in infos[table.name].endpoints)
    assert sorted(got.column("id").to_pylist()) == [1, 2, 3]
    raw.close()
    still_serving(table)


def test_unreachable_broker_is_a_typed_error():
    with pytest.raises(fc.BrokerUnavailableError):
        fc.connect("grpc://127.0.0.1:1").list_tables()
