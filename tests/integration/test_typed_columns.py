"""Column types declared at table creation are the types stored, in the JSON value format
too (its JSON Schema records the Arrow type), and `fluvial table describe` shows them."""
from __future__ import annotations

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
                       "--column", "at:timestamp", "--kafka-format", fmt, *url)
        assert made.returncode == 0, made.stderr
        with fc.connect(broker.flight_url) as client:
            stored = {f.name: f.type for f in client.describe(name).schema}
        assert stored["score"] == pa.int32()
        lines = fluvial("table", "describe", name, *url).stdout.splitlines()
        cells = [[c.strip() for c in line.split("|")] for line in lines if "|" in line]
        score = next(c for c in cells if c[1] == "score")
        assert score[2:] == ["int32", "True", "integer (int32)" if fmt == "json" else "int"]
        if fmt == "json":
            # JSON values carry timestamps as text: the table says so when it is created.
            assert stored["at"] == pa.string()
            assert "column 'at' is stored as string" in made.stderr
        else:
            assert stored["at"] == pa.timestamp("ms", tz="UTC") and "stored as" not in made.stderr


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_declared_int32_survives_in_both_formats(broker, topic_name, fmt):
    schema = pa.schema([pa.field("id", pa.int64(), False), ("score", pa.int32()), ("ratio", pa.float32())])
    with fc.connect(broker.flight_url) as client:
        t = client.create_table(f"{topic_name}-{fmt}", schema, kafka_format=fmt)
        assert plain(t.schema).equals(schema)
