"""Column types declared at table creation are the types stored, in the JSON value format
too (its JSON Schema records the Arrow type), and `fluvial table describe` shows them."""
from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import fluvial.client as fc
from tests.integration.test_flight_cli import fluvial

NARROW = pa.schema([pa.field("id", pa.int64(), False), ("i8", pa.int8()), ("i16", pa.int16()), ("i32", pa.int32()),
                    ("u8", pa.uint8()), ("u32", pa.uint32()), ("u64", pa.uint64()), ("f32", pa.float32()),
                    ("text", pa.large_string()), ("tags", pa.list_(pa.int16())),
                    ("point", pa.struct([("x", pa.int16()), ("y", pa.float32())]))])


def produce(bootstrap: str, topic: str, values: list[dict]) -> list:
    errors: list = []
    p = Producer({"bootstrap.servers": bootstrap})
    for v in values:
        p.produce(topic, value=json.dumps(v).encode(), on_delivery=lambda e, m: errors.append(e))
    p.flush(30)
    return errors


def plain(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.remove_metadata() for f in schema])


def test_json_tables_keep_timestamps(broker, topic_name):
    """Date-times travel as RFC 3339 text: zoned columns as UTC with Z, local ones without an
    offset; texts that do not parse as the column's type are refused per record."""
    schema = pa.schema([pa.field("id", pa.int64(), False), ("at", pa.timestamp("ms", tz="UTC")),
                        ("local", pa.timestamp("us")), ("seen", pa.list_(pa.timestamp("s", tz="UTC")))])
    when = dt.datetime(2026, 1, 31, 12, 0, 0, 250000, tzinfo=dt.timezone.utc)
    with fc.connect(broker.flight_url) as client:
        t = client.create_table(topic_name, schema, kafka_format="json")
        assert plain(t.schema).equals(schema)
        t.append(pa.Table.from_pylist([{"id": 1, "at": when, "local": dt.datetime(2026, 1, 31, 13, 0, 0, 123456),
                                        "seen": [when.replace(microsecond=0)]}], schema=schema))
        assert produce(broker.bootstrap, topic_name, [
            {"id": 2, "at": "2026-01-31T13:00:00.250+01:00", "local": "2026-01-31T13:00:00", "seen": []}]) == [None]
        for bad in ({"at": "yesterday"}, {"at": "2026-01-31T12:00:00"}, {"local": "2026-01-31T12:00:00Z"},
                    {"at": "2026-01-31T12:00:00.250001Z"}):
            errors = produce(broker.bootstrap, topic_name, [{"id": 3, "at": None, "local": None, "seen": None, **bad}])
            assert errors[0] is not None and errors[0].name() == "INVALID_RECORD", bad
        got = t.scan().to_arrow()
        assert got.schema.equals(schema) and got.column("id").to_pylist() == [1, 2]
        assert got.column("at").to_pylist() == [when, when]
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic_name, "enable.auto.commit": False})
        c.assign([TopicPartition(topic_name, 0, 0)])
        msgs: list = []
        while len(msgs) < 2:
            msgs += [m for m in c.consume(10, timeout=5) if m.error() is None]
        c.close()
        assert json.loads(msgs[0].value()) == {"id": 1, "at": "2026-01-31T12:00:00.250Z",
                                               "local": "2026-01-31T13:00:00.123456", "seen": ["2026-01-31T12:00:00Z"]}


def test_json_tables_keep_times_decimals_and_bytes(broker, topic_name):
    """Times as HH:MM:SS[.fff] text, decimals of up to 15 digits as JSON numbers, bytes as base64."""
    import decimal

    schema = pa.schema([pa.field("id", pa.int64(), False), ("at", pa.time32("ms")), ("price", pa.decimal128(10, 2)),
                        ("blob", pa.binary())])
    with fc.connect(broker.flight_url) as client:
        t = client.create_table(topic_name, schema, kafka_format="json")
        assert plain(t.schema).equals(schema)
        t.append(pa.Table.from_pylist([{"id": 1, "at": dt.time(12, 0, 0, 250000), "price": decimal.Decimal("12.34"),
                                        "blob": b"\x00\xffab"}], schema=schema))
        assert produce(broker.bootstrap, topic_name, [{"id": 2, "at": "23:59:59", "price": 0.5, "blob": "eHk="}]) == [None]
        for bad in ({"at": "25:00:00"}, {"at": "noon"}, {"price": 1.234}, {"blob": "eA="}, {"blob": "not base64!"}):
            errors = produce(broker.bootstrap, topic_name, [{"id": 3, "at": None, "price": None, "blob": None, **bad}])
            assert errors[0] is not None and errors[0].name() == "INVALID_RECORD", bad
        got = t.scan().to_arrow()
        assert got.schema.equals(schema) and got.to_pylist() == [
            {"id": 1, "at": dt.time(12, 0, 0, 250000), "price": decimal.Decimal("12.34"), "blob": b"\x00\xffab"},
            {"id": 2, "at": dt.time(23, 59, 59), "price": decimal.Decimal("0.50"), "blob": b"xy"}]
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic_name, "enable.auto.commit": False})
        c.assign([TopicPartition(topic_name, 0, 0)])
        msgs: list = []
        while len(msgs) < 1:
            msgs += [m for m in c.consume(10, timeout=5) if m.error() is None]
        c.close()
        assert json.loads(msgs[0].value()) == {"id": 1, "at": "12:00:00.250", "price": 12.34, "blob": "AP9hYg=="}


