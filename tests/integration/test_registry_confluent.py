"""Confluent's own registry client and serializers against Fluvial's registry over HTTP."""
from __future__ import annotations

import asyncio
import json
import random
import socket
import threading

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from fluvial.broker.metadata import MetadataStore
from fluvial.schema.codecs import value_codec
from fluvial.schema.registry import SchemaRegistry
from fluvial.schema.rest import start_http
from tests.unit.test_schema_codecs import JSON_SCHEMA, SCHEMA20, make_record, normalized


class RegistryServer:
    """The registry's aiohttp app in an event loop of its own thread, on a free port."""

    def __init__(self, registry: SchemaRegistry, **http_options):
        self.registry = registry
        self.http_options = http_options
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = self.loop.run_until_complete(start_http(self.registry, "127.0.0.1", self.port,
                                                                     **self.http_options))
        self.started.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def __enter__(self) -> "RegistryServer":
        self.thread.start()
        assert self.started.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def server(tmp_path):
    registry = SchemaRegistry(MetadataStore(tmp_path / "meta.db"))
    with RegistryServer(registry) as s:
        yield s


def test_avro_serializer_records_through_typed_columns_and_back(server):
    client = SchemaRegistryClient({"url": server.url})
    topic = "orders"
    ctx = SerializationContext(topic, MessageField.VALUE)
    serializer = AvroSerializer(client, json.dumps(SCHEMA20))
    rng = random.Random(11)
    records = [make_record(rng, i) for i in range(10_000)]
    produced = [serializer(r, ctx) for r in records]
    assert 150 < sum(map(len, produced)) / len(produced) < 260  # about 200 bytes a value

    codec = value_codec(server.registry, topic)
    columns, ids = codec.decode(pa.array(produced, pa.binary()))
    assert columns.type.num_fields == 20
    assert columns.field("amount").type == pa.decimal128(12, 2)
    consumed = codec.encode(columns, ids)
    assert consumed.to_pylist() == produced  # byte-identical

    deserializer = AvroDeserializer(client)
    values = [deserializer(v, ctx) for v in consumed.to_pylist()]
    assert [normalized(v) for v in values] == [normalized(r) for r in records]


def test_json_serializer_records_through_typed_columns_and_back(server):
    client = SchemaRegistryClient({"url": server.url})
    topic = "events"
    ctx = SerializationContext(topic, MessageField.VALUE)
    serializer = JSONSerializer(json.dumps(JSON_SCHEMA), client)
    docs = [{"id": i, "name": f"n{i}", "price": i / 4, "active": i % 2 == 0, "day": "2024-05-%02d" % (i % 28 + 1),
             "at": "2024-05-01T00:00:00+02:00", "tags": ["x"] * (i % 3),
             "owner": {"name": "o", "age": i % 90}, "note": "n" if i % 5 else None} for i in range(2000)]
    produced = [serializer(d, ctx) for d in docs]
    codec = value_codec(server.registry, topic)
    columns, ids = codec.decode(pa.array(produced, pa.binary()))
    assert columns.field("day").type == pa.date32()
    consumed = codec.encode(columns, ids).to_pylist()
    deserializer = JSONDeserializer(json.dumps(JSON_SCHEMA), schema_registry_client=client)
    assert [deserializer(v, ctx) for v in consumed] == docs
    assert all(b", " not in v and b": " not in v for v in consumed)  # compact


def test_registry_answers_in_confluent_form(server):
    client = SchemaRegistryClient({"url": server.url})
    v1 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    v2 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"},
                                                   {"name": "b", "type": "string", "default": "x"}]}
    bad = {"type": "record", "name": "R", "fields": [{"name": "c", "type": "int"}]}
    id1 = client.register_schema("t-value", Schema(json.dumps(v1), "AVRO"))
    assert client.register_schema("t-value", Schema(json.dumps(v1), "AVRO")) == id1
    assert client.test_compatibility("t-value", Schema(json.dumps(v2), "AVRO"))
    assert not client.test_compatibility("t-value", Schema(json.dumps(bad), "AVRO"))
    id2 = client.register_schema("t-value", Schema(json.dumps(v2), "AVRO"))
    assert id2 != id1
    latest = client.get_latest_version("t-value")
    assert (latest.version, latest.schema_id) == (2, id2)
    assert client.get_version("t-value", 1).schema_id == id1
    assert json.loads(client.get_schema(id1).schema_str) == v1
    assert client.lookup_schema("t-value", Schema(json.dumps(v1), "AVRO")).version == 1
    assert client.get_subjects() == ["t-value"]
    assert client.get_versions("t-value") == [1, 2]
    assert client.get_compatibility() == "BACKWARD"
    client.set_compatibility("t-value", "FULL")
    assert client.get_compatibility("t-value") == "FULL"

    def error(call) -> SchemaRegistryError:
        with pytest.raises(SchemaRegistryError) as info:
            call()
        return info.value

    e = error(lambda: client.register_schema("t-value", Schema(json.dumps(bad), "AVRO")))
    assert (e.http_status_code, e.error_code) == (409, 409)
    e = error(lambda: client.register_schema("t-value", Schema('{"type": "nope"}', "AVRO")))
    assert (e.http_status_code, e.error_code) == (422, 42201)
    e = error(lambda: client.get_versions("missing"))
    assert (e.http_status_code, e.error_code) == (404, 40401)
    e = error(lambda: client.get_version("t-value", 9))
    assert (e.http_status_code, e.error_code) == (404, 40402)
    e = error(lambda: client.get_schema(4242))
    assert (e.http_status_code, e.error_code) == (404, 40403)

    assert client.delete_version("t-value", 1) == 1
    assert client.get_versions("t-value") == [2]
    assert client.delete_subject("t-value") == [2]
    assert client.get_subjects() == []


def test_registration_over_http_notifies_the_broker(server):
    heard = []
    server.registry.listeners.append(heard.append)
    client = SchemaRegistryClient({"url": server.url})
    client.register_schema("clicks-value", Schema(json.dumps(JSON_SCHEMA), "JSON"))
    assert [(e.topic, e.version, e.schema.schema_type.value) for e in heard] == [("clicks", 1, "JSON")]
