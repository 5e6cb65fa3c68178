"""Scans through the native client read only the columns asked for, at the Kafka offsets."""
from __future__ import annotations

import datetime as dt
import json
import random
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import fluvial.client as fc
from tests.unit.test_schema_codecs import SCHEMA20, make_record


def consume_all(bootstrap: str, topic: str, partitions: int, n: int, timeout: float = 60) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "flight-scan", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got.extend(m for m in c.consume(2000, timeout=1) if m.error() is None)
    c.close()
    return got


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)


@pytest.fixture
def client(broker):
    with fc.connect(broker.flight_url) as c:
        yield c


def test_two_of_twenty_avro_columns_equal_what_was_produced_at_the_kafka_offsets(broker, client, topic_name):
    sr = SchemaRegistryClient({"url": broker.http_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA20))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    rng = random.Random(5)
    records = [make_record(rng, i) for i in range(5000)]
    payloads = [ser(r, ctx) for r in records]  # registers <topic>-value first: the table is typed
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    for v in payloads:
        p.produce(topic_name, value=v, partition=0)
    assert p.flush(60) == 0
    consumed = consume_all(broker.bootstrap, topic_name, 1, len(records))
    assert len(consumed) == len(records)

    table = client.table(topic_name)
    assert len(table.schema) == 20 and "_schema_id" not in table.schema.names
    narrow = table.scan(columns=["_offset", "id", "name"])
    got = narrow.to_arrow()
    assert got.column_names == ["_offset", "id", "name"]
    assert got.column("_offset").to_pylist() == [m.offset() for m in consumed]
    assert got.column("id").to_pylist() == [r["id"] for r in records]
    assert got.column("name").to_pylist() == [r["name"] for r in records]

    full = table.scan(columns=["_offset", *table.schema.names])
    assert full.to_arrow().num_rows == len(records)
    assert narrow.stats.rows_sent == full.stats.rows_sent == len(records)
    # Only the asked-for column buffers leave the broker.
    assert narrow.stats.bytes_sent < 0.2 * full.stats.bytes_sent, (narrow.stats, full.stats)


def test_raw_table_keys_values_and_offsets_equal_the_kafka_records(broker, client, topic_name):
    create_topic(broker.bootstrap, topic_name, 3)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(900):
        p.produce(topic_name, key=f"k{i % 37}".encode(), value=f"value {i}".encode() * (i % 5))
    assert p.flush(30) == 0
    consumed = consume_all(broker.bootstrap, topic_name, 3, 900)
    assert len(consumed) == 900
    kafka = sorted((m.partition(), m.offset(), m.key(), m.value() or b"") for m in consumed)

    scan = client.table(topic_name).scan(columns=["_bucket", "_offset", "_key", "value"])
    rows = scan.to_arrow().to_pydict()
    ours = sorted(zip(rows["_bucket"], rows["_offset"], rows["_key"], [v or b"" for v in rows["value"]]))
    assert ours == kafka
    assert sorted({b for b, *_ in kafka}) == [0, 1, 2]


def test_offsets_start_end_and_timestamps(broker, client, topic_name):
    t = client.create_table(topic_name, pa.schema([("n", pa.int64())]), buckets=1)
    base = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    for k in range(4):
        ts = pa.array([base + dt.timedelta(minutes=k)] * 10, pa.timestamp("ms", tz="UTC"))
        t.append(pa.table({"n": range(k * 10, k * 10 + 10), "_timestamp": ts}))
    assert t.offsets() == [fc.BucketOffsets(0, 0, 40)]
    assert t.scan(columns=["n"], start=15, end=22).to_arrow().column("n").to_pylist() == list(range(15, 22))
    assert t.scan(columns=["n"], start="latest").to_arrow().num_rows == 0
    later = t.scan(columns=["_offset", "_timestamp"], start=base + dt.timedelta(minutes=2)).to_arrow()
    assert later.column("_offset").to_pylist() == list(range(20, 40))
    assert later.column("_timestamp")[0].as_py() == base + dt.timedelta(minutes=2)
    # The default end is the high watermark when the scan starts.
    assert t.scan(columns=["n"]).to_pandas()["n"].tolist() == list(range(40))
    pd = pytest.importorskip("pandas")
    t.append(pd.DataFrame({"n": [40, 41]}))
    assert t.scan(columns=["n"], start=40).to_pandas()["n"].tolist() == [40, 41]