def test_json_tables_keep_narrow_and_unsigned_types(broker, topic_name):
    with fc.connect(broker.flight_url) as client:
        t = client.create_table(topic_name, NARROW, kafka_format="json")
        assert plain(t.schema).equals(NARROW)
        assert plain(client.describe(topic_name).schema).equals(NARROW)
        row = {"id": 1, "i8": -128, "i16": 32767, "i32": -2**31, "u8": 255, "u32": 2**32 - 1, "u64": 2**64 - 1,
               "f32": 1.5, "text": "a", "tags": [1, -2], "point": {"x": 3, "y": 0.25}}
        t.append(pa.Table.from_pylist([row], schema=NARROW))
        # Kafka producers write the same columns; values a column cannot hold are refused whole.
        assert produce(broker.bootstrap, topic_name, [{**row, "id": 2}]) == [None]
        refused = produce(broker.bootstrap, topic_name, [{**row, "id": 3, "i32": 2**31}, {**row, "id": 4, "u8": -1}])
        assert all(e is not None and e.name() == "INVALID_RECORD" for e in refused), refused
        got = t.scan().to_arrow()
        assert got.schema.equals(NARROW) and got.column("id").to_pylist() == [1, 2]
        assert got.to_pylist()[1] == {**row, "id": 2}


def test_cli_create_keeps_int_and_describe_shows_what_is_stored(broker, topic_name):
    url = ["--url", broker.flight_url]
    for fmt in ("json", "avro"):
        name = f"{topic_name}-{fmt}"
        made = fluvial("table", "create", name, "--column", "id:long!", "--column", "score:int",
                       "--column", "at:timestamp", "--column", "blob:bytes", "--kafka-format", fmt, *url)
        assert made.returncode == 0, made.stderr
        with fc.connect(broker.flight_url) as client:
            stored = {f.name: f.type for f in client.describe(name).schema}
        assert stored["score"] == pa.int32()
        lines = fluvial("table", "describe", name, *url).stdout.splitlines()
        cells = [[c.strip() for c in line.split("|")] for line in lines if "|" in line]
        score = next(c for c in cells if c[1] == "score")
        assert score[2:] == ["int32", "True", "integer (int32)" if fmt == "json" else "int"]
        assert stored["at"] == pa.timestamp("ms", tz="UTC") and stored["blob"] == pa.binary()
        assert "stored as" not in made.stderr  # said only when a declared type is not kept


def test_avro_tables_keep_narrow_and_unsigned_types(broker, topic_name):
    """Avro has int and long only: the registered schema records the Arrow type
    ("arrow.type"), Kafka producers and consumers use it as plain int/long."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema = pa.schema([f for f in NARROW if f.name != "u64"])  # Avro long holds no uint64 beyond 2**63
    with fc.connect(broker.flight_url) as client:
        t = client.create_table(topic_name, schema, kafka_format="avro")
        assert plain(t.schema).equals(schema)
        row = {"id": 1, "i8": -128, "i16": 32767, "i32": -2**31, "u8": 255, "u32": 2**32 - 1,
               "f32": 1.5, "text": "a", "tags": [1, -2], "point": {"x": 3, "y": 0.25}}
        t.append(pa.Table.from_pylist([row], schema=schema))
        registry = SchemaRegistryClient({"url": broker.http_url})
        text = registry.get_latest_version(f"{topic_name}-value").schema.schema_str
        ser = AvroSerializer(registry, text, conf={"auto.register.schemas": False, "use.latest.version": True})
        ctx = SerializationContext(topic_name, MessageField.VALUE)
        errors: list = []
        p = Producer({"bootstrap.servers": broker.bootstrap})
        for v in ({**row, "id": 2}, {**row, "id": 3, "i8": 200}, {**row, "id": 4, "u32": -1}):
            p.produce(topic_name, value=ser(v, ctx), on_delivery=lambda e, m: errors.append(e))
            p.flush(30)  # one batch each: a refused record fails its whole batch
        assert errors[0] is None and all(e is not None and e.name() == "INVALID_RECORD" for e in errors[1:]), errors
        got = t.scan().to_arrow()
        assert got.schema.equals(schema) and got.column("id").to_pylist() == [1, 2]
        # Kafka consumers read the rows with the registered schema
        de = AvroDeserializer(registry)
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic_name, "enable.auto.commit": False})
        c.assign([TopicPartition(topic_name, 0, 0)])
        msgs = []
        while len(msgs) < 2:
            msgs += [m for m in c.consume(10, timeout=5) if m.error() is None]
        c.close()
        values = [de(m.value(), ctx) for m in msgs]
        assert [v["i8"] for v in values] == [-128, -128] and values[0]["u32"] == 2**32 - 1


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_declared_int32_survives_in_both_formats(broker, topic_name, fmt):
    schema = pa.schema([pa.field("id", pa.int64(), False), ("score", pa.int32()), ("ratio", pa.float32())])
    with fc.connect(broker.flight_url) as client:
        t = client.create_table(f"{topic_name}-{fmt}", schema, kafka_format=fmt)
        assert plain(t.schema).equals(schema)