def _filtered_table(client, name: str) -> fc.Table:
    schema = pa.schema([("id", pa.int64()), ("city", pa.string()), ("price", pa.float64())])
    t = client.create_table(name, schema, buckets=2)
    rng = random.Random(11)
    cities = ["Lyon", "Oslo", "Lima", None]
    for k in range(10):  # batches with disjoint id ranges: a range filter can skip most of them
        ids = list(range(k * 1000, k * 1000 + 1000))
        t.append(pa.table({"id": ids, "city": [rng.choice(cities) for _ in ids],
                           "price": [rng.uniform(0, 100) for _ in ids]}), bucket=k % 2)
    return t


FILTERS = [
    [("id", "=", 4242)],
    [("id", ">=", 3000), ("id", "<", 3500)],
    [("price", ">", 90.0), ("city", "=", "Oslo")],
    [("city", "in", ["Lima", "Lyon"]), ("id", "<=", 2500)],
    [("city", "not in", ["Lima"])],
    [("city", "is_null", None)],
    [("city", "not_null", None), ("id", "!=", 17)],
]

_PC = {"=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
       ">=": pc.greater_equal}


def _pyarrow_filter(table: pa.Table, filters) -> pa.Table:
    mask = None
    for col, op, value in filters:
        c = table.column(col)
        if op in _PC:
            m = _PC[op](c, value)
        elif op == "in":
            m = pc.is_in(c, pa.array(value))
        elif op == "not in":
            m = pc.and_(pc.invert(pc.is_in(c, pa.array(value))), pc.is_valid(c))
        elif op == "is_null":
            m = pc.is_null(c)
        else:
            m = pc.is_valid(c)
        mask = m if mask is None else pc.and_kleene(mask, m)
    return table.filter(mask)


def test_filters_return_exactly_the_rows_pyarrow_computes(client, topic_name):
    t = _filtered_table(client, topic_name)
    full = t.scan(columns=["_bucket", "_offset", "id", "city", "price"]).to_arrow()
    assert full.num_rows == 10_000
    for filters in FILTERS:
        got = t.scan(columns=["_bucket", "_offset", "id", "city"], filter=filters).to_arrow()
        want = _pyarrow_filter(full, filters).select(["_bucket", "_offset", "id", "city"])
        key = [("_bucket", "ascending"), ("_offset", "ascending")]
        assert got.sort_by(key).equals(want.sort_by(key)), filters
        assert got.num_rows > 0, filters


def test_range_filter_skips_batches_outside_the_range(client, topic_name):
    t = _filtered_table(client, topic_name)
    scan = t.scan(columns=["id"], filter=[("id", ">=", 3000), ("id", "<", 3500)])
    assert scan.to_arrow().column("id").to_pylist() == list(range(3000, 3500))
    assert scan.stats.batches_skipped >= 8, scan.stats
    assert scan.stats.batches_read == 10


def test_batches_written_before_the_schema_evolved_are_read_under_the_new_schema(broker, client, topic_name):
    sr = SchemaRegistryClient({"url": broker.http_url})
    v1 = {"type": "record", "name": "E", "fields": [{"name": "id", "type": "int"}]}
    v2 = {**v1, "fields": v1["fields"] + [{"name": "kind", "type": "string", "default": "plain"}]}
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for schema, rec in [(v1, {"id": 1}), (v2, {"id": 2, "kind": "k"})]:
        ser = AvroSerializer(sr, json.dumps(schema))
        for _ in range(3):
            p.produce(topic_name, value=ser(rec, ctx), partition=0)
        assert p.flush(10) == 0
    t = client.table(topic_name)
    assert t.schema.names == ["id", "kind"]
    got = t.scan(columns=["_offset", "id", "kind"]).to_arrow().to_pydict()
    assert got == {"_offset": list(range(6)), "id": [1, 1, 1, 2, 2, 2], "kind": ["plain"] * 3 + ["k"] * 3}
    assert t.scan(columns=["id"], filter=("kind", "=", "plain")).to_arrow().column("id").to_pylist() == [1, 1, 1]
    t.append(pa.table({"id": pa.array([3], pa.int32()), "kind": ["native"]}))
    assert t.scan(columns=["kind"], start=6).to_arrow().column("kind").to_pylist() == ["native"]
